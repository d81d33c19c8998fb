"""What a sync run is asked to do, checked in the parent process (torch-free).

A run trains ``ranks`` workers with ``batch_per_rank`` samples each through a sequence of
**phases** ``[(protocol, samples), ...]``: each phase applies exactly ``samples`` samples to the
shared model under its protocol (samples are the clock, spec §2.3). One *update unit* of a
protocol is the samples one update (or one round) applies: BSP and local SGD ``N·b`` (one step
on every rank), k-of-N ``k·b``, ASP and SSP ``b``; a phase's samples are a whole number of units.

:func:`plan_segments` cuts the phases at checkpoint boundaries into **segments**; the end of every
segment is a synchronisation point (the server drains, replicas agree), which is where the run
switches protocol or writes a checkpoint. :func:`policy_phases` turns a
:class:`~trainsched.sync.policy.SyncPolicy`'s fractions into such sample counts. The learning
rate of an update is ``base x schedule(samples applied / total) x lr_scale(protocol)``
(:data:`LR_SCHEDULES`; :func:`~trainsched.sync.policy.lr_scale`), keyed on samples so it is the
same after a restart.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from trainsched.errors import TrainschedError
from trainsched.registry import Registry
from trainsched.sync.policy import SyncPolicy
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
    "OPTIMIZERS",
    "Segment",
    "check_phases",
    "needs_server",
    "phase_quantum",
    "plan_segments",
    "policy_phases",
    "shard_bounds",
    "update_samples",
]

SERVER_PROTOCOLS = (Asp, Ssp, KOfN)

#: The optimizers a sync run trains with.
OPTIMIZERS = ("sgd", "adam")


def needs_server(protocol: SyncProtocol) -> bool:
    """Whether ``protocol`` runs on the parameter server (ASP, SSP, k-of-N)."""
    return isinstance(protocol, SERVER_PROTOCOLS)


def shard_bounds(numel: int, servers: int) -> tuple[tuple[int, int], ...]:
    """The flat parameter vector of ``numel`` values cut into ``servers`` contiguous shards of
    (nearly) equal size: shard ``j`` is ``[j·numel // S, (j + 1)·numel // S)``."""
    if servers > numel:
        raise TrainschedError(f"{servers} parameter servers for a model of {numel} parameters "
                              f"would leave a server without a shard; use at most {numel}")
    return tuple((j * numel // servers, (j + 1) * numel // servers) for j in range(servers))


def update_samples(protocol: SyncProtocol, ranks: int, batch_per_rank: int) -> int:
    """Samples one update (one round, for BSP and local SGD) of ``protocol`` applies."""
    if isinstance(protocol, (Bsp, LocalSgd)):
        return ranks * batch_per_rank
    return protocol.effective_batch(ranks, batch_per_rank)


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


def phase_quantum(protocols: Sequence[SyncProtocol], ranks: int, batch_per_rank: int) -> int:
    """The least common multiple of the protocols' update sizes: phase boundaries on its
    multiples leave every phase a whole number of its updates."""
    return math.lcm(*(update_samples(_check_protocol(p, ranks), ranks, batch_per_rank)
                      for p in protocols))


def policy_phases(policy: SyncPolicy, total_samples: int, *, ranks: int,
                  batch_per_rank: int) -> list[tuple[SyncProtocol, int]]:
    """A sync policy's phases ``(protocol, fraction)`` as ``(protocol, samples)`` for
    ``run_sync``: :meth:`SyncPolicy.phase_samples` with boundaries on multiples of the
    phases' common update size, so each phase is a whole number of its updates."""
    quantum = phase_quantum(policy.protocols, ranks, batch_per_rank)
    if not is_int(total_samples) or total_samples <= 0 or total_samples % quantum:
        raise TrainschedError(f"the total of {total_samples!r} samples must be a positive "
                              f"multiple of {quantum}, the phases' common update size "
                              f"({ranks} ranks x batch {batch_per_rank})")
    quotas = policy.phase_samples(total_samples, quantum=quantum)
    return list(zip(policy.protocols, quotas, strict=True))


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
