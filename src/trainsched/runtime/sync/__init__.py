"""The sync runtime: BSP, a parameter server for ASP / SSP / k-of-N, and local SGD on
``torch.distributed`` (gloo), switched in process at step boundaries.

:func:`run_sync` trains a task through phases ``[(protocol, samples), ...]`` on ``N`` worker
ranks plus, when a phase needs it, ``S`` server ranks (one per shard of the parameters), and
returns a :class:`SyncRunResult` (per-phase counters and staleness, switch records with their
cost, the held-out curve). Samples are the clock: a phase applies exactly its samples to the
shared model, the learning rate is the base rate times the protocol's effective batch over
``N·b``, momentum is kept across switches, and checkpoints resume exactly.
:class:`trainsched.sync.Straggler` values slow ranks for tests and benchmarks;
:func:`policy_phases` turns a :class:`~trainsched.sync.SyncPolicy` into phase sample counts. A
policy's straggler part (``straggler_policy``) watches the BSP phases and relaxes to ASP while
a worker is slow (:mod:`.online`), or trains BSP among the fast workers until it recovers
(:mod:`.exclude`). Under ``torchrun`` this process is one rank of the run (workers first, then
the servers).

Importing this package stays torch-free; torch is imported in the worker processes
(:mod:`.trainer`, :mod:`.server`, :mod:`.worker`, :mod:`.state`, :mod:`.wire`).
"""

from trainsched.runtime.sync.config import (
    LR_SCHEDULES,
    needs_server,
    phase_quantum,
    policy_phases,
    update_samples,
)
from trainsched.runtime.sync.results import (
    DetectorRecord,
    EpisodeRecord,
    EvalPoint,
    LinkRecord,
    PhaseRecord,
    SwitchRecord,
    SyncRunResult,
)
from trainsched.runtime.sync.run import run_sync

__all__ = [
    "LR_SCHEDULES",
    "DetectorRecord",
    "EpisodeRecord",
    "EvalPoint",
    "LinkRecord",
    "PhaseRecord",
    "SwitchRecord",
    "SyncRunResult",
    "needs_server",
    "phase_quantum",
    "policy_phases",
    "run_sync",
    "update_samples",
]
