"""The sync runtime: BSP, a parameter server for ASP / SSP / k-of-N, and local SGD on
``torch.distributed`` (gloo), switched in process at step boundaries.

:func:`run_sync` trains a task through phases ``[(protocol, samples), ...]`` on ``N`` worker
ranks plus, when a phase needs it, one server rank, and returns a :class:`SyncRunResult`
(per-phase counters and staleness, switch events with their cost, the held-out curve). Samples
are the clock: a phase applies exactly its samples to the shared model, the learning rate is
the base rate times the protocol's effective batch over ``N·b``, momentum is kept across
switches, and checkpoints resume exactly. :class:`Straggler` slows a rank for tests and
benchmarks; :func:`split_samples` turns a policy's fractions into phase sample counts.

Importing this package stays torch-free; torch is imported in the worker processes
(:mod:`.trainer`, :mod:`.server`, :mod:`.worker`, :mod:`.state`, :mod:`.wire`).
"""

from trainsched.runtime.sync.config import Straggler, lr_scale, split_samples, update_samples
from trainsched.runtime.sync.results import EvalPoint, PhaseRecord, SwitchEvent, SyncRunResult
from trainsched.runtime.sync.run import run_sync

__all__ = [
    "EvalPoint",
    "PhaseRecord",
    "Straggler",
    "SwitchEvent",
    "SyncRunResult",
    "lr_scale",
    "run_sync",
    "split_samples",
    "update_samples",
]
