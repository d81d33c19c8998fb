"""The run's clock and its timeline: spans recorded by both threads, written by ``close()``.

:class:`Recorder` keeps two lists, one per writer: the training thread's compute spans
(``FWD``, ``BWD``, ``WAIT``) and the dispatcher thread's (``QUEUE``, ``COMM``, ``UPDATE``,
``SWITCH``), so neither thread takes a lock to record. Spans are kept only for the steps of the
window and only when a timeline directory was given. Nothing is written at interpreter exit:
:meth:`Recorder.write` is called by an explicit ``close()``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trainsched.comm.timeline import Span, write_timeline
from trainsched.errors import TrainschedError

__all__ = ["Recorder", "clock"]


def clock() -> float:
    """Seconds on the monotonic high-resolution clock every timing here uses."""
    return time.perf_counter()


class Recorder:
    """Spans of steps ``steps = (first, last)`` for ``rank<r>.trace.json`` in ``directory``
    (``None``: record nothing). Times are seconds from :attr:`t0`, this recorder's birth."""

    def __init__(self, directory: Path | None, steps: tuple[int, int]) -> None:
        if directory is not None and not directory.is_dir():
            raise TrainschedError(f"timeline directory {directory} does not exist")
        self.directory = directory
        self.steps = steps
        self.t0 = clock()
        self.compute: list[Span] = []  # the training thread's (FWD, BWD, WAIT)
        self.comm: list[Span] = []  # the dispatcher thread's (QUEUE, COMM, UPDATE, SWITCH)

    @property
    def enabled(self) -> bool:
        return self.directory is not None

    def now(self) -> float:
        """Seconds since :attr:`t0`."""
        return clock() - self.t0

    def in_window(self, step: int) -> bool:
        first, last = self.steps
        return self.directory is not None and first <= step <= last

    def backward(self, label: str, step: int, start_s: float, end_s: float) -> None:
        """A gradient of layer ``label`` became ready at ``end_s``: extend that layer's ``BWD``
        slice if it is the last one recorded, else open one from ``start_s`` (training
        thread)."""
        last = self.compute[-1] if self.compute else None
        if (last is not None and last.phase == "BWD" and last.label == label
                and last.step == step):
            self.compute[-1] = Span(track="compute", phase="BWD", label=label,
                                    start_s=last.start_s, end_s=end_s, step=step,
                                    args=last.args)
        else:
            self.compute.append(Span(track="compute", phase="BWD", label=label,
                                     start_s=start_s, end_s=end_s, step=step,
                                     args={"layer": label}))

    def write(self, rank: int, meta: Mapping[str, Any]) -> None:
        """Write ``rank<rank>.trace.json`` (nothing without a directory)."""
        if self.directory is None:
            return
        write_timeline(self.directory / f"rank{rank}.trace.json", [*self.compute, *self.comm],
                       rank=rank, title="trainsched run",
                       meta={**meta, "steps": list(self.steps)})
