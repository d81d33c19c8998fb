"""``simulate(plan, graph, cluster)``: the one entry to the simulator for every kind of plan.

The plan is validated against the graph and the cluster first (a plan for another model, more
ranks than devices, a schedule for other stage counts: a clear error). A forward-only graph
gets its backward and optimizer ops (:func:`trainsched.graph.to_training`, plain SGD), as the
command line does. Each kind of plan goes to its executor:

- single device: :func:`simulate_single`, or with dW slots the two-stream executor
  :func:`simulate_slots`;
- placed: :func:`simulate_placed` on the cluster's first ``placement.num_devices`` devices;
- data parallel: :func:`simulate_data_parallel` with the plan's policy, algorithm, steps,
  start-up overlap and compute order (its backprop order and k,
  :func:`trainsched.backprop.reorder.backprop_order`);
- pipeline: the stages the plan's cuts make (:func:`stage_costs_from_graph`) under its
  schedule, :func:`simulate_pipeline`.
"""

from __future__ import annotations

from collections.abc import Mapping

from trainsched.backprop.reorder import backprop_order
from trainsched.backprop.stages import stage_costs_from_graph
from trainsched.cluster import Cluster
from trainsched.errors import TrainschedError
from trainsched.graph import Graph, to_training
from trainsched.plan import (
    DataParallelPlan,
    PipelinePlan,
    PlacedPlan,
    Placement,
    Plan,
    SinglePlan,
)
from trainsched.sim.data_parallel import simulate_data_parallel
from trainsched.sim.executors import Progress, simulate_placed, simulate_single
from trainsched.sim.pipeline import simulate_pipeline
from trainsched.sim.result import SimResult
from trainsched.sim.streams import simulate_slots

__all__ = ["check_costs_fit", "predict_placement", "simulate", "training_graph"]


def training_graph(graph: Graph) -> Graph:
    """``graph`` as a training graph: a forward-only graph gets backward and SGD ops."""
    if graph.forward_only():
        return to_training(graph)
    return graph


def _squashed(text: str) -> str:
    return "".join(ch for ch in text.lower() if ch.isalnum())


def check_costs_fit(graph: Graph, cluster: Cluster) -> None:
    """Refuse a graph whose costs belong to another device than the cluster's.

    ``graph.meta`` says how its costs were made (``tier``) and for which device (``device``):
    roofline costs for a catalogue kind fit clusters of that kind; costs measured on this
    host's CPU fit ``cpu`` clusters (the preset, a calibrated file); costs measured on a GPU
    fit clusters whose device kind names that GPU (``H100-80GB`` for an "NVIDIA H100 80GB
    HBM3"). A graph that says nothing (built by hand, static costs) is not checked.
    """
    tier, where = graph.meta.get("tier"), graph.meta.get("device")
    if tier not in ("measured", "roofline") or not isinstance(where, str) or not where:
        return
    kind = cluster.device.kind
    cpu_cluster = kind.lower().startswith("cpu")
    if tier == "roofline":
        fits = where == kind
    elif where.lower() == "cpu":
        fits = cpu_cluster
    else:
        fits = not cpu_cluster and _squashed(kind.split("-")[0]) in _squashed(where)
    if fits:
        return
    elsewhere = ("a cpu cluster (the cpu preset, or this host calibrated: trainsched calibrate)"
                 if where.lower() == "cpu" else f"a cluster of {where} devices")
    model = graph.meta.get("model")
    model = model if isinstance(model, str) and model else "MODEL"
    raise TrainschedError(
        f"the graph's costs are {tier} on {where}, but cluster {cluster.label} has {kind} "
        f"devices, so its step would be {where}'s, not {kind}'s: capture roofline costs for "
        f"{kind} (trainsched profile {model} --costs roofline --device-kind {kind}; in Python "
        f"capture(..., costs='roofline', device_kind='{kind}'); trainsched compare {model} "
        f"with the same --cluster captures them itself), or simulate on {elsewhere}")


def simulate(plan: Plan, graph: Graph, cluster: Cluster, *,
             progress: Progress | None = None,
             microbatch_graph: Graph | None = None) -> SimResult:
    """Predict one step of ``plan`` for ``graph`` on ``cluster`` (module docstring); a graph
    whose costs belong to another device kind is refused (:func:`check_costs_fit`).
    ``progress(done, total, phase)`` hears how far a single-device or placed simulation is
    (:func:`simulate_single`); the other executors do not report. ``microbatch_graph`` (a
    pipeline plan only): the model captured at the micro-batch size, whose costs are a
    micro-batch's (:func:`stage_costs_from_graph`)."""
    if not isinstance(graph, Graph):
        raise TrainschedError(f"simulate needs a Graph, got {type(graph).__name__}")
    if not isinstance(cluster, Cluster):
        raise TrainschedError(f"simulate needs a Cluster (trainsched.cluster.resolve_cluster "
                              f"makes one from a preset name), got {type(cluster).__name__}")
    check_costs_fit(graph, cluster)
    if microbatch_graph is not None:
        if not isinstance(plan, PipelinePlan):
            raise TrainschedError(f"a micro-batch graph costs a pipeline's micro-batches; this "
                                  f"is a {getattr(plan, 'kind', type(plan).__name__)} plan")
        check_costs_fit(microbatch_graph, cluster)
    graph = training_graph(graph)
    if isinstance(plan, SinglePlan):
        plan.validate(graph, cluster)
        if plan.slots:
            return simulate_slots(graph, cluster, plan.slots)
        return simulate_single(graph, cluster, progress=progress)
    if isinstance(plan, PlacedPlan):
        plan.validate(graph, cluster)
        devices = cluster.first_devices(plan.placement.num_devices)
        return simulate_placed(graph, devices, plan.placement, progress=progress)
    if isinstance(plan, DataParallelPlan):
        plan.validate(graph, cluster)
        order = backprop_order(plan.backprop, graph, plan.k)
        return simulate_data_parallel(graph, cluster, ranks=plan.ranks, policy=plan.policy,
                                      algorithm=plan.algorithm, steps=plan.steps,
                                      startup_overlap=plan.startup_overlap, order=order)
    if isinstance(plan, PipelinePlan):
        plan.validate(graph, cluster)
        stages = stage_costs_from_graph(graph, plan.num_stages, plan.num_microbatches,
                                        cut=list(plan.cuts), microbatch_graph=microbatch_graph)
        return simulate_pipeline(stages, plan.schedule, cluster)
    raise TrainschedError(f"not a plan: {type(plan).__name__} (trainsched.plan has the kinds)")


def predict_placement(graph: Graph, cluster: Cluster,
                      placement: Placement | Mapping[str, int]) -> tuple[float, tuple[int, ...]]:
    """The simulator's step time of a placement (replaying its stored order, see
    :func:`simulate_placed`) and its peak bytes per cluster device (0 where unused): the
    predictor :func:`trainsched.placement.place` takes. A forward-only graph (an inference
    graph, as placers also place) is predicted as its forward pass."""
    result = simulate_placed(graph, cluster, placement, allow_forward_only=True)
    peaks = tuple(result.peak_memory_bytes.get(name, 0) for name in cluster.device_names())
    return result.step_time_s, peaks
