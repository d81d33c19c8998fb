"""``trainsched simulate --parallelism pipeline``: the plan its flags describe, the micro-batch
graphs (``--microbatch-graph``) that cost its micro-batches, ``--schedule auto`` and the
pipeline's part of the report."""

from __future__ import annotations

import argparse
import contextlib
from typing import Any

from trainsched.cli.common import error_context, training_graph
from trainsched.errors import TrainschedError
from trainsched.report.progress import ProgressBar

__all__ = ["auto_pipeline", "microbatch_graphs", "pipeline_doc", "pipeline_plan",
           "plan_microbatch_graph"]


def microbatch_graphs(graph: Any, args: argparse.Namespace) -> dict[int, Any]:
    """The ``--microbatch-graph`` files as training graphs, by the micro-batch count each makes
    of ``graph``'s batch (:func:`~trainsched.backprop.stages.microbatch_count`)."""
    from trainsched.backprop.stages import microbatch_count

    sized: dict[int, Any] = {}
    for path in args.microbatch_graph or ():
        micro = training_graph(path, args)
        with error_context(f"--microbatch-graph {path}"):
            count = microbatch_count(graph, micro)
            if count is None:
                raise TrainschedError(
                    f"it or {args.graph} does not record its batch size (meta batch_size), so "
                    f"the micro-batch count is unknown: profile both with --batch-size")
            if count in sized:
                raise TrainschedError(f"a second graph of 1/{count} of the batch; give one "
                                      f"per micro-batch count")
        sized[count] = micro
    return sized


def pipeline_plan(graph: Any, cluster: Any, args: argparse.Namespace, ranks: int,
                  sized: dict[int, Any]) -> Any:
    """The pipeline plan of ``--schedule`` (default 1F1B; ``auto``: :func:`auto_pipeline`'s)
    over ``ranks`` ranks, its micro-batches costed by ``sized`` where it has their count, its
    cut chosen by :func:`trainsched.sim.pipeline_choice.plan_stages`."""
    from trainsched import plan as plans
    from trainsched.sim.pipeline_choice import plan_graph_stages
    from trainsched.strategies import default_microbatches

    if (args.schedule or "").strip().lower() == "auto":
        return auto_pipeline(graph, cluster, args, ranks, sized)[0]
    if args.memory_limit is not None:
        raise TrainschedError("--memory-limit: the limit picks a schedule; it applies with "
                              "--schedule auto")
    if len(sized) > 1:
        raise TrainschedError(f"--microbatch-graph: {len(sized)} files cost "
                              f"{len(sized)} micro-batch counts, and one schedule runs one; "
                              f"give one, or several with --schedule auto")
    batch = graph.meta.get("batch_size")
    micro = args.microbatches or next(iter(sized), None) or default_microbatches(ranks, batch)
    if sized and micro not in sized:
        raise TrainschedError(f"--microbatches {micro}: the --microbatch-graph holds 1/"
                              f"{next(iter(sized))} of the batch; drop --microbatches (the "
                              f"graph sets the count) or profile 1/{micro} of the batch")
    if isinstance(batch, int) and micro > batch:
        raise TrainschedError(f"--microbatches {micro}: the graph's batch has {batch} samples "
                              f"and a micro-batch needs at least one; give at most {batch}")
    name = (args.schedule or "1f1b").strip().lower()

    stages, schedule, _ = plan_graph_stages(graph, name, ranks, micro, cluster, sized=sized)
    return plans.PipelinePlan(model=plans.ModelRef.of(graph), stages=stages.ops,
                              schedule=schedule, schedule_name=name)


def auto_pipeline(graph: Any, cluster: Any, args: argparse.Namespace, ranks: int,
                  sized: dict[int, Any]) -> tuple[Any, Any]:
    """``--schedule auto``: the plan of the schedule and micro-batch count that
    :func:`trainsched.sim.pipeline_choice.choose_pipeline` picks (micro-batches costed by
    ``sized`` where given), and its choice."""
    from trainsched import plan as plans
    from trainsched.sim.pipeline_choice import choose_pipeline
    from trainsched.units import parse_size

    limit = None if args.memory_limit is None else parse_size(args.memory_limit)
    with error_context("--microbatch-graph") if sized else contextlib.nullcontext(), \
            ProgressBar("choosing a schedule", enabled=not args.json) as bar:
        choice = choose_pipeline(graph, cluster, ranks, memory_limit_bytes=limit,
                                 microbatches=[args.microbatches] if args.microbatches else None,
                                 microbatch_graphs=sized, progress=bar.update)
    plan = plans.PipelinePlan(model=plans.ModelRef.of(graph), stages=choice.stages.ops,
                              schedule=choice.schedule, schedule_name=choice.schedule_name)
    return plan, choice


def plan_microbatch_graph(plan: Any, graph: Any, args: argparse.Namespace) -> Any:
    """``--plan FILE --microbatch-graph FILE``: the micro-batch graph of the plan's count
    (``None`` without the flag); refused for a plan that is not a pipeline's."""
    from trainsched.plan import PipelinePlan

    if not args.microbatch_graph:
        return None
    if not isinstance(plan, PipelinePlan):
        raise TrainschedError(f"--microbatch-graph: the plan in {args.plan} is a {plan.kind} "
                              f"plan; micro-batch graphs cost a pipeline's micro-batches")
    sized = microbatch_graphs(graph, args)
    micro_graph = sized.get(plan.num_microbatches)
    if len(sized) > 1 or micro_graph is None:
        raise TrainschedError(
            f"--microbatch-graph: the plan in {args.plan} runs {plan.num_microbatches} "
            f"micro-batches; give the one graph of 1/{plan.num_microbatches} of the batch "
            f"(given: 1/{', 1/'.join(map(str, sorted(sized)))})")
    return micro_graph


def pipeline_doc(plan: Any, graph: Any, micro_graph: Any) -> dict[str, Any]:
    """A pipeline plan's shape for the report: schedule, stages, micro-batches, samples in
    each (where the graph's batch says) and where a micro-batch's costs came from:
    ``"graph"`` (a micro-batch graph), ``"divided"`` or ``"divided, launches whole"``
    (:func:`~trainsched.backprop.stages.launch_s`)."""
    from trainsched.backprop.stages import launch_s
    from trainsched.units import is_int

    batch, m = graph.meta.get("batch_size"), plan.num_microbatches
    costs = "graph" if micro_graph is not None else \
        "divided, launches whole" if launch_s(graph) else "divided"
    return {"schedule": plan.schedule_name, "stages": plan.num_stages, "microbatches": m,
            "microbatch_samples": batch // m if is_int(batch) and batch % m == 0 else None,
            "microbatch_costs": costs}
