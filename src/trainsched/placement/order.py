"""The order a placement runs its ops in: what the placer scheduled, or the step's list schedule.

A :class:`~trainsched.plan.Placement` carries one order (``docs/placement.md``, "One order"):
the simulator replays it and ``PlacedModule`` runs it. When the placer scheduled every op of the
graph, it is the order the placer started them (fused ops expanded into their members, in
topological order), so the replay reproduces the placer's schedule. A forward-only placer never
saw the backward and optimizer ops; the order is then the list schedule of the whole step on
that placement (m-ETF's rule with the devices fixed, memory not limiting).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

from trainsched.graph import Graph
from trainsched.placement.model import Machine, PlacerSchedule, run_schedule
from trainsched.placement.reduce import Problem, reduce_graph

__all__ = ["Orders", "order_of"]

_UNLIMITED_BYTES = 2**62  # the list schedule of a whole step is ordered without memory limits


class Orders:
    """The order of a placement of ``graph`` (:func:`order_of`), with the graph's unreduced
    problem built once for every candidate that needs a list schedule, and each distinct
    placement list-scheduled once."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self._full: Problem | None = None
        self._listed: dict[tuple[int, ...], tuple[str, ...]] = {}

    def full(self) -> Problem:
        if self._full is None:
            self._full = reduce_graph(self.graph, forward_only=False, coplacement=False,
                                      fusion=False, group_cap_bytes=math.inf)
        return self._full

    def __call__(self, problem: Problem, schedule: PlacerSchedule, machine: Machine,
                 device_of: Mapping[str, int]) -> tuple[str, ...]:
        if sum(len(m) for m in problem.members) == len(self.graph):
            # The placer scheduled every op: its commit order, fused ops expanded in order.
            return tuple(name for i in schedule.sequence for name in problem.members[i])
        full = self.full()
        devices = tuple(device_of[name] for name in full.names)
        if devices not in self._listed:
            ample = dataclasses.replace(machine,
                                        capacity=(_UNLIMITED_BYTES,) * machine.num_devices)
            listed = run_schedule(full, ample, fixed=devices)
            self._listed[devices] = tuple(full.names[i] for i in listed.sequence)
        return self._listed[devices]


def order_of(graph: Graph, problem: Problem, schedule: PlacerSchedule, machine: Machine,
             device_of: Mapping[str, int]) -> tuple[str, ...]:
    """The order a placement of ``graph`` runs its ops in (the module docstring): the placer's
    commit order (``schedule.sequence`` of ``problem``, fused ops expanded into their members)
    when ``problem`` schedules every op of ``graph``, else the list schedule of ``graph`` with
    the devices ``device_of`` fixed and memory unlimited."""
    return Orders(graph)(problem, schedule, machine, device_of)


