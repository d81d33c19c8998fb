"""Choosing out-of-order backprop by simulation: k for data parallel, slots for one device.

**k** (:func:`sweep_k`): reverse-first-k (:func:`trainsched.backprop.reorder.reverse_first_k`)
is simulated for every k in [0, L] with the data-parallel executor over ``steps`` steps (3 by
default: the steady step, where a deferred layer's update meets its deadline, the forward of
that layer in the next step, which the executor already enforces). Each k's step time and peak
memory are kept. Memory held by deferred dW needs no separate model: the training graph's edges
``forward_i -> v_i:dW`` (the saved input x_i) and ``dX -> v_i:dW`` (the output gradient gy_i)
keep both buffers allocated until the dW ends, wherever the order puts it. The chosen k is the
fastest among those that *fit*, ties to the smaller k (step times within a relative
:data:`TIE` of the fastest tie: summation order alone must not pick a k). A k fits when its
peak is at most the memory cap, or at most the peak of k = 0 (deferring must not be what runs
a device out of memory; a baseline over the cap already is the baseline's problem, said by
its ``oom``).

**Slots** (:func:`choose_slots`) follow ``specs/backprop.md`` §2a's rule: start with every
layer ``overlap_backward``; in backprop order (last layer first), a layer whose dW still runs
once the last dX has ended (it does not hide under the dX chain) tries ``overlap_forward(j)``
for a few ``j < i`` (:data:`FORWARD_CANDIDATES` fractions of i, and i - 1) and keeps the one
with the shortest steady step that fits the memory cap, if it beats the slot it had.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from trainsched.backprop.reorder import Slot, check_k, layers, reverse_first_k, weight_ops
from trainsched.cluster import Cluster
from trainsched.comm.policy import CommPolicy, comm_policy
from trainsched.errors import TrainschedError
from trainsched.graph import Graph
from trainsched.sim.data_parallel import simulate_data_parallel
from trainsched.sim.result import SimResult
from trainsched.sim.streams import simulate_slots
from trainsched.units import is_int

__all__ = ["FORWARD_CANDIDATES", "TIE", "KSweep", "SlotChoice", "choose_slots", "sweep_k"]

#: Step times within this relative distance of the fastest are a tie (module docstring).
TIE = 1e-9
#: ``overlap_forward(j)`` candidates tried for layer i: ``j = floor(f * i)`` for each f, and i-1.
FORWARD_CANDIDATES = (0.0, 0.25, 0.5, 0.75)


def _peak(result: SimResult) -> int:
    return max(result.peak_memory_bytes.values(), default=0)


@dataclass(frozen=True, kw_only=True)
class KSweep:
    """Every k simulated: ``step_time_s[k]`` and ``peak_memory_bytes[k]`` for k = 0..layers;
    ``k`` the chosen one (module docstring); ``memory_cap_bytes`` the cap applied (``None``:
    none)."""

    k: int
    layers: int
    step_time_s: tuple[float, ...]
    peak_memory_bytes: tuple[int, ...]
    memory_cap_bytes: int | None

    def fits(self, k: int) -> bool:
        """Whether k's peak memory is within the cap (or no more than k = 0's)."""
        if self.memory_cap_bytes is None:
            return True
        return self.peak_memory_bytes[k] <= max(self.memory_cap_bytes, self.peak_memory_bytes[0])

    @property
    def speedup(self) -> float:
        """Step time of k = 0 over that of the chosen k."""
        best = self.step_time_s[self.k]
        return self.step_time_s[0] / best if best else 1.0

    def to_dict(self) -> dict[str, Any]:
        return {"k": self.k, "layers": self.layers, "speedup": self.speedup,
                "step_time_s": list(self.step_time_s),
                "peak_memory_bytes": list(self.peak_memory_bytes),
                "memory_cap_bytes": self.memory_cap_bytes}


def _check_cap(cap: Any) -> None:
    if cap is not None and not (is_int(cap) and cap > 0):
        raise TrainschedError(f"memory_cap_bytes must be a positive integer or None, got {cap!r}")


def sweep_k(graph: Graph, cluster: Cluster, *, ranks: int, policy: CommPolicy | str,
            algorithm: str = "ring", steps: int = 3, startup_overlap: bool = False,
            memory_cap_bytes: int | None = None) -> KSweep:
    """Simulate reverse-first-k for every k in [0, L] on ``ranks`` data-parallel ranks with
    ``policy`` (module docstring) and choose k. ``policy`` must cross the step barrier (the
    deferred layers update lazily); k = 0's result is the in-order step exactly."""
    _check_cap(memory_cap_bytes)
    if isinstance(policy, str):
        policy = comm_policy(policy)
    if not policy.cross_barrier:
        raise TrainschedError(f"choosing k needs a comm policy whose updates cross the step "
                              f"barrier (deferred layers update lazily in the next step); "
                              f"{type(policy).__name__} at these settings does not")
    count = check_k(graph, 0)
    times: list[float] = []
    peaks: list[int] = []
    for k in range(count + 1):
        result = simulate_data_parallel(graph, cluster, ranks=ranks, policy=policy,
                                        algorithm=algorithm, steps=steps,
                                        startup_overlap=startup_overlap,
                                        order=reverse_first_k(graph, k))
        times.append(result.step_time_s)
        peaks.append(_peak(result))
    sweep = KSweep(k=0, layers=count, step_time_s=tuple(times), peak_memory_bytes=tuple(peaks),
                   memory_cap_bytes=memory_cap_bytes)
    fitting = [k for k in range(count + 1) if sweep.fits(k)]
    fastest = min(times[k] for k in fitting)
    best = next(k for k in fitting if times[k] <= fastest * (1 + TIE))
    return KSweep(k=best, layers=count, step_time_s=sweep.step_time_s,
                  peak_memory_bytes=sweep.peak_memory_bytes, memory_cap_bytes=memory_cap_bytes)


@dataclass(frozen=True, kw_only=True)
class SlotChoice:
    """The slots chosen per layer, the steady step time with them, that of all-``inline``
    (the baseline) and the number of simulations run."""

    slots: tuple[Slot, ...]
    step_time_s: float
    inline_step_time_s: float
    simulations: int

    @property
    def speedup(self) -> float:
        return self.inline_step_time_s / self.step_time_s if self.step_time_s else 1.0


def _steady(graph: Graph, cluster: Cluster | None, slots: Sequence[Slot]) -> SimResult:
    return simulate_slots(graph, cluster, slots, steps=3)


def choose_slots(graph: Graph, cluster: Cluster | None = None, *,
                 memory_cap_bytes: int | None = None) -> SlotChoice:
    """Slots for one device by the rule of the module docstring; the steady step of 3 steps
    (a deferred dW runs in the next step) on ``cluster``'s device 0 (without a cluster: the
    two-stream defaults of :class:`~trainsched.cluster.DeviceSpec`). ``memory_cap_bytes``
    defaults to the device's memory (no cap without a cluster)."""
    _check_cap(memory_cap_bytes)
    if memory_cap_bytes is None and cluster is not None:
        memory_cap_bytes = cluster.device.memory_bytes
    count = len(layers(graph))
    runs = 0

    def run(slots: Sequence[Slot]) -> SimResult:
        nonlocal runs
        runs += 1
        return _steady(graph, cluster, slots)

    inline = run([Slot(kind="inline")] * count)
    slots = [Slot(kind="overlap_backward")] * count
    current = run(slots)
    dws = weight_ops(graph)
    for i in reversed(range(count)):
        if i == 0 or not _sticks_out(current, dws[i]):
            continue
        best = current
        for j in sorted({int(f * i) for f in FORWARD_CANDIDATES} | {i - 1}):
            trial = [*slots[:i], Slot(kind="overlap_forward", after=j), *slots[i + 1:]]
            result = run(trial)
            fits = memory_cap_bytes is None or _peak(result) <= memory_cap_bytes
            if fits and result.step_time_s < best.step_time_s:
                best, slots_best = result, trial
        if best is not current:
            slots, current = slots_best, best
    return SlotChoice(slots=tuple(slots), step_time_s=current.step_time_s,
                      inline_step_time_s=inline.step_time_s, simulations=runs)


def _sticks_out(result: SimResult, dw: str) -> bool:
    """Whether ``dw`` of the last simulated step ends after that step's last dX op."""
    last = max((t.args.get("step", 0) for t in result.tasks), default=0)
    mine = [t for t in result.tasks if t.args.get("step", 0) == last]
    ends = [t.end_s for t in mine if t.category == "backward_input"]
    dw_end = next((t.end_s for t in mine if t.args.get("op") == dw), None)
    return bool(ends) and dw_end is not None and dw_end > max(ends)
