"""Huge pages for a model's ranks, chosen by measurement (``trainsched train --huge-pages auto``).

With ``THP_MEM_ALLOC_ENABLE=1`` PyTorch's CPU allocator asks for 2 MiB pages for every buffer
of 2 MiB or more (:data:`~trainsched.runtime.launch.HUGE_PAGES_ENV`). Whether that helps depends
on the model: on this project's 2-CPU host VGG-16 trained 1.70x faster with it and the small
CNN at batch 32 2.3x slower (``benchmarks/huge_pages.py``). So it is measured, not guessed:
:func:`choose_huge_pages` times the model with the setting off and on, alternating (off, on,
on, off, ...), and keeps it on only where the on runs' median step is more than ``margin``
faster. :func:`huge_pages_trial` times short stock-DDP jobs of the model: what the setting acts
on is how the model's forward and backward allocate, which every plan of the model shares.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass

from trainsched.errors import TrainschedError
from trainsched.runtime.launch import huge_pages
from trainsched.units import is_int

__all__ = ["HUGE_PAGES_GAIN", "HugePagesChoice", "choose_huge_pages", "huge_pages_trial"]

#: How much faster the runs with huge pages must be to keep them on.
HUGE_PAGES_GAIN = 0.03


@dataclass(frozen=True)
class HugePagesChoice:
    """The setting chosen (``"0"`` or ``"1"``), the median step of each timed run, and the
    margin the runs with huge pages had to beat."""

    setting: str
    off_s: tuple[float, ...]
    on_s: tuple[float, ...]
    margin: float = HUGE_PAGES_GAIN

    @property
    def speedup(self) -> float:
        """The runs' median step off over on (> 1: faster with huge pages)."""
        return statistics.median(self.off_s) / statistics.median(self.on_s)

    def reason(self) -> str:
        word = "on" if self.setting == "1" else "off"
        return (f"huge pages {word}: steps {statistics.median(self.off_s) * 1e3:.1f} ms without "
                f"and {statistics.median(self.on_s) * 1e3:.1f} ms with them "
                f"({self.speedup:.3f}x; on only beyond {1 + self.margin:.2f}x), "
                f"{len(self.off_s)} runs each")


def choose_huge_pages(time_step: Callable[[str], float], *, rounds: int = 2,
                      margin: float = HUGE_PAGES_GAIN) -> HugePagesChoice:
    """``time_step(setting)`` (a median step in seconds) for each setting ``rounds`` times,
    off and on alternating in pairs (off on, on off, ...) so that a drift of the host is
    shared; on if the median over the on runs is more than ``margin`` below the off runs'."""
    if not (is_int(rounds) and rounds >= 1):
        raise TrainschedError(f"rounds must be an integer >= 1, got {rounds!r}")
    times: dict[str, list[float]] = {"0": [], "1": []}
    for r in range(rounds):
        for setting in ("0", "1") if r % 2 == 0 else ("1", "0"):
            times[setting].append(float(time_step(setting)))
    off, on = statistics.median(times["0"]), statistics.median(times["1"])
    setting = "1" if off > on * (1 + margin) else "0"
    return HugePagesChoice(setting=setting, off_s=tuple(times["0"]), on_s=tuple(times["1"]),
                           margin=margin)


def huge_pages_trial(model: str, *, nproc: int, batch_size: int | None = None,
                     image_size: int | None = None, seq_len: int | None = None,
                     optimizer: str = "sgd", lr: float = 0.01, steps: int = 5,
                     warmup: int = 2, rounds: int = 2,
                     timeout_s: float = 1800.0) -> HugePagesChoice:
    """:func:`choose_huge_pages` on short stock-DDP jobs of zoo model ``model``: ``warmup``
    then ``steps`` timed steps per job, one job per setting and round."""
    from trainsched.runtime.train import Segment, run_segments

    segment = Segment(label="huge-pages trial", kind="ddp", steps=steps, warmup=warmup)

    def time_step(setting: str) -> float:
        with huge_pages(setting):
            result = run_segments(model, [segment], nproc=nproc, batch_size=batch_size,
                                  image_size=image_size, seq_len=seq_len,
                                  optimizer=optimizer, lr=lr, timeout_s=timeout_s)
        return result.first.median_s

    return choose_huge_pages(time_step, rounds=rounds)
