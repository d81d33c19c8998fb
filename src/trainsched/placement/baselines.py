"""Baselines every placer is measured against: one device, and contiguous splits.

``single`` puts every op on the device with the most memory. ``contiguous`` cuts the groups, in
topological order of their first op, into at most m consecutive segments, one per device,
minimising the heaviest segment's weight (parameter bytes, compute, or op count) while each
segment fits its device statically: what DeepSpeed's ``PipelineModule`` (``partition_method``
``parameters``, ``uniform``) and PiPPy's ``split_into_equal_size`` do. The min-max segment
weight is found by bisection over a greedy feasibility test (greedy packing gives the fewest
segments under both limits). Both are scheduled as list schedules of their placement.
"""

from __future__ import annotations

from collections.abc import Sequence

from trainsched.placement.model import Machine, PlacerSchedule, Stall, run_schedule
from trainsched.placement.reduce import Problem

_BISECTION_STEPS = 60


def single_devices(problem: Problem, machine: Machine) -> list[int]:
    """Every op on the device with the largest capacity (the first of them)."""
    cap = machine.capacity
    best = max(range(len(cap)), key=lambda d: (cap[d], -d))
    return [best] * problem.n


def single(problem: Problem, machine: Machine) -> PlacerSchedule:
    return run_schedule(problem, machine, fixed=single_devices(problem, machine))


def group_static_bytes(problem: Problem) -> list[int]:
    static = problem.static_bytes()
    totals = [0] * len(problem.group_ops)
    for i, g in enumerate(problem.group):
        totals[g] += static[i]
    return totals


def _segments(weights: Sequence[float], memory: Sequence[int], cap: Sequence[int],
              bound: float) -> list[int] | None:
    """Greedy: a device per group with every segment within ``bound`` and its device's cap;
    None when more than len(cap) segments are needed."""
    out = []
    d, w, mem, empty = 0, 0.0, 0, True
    for wg, mg in zip(weights, memory, strict=True):
        if wg > bound:
            return None
        while mem + mg > cap[d] or (not empty and w + wg > bound):
            d += 1
            w, mem, empty = 0.0, 0, True
            if d == len(cap):
                return None
        w += wg
        mem += mg
        empty = False
        out.append(d)
    return out


def contiguous_devices(problem: Problem, machine: Machine,
                       group_weights: Sequence[float]) -> list[int]:
    """A device per op from the min-max contiguous split of the groups by ``group_weights``."""
    memory = group_static_bytes(problem)
    cap = machine.capacity
    hi = float(sum(group_weights))
    if _segments(group_weights, memory, cap, hi) is None:
        first = next(i for i, g in enumerate(problem.group) if memory[g] > max(cap)) \
            if max(memory, default=0) > max(cap) else problem.n - 1
        raise Stall(first, memory[problem.group[first]])
    lo = max(group_weights, default=0.0)
    if _segments(group_weights, memory, cap, lo) is not None:
        hi = lo
    for _ in range(_BISECTION_STEPS):
        if hi - lo <= 1e-12 * hi:
            break
        mid = (lo + hi) / 2
        if _segments(group_weights, memory, cap, mid) is None:
            lo = mid
        else:
            hi = mid
    group_dev = _segments(group_weights, memory, cap, hi)
    assert group_dev is not None
    return [group_dev[g] for g in problem.group]


def contiguous(problem: Problem, machine: Machine,
               group_weights: Sequence[float]) -> PlacerSchedule:
    return run_schedule(problem, machine,
                        fixed=contiguous_devices(problem, machine, group_weights))
