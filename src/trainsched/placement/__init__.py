"""Memory-constrained device placement (Baechi's m-TOPO, m-ETF, m-SCT) and its baselines.

``place(graph, cluster, algorithm)`` reduces the graph (co-location, forward-only, co-placement,
fusion), runs a placer from :data:`PLACERS` (or, with ``auto``, all of them, keeping the one the
simulator predicts fastest), and returns a :class:`PlacementResult`: a
:class:`~trainsched.plan.Placement` of every original op with the order they run in (which the
simulator replays and ``PlacedModule`` runs), the placer's own schedule, and the predictions.
Ties break on structure (:func:`structural_order`), never on names alone, so renaming the ops
renames the placement. ``docs/placement.md`` describes the algorithms, the cost model and the
options.
"""

from trainsched.placement.api import (
    ALGORITHMS,
    AUTO_VARIANT_OPS,
    PLACERS,
    SCT_THRESHOLD,
    Candidate,
    PlacementResult,
    order_of,
    place,
)
from trainsched.placement.model import Machine, PlacerSchedule, Stall, Transfer, run_schedule
from trainsched.placement.reduce import Problem, canonical_order, reduce_graph, structural_order

__all__ = [
    "ALGORITHMS",
    "AUTO_VARIANT_OPS",
    "PLACERS",
    "SCT_THRESHOLD",
    "Candidate",
    "Machine",
    "PlacementResult",
    "PlacerSchedule",
    "Problem",
    "Stall",
    "Transfer",
    "canonical_order",
    "order_of",
    "place",
    "reduce_graph",
    "run_schedule",
    "structural_order",
]
