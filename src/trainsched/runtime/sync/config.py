"""What a sync run is asked to do, checked in the parent process (torch-free).

A run trains ``ranks`` workers with ``batch_per_rank`` samples each through a sequence of
**phases** ``[(protocol, samples), ...]``: each phase applies exactly ``samples`` samples to the
shared model under its protocol (samples are the clock, spec §2.3). One *update unit* of a
protocol is the samples one update (or one round) applies: BSP and local SGD ``N·b`` (one step
on every rank), k-of-N ``k·b``, ASP and SSP ``b``; a phase's samples are a whole number of units.

:func:`plan_segments` cuts the phases at checkpoint boundaries into **segments**; the end of every
segment is a synchronisation point (the server drains, replicas agree), which is where the run
switches protocol or writes a checkpoint. :func:`split_samples` turns a policy's fractions into
such sample counts. :class:`Straggler` slows one rank for tests and benchmarks. The learning
rate of an update is ``base x schedule(samples applied / total) x lr_scale(protocol)``
(:data:`LR_SCHEDULES`), keyed on samples so it is the same after a restart.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from trainsched.errors import TrainschedError
from trainsched.registry import Registry
from trainsched.sync.protocols import (
    Asp,
    Bsp,
    KOfN,
    LocalSgd,
    Ssp,
    SyncProtocol,
    format_protocol,
    parse_protocol,
)
from trainsched.units import is_int

__all__ = [
    "LR_SCHEDULES",
    "Segment",
    "Straggler",
    "lr_scale",
    "needs_server",
    "plan_segments",
    "split_samples",
    "update_samples",
]

SERVER_PROTOCOLS = (Asp, Ssp, KOfN)


@dataclass(frozen=True, kw_only=True)
class Straggler:
    """Slow worker ``rank`` on its batches ``from_step`` .. ``to_step - 1`` (``None``: to the
    end; a rank's steps count every batch it computes, across phases): after computing each,
    it sleeps ``delay_s`` seconds, or ``(factor - 1)`` times that batch's compute time. Exactly
    one of ``delay_s`` and ``factor`` is given."""

    rank: int
    delay_s: float | None = None
    factor: float | None = None
    from_step: int = 0
    to_step: int | None = None

    def __post_init__(self) -> None:
        if not is_int(self.rank) or self.rank < 0:
            raise TrainschedError(f"straggler: rank must be a whole number >= 0, got "
                                  f"{self.rank!r}")
        if (self.delay_s is None) == (self.factor is None):
            raise TrainschedError("straggler: give exactly one of delay_s (seconds of sleep "
                                  "per step) and factor (slowdown x compute time)")
        if self.delay_s is not None and not (isinstance(self.delay_s, (int, float))
                                             and 0 <= self.delay_s < math.inf):
            raise TrainschedError(f"straggler: delay_s must be seconds >= 0, got "
                                  f"{self.delay_s!r}")
        if self.factor is not None and not (isinstance(self.factor, (int, float))
                                            and 1 <= self.factor < math.inf):
            raise TrainschedError(f"straggler: factor must be >= 1 (1: not slowed), got "
                                  f"{self.factor!r}")
        if not is_int(self.from_step) or self.from_step < 0:
            raise TrainschedError(f"straggler: from_step must be a whole number >= 0, got "
                                  f"{self.from_step!r}")
        if self.to_step is not None and (not is_int(self.to_step)
                                         or self.to_step <= self.from_step):
            raise TrainschedError(f"straggler: to_step must be a whole number > from_step "
                                  f"({self.from_step}), got {self.to_step!r}")

    def active(self, step: int) -> bool:
        return self.from_step <= step and (self.to_step is None or step < self.to_step)

    def to_json(self) -> dict[str, Any]:
        return {"rank": self.rank, "delay_s": self.delay_s, "factor": self.factor,
                "from_step": self.from_step, "to_step": self.to_step}


def needs_server(protocol: SyncProtocol) -> bool:
    """Whether ``protocol`` runs on the parameter server (ASP, SSP, k-of-N)."""
    return isinstance(protocol, SERVER_PROTOCOLS)


def update_samples(protocol: SyncProtocol, ranks: int, batch_per_rank: int) -> int:
    """Samples one update (one round, for BSP and local SGD) of ``protocol`` applies."""
    if isinstance(protocol, (Bsp, LocalSgd)):
        return ranks * batch_per_rank
    return protocol.effective_batch(ranks, batch_per_rank)


def lr_scale(protocol: SyncProtocol, ranks: int, batch_per_rank: int) -> float:
    """The learning-rate factor of ``protocol``: effective batch / (N·b) — 1 for BSP and local
    SGD, 1/N for ASP and SSP, k/N for k-of-N. Derived from the protocol, never compounded."""
    return protocol.effective_batch(ranks, batch_per_rank) / (ranks * batch_per_rank)


def _constant(progress: float) -> float:
    return 1.0


def _cosine(progress: float) -> float:
    return 0.5 * (1.0 + math.cos(math.pi * progress))


#: Learning-rate schedules: the fraction of the run's samples applied so far -> a factor of the
#: base rate (the protocol's scale multiplies it).
LR_SCHEDULES: Registry[Callable[[float], float]] = Registry("learning-rate schedule",
                                                             "schedules")
LR_SCHEDULES.register("constant", _constant)
LR_SCHEDULES.register("cosine", _cosine)


def _check_protocol(protocol: object, ranks: int) -> SyncProtocol:
    if isinstance(protocol, str):
        protocol = parse_protocol(protocol)
    if not isinstance(protocol, (Bsp, Asp, Ssp, KOfN, LocalSgd)):
        raise TrainschedError(f"a phase's protocol must be a sync protocol (Bsp(), Asp(), "
                              f"Ssp(s), KOfN(k), LocalSgd(h)) or its text, got {protocol!r}")
    if isinstance(protocol, KOfN):
        protocol.server_rule(ranks)  # k > N fails here, naming N
    return protocol


def check_phases(phases: Sequence[tuple[Any, int]], ranks: int,
                 batch_per_rank: int) -> tuple[tuple[SyncProtocol, int], ...]:
    """``phases`` as ``(protocol, samples)`` pairs, each a whole number of update units."""
    if not phases:
        raise TrainschedError("a sync run needs at least one phase (protocol, samples)")
    checked = []
    for i, item in enumerate(phases):
        if not (isinstance(item, (tuple, list)) and len(item) == 2):
            raise TrainschedError(f"phase {i} must be a pair (protocol, samples), got {item!r}")
        protocol, samples = _check_protocol(item[0], ranks), item[1]
        if not is_int(samples) or samples < 0:
            raise TrainschedError(f"phase {i} ({format_protocol(protocol)}): samples must be a "
                                  f"whole number >= 0, got {samples!r}")
        unit = update_samples(protocol, ranks, batch_per_rank)
        if samples % unit:
            low, high = samples // unit * unit, (samples // unit + 1) * unit
            raise TrainschedError(
                f"phase {i} ({format_protocol(protocol)}): {samples} samples is not a whole "
                f"number of its updates of {unit} samples ({ranks} ranks x batch "
                f"{batch_per_rank}); use {low} or {high}")
        checked.append((protocol, samples))
    if sum(s for _, s in checked) == 0:
        raise TrainschedError("the phases add up to 0 samples; give at least one phase "
                              "some samples")
    return tuple(checked)


def split_samples(fractions: Sequence[tuple[SyncProtocol, float]], total_samples: int, *,
                  ranks: int, batch_per_rank: int) -> list[tuple[SyncProtocol, int]]:
    """Phases ``(protocol, fraction)`` as ``(protocol, samples)`` for ``run_sync``: every phase
    boundary rounded to the nearest multiple of the largest common update unit, so each phase
    is a whole number of its updates and the samples add up to ``total_samples`` exactly."""
    units = [update_samples(_check_protocol(p, ranks), ranks, batch_per_rank)
             for p, _ in fractions]
    unit = math.lcm(*units) if units else 1
    if not is_int(total_samples) or total_samples <= 0 or total_samples % unit:
        raise TrainschedError(f"the total of {total_samples!r} samples must be a positive "
                              f"multiple of {unit}, the phases' common update size")
    out, done, cumulative = [], 0, 0.0
    for i, (protocol, fraction) in enumerate(fractions):
        cumulative += fraction
        end = (total_samples if i == len(fractions) - 1
               else min(total_samples, round(cumulative * total_samples / unit) * unit))
        out.append((_check_protocol(protocol, ranks), max(0, end - done)))
        done = max(done, end)
    return out


@dataclass(frozen=True, kw_only=True)
class Segment:
    """A stretch of one phase that ends at a synchronisation point: samples ``start ..
    start + samples`` of the run, under phase ``phase``'s protocol."""

    phase: int
    protocol: SyncProtocol
    start: int
    samples: int
    last_of_phase: bool
    checkpoint: bool


def plan_segments(phases: Sequence[tuple[SyncProtocol, int]], *, ranks: int,
                  batch_per_rank: int, checkpoint_every: int | None) -> tuple[Segment, ...]:
    """The phases cut at every multiple of ``checkpoint_every`` samples (each cut must fall on
    an update boundary of the phase it cuts)."""
    total = sum(s for _, s in phases)
    cuts: list[int] = []
    if checkpoint_every is not None:
        if not is_int(checkpoint_every) or checkpoint_every <= 0:
            raise TrainschedError(f"checkpoint_every_samples must be a whole number > 0, got "
                                  f"{checkpoint_every!r}")
        cuts = list(range(checkpoint_every, total, checkpoint_every))
    segments, start = [], 0
    for index, (protocol, samples) in enumerate(phases):
        unit = update_samples(protocol, ranks, batch_per_rank)
        end = start + samples
        inner = [c for c in cuts if start < c < end]
        for c in inner:
            if (c - start) % unit:
                raise TrainschedError(
                    f"a checkpoint every {checkpoint_every} samples cuts phase {index} "
                    f"({format_protocol(protocol)}) at sample {c}, inside one of its updates "
                    f"of {unit} samples; use a multiple of {unit}")
        points = [start, *inner, end]
        for a, b in itertools.pairwise(points):
            checkpoint = b > a and (b in cuts or (checkpoint_every is not None and b == total))
            segments.append(Segment(phase=index, protocol=protocol, start=a, samples=b - a,
                                    last_of_phase=b == end, checkpoint=checkpoint))
        start = end
    return tuple(segments)
