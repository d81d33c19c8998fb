"""m-TOPO: fill devices in topological order, each up to a proportional share of the memory.

Device 0 takes ops in topological order until the next group would exceed its cap, then device
1, and so on; a group lands whole at its first op. Memory is counted statically (everything an
op ever holds, for good), as Baechi does. Baechi's cap is Σmem/m + max op mem; ours scales the
share by the device's capacity and never exceeds it: min(cap_d, Σmem·cap_d/Σcap + max group mem).
Contiguous chunks, no branch parallelism, O(n); the schedule is then the list schedule of that
placement.
"""

from __future__ import annotations

from trainsched.placement.model import Machine, PlacerSchedule, Stall, run_schedule
from trainsched.placement.reduce import Problem


def topo_devices(problem: Problem, machine: Machine) -> list[int]:
    """A device per op (raises :class:`Stall` naming the first group that fits nowhere)."""
    static = problem.static_bytes()
    group_static = [0] * len(problem.group_ops)
    for i, g in enumerate(problem.group):
        group_static[g] += static[i]
    total = sum(group_static)
    cap = machine.capacity
    largest = max(group_static, default=0)
    soft = [min(c, total * c / sum(cap) + largest) for c in cap]
    used = [0] * len(cap)
    group_dev = [-1] * len(group_static)
    devices = []
    d = 0
    for i, g in enumerate(problem.group):
        if group_dev[g] < 0:
            need = group_static[g]
            while d < len(cap) and used[d] + need > soft[d]:
                d += 1
            if d == len(cap):
                raise Stall(i, need)
            group_dev[g] = d
            used[d] += need
        devices.append(group_dev[g])
    return devices


def m_topo(problem: Problem, machine: Machine) -> PlacerSchedule:
    """m-TOPO's placement, scheduled as a list schedule."""
    return run_schedule(problem, machine, fixed=topo_devices(problem, machine))
