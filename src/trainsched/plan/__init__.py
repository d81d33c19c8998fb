"""Plans: everything a run needs to know, as frozen data that the simulator and runtime share.

The parts: :class:`Placement` (which device runs each op), :class:`Action` and
:class:`Schedule` (per-rank ordered pipeline actions). The plans
(:mod:`trainsched.plan.plans`): :class:`SinglePlan`, :class:`PlacedPlan`,
:class:`DataParallelPlan` and :class:`PipelinePlan`, one JSON format ``trainsched.plan/1``
(``docs/plans.md``).
"""

from trainsched.plan.placement import PLACEMENT_FORMAT, Placement
from trainsched.plan.schedule import (
    ACTION_KINDS,
    COMM_KINDS,
    COMPUTE_KINDS,
    STAGE_KINDS,
    Action,
    Schedule,
)

__all__ = [
    "ACTION_KINDS",
    "COMM_KINDS",
    "COMPUTE_KINDS",
    "PLACEMENT_FORMAT",
    "STAGE_KINDS",
    "Action",
    "Placement",
    "Schedule",
]
