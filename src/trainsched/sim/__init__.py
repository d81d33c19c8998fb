"""The simulator: predicts step time, timeline and memory of a plan without running it.

Executors lower their input to one task graph on the discrete-event engine
(:mod:`trainsched.sim.engine`); :class:`SimResult` holds what they predict and
:func:`write_trace` writes it as a Chrome/Perfetto trace. Plain Python: no torch here.
"""

from trainsched.sim.engine import Resource, Schedule, TaskGraph, longest_path_s, run_tasks
from trainsched.sim.executors import priority_order, simulate_placed, simulate_single
from trainsched.sim.result import (
    Allocation,
    PathStep,
    ResourceRecord,
    SimResult,
    TaskRecord,
    build_result,
)
from trainsched.sim.trace import chrome_trace, trace_json, write_trace

__all__ = [
    "Allocation",
    "PathStep",
    "Resource",
    "ResourceRecord",
    "Schedule",
    "SimResult",
    "TaskGraph",
    "TaskRecord",
    "build_result",
    "chrome_trace",
    "longest_path_s",
    "priority_order",
    "run_tasks",
    "simulate_placed",
    "simulate_single",
    "trace_json",
    "write_trace",
]
