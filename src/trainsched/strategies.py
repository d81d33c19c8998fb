"""Strategies: the plans ``trainsched compare`` ranks, made from the registries.

A strategy is a name and a builder ``(graph, cluster, options) -> Planned``: a plan (one of
:mod:`trainsched.plan`'s kinds), how many samples one step of it processes, and a line saying
what it does. :func:`strategies` makes the list from the registries at each call, so a policy
registered with ``compare=True`` is a row without any other edit:

- ``single``: every op on one device (the baseline);
- ``data-<policy>`` for each communication policy tagged ``compare`` (a policy whose updates
  cross the barrier is simulated for its steady step of 3), and ``data-<policy>-tuned`` for
  those tagged ``tuned``: the partition and credit the tuner picks on the simulator;
- ``data-<policy>+<backprop>`` for each backprop order tagged ``compare``
  (:data:`trainsched.backprop.reorder.BACKPROP_ORDERS`: ``ooo``, reverse-first-k) and each
  comm policy tagged ``compare`` whose updates cross the barrier (the deferred layers update
  lazily): k chosen by simulating every k (``sim.sweep_k``) within the device's memory;
- ``pipeline-<schedule>`` for each schedule tagged ``compare``: stages balanced by compute;
- ``placed-auto``: the placers run on ``ranks`` devices, the fastest predicted kept.

A strategy may not fit a graph (a pipeline of more stages than the graph has forward ops):
:func:`make_plans` raises, naming the strategy; :func:`plan_strategies` builds those it can and
says why each other one cannot, as ``trainsched compare`` shows them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from trainsched.backprop.reorder import BACKPROP_ORDERS
from trainsched.backprop.schedules import SCHEDULES
from trainsched.cluster import Cluster
from trainsched.comm.policy import COMM_POLICIES, ByteSchedulerPolicy, comm_policy
from trainsched.errors import TrainschedError
from trainsched.graph import Graph
from trainsched.plan import (
    DataParallelPlan,
    ModelRef,
    PipelinePlan,
    PlacedPlan,
    Plan,
    SinglePlan,
    default_steps,
)
from trainsched.units import format_size, is_int

__all__ = ["Options", "Planned", "Strategy", "default_microbatches", "make_plans",
           "plan_strategies", "strategies"]


@dataclass(frozen=True, kw_only=True)
class Options:
    """How wide the parallel strategies are: ranks (or stages) and micro-batches; the batch
    size per rank (data parallel) or per step (the others). Each an integer >= 1.
    ``microbatch_graph``: the model's graph captured at the micro-batch size, whose costs the
    pipeline strategies take as a micro-batch's (``stage_costs_from_graph``); without it they
    divide the batch's costs by the micro-batch count."""

    ranks: int
    microbatches: int
    batch_size: int
    microbatch_graph: Graph | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        for name in ("ranks", "microbatches", "batch_size"):
            value = getattr(self, name)
            if not (is_int(value) and value >= 1):
                raise TrainschedError(f"Options.{name} must be an integer >= 1, got {value!r}")
        if self.microbatch_graph is not None and not isinstance(self.microbatch_graph, Graph):
            raise TrainschedError(f"Options.microbatch_graph must be a Graph, got "
                                  f"{type(self.microbatch_graph).__name__}")


@dataclass(frozen=True, kw_only=True)
class Planned:
    """A strategy's plan, the samples one step processes and a one-line description."""

    plan: Plan
    samples_per_step: int
    description: str


Strategy = Callable[[Graph, Cluster, Options], Planned]


def _single(graph: Graph, cluster: Cluster, o: Options) -> Planned:
    return Planned(plan=SinglePlan(model=ModelRef.of(graph)), samples_per_step=o.batch_size,
                   description="all ops on one device")


def _data(name: str) -> Strategy:
    """Data parallelism with the registered comm policy ``name`` at its defaults."""
    def build(graph: Graph, cluster: Cluster, o: Options) -> Planned:
        policy = comm_policy(name)
        steps = default_steps(policy)
        steady = f", steady step of {steps}" if steps > 1 else ""
        return Planned(
            plan=DataParallelPlan(model=ModelRef.of(graph), ranks=o.ranks, comm=name,
                                  policy=policy, steps=steps),
            samples_per_step=o.ranks * o.batch_size,
            description=f"{o.ranks} replicas, ring all-reduce, {name} gradient "
                        f"communication{steady}")
    return build


def _data_tuned(name: str) -> Strategy:
    """The policy ``name`` at the partition and credit the tuner picks on the simulator (15
    trials, seed 0, the steady step of 3), as ``simulate --autotune`` picks them."""
    def build(graph: Graph, cluster: Cluster, o: Options) -> Planned:
        from trainsched.comm.tune import tune, tuned_policy
        from trainsched.sim.tune import simulated_objective

        base = comm_policy(name)
        if not isinstance(base, ByteSchedulerPolicy):
            raise TrainschedError(f"comm policy {name!r} is tagged 'tuned', but the simulator's "
                                  f"tuner tunes the bytescheduler policy only")
        best = tune(simulated_objective(graph, cluster, o.ranks, steps=3))
        policy = tuned_policy(base, best.partition_bytes, best.credit_bytes)
        return Planned(
            plan=DataParallelPlan(model=ModelRef.of(graph), ranks=o.ranks, comm=name,
                                  policy=policy, steps=3),
            samples_per_step=o.ranks * o.batch_size,
            description=f"{o.ranks} replicas, ring all-reduce, {name} tuned on the simulator: "
                        f"partition {format_size(best.partition_bytes)}, credit "
                        f"{format_size(best.credit_bytes)}, steady step of 3")
    return build


def _data_backprop(name: str, backprop: str) -> Strategy:
    """Comm policy ``name`` with the out-of-order backprop order ``backprop``, k chosen on the
    simulator (every k, the steady step, within the device's memory)."""
    def build(graph: Graph, cluster: Cluster, o: Options) -> Planned:
        from trainsched.sim.ooo import sweep_k

        policy = comm_policy(name)
        steps = default_steps(policy)
        sweep = sweep_k(graph, cluster, ranks=o.ranks, policy=policy, steps=steps,
                        memory_cap_bytes=cluster.device.memory_bytes)
        return Planned(
            plan=DataParallelPlan(model=ModelRef.of(graph), ranks=o.ranks, comm=name,
                                  policy=policy, steps=steps, backprop=backprop, k=sweep.k),
            samples_per_step=o.ranks * o.batch_size,
            description=f"{o.ranks} replicas, ring all-reduce, {name} gradient communication, "
                        f"{backprop} backprop deferring k = {sweep.k} of {sweep.layers} layers "
                        f"(chosen on the simulator), steady step of {steps}")
    return build


def default_microbatches(ranks: int, batch_size: int | None) -> int:
    """Micro-batches of a pipeline when none are asked for: two per stage, but never more than
    the batch has samples (a micro-batch holds at least one; ``None``: batch unknown)."""
    return 2 * ranks if batch_size is None else max(1, min(2 * ranks, batch_size))


def _pipeline(name: str) -> Strategy:
    def build(graph: Graph, cluster: Cluster, o: Options) -> Planned:
        batch = graph.meta.get("batch_size")  # the batch the graph was captured at, if known
        if is_int(batch) and o.microbatches > batch:
            raise TrainschedError(f"{o.microbatches} micro-batches of a batch of {batch}: a "
                                  f"micro-batch needs at least one sample; use at most {batch} "
                                  f"micro-batches or a larger batch")
        from trainsched.sim.pipeline_choice import plan_graph_stages

        sized = {o.microbatches: o.microbatch_graph} if o.microbatch_graph is not None else {}
        stages, schedule, _ = plan_graph_stages(graph, name, o.ranks, o.microbatches, cluster,
                                                sized=sized)
        plan = PipelinePlan(model=ModelRef.of(graph), stages=stages.ops, schedule=schedule,
                            schedule_name=name)
        return Planned(plan=plan, samples_per_step=o.batch_size,
                       description=f"{o.ranks} stages balanced by compute, {o.microbatches} "
                                   f"micro-batches")
    return build


def _placed(algorithm: str) -> Strategy:
    """Model parallelism: ops placed on ``o.ranks`` devices by ``placement.place``."""
    def build(graph: Graph, cluster: Cluster, o: Options) -> Planned:
        from trainsched.placement import place
        from trainsched.sim import predict_placement

        devices = cluster.first_devices(o.ranks)
        chosen = place(graph, devices, algorithm, predict=predict_placement)
        used = len(set(chosen.placement.device_of.values()))
        return Planned(plan=PlacedPlan(model=ModelRef.of(graph), placement=chosen.placement),
                       samples_per_step=o.batch_size,
                       description=f"{chosen.placer} placement on {used} of "
                                   f"{devices.num_devices} devices")
    return build


def strategies() -> dict[str, Strategy]:
    """Name -> builder, from the registries as they are now (module docstring); the first,
    ``single``, is the baseline every speedup is measured against."""
    out: dict[str, Strategy] = {"single": _single}
    for name in COMM_POLICIES.tagged("compare"):
        out[f"data-{name}"] = _data(name)
        if COMM_POLICIES.tags(name).get("tuned"):
            out[f"data-{name}-tuned"] = _data_tuned(name)
    for backprop in BACKPROP_ORDERS.tagged("compare"):
        for name in COMM_POLICIES.tagged("compare"):
            if comm_policy(name).cross_barrier:
                out[f"data-{name}+{backprop}"] = _data_backprop(name, backprop)
    for name in SCHEDULES.tagged("compare"):
        out[f"pipeline-{name}"] = _pipeline(name)
    out["placed-auto"] = _placed("auto")
    return out


def make_plans(graph: Graph, cluster: Cluster, options: Options,
               names: list[str] | None = None) -> dict[str, Planned]:
    """The plans of the strategies ``names`` (default: all), in that order; a strategy that
    cannot be built for this graph raises, naming it."""
    planned, skipped = plan_strategies(graph, cluster, options, names)
    if skipped:
        name, reason = next(iter(skipped.items()))
        raise TrainschedError(f"strategy {name!r}: {reason}")
    return planned


def plan_strategies(graph: Graph, cluster: Cluster, options: Options,
                    names: list[str] | None = None) -> tuple[dict[str, Planned], dict[str, str]]:
    """The plans of the strategies ``names`` (default: all) that can be built for ``graph``, in
    that order, and for each other one why not (its builder's error). ``single``, the baseline,
    must build: its error is raised."""
    if not isinstance(graph, Graph):
        raise TrainschedError(f"the strategies plan a Graph, got {type(graph).__name__}")
    if not isinstance(cluster, Cluster):
        raise TrainschedError(f"the strategies need a Cluster (trainsched.cluster."
                              f"resolve_cluster makes one), got {type(cluster).__name__}")
    if not isinstance(options, Options):
        raise TrainschedError(f"options must be a trainsched.strategies.Options, got "
                              f"{type(options).__name__}")
    known = strategies()
    names = list(known) if names is None else names
    unknown = [n for n in names if n not in known]
    if unknown:
        raise TrainschedError(f"unknown strategy {unknown[0]!r}; known: {', '.join(known)}")
    if options.ranks > cluster.num_devices:
        raise TrainschedError(f"ranks {options.ranks} is more than the cluster's "
                              f"{cluster.num_devices} devices")
    planned: dict[str, Planned] = {}
    skipped: dict[str, str] = {}
    for name in names:
        if name == "single":
            planned[name] = known[name](graph, cluster, options)
            continue
        try:
            planned[name] = known[name](graph, cluster, options)
        except TrainschedError as exc:
            skipped[name] = str(exc)
    return planned, skipped
