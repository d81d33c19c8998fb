"""What a sync run measured (torch-free values, JSON round trip).

One :class:`PhaseRecord` per phase (samples and updates applied, gradients computed, dropped and
drained, the learning rate used, staleness per worker, the widest SSP clock lead, worker 0's
time), one :class:`SwitchRecord` per switch of protocol carried out (when, and what it cost),
the held-out curve as :class:`EvalPoint` rows, and the run's totals in :class:`SyncRunResult`.
Under an online straggler policy the result also lists every detector event
(:class:`DetectorRecord`) and every relaxed episode (:class:`EpisodeRecord`), and the switches
the policy made carry the reason ``"straggler"``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

__all__ = ["DetectorRecord", "EpisodeRecord", "EvalPoint", "LinkRecord", "PhaseRecord",
           "SwitchRecord", "SyncRunResult"]


@dataclass(frozen=True, kw_only=True)
class PhaseRecord:
    """One phase of a run.

    ``samples``: samples applied to the shared model under this protocol (the phase's quota);
    ``updates``: updates of the shared model (BSP and local SGD: rounds, one step on every
    rank); ``gradients``: gradients the workers computed; ``dropped``: k-of-N gradients computed
    on an old version and left out; ``drained``: gradients still in flight when the quota was
    reached, received and discarded at the phase's end. ``lr``: the phase's learning rate
    before the run's schedule factor (base x effective batch / (N·b)). ``staleness[r][s]``:
    how many of worker ``r``'s applied gradients were ``s`` versions old (server protocols;
    BSP: all 0; local SGD: empty).
    ``max_clock_lead``: the most clocks a worker was let ahead of the slowest when its pull was
    answered (ASP and SSP; ``None`` otherwise). ``wall_s`` and ``batches``: worker 0's time in
    the phase (switches excluded) and its batches, so ``wall_s / batches`` is its step time;
    ``local_s``: the part of ``wall_s`` worker 0 spent computing its batches (forward and
    backward until the gradient was ready, injected delays included), so ``local_s / batches``
    is its local time per batch.
    """

    index: int
    protocol: str
    samples: int
    updates: int
    gradients: int
    dropped: int
    drained: int
    lr: float
    staleness: tuple[tuple[int, ...], ...]
    max_clock_lead: int | None
    wall_s: float
    batches: int
    local_s: float = 0.0

    @property
    def step_s(self) -> float | None:
        """Worker 0's mean time per batch in this phase."""
        return self.wall_s / self.batches if self.batches else None

    def max_staleness(self, rank: int) -> int:
        """The oldest gradient of worker ``rank`` that was applied (0 when none was late)."""
        counts = self.staleness[rank] if rank < len(self.staleness) else ()
        return max((s for s, n in enumerate(counts) if n), default=0)


@dataclass(frozen=True, kw_only=True)
class SwitchRecord:
    """A switch from one protocol to the next at ``samples`` applied, worker 0's batch ``step``,
    ``at_s`` seconds into the run; ``cost_s``: worker 0's time from its last batch of the old
    phase to the new phase ready (drain, barrier, state transfer, learning rate). ``reason``:
    ``"plan"`` (a phase boundary of the sync policy) or ``"straggler"`` (the online policy:
    out of BSP because of the slow ``ranks``, or back once they recovered)."""

    from_protocol: str
    to_protocol: str
    samples: int
    step: int
    at_s: float
    cost_s: float
    reason: str = "plan"
    ranks: tuple[int, ...] = ()


@dataclass(frozen=True, kw_only=True)
class DetectorRecord:
    """The straggler detector marked worker ``rank`` slow (``kind="slow"``) or recovered
    (``"recovered"``) at its observation ``observation`` (0-based) with EWMA ratio ``ratio``,
    when ``samples`` were applied, at worker 0's batch ``step`` (the last one before the
    observation) and ``at_s`` seconds into the run."""

    kind: str
    rank: int
    observation: int
    ratio: float
    samples: int
    step: int
    at_s: float


@dataclass(frozen=True, kw_only=True)
class EpisodeRecord:
    """A relaxed episode of the online policy: ``protocol`` (``asp``) from ``start_samples``
    applied, ``samples`` and ``updates`` applied while it lasted (never counted toward a BSP
    phase's quota), ``gradients`` the workers computed, ``drained`` the ones received after it
    ended, ``staleness[r][s]`` as in :class:`PhaseRecord`, from ``start_s`` seconds into the run
    for ``wall_s`` seconds (worker 0's training time, switches excluded), because of the slow
    ``ranks``; ``end``: ``"recovered"`` (the detector cleared them) or ``"run end"`` (the run's
    samples were spent first)."""

    protocol: str
    start_samples: int
    samples: int
    updates: int
    gradients: int
    drained: int
    staleness: tuple[tuple[int, ...], ...]
    start_s: float
    wall_s: float
    ranks: tuple[int, ...]
    end: str


@dataclass(frozen=True, kw_only=True)
class LinkRecord:
    """The messages worker ``rank`` sent while training in phase ``phase`` (a relaxed or
    excluding episode counts in the phase it interrupted): ``messages`` (its all-reduce rounds,
    local-SGD averages, pushes to the servers, which also ask for the next weights, and the
    first pull of each server segment), ``delayed`` how many an injected delayed link held,
    ``delay_s`` the time they were held and ``comm_s`` the time the sends took, hold included
    (both measured; on the scheduled data-parallel runtime, a BSP step's wait for its last
    updates after backward, :mod:`trainsched.runtime.sync.worker`). ``in_flight_bytes``: the
    most gradient bytes of a BSP step it had in flight at once (the flat all-reduce: the whole
    gradient; the scheduled runtime: what the comm policy's credit let through; 0 without BSP
    steps). Counted from the process's start: a resumed run counts from the resume."""

    rank: int
    phase: int
    messages: int
    delayed: int
    delay_s: float
    comm_s: float
    in_flight_bytes: float = 0.0


@dataclass(frozen=True, kw_only=True)
class EvalPoint:
    """Held-out loss and accuracy of worker 0's model after ``samples`` applied samples."""

    samples: int
    loss: float
    accuracy: float


@dataclass(frozen=True, kw_only=True)
class SyncRunResult:
    """A whole run: its phases, switches, checkpoints (samples at which one was written),
    held-out curve, final held-out loss and accuracy (replicas agreeing), total samples
    applied, wall time, where it resumed from (samples; ``None``: a fresh start) and, when asked,
    the final parameters flattened in ``model.parameters()`` order. With an online straggler
    policy (``straggler_policy``, its text): the detector's ``observations``, its events,
    the relaxed ``episodes`` and the observations where the decider ``declined`` to act.
    ``links``: every worker's messages per phase (:class:`LinkRecord`, by phase then rank).
    ``comm``: the registered name of the comm policy the BSP phases reduced with on the
    scheduled data-parallel runtime (``None``: one flat all-reduce per step)."""

    task: str
    ranks: int
    batch_per_rank: int
    phases: tuple[PhaseRecord, ...]
    switches: tuple[SwitchRecord, ...]
    checkpoints: tuple[int, ...]
    curve: tuple[EvalPoint, ...]
    final_loss: float
    final_accuracy: float
    total_samples: int
    wall_s: float
    resumed_from: int | None
    params: tuple[float, ...] | None = None
    straggler_policy: str | None = None
    observations: int = 0
    detector_events: tuple[DetectorRecord, ...] = ()
    episodes: tuple[EpisodeRecord, ...] = ()
    declined: int = 0
    links: tuple[LinkRecord, ...] = ()
    comm: str | None = None

    def link(self, rank: int, phase: int) -> LinkRecord | None:
        """Worker ``rank``'s messages in phase ``phase`` (``None`` if it sent none counted)."""
        return next((r for r in self.links if (r.rank, r.phase) == (rank, phase)), None)

    @property
    def relaxed_samples(self) -> int:
        """Samples applied in relaxed episodes (outside every phase's quota)."""
        return sum(e.samples for e in self.episodes)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SyncRunResult:
        d = dict(data)
        d["phases"] = tuple(PhaseRecord(**{**p, "staleness": tuple(map(tuple, p["staleness"]))})
                            for p in d["phases"])
        d["switches"] = tuple(SwitchRecord(**{**s, "ranks": tuple(s.get("ranks", ()))})
                              for s in d["switches"])
        d["detector_events"] = tuple(DetectorRecord(**e) for e in d.get("detector_events", ()))
        d["episodes"] = tuple(
            EpisodeRecord(**{**e, "staleness": tuple(map(tuple, e["staleness"])),
                             "ranks": tuple(e["ranks"])}) for e in d.get("episodes", ()))
        d["curve"] = tuple(EvalPoint(**e) for e in d["curve"])
        d["links"] = tuple(LinkRecord(**{**e, "messages": int(e["messages"]),
                                         "delayed": int(e["delayed"])})
                           for e in d.get("links", ()))
        d["checkpoints"] = tuple(d["checkpoints"])
        if d.get("params") is not None:
            d["params"] = tuple(d["params"])
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})
