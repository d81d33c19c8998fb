"""When nothing fits: the checks before placing and the error that names the memory needed.

:func:`check_totals` refuses a problem whose resident memory alone cannot fit (in total, or one
group on one device); :func:`infeasible_error` is the error for a graph no placer could place,
naming the op that did not fit and about the least capacity per device at which a placer
succeeds (:func:`memory_needed`, a bisection over the capacity).
"""

from __future__ import annotations

import dataclasses
import math

from trainsched.errors import TrainschedError
from trainsched.placement.baselines import contiguous_devices, group_static_bytes
from trainsched.placement.model import Machine, Stall, run_schedule
from trainsched.placement.reduce import Problem
from trainsched.units import format_size

__all__ = ["check_totals", "infeasible_error", "memory_needed"]


def check_totals(problem: Problem, machine: Machine) -> None:
    """Resident memory alone must fit: in total, and each group on one device."""
    cap = machine.capacity
    group_res = problem.group_resident()
    total = sum(group_res)
    m = machine.num_devices
    if total > sum(cap):
        running, op = 0, problem.n - 1
        for i, g in enumerate(problem.group):
            if problem.group_ops[g][0] == i:
                running += group_res[g]
                if running > sum(cap):
                    op = i
                    break
        raise TrainschedError(
            f"op {problem.names[op]!r} does not fit: what the ops hold for the whole step "
            f"(parameters, gradients, optimizer state, activations kept for backward) takes "
            f"{format_size(total)}; that needs at least "
            f"{format_size(math.ceil(total / m))} per device; the cluster has "
            f"{format_size(min(cap))} on each of {m} devices")
    for g, res in enumerate(group_res):
        if res > max(cap):
            op = problem.group_ops[g][0]
            raise TrainschedError(
                f"op {problem.names[op]!r} does not fit: its co-location group holds "
                f"{format_size(res)} for the whole step, which needs at least {format_size(res)} "
                f"per device; the cluster has {format_size(max(cap))}")


def infeasible_error(problem: Problem, machine: Machine,
                     stalls: dict[str, Stall]) -> TrainschedError:
    """The error for a graph no placer could place (``stalls`` of the attempts on ``problem``,
    and maybe others, whose names have a ``/``)."""
    name = "m-etf" if "m-etf" in stalls else next(k for k in stalls if "/" not in k)
    stall = stalls[name]
    need = memory_needed(problem, machine)
    return TrainschedError(
        f"op {problem.names[stall.op]!r} does not fit ({name} found no device with "
        f"{format_size(stall.needed_bytes)} free); placing this graph needs at least "
        f"{format_size(need)} per device; the cluster has {format_size(min(machine.capacity))}"
        f" on each of {machine.num_devices} devices (use more or larger devices, or a smaller "
        f"batch)")


_SEARCH_OPS = 3000  # above this, only contiguous splits are tried when looking for the need


def memory_needed(problem: Problem, machine: Machine) -> int:
    """About the least capacity per device at which a placer succeeds: bisection on the
    capacity, a capacity counting as enough when m-ETF (on graphs up to ``_SEARCH_OPS`` ops)
    or the count-balanced contiguous split places the graph with it."""
    m = machine.num_devices
    weights = [1.0] * len(problem.group_ops)

    def fits(cap: int) -> bool:
        trial = dataclasses.replace(machine, capacity=(cap,) * m)
        tries = [lambda: run_schedule(problem, trial, fixed=contiguous_devices(
            problem, trial, weights))]
        if problem.n <= _SEARCH_OPS:
            tries.insert(0, lambda: run_schedule(problem, trial))
        for attempt in tries:
            try:
                attempt()
                return True
            except Stall:
                pass
        return False

    lo = max(max(problem.group_resident(), default=0), 1)
    hi = max(sum(group_static_bytes(problem)), lo)
    while not fits(hi):
        lo, hi = hi, 2 * hi
    while hi - lo > max(1, hi // 1000):
        mid = (lo + hi) // 2
        if fits(mid):
            hi = mid
        else:
            lo = mid + 1
    return hi
