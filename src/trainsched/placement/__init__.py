"""Memory-constrained device placement (Baechi's m-TOPO, m-ETF, m-SCT) and its baselines.

``place(graph, cluster, algorithm)`` reduces the graph (co-location, forward-only, co-placement,
fusion), runs a placer from :data:`PLACERS` (or, with ``auto``, all of them, keeping the one the
simulator predicts fastest), and returns a :class:`PlacementResult`: a
:class:`~trainsched.plan.Placement` of every original op, the placer's own schedule, and the
predictions. ``docs/placement.md`` describes the algorithms, the cost model and the options.
"""

from trainsched.placement.api import ALGORITHMS, PLACERS, Candidate, PlacementResult, place
from trainsched.placement.model import Machine, PlacerSchedule, Stall, Transfer, run_schedule
from trainsched.placement.reduce import Problem, canonical_order, reduce_graph

__all__ = [
    "ALGORITHMS",
    "PLACERS",
    "Candidate",
    "Machine",
    "PlacementResult",
    "PlacerSchedule",
    "Problem",
    "Stall",
    "Transfer",
    "canonical_order",
    "place",
    "reduce_graph",
    "run_schedule",
]
