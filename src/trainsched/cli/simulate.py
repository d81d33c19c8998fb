"""``trainsched simulate``: predict a training step of a graph on a cluster (torch-free).

One executor per ``--parallelism``; data parallelism takes a comm policy's flags, or
``--autotune`` to pick the bytescheduler policy's partition and credit by Bayesian search on the
simulator itself.
"""

from __future__ import annotations

import argparse
from typing import Any

from trainsched.backprop.schedules import SCHEDULES
from trainsched.cli.common import (
    Subcommands,
    add_json,
    add_tune_args,
    dump,
    given,
    parse_credit,
    training_graph,
    tune_ranges,
)
from trainsched.comm.policy import COMM_POLICIES
from trainsched.costs import ALGORITHMS
from trainsched.errors import TrainschedError
from trainsched.report.progress import ProgressBar
from trainsched.report.tables import simulate_report

NAME = "simulate"

PARALLELISMS = ("single", "placed", "data", "pipeline")

#: The policy flags of ``simulate --parallelism data`` and the policy fields they set.
POLICY_FLAGS = {"partition": "partition_bytes", "credit": "credit_bytes",
                "credit_mode": "credit_mode", "backfill": "backfill"}


def add_parser(sub: Subcommands) -> None:
    p = sub.add_parser(NAME, help="predict one training step of a graph on a cluster")
    p.add_argument("graph", help="a graph file (forward graphs get backward/optimizer ops)")
    p.add_argument("--cluster", required=True, help="preset, NAME:NODES, or a cluster file")
    p.add_argument("--plan", default=None,
                   help="simulate this plan file (trainsched compare writes one per strategy) "
                   "instead of the one the flags below describe")
    p.add_argument("--parallelism", choices=PARALLELISMS, default=None,
                   help="single (default), placed, data or pipeline")
    p.add_argument("--placement", default=None, help="placement file for --parallelism placed")
    p.add_argument("--ranks", type=int, default=None,
                   help="data-parallel ranks or pipeline stages (default: all devices)")
    p.add_argument("--comm-policy", default=None,
                   help=f"data parallel: {', '.join(COMM_POLICIES)} (default ddp)")
    p.add_argument("--partition", default=None,
                   help="data parallel: partition size (priority, bytescheduler, p3)")
    p.add_argument("--credit", default=None, help="data parallel: bytes in flight (or inf)")
    p.add_argument("--credit-mode", choices=("overdraft", "strict"), default=None)
    p.add_argument("--backfill", action="store_true",
                   help="data parallel, strict credit: the most urgent partition that fits "
                   "goes when the head does not")
    p.add_argument("--algorithm", default="ring", choices=ALGORITHMS,
                   help="data parallel: the all-reduce algorithm")
    p.add_argument("--startup-overlap", action="store_true",
                   help="data parallel: collectives in flight together overlap their start-up "
                   "latency (separate messages, as on parameter servers)")
    p.add_argument("--steps", type=int, default=None,
                   help="data parallel: steps simulated, the last one's period reported "
                   "(default 3 for a policy crossing the barrier, else 1)")
    p.add_argument("--autotune", action="store_true",
                   help="data parallel: pick the bytescheduler policy's partition and credit "
                   "by Bayesian search on the simulator")
    add_tune_args(p, "--autotune")
    p.add_argument("--schedule", default="1f1b",
                   help=f"pipeline schedule: {', '.join(SCHEDULES)}")
    p.add_argument("--microbatches", type=int, default=None,
                   help="pipeline micro-batches (default: 2 x stages)")
    p.add_argument("--optimizer", default="sgd", help="sgd, momentum or adam")
    p.add_argument("--trace", default=None, help="write a Chrome/Perfetto trace here (.gz ok)")
    add_json(p)
    p.set_defaults(func=run)


def build_plan(graph: Any, cluster: Any, args: argparse.Namespace, *, policy: Any = None,
               steps: int = 1) -> Any:
    """The plan the flags describe (``--parallelism`` and its options); data parallelism runs
    ``policy`` for ``steps`` steps."""
    from trainsched import plan as plans

    model = plans.ModelRef.of(graph)
    if args.parallelism == "single":
        return plans.SinglePlan(model=model)
    if args.parallelism == "placed":
        if not args.placement:
            raise TrainschedError("--parallelism placed needs --placement FILE "
                                  "(trainsched place writes one)")
        return plans.PlacedPlan(model=model, placement=plans.Placement.load(args.placement))
    ranks = args.ranks or cluster.num_devices
    if args.parallelism == "data":
        return plans.DataParallelPlan(model=model, ranks=ranks, comm=_comm_policy_name(args),
                                      policy=policy, algorithm=args.algorithm, steps=steps,
                                      startup_overlap=args.startup_overlap)
    from trainsched.backprop.schedules import build_schedule
    from trainsched.backprop.stages import stage_costs_from_graph

    micro = args.microbatches or 2 * ranks
    stages = stage_costs_from_graph(graph, ranks, micro)
    return plans.PipelinePlan(model=model, stages=stages.ops,
                              schedule=build_schedule(args.schedule, ranks, micro),
                              schedule_name=args.schedule.strip().lower())


def _data_policy(args: argparse.Namespace) -> Any:
    """The comm policy ``--comm-policy`` names, with the partition and credit flags given."""
    from trainsched.comm import comm_policy
    from trainsched.units import parse_size

    parse = {"partition": parse_size, "credit": parse_credit}
    options = {field: parse.get(flag, lambda v: v)(getattr(args, flag))
               for flag, field in POLICY_FLAGS.items() if getattr(args, flag) not in (None, False)}
    name = _comm_policy_name(args)
    if options and name in ("fifo", "ddp"):
        raise TrainschedError(f"{', '.join(given(args, list(POLICY_FLAGS)))}: --comm-policy "
                              f"{name} has no partition or credit; use priority, bytescheduler, "
                              f"tictac or p3")
    return comm_policy(name, **options)


def _comm_policy_name(args: argparse.Namespace) -> str:
    """``--comm-policy``; by default ddp, or bytescheduler with ``--autotune``."""
    if args.comm_policy is not None:
        return args.comm_policy.strip().lower()
    return "bytescheduler" if args.autotune else "ddp"


def _data_steps(args: argparse.Namespace, policy: Any) -> int:
    """``--steps``; by default 3 for a policy that crosses the barrier (its steady step), else 1."""
    if args.steps is not None:
        if args.steps < 1:
            raise TrainschedError(f"--steps must be >= 1, got {args.steps}")
        return args.steps
    return 3 if getattr(policy, "cross_barrier", False) else 1


def _simulate_autotune(graph: Any, cluster: Any, args: argparse.Namespace,
                       steps: int) -> tuple[Any, dict[str, Any]]:
    """``--autotune``: the tuner on the simulator (offline). Returns the bytescheduler policy at
    the point it picks (exactly the policy its trials simulated) and the tuner's result."""
    from trainsched.comm import ByteSchedulerPolicy
    from trainsched.comm.tune import tune, tuned_policy
    from trainsched.sim.tune import simulated_objective

    if _comm_policy_name(args) != "bytescheduler":
        raise TrainschedError(f"--autotune tunes the bytescheduler policy; drop --comm-policy "
                              f"{args.comm_policy} (or use --comm-policy bytescheduler)")
    if args.partition is not None or args.credit is not None:
        raise TrainschedError("--autotune picks --partition and --credit itself; drop them")
    partition_range, credit_range = tune_ranges(args)
    options: dict[str, Any] = {"credit_mode": args.credit_mode} if args.credit_mode else {}
    if args.backfill:
        options["backfill"] = True
    objective = simulated_objective(graph, cluster, args.ranks or cluster.num_devices,
                                    args.algorithm, steps=steps,
                                    startup_overlap=args.startup_overlap, **options)
    startup = min(10, args.tune_trials)
    with ProgressBar("tuning", enabled=not args.json) as bar:
        result = tune(objective, partition_range=partition_range, credit_range=credit_range,
                      startup_trials=startup, guided_trials=args.tune_trials - startup,
                      seed=args.tune_seed,
                      on_trial=lambda t: bar.update(t.number + 1, args.tune_trials))
    policy = tuned_policy(ByteSchedulerPolicy(**options), result.partition_bytes,
                          result.credit_bytes)
    return policy, result.to_dict()


def _policy_doc(policy: Any) -> dict[str, Any]:
    """A policy as JSON: its name and fields (an unlimited credit as ``"inf"``)."""
    from dataclasses import asdict, is_dataclass

    fields = asdict(policy) if is_dataclass(policy) else {}
    if fields.get("credit_bytes") == float("inf"):
        fields["credit_bytes"] = "inf"
    return {"class": type(policy).__name__, **fields}


#: The flags that describe a plan, which ``--plan`` replaces.
PLAN_FLAGS = ("parallelism", "placement", "ranks", "comm_policy", *POLICY_FLAGS, "steps",
              "autotune", "startup_overlap", "microbatches")


def run(args: argparse.Namespace) -> int:
    from trainsched.cluster import resolve_cluster
    from trainsched.comm import ByteSchedulerPolicy
    from trainsched.sim import bubble_fraction, simulate, write_trace

    if args.plan is not None:
        flags = given(args, PLAN_FLAGS)
        flags += [f"--{k}" for k, v in (("algorithm", "ring"), ("schedule", "1f1b"))
                  if getattr(args, k) != v]
        if flags:
            raise TrainschedError(f"{', '.join(flags)}: the plan file describes the run; drop "
                                  f"{'them' if len(flags) > 1 else 'it'} or drop --plan")
        return _run_plan_file(args)
    args.parallelism = args.parallelism or "single"
    if args.parallelism != "data":
        flags = given(args, [*POLICY_FLAGS, "comm_policy", "steps", "autotune",
                             "startup_overlap"])
        if args.algorithm != "ring":
            flags.append("--algorithm")
        if flags:
            raise TrainschedError(f"{', '.join(flags)}: data-parallel options; add "
                                  f"--parallelism data")
    graph = training_graph(args.graph, args.optimizer)
    cluster = resolve_cluster(args.cluster)
    policy, steps, autotune = None, 1, None
    if args.parallelism == "data" and args.autotune:
        steps = _data_steps(args, ByteSchedulerPolicy())  # the policy it tunes
        policy, autotune = _simulate_autotune(graph, cluster, args, steps)
    elif args.parallelism == "data":
        policy = _data_policy(args)
        steps = _data_steps(args, policy)
    plan = build_plan(graph, cluster, args, policy=policy, steps=steps)
    result = simulate(plan, graph, cluster)
    if args.trace:
        write_trace(args.trace, result, title=f"{graph.meta.get('model', 'graph')} "
                    f"{args.parallelism}", meta={"parallelism": args.parallelism,
                                                 "cluster": cluster.name})
    doc = {
        "parallelism": args.parallelism,
        "cluster": cluster.name,
        "step_time_s": result.step_time_s,
        "dependency_bound_s": result.dependency_bound_s,
        "exposed_comm_s": result.exposed_comm_s,
        "bubble_fraction": bubble_fraction(result),
        "peak_memory_bytes": dict(result.peak_memory_bytes),
        "oom": dict(result.oom),
        "events": result.events,
        "trace": args.trace,
    }
    if args.parallelism == "data":
        from trainsched.sim import crossing_bound_s

        ranks = args.ranks or cluster.num_devices
        bound, gradient = crossing_bound_s(graph, cluster, ranks=ranks, algorithm=args.algorithm)
        doc.update(ranks=ranks, algorithm=args.algorithm, steps=steps,
                   policy=_policy_doc(policy), crossing_bound_s=bound,
                   crossing_bound_gradient=gradient, autotune=autotune)
    print(dump(doc) if args.json else simulate_report(doc, graph.meta.get("model", args.graph)))
    return 0


def _run_plan_file(args: argparse.Namespace) -> int:
    """``--plan FILE``: the plan file's plan, simulated on ``--cluster``."""
    from trainsched.cluster import resolve_cluster
    from trainsched.plan import DataParallelPlan, load_plan
    from trainsched.sim import bubble_fraction, crossing_bound_s, simulate, write_trace

    graph = training_graph(args.graph, args.optimizer)
    cluster = resolve_cluster(args.cluster)
    plan = load_plan(args.plan)
    result = simulate(plan, graph, cluster)
    if args.trace:
        write_trace(args.trace, result, title=f"{graph.meta.get('model', 'graph')} {plan.kind}",
                    meta={"parallelism": plan.kind, "cluster": cluster.name})
    doc = {"parallelism": plan.kind, "plan": args.plan, "cluster": cluster.name,
           "step_time_s": result.step_time_s, "dependency_bound_s": result.dependency_bound_s,
           "exposed_comm_s": result.exposed_comm_s, "bubble_fraction": bubble_fraction(result),
           "peak_memory_bytes": dict(result.peak_memory_bytes), "oom": dict(result.oom),
           "events": result.events, "trace": args.trace}
    if isinstance(plan, DataParallelPlan):
        bound, gradient = crossing_bound_s(graph, cluster, ranks=plan.ranks,
                                           algorithm=plan.algorithm)
        doc.update(ranks=plan.ranks, algorithm=plan.algorithm, steps=plan.steps,
                   policy=_policy_doc(plan.policy), crossing_bound_s=bound,
                   crossing_bound_gradient=gradient, autotune=None)
    print(dump(doc) if args.json else simulate_report(doc, graph.meta.get("model", args.graph)))
    return 0
