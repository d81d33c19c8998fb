"""Couplings: two sets of tasks that slow each other down while they run at the same time.

A GPU's compute kernels and its NCCL kernels share the SMs and the memory bandwidth; a CPU
host's compute and its gloo threads share the cores. Neither takes turns (that would be the
engine's exclusive resources) and neither is free: while both run, each runs at a reduced
*rate* (work done per second). A :class:`Coupling` says by how much, for one device:

- a task of the **first** side (compute) runs at ``first_rate`` while at least one task of the
  second side runs, else at rate 1;
- a task of the **second** side (collectives) runs at ``second_rate`` while a first-side task
  runs, else at rate 1, and, with ``k`` second-side tasks running at once, each also at
  ``1 / (1 + contention·(k − 1))``: ``contention`` 1 is processor sharing (k collectives
  in flight take as long as k in a row), 0 is no contention (each as fast as alone).

A task's duration is its *work* at rate 1, but for a *fixed* part at its start
(``TaskGraph.couple(..., fixed_s=)``): a delay that passes at rate 1 whatever the rates (a
collective's per-call overhead on a host is mostly waiting: a thread handing it over, a
scheduler tick; two in flight wait side by side), while the task counts as running in its
group. :class:`CouplingState` is the replay's state, used
by :func:`trainsched.sim.engine.run_tasks`: whenever a group's running set changes (a start or
an end), it advances each running task's work at its old rate and hands back the ends to
re-post at the new rates; the engine drops an end that was re-posted since (the heap entry is
remembered per task). A zero-work task changes nobody's rate. Rates never exceed 1, so a
coupled task never ends before its duration: the dependency bound (critical path ≤ makespan)
still holds.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from trainsched.errors import TrainschedError

if TYPE_CHECKING:
    from trainsched.cluster import DeviceSpec
    from trainsched.sim.engine import TaskGraph

__all__ = ["Coupling", "CouplingState", "couple_devices"]


@dataclass(frozen=True, kw_only=True)
class Coupling:
    """The rates of one coupling group (module docstring)."""

    first_rate: float
    second_rate: float
    contention: float = 1.0

    def __post_init__(self) -> None:
        for name in ("first_rate", "second_rate"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and 0 < value <= 1):
                raise TrainschedError(f"coupling: {name} must be in (0, 1], got {value!r}")
        value = self.contention
        if not (isinstance(value, int | float) and math.isfinite(value) and 0 <= value <= 1):
            raise TrainschedError(f"coupling: contention must be in [0, 1], got {value!r}")


def couple_devices(tasks: TaskGraph, device: DeviceSpec, count: int,
                   fixed_s: Mapping[int, float] | None = None) -> None:
    """One coupling group per device ``0..count-1`` at ``device``'s collective rates: its
    compute-stream tasks on the first side, its ``"comm"`` tasks on the second, each with
    the fixed part ``fixed_s`` gives it (default none)."""
    groups = [tasks.add_coupling(Coupling(first_rate=device.compute_rate_with_comm,
                                          second_rate=device.comm_rate_with_compute,
                                          contention=device.collective_contention))
              for _ in range(count)]  # fmt: skip
    kinds = [r.kind for r in tasks.resources]
    for t, needs in enumerate(tasks.needs):
        k = tasks.device[t]
        if tasks.category[t] == "comm":
            tasks.couple(t, groups[k], 1, fixed_s=fixed_s.get(t, 0.0) if fixed_s else 0.0)
        elif len(needs) == 1 and kinds[needs[0]] == "compute":
            tasks.couple(t, groups[k], 0)


class CouplingState:
    """The couplings' state during one replay: per task its group (-1: none), side, work
    left, rate, since when, and the heap entry of its posted end; per group the running tasks
    of each side."""

    def __init__(self, tasks: TaskGraph, paired: set[int] | None = None) -> None:
        n = len(tasks)
        self.params = tasks.couplings
        self.group = [-1] * n
        self.side = [0] * n
        for t, (g, s) in tasks.coupled.items():
            assert not paired or t not in paired, f"task {tasks.label[t]!r}: paired and coupled"
            self.group[t], self.side[t] = g, s
        self.on = [g >= 0 for g in self.group]
        self.dur = tasks.duration_s
        self.running: list[tuple[list[int], list[int]]] = [([], []) for _ in self.params]
        self.fixed = [0.0] * n  # what is left of each task's delay (rate 1)
        self.fixed_s = tasks.fixed_s
        self.left = [0.0] * n
        self.rate = [1.0] * n
        self.since = [0.0] * n
        self.entry = [-1] * n
        self.active = [False] * n

    def max_posts(self) -> int:
        """An upper bound on the ends one replay posts for coupled tasks."""
        sizes = [0] * len(self.params)
        for g in self.group:
            if g >= 0:
                sizes[g] += 1
        return 2 * sum(s * (s + 1) for s in sizes)

    def _rates(self, g: int) -> tuple[float, float]:
        first, second = self.running[g]
        c = self.params[g]
        r0 = c.first_rate if second else 1.0
        k = len(second)
        r1 = (c.second_rate if first else 1.0) / (1.0 + c.contention * (k - 1)) if k else 1.0
        return r0, r1

    def _advance(self, g: int, now: float) -> None:
        for side in self.running[g]:
            for u in side:
                elapsed = now - self.since[u]
                delay = min(self.fixed[u], elapsed)  # the delay passes first, at rate 1
                self.fixed[u] -= delay
                self.left[u] = max(0.0, self.left[u] - self.rate[u] * (elapsed - delay))
                self.since[u] = now

    def _repost(self, g: int, now: float, out: list[tuple[int, float]]) -> None:
        rates = self._rates(g)
        for side, tasks in enumerate(self.running[g]):
            rate = rates[side]
            for u in tasks:
                if self.rate[u] != rate:
                    self.rate[u] = rate
                    out.append((u, now + self.fixed[u] + self.left[u] / rate))

    def start(self, t: int, now: float) -> list[tuple[int, float]]:
        """Coupled task ``t`` starts: the (task, end) pairs to post (``t``'s own among them)."""
        g = self.group[t]
        if self.dur[t] == 0.0:
            return [(t, now)]
        self._advance(g, now)
        self.running[g][self.side[t]].append(t)
        self.active[t] = True
        self.fixed[t] = self.fixed_s.get(t, 0.0)
        self.left[t] = self.dur[t] - self.fixed[t]
        self.since[t], self.rate[t] = now, 0.0  # 0: re-posted below
        out: list[tuple[int, float]] = []
        self._repost(g, now, out)
        return out

    def end(self, t: int, now: float) -> list[tuple[int, float]]:
        """Coupled task ``t`` ended: the ends of the others in its group to re-post."""
        if not self.active[t]:
            return []
        g = self.group[t]
        self.active[t] = False
        self.running[g][self.side[t]].remove(t)
        self._advance(g, now)
        out: list[tuple[int, float]] = []
        self._repost(g, now, out)
        return out
