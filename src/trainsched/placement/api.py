"""``place()``: reduce a graph, run a placer (or all of them), expand, order, predict, report.

Every placer is a pure function of (reduced problem, machine, context) registered in
:data:`PLACERS`; ``auto`` runs them all, on the graph reduced as asked and on every variant with
fewer reductions (up to :data:`AUTO_VARIANT_OPS` ops), and keeps the one predicted fastest
without running out of memory. The prediction is a :data:`Predictor` the caller passes: the
simulator's (:func:`trainsched.sim.predict_placement`, on the full graph, replaying the
placement's order), which makes ``auto`` never worse than one device (when the model fits
there), the best contiguous split, or any placer without a reduction, by the simulator's own
measure; without one, each placer's own schedule (makespan and peak bytes) decides. This
package never imports the simulator: the command line and ``compare`` pass it in.

**The order.** The placement carries the order the ops run in (:attr:`Placement.order`,
:func:`order_of`): the placer's own commit order when it scheduled every op (fused ops expanded
into their members, in topological order); for a forward-only placement, whose placer never saw
the backward and optimizer ops, the list schedule of the whole step on that placement (m-ETF's
rule with the devices fixed, memory not limiting). The simulator replays it and ``PlacedModule``
runs it.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from trainsched.cluster import COMM_MODES, Cluster
from trainsched.errors import TrainschedError
from trainsched.graph import Graph, Op
from trainsched.placement.baselines import contiguous_devices, single_devices
from trainsched.placement.etf import m_etf
from trainsched.placement.feasibility import check_totals, infeasible_error
from trainsched.placement.model import Machine, PlacerSchedule, Stall, run_schedule
from trainsched.placement.order import Orders, order_of
from trainsched.placement.reduce import Problem, reduce_graph
from trainsched.placement.sct import m_sct
from trainsched.placement.topo import topo_devices
from trainsched.plan import Placement
from trainsched.registry import Registry

__all__ = ["ALGORITHMS", "AUTO_VARIANT_OPS", "PLACERS", "SCT_THRESHOLD", "Candidate",
           "PlacementResult", "Predictor", "order_of", "place"]

#: m-SCT's rounding threshold θ by default: an edge whose LP value x_e ≤ θ may make its child
#: the favourite. Baechi's function default (its command line used 0.1).
SCT_THRESHOLD = 0.5

#: ``(graph, cluster, placement) -> (step seconds, peak bytes per cluster device)``: how a
#: placement of the whole graph (devices and order) is predicted to run.
Predictor = Callable[[Graph, Cluster, Placement], tuple[float, tuple[int, ...]]]


@dataclass(frozen=True, kw_only=True)
class _Context:
    """What placers may need beyond the reduced problem."""

    group_weights: Mapping[str, list[float]]  # contiguous: weight per group by kind
    sct_threshold: float


@dataclass(frozen=True, kw_only=True)
class _Run:
    """A placer's answer: a device per op (static placers) or a schedule (dynamic ones)."""

    devices: list[int] | None = None
    schedule: PlacerSchedule | None = None
    lp_value_s: float | None = None


Placer = Callable[[Problem, Machine, _Context], _Run]


def _sct(problem: Problem, machine: Machine, ctx: _Context) -> _Run:
    schedule, w_star, _ = m_sct(problem, machine, ctx.sct_threshold)
    return _Run(schedule=schedule, lp_value_s=w_star)


def _contiguous(by: str) -> Placer:
    def run(problem: Problem, machine: Machine, ctx: _Context) -> _Run:
        return _Run(devices=contiguous_devices(problem, machine, ctx.group_weights[by]))
    return run


#: name -> placer, in the order ``auto`` breaks exact ties (after fewer devices used).
PLACERS: Registry[Placer] = Registry("placer", "placers")
PLACERS.register("m-sct", _sct)
PLACERS.register("m-etf", lambda problem, machine, ctx: _Run(schedule=m_etf(problem, machine)))
PLACERS.register("m-topo",
                 lambda problem, machine, ctx: _Run(devices=topo_devices(problem, machine)))
PLACERS.register("contiguous-params", _contiguous("params"))
PLACERS.register("contiguous-compute", _contiguous("compute"))
PLACERS.register("contiguous-count", _contiguous("count"))
PLACERS.register("single",
                 lambda problem, machine, ctx: _Run(devices=single_devices(problem, machine)))
ALGORITHMS = ("auto", *PLACERS)


@dataclass(frozen=True, kw_only=True)
class Candidate:
    """One placer's outcome under ``auto``: the simulator's step time, or why it failed."""

    name: str
    step_s: float | None
    oom: bool
    devices_used: int
    error: str | None = None


@dataclass(frozen=True, kw_only=True, eq=False)
class PlacementResult:
    """A placement with the placer's own schedule (on the reduced graph) and the predictions.

    ``makespan_s`` is the placer's schedule of the reduced graph (forward ops only, for a
    forward-only placement); ``predicted_step_s`` is the simulator's step on the full graph
    (None when not simulated); ``lower_bound_s`` = max(critical path, total compute / devices)
    of the full graph. ``wall_s`` is placement time (reduction and placers; for ``auto`` also
    the scoring simulations), ``reduce_s`` the reduction's part and ``placer_s`` the chosen
    placer's own (for a static placer, without scheduling its placement); none is written into
    the placement file, which stays byte-identical for equal inputs.
    """

    placement: Placement
    algorithm: str
    placer: str
    problem: Problem
    schedule: PlacerSchedule
    machine: Machine
    makespan_s: float
    predicted_step_s: float | None
    lower_bound_s: float
    peak_bytes: tuple[int, ...]
    simulated_peak_bytes: tuple[int, ...] | None
    ops_before: int
    ops_after: int
    wall_s: float
    reduce_s: float
    placer_s: float
    lp_value_s: float | None
    candidates: tuple[Candidate, ...] = ()

    def device_order(self) -> tuple[tuple[str, ...], ...]:
        """Per device, the (reduced) ops in the order the placer starts them."""
        names = self.problem.names
        return tuple(tuple(names[i] for i in ops) for ops in self.schedule.order)

    def op_times(self) -> dict[str, tuple[int, float, float]]:
        """Reduced op name -> (device, start, end) in the placer's schedule."""
        s = self.schedule
        return {name: (s.device[i], s.start_s[i], s.end_s[i])
                for i, name in enumerate(self.problem.names)}

    def transfers(self) -> tuple[dict[str, Any], ...]:
        """The placer's transfers in commit order (each channel serves them in this order)."""
        p, names = self.problem, self.machine.names
        return tuple({"tensor": p.tensor_key[x.tensor],
                      "producer": p.names[p.tensor_producer[x.tensor]],
                      "src": names[x.src], "dst": names[x.dst], "bytes": x.size_bytes,
                      "start_s": x.start_s, "end_s": x.end_s}
                     for x in self.schedule.transfers)  # fmt: skip

    def summary(self) -> dict[str, Any]:
        """What ``trainsched place --json`` prints."""
        names = self.machine.names
        peaks = self.simulated_peak_bytes or self.peak_bytes
        return {
            "algorithm": self.algorithm,
            "placer": self.placer,
            "placement_s": self.wall_s,
            "reduce_s": self.reduce_s,
            "placer_s": self.placer_s,
            "predicted_step_s": self.predicted_step_s,
            "placer_makespan_s": self.makespan_s,
            "lower_bound_s": self.lower_bound_s,
            "lp_value_s": self.lp_value_s,
            "peak_bytes": dict(zip(names, peaks, strict=True)),
            "capacity_bytes": dict(zip(names, self.machine.capacity, strict=True)),
            "out_of_memory": list(self.placement.meta["out_of_memory"]),
            "placer_capacity_bytes": self.placement.meta.get("placer_capacity_bytes"),
            "ops_before": self.ops_before,
            "ops_after": self.ops_after,
            "ops_per_device": {names[d]: n for d, n in enumerate(self._ops_per_device())},
            "candidates": [dataclasses.asdict(c) for c in self.candidates],
        }

    def _ops_per_device(self) -> list[int]:
        counts = [0] * self.placement.num_devices
        for d in self.placement.device_of.values():
            counts[d] += 1
        return counts


def place(graph: Graph, cluster: Cluster, algorithm: str = "auto", *, comm: str | None = None,
          fusion: bool = True, coplacement: bool = True, forward_only: bool | None = None,
          group_cap_fraction: float = 0.5, sct_threshold: float = SCT_THRESHOLD,
          memory_fraction: float = 1.0, reserved_bytes: int = 0,
          backward_in_weight: bool = False,
          predict: Predictor | None = None) -> PlacementResult:
    """Place ``graph`` on ``cluster`` with ``algorithm`` (one of :data:`ALGORITHMS`).

    ``comm`` overrides the cluster's contention mode; ``forward_only`` defaults to True for
    training graphs (any non-forward op). Usable memory per device is ``memory_bytes ×
    memory_fraction − reserved_bytes``. ``sct_threshold`` is m-SCT's rounding threshold θ in
    [0, 1] (:data:`SCT_THRESHOLD`). Raises :class:`TrainschedError` when nothing fits, naming
    the op and the memory per device a placement would need.
    """
    began = time.perf_counter()
    if algorithm not in ALGORITHMS:
        raise TrainschedError(f"unknown placement algorithm {algorithm!r}; "
                              f"choose one of {', '.join(ALGORITHMS)}")
    if comm is not None:
        if comm not in COMM_MODES:
            raise TrainschedError(f"comm must be 'sequential' or 'parallel', got {comm!r}")
        cluster = dataclasses.replace(cluster, comm=comm)
    if not 0 < group_cap_fraction <= 1:
        raise TrainschedError(f"group_cap_fraction must be in (0, 1], got {group_cap_fraction!r}")
    if not 0 <= sct_threshold <= 1:
        raise TrainschedError(f"sct_threshold must be in [0, 1], got {sct_threshold!r}")
    if len(graph) == 0:
        raise TrainschedError("the graph has no ops to place")
    machine = Machine.from_cluster(cluster, memory_fraction=memory_fraction,
                                   reserved_bytes=reserved_bytes)
    if forward_only is None:
        forward_only = any(op.kind != "forward" for op in graph.ops)
    settings = _Settings(forward_only=forward_only, fusion=fusion, coplacement=coplacement,
                         group_cap_fraction=group_cap_fraction, sct_threshold=sct_threshold,
                         backward_in_weight=backward_in_weight)
    if algorithm != "auto":
        return _place_once(graph, cluster, machine, machine, algorithm, settings, predict,
                           began)
    # auto: the placers' memory model sees forward ops only (when forward-only), so the
    # simulator's full step may need more; while the best placement runs out of memory, give
    # the placers less, in proportion to the overshoot (and below what the placers used, or
    # they would place the same again), halving back towards the last capacity that placed
    # something when a smaller one leaves nothing placeable.
    best: PlacementResult | None = None
    scaled = machine
    placed_at: float | None = None  # the last fraction of the capacity that placed something
    for _ in range(AUTO_MEMORY_ROUNDS):
        fraction = scaled.capacity[0] / machine.capacity[0]
        try:
            result = _place_once(graph, cluster, machine, scaled, algorithm, settings, predict,
                                 began)
        except TrainschedError:
            if best is None or placed_at is None:
                raise
            fraction = (fraction + placed_at) / 2
        else:
            placed_at = fraction
            if best is None or _rank(result) < _rank(best):
                best = result
            if not _oom(result):
                break
            peaks = result.simulated_peak_bytes or result.peak_bytes
            shrink = min(c / b for b, c in zip(peaks, machine.capacity, strict=True) if b > c)
            used = max(b / c for b, c in zip(result.peak_bytes, machine.capacity, strict=True))
            fraction = min(fraction * shrink, used) * AUTO_MEMORY_MARGIN
        scaled = dataclasses.replace(scaled, capacity=tuple(
            int(c * fraction) for c in machine.capacity))
        if min(scaled.capacity) <= 0:
            break
    assert best is not None
    return best


AUTO_MEMORY_ROUNDS = 6
AUTO_MEMORY_MARGIN = 0.97


def _overshoot(result: PlacementResult) -> float:
    """The largest peak over capacity ratio (the simulator's peaks when simulated)."""
    peaks = result.simulated_peak_bytes or result.peak_bytes
    return max(b / c for b, c in zip(peaks, result.machine.capacity, strict=True))


def _oom(result: PlacementResult) -> bool:
    return _overshoot(result) > 1


def _rank(result: PlacementResult) -> tuple[bool, float, float]:
    over = _overshoot(result)
    return over > 1, max(over, 1.0), result.predicted_step_s or 0.0


@dataclass(frozen=True, kw_only=True)
class _Settings:
    forward_only: bool
    fusion: bool
    coplacement: bool
    group_cap_fraction: float
    sct_threshold: float
    backward_in_weight: bool


def _place_once(graph: Graph, cluster: Cluster, machine: Machine, scaled: Machine,
                algorithm: str, settings: _Settings, predict: Predictor | None,
                began: float) -> PlacementResult:
    """One placement with the placers given ``scaled`` capacities (``machine``'s are the
    real ones, which results and out-of-memory checks use)."""
    variants = _variants(settings) if algorithm == "auto" else [settings]
    reduced: list[tuple[_Settings, Problem]] = []
    seen: set[tuple] = set()
    forward_ops = sum(op.kind == "forward" for op in graph.ops)
    for k, variant in enumerate(variants):
        if k and not _worth_reducing(variant, len(graph), forward_ops):
            continue
        problem = reduce_graph(
            graph, forward_only=variant.forward_only, fusion=variant.fusion,
            coplacement=variant.coplacement,
            group_cap_bytes=variant.group_cap_fraction * min(scaled.capacity),
            backward_in_weight=variant.backward_in_weight)
        if k == 0:
            check_totals(problem, scaled)
        elif problem.n > AUTO_VARIANT_OPS:
            continue
        key = (variant.forward_only, problem.members, problem.group)
        if key in seen:  # the reduction changed nothing here
            continue
        seen.add(key)
        reduced.append((variant, problem))
    reduced_at = time.perf_counter()
    names = list(PLACERS) if algorithm == "auto" else [algorithm]
    attempts = [_Attempt(name=name + _suffix(variant, settings), placer=name, problem=problem,
                         settings=variant)
                for variant, problem in reduced for name in names]  # fmt: skip
    runs: dict[str, _Run] = {}
    stalls: dict[str, Stall] = {}
    placer_s: dict[str, float] = {}
    contexts: dict[int, _Context] = {}
    for attempt in attempts:
        key = id(attempt.problem)
        if key not in contexts:
            contexts[key] = _Context(group_weights=_group_weights(graph, attempt.problem),
                                     sct_threshold=settings.sct_threshold)
        t0 = time.perf_counter()
        try:
            run = PLACERS[attempt.placer](attempt.problem, scaled, contexts[key])
            placer_s[attempt.name] = time.perf_counter() - t0
            if run.schedule is None:
                fixed = run_schedule(attempt.problem, scaled, fixed=run.devices)
                run = dataclasses.replace(run, schedule=fixed)
            runs[attempt.name] = run
        except Stall as stall:
            stalls[attempt.name] = stall
    if not runs:
        raise infeasible_error(reduced[0][1], scaled, stalls)
    orders = Orders(graph)
    if algorithm != "auto":
        chosen = attempts[0]
        wall = time.perf_counter() - began
        simulated = (predict(graph, cluster,
                             _candidate(chosen, runs[chosen.name], orders, machine))
                     if predict is not None else None)
        candidates: tuple[Candidate, ...] = ()
    else:
        chosen, simulated, candidates = _choose(graph, cluster, machine, attempts, runs, stalls,
                                                predict, orders)
        wall = time.perf_counter() - began
    options: dict[str, Any] = {"comm": cluster.comm,
                               "forward_only": chosen.settings.forward_only,
                               "fusion": chosen.settings.fusion,
                               "coplacement": chosen.settings.coplacement,
                               "sct_threshold": settings.sct_threshold}
    if scaled.capacity != machine.capacity:
        options["placer_capacity_bytes"] = scaled.capacity[0]
    timings = {"reduce_s": reduced_at - began, "placer_s": placer_s[chosen.name],
               "total_s": wall}
    return _result(graph, cluster, machine, algorithm, chosen, runs[chosen.name], simulated,
                   candidates, timings, options, orders)


@dataclass(frozen=True, kw_only=True, eq=False)
class _Attempt:
    """One candidate: a placer on one reduction of the graph."""

    name: str
    placer: str
    problem: Problem
    settings: _Settings


#: auto also places the graph with fewer reductions (no fusion, no co-placement, not
#: forward-only: every combination of the reductions asked for) when that problem has at most
#: this many ops, so that no reduction can make auto worse than a placer without it.
AUTO_VARIANT_OPS = 5000

_REDUCTIONS = ("forward_only", "coplacement", "fusion")


def _worth_reducing(variant: _Settings, ops: int, forward_ops: int) -> bool:
    """Whether a variant may come within :data:`AUTO_VARIANT_OPS` ops: without fusion it has
    exactly the ops it schedules (co-placement merges groups, not ops); with fusion, graphs
    ten times larger are not tried."""
    scheduled = forward_ops if variant.forward_only else ops
    limit = AUTO_VARIANT_OPS if not variant.fusion else 10 * AUTO_VARIANT_OPS
    return scheduled <= limit


def _variants(settings: _Settings) -> list[_Settings]:
    """``settings`` first, then every combination with some of its reductions turned off."""
    on = [r for r in _REDUCTIONS if getattr(settings, r)]
    out = [settings]
    for mask in range(1, 2 ** len(on)):
        off = {r: False for k, r in enumerate(on) if mask >> k & 1}
        out.append(dataclasses.replace(settings, **off))
    return out


def _suffix(variant: _Settings, settings: _Settings) -> str:
    """``/no-coplacement+fusion`` for a variant with those reductions off, '' for the asked."""
    off = [r.replace("_", "-") for r in _REDUCTIONS
           if getattr(settings, r) and not getattr(variant, r)]
    return "/no-" + "+".join(off) if off else ""


def _group_weights(graph: Graph, problem: Problem) -> dict[str, list[float]]:
    """Per group: parameter bytes, compute and op count (exact sums, so the listing order of
    the graph's ops cannot change a contiguous split)."""
    members: list[list[Op]] = [[] for _ in problem.group_ops]
    for op in graph.ops:
        members[problem.group_of[op.name]].append(op)
    return {"params": [float(sum(op.param_bytes for op in ops)) for ops in members],
            "compute": [math.fsum(op.compute_s for op in ops) for ops in members],
            "count": [float(len(ops)) for ops in members]}


def _expand(problem: Problem, schedule: PlacerSchedule) -> dict[str, int]:
    group_dev = [0] * len(problem.group_ops)
    for i, g in enumerate(problem.group):
        group_dev[g] = schedule.device[i]
    return {name: group_dev[g] for name, g in sorted(problem.group_of.items())}


def _candidate(attempt: _Attempt, run: _Run, orders: Orders, machine: Machine,
               meta: Mapping[str, Any] | None = None) -> Placement:
    """The placement an attempt produced: devices of every original op, and its order."""
    schedule = run.schedule
    assert schedule is not None
    device_of = _expand(attempt.problem, schedule)
    order = orders(attempt.problem, schedule, machine, device_of)
    return Placement(device_of=device_of, num_devices=machine.num_devices, meta=meta or {},
                     order=order)


def _choose(graph: Graph, cluster: Cluster, machine: Machine, attempts: list[_Attempt],
            runs: dict[str, _Run], stalls: dict[str, Stall], predict: Predictor | None,
            orders: Orders
            ) -> tuple[_Attempt, tuple[float, tuple[int, ...]] | None, tuple[Candidate, ...]]:
    """auto: predict every placement (devices and order) on the full graph (without
    ``predict``: each placer's schedule); the fastest that fits wins (ties: fewer devices
    used, then the order of the attempts: the reductions asked for first, :data:`PLACERS`'
    order within). Identical placements are predicted once."""
    scored = []
    candidates = []
    predicted: dict[tuple, tuple[float, tuple[int, ...]]] = {}
    for k, attempt in enumerate(attempts):
        name = attempt.name
        if name in stalls:
            op = attempt.problem.names[stalls[name].op]
            candidates.append(Candidate(name=name, step_s=None, oom=True, devices_used=0,
                                        error=f"no room for op {op!r}"))
            continue
        schedule = runs[name].schedule
        assert schedule is not None
        device_of = _expand(attempt.problem, schedule)
        if predict is not None:
            placement = _candidate(attempt, runs[name], orders, machine)
            key = (tuple(placement.device_of.values()), placement.order)
            if key not in predicted:
                predicted[key] = predict(graph, cluster, placement)
            step, peaks = predicted[key]
        else:
            step, peaks = schedule.makespan_s, tuple(schedule.peak_bytes)
        over = max(b / c for b, c in zip(peaks, machine.capacity, strict=True))
        used = len(set(device_of.values()))
        candidates.append(Candidate(name=name, step_s=step, oom=over > 1, devices_used=used))
        # Placements that fit first, by step time; those that do not, by how far they overshoot.
        scored.append(((over > 1, max(over, 1.0), step, used, k), attempt, (step, peaks)))
    _, chosen, simulated = min(scored, key=lambda item: item[0])
    return chosen, simulated if predict is not None else None, tuple(candidates)


def _result(graph: Graph, cluster: Cluster, machine: Machine, algorithm: str,
            attempt: _Attempt, run: _Run, simulated: tuple[float, tuple[int, ...]] | None,
            candidates: tuple[Candidate, ...], timings: dict[str, float],
            options: dict[str, Any], orders: Orders) -> PlacementResult:
    schedule = run.schedule
    assert schedule is not None
    problem, chosen = attempt.problem, attempt.name
    whole = sum(len(m) for m in problem.members) == len(graph)
    options = dict(options)
    threshold = options.pop("sct_threshold")
    m = machine.num_devices
    critical, _ = graph.critical_path()
    lower = max(critical, graph.totals().compute_s / m)
    peaks = simulated[1] if simulated else schedule.peak_bytes
    meta: dict[str, Any] = {
        "algorithm": algorithm,
        "placer": chosen,
        "cluster": cluster.label,
        **options,
        "predicted_step_s": simulated[0] if simulated else None,
        "placer_makespan_s": schedule.makespan_s,
        "lower_bound_s": lower,
        "peak_bytes": dict(zip(machine.names, peaks, strict=True)),
        "out_of_memory": [name for name, b, c in zip(machine.names, peaks, machine.capacity,
                                                    strict=True) if b > c],
        "ops_before": len(graph),
        "ops_after": problem.n,
        "order_from": "placer" if whole else "list schedule of the step",
    }
    if run.lp_value_s is not None:
        meta["lp_value_s"] = run.lp_value_s
        meta["sct_threshold"] = threshold
    placement = _candidate(attempt, run, orders, machine, meta)
    return PlacementResult(
        placement=placement, algorithm=algorithm, placer=chosen, problem=problem,
        schedule=schedule, machine=machine, makespan_s=schedule.makespan_s,
        predicted_step_s=simulated[0] if simulated else None, lower_bound_s=lower,
        peak_bytes=schedule.peak_bytes, simulated_peak_bytes=simulated[1] if simulated else None,
        ops_before=len(graph), ops_after=problem.n, wall_s=timings["total_s"],
        reduce_s=timings["reduce_s"], placer_s=timings["placer_s"], lp_value_s=run.lp_value_s,
        candidates=candidates)
