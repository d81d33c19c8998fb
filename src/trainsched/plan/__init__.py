"""Plans: everything a run needs to know, as frozen data that the simulator and runtime share.

The parts: :class:`Placement` (which device runs each op), :class:`Action` and
:class:`Schedule` (per-rank ordered pipeline actions). The plans
(:mod:`trainsched.plan.plans`): :class:`SinglePlan`, :class:`PlacedPlan`,
:class:`DataParallelPlan` and :class:`PipelinePlan`, one JSON format ``trainsched.plan/1``
(``docs/plans.md``).
"""

from trainsched.plan.files import (
    PLAN_FORMAT,
    load_plan,
    plan_from_json,
    plan_to_json,
    read_plan_file,
    save_plan,
)
from trainsched.plan.placement import PLACEMENT_FORMAT, Placement
from trainsched.plan.plans import (
    COLLECTIVE_ORDERS,
    PLAN_KINDS,
    SERVER_PLACEMENTS,
    SYNC_PROTOCOLS,
    DataParallelPlan,
    ModelRef,
    PipelinePlan,
    PlacedPlan,
    Plan,
    Prediction,
    SinglePlan,
    default_steps,
)
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
    "COLLECTIVE_ORDERS",
    "COMM_KINDS",
    "COMPUTE_KINDS",
    "PLACEMENT_FORMAT",
    "PLAN_FORMAT",
    "PLAN_KINDS",
    "SERVER_PLACEMENTS",
    "STAGE_KINDS",
    "SYNC_PROTOCOLS",
    "Action",
    "DataParallelPlan",
    "ModelRef",
    "PipelinePlan",
    "PlacedPlan",
    "Placement",
    "Plan",
    "Prediction",
    "Schedule",
    "SinglePlan",
    "default_steps",
    "load_plan",
    "plan_from_json",
    "plan_to_json",
    "read_plan_file",
    "save_plan",
]
