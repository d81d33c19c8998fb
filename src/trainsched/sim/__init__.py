"""The simulator: predicts step time, timeline and memory of a plan without running it.

Executors lower their input to one task graph on the discrete-event engine
(:mod:`trainsched.sim.engine`); :class:`SimResult` holds what they predict and
:func:`write_trace` writes it as a Chrome/Perfetto trace. Plain Python: no torch here.
"""

from trainsched.sim.data_parallel import (
    ALGORITHMS,
    buffer_sync_s,
    collective_link,
    collective_s,
    collective_startup_s,
    crossing_bound_s,
    rank_classes,
    simulate_data_parallel,
)
from trainsched.sim.engine import (
    Gate,
    Release,
    Replay,
    Resource,
    StreamPair,
    TaskGraph,
    longest_path_s,
    run_tasks,
)
from trainsched.sim.executors import priority_order, simulate_placed, simulate_single
from trainsched.sim.ooo import FORWARD_CANDIDATES, KSweep, SlotChoice, choose_slots, sweep_k
from trainsched.sim.pipeline import PipelineResult, bubble_fraction, simulate_pipeline
from trainsched.sim.result import (
    Allocation,
    PathStep,
    ResourceRecord,
    SimResult,
    TaskRecord,
    build_result,
)
from trainsched.sim.simulate import (
    check_costs_fit,
    predict_placement,
    simulate,
    training_graph,
)
from trainsched.sim.streams import simulate_slots
from trainsched.sim.trace import chrome_trace, trace_json, write_trace

__all__ = [
    "ALGORITHMS",
    "FORWARD_CANDIDATES",
    "Allocation",
    "Gate",
    "KSweep",
    "PathStep",
    "PipelineResult",
    "Release",
    "Replay",
    "Resource",
    "ResourceRecord",
    "SimResult",
    "SlotChoice",
    "StreamPair",
    "TaskGraph",
    "TaskRecord",
    "bubble_fraction",
    "buffer_sync_s",
    "build_result",
    "check_costs_fit",
    "choose_slots",
    "chrome_trace",
    "collective_link",
    "collective_s",
    "collective_startup_s",
    "crossing_bound_s",
    "longest_path_s",
    "predict_placement",
    "priority_order",
    "rank_classes",
    "run_tasks",
    "simulate",
    "simulate_data_parallel",
    "simulate_pipeline",
    "simulate_placed",
    "simulate_single",
    "simulate_slots",
    "sweep_k",
    "trace_json",
    "training_graph",
    "write_trace",
]
