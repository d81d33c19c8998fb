"""``trainsched simulate``: predict a training step of a graph on a cluster (torch-free).

One executor per ``--parallelism``; data parallelism takes a comm policy's flags, or
``--autotune`` to pick the bytescheduler policy's partition and credit by Bayesian search on the
simulator itself, and ``--backprop ooo [--k K]`` for out-of-order backprop (reverse-first-k; k
chosen by simulating every k when not given, ``trainsched.sim.sweep_k``). ``--sync POLICY``
(or a plan file whose sync policy is not plain BSP, or a ``--straggler``) adds the multi-step
protocol simulation (:mod:`trainsched.sim.sync`): the policy beside pure BSP, time per step
and per sample, staleness. ``--servers S --server-placement dedicated|colocated`` set the
plan's parameter servers for a policy with a server phase (default: the cluster's parameter
servers, dedicated; one where it describes none).
"""

from __future__ import annotations

import argparse
from typing import Any

from trainsched.backprop.reorder import BACKPROP_ORDERS
from trainsched.backprop.schedules import SCHEDULES
from trainsched.cli.common import (
    TUNE_FLAGS,
    Applies,
    Fact,
    Subcommands,
    add_json,
    add_optimizer,
    add_tune_args,
    check_applicable,
    check_count,
    collector_paused,
    dump,
    given,
    parse_credit,
    training_graph,
    tune_ranges,
)
from trainsched.cli.simulate_pipeline import (
    auto_pipeline,
    microbatch_graphs,
    pipeline_doc,
    pipeline_plan,
    plan_microbatch_graph,
)
from trainsched.cli.simulate_sync import (
    STEP_NOISE,
    SYNC_FLAGS,
    SYNC_STEPS,
    plan_servers,
    sync_doc,
)
from trainsched.comm.policy import COMM_POLICIES, CREDIT_MODES
from trainsched.costs import ALGORITHMS
from trainsched.errors import TrainschedError
from trainsched.plan.plans import SERVER_PLACEMENTS
from trainsched.report.progress import ProgressBar
from trainsched.report.tables import simulate_report
from trainsched.units import is_int

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
                   help=f"data parallel: {', '.join(COMM_POLICIES)} (default ddp; bytescheduler "
                   f"with --autotune or an out-of-order --backprop)")
    p.add_argument("--partition", default=None,
                   help="data parallel: partition size (priority, bytescheduler, p3)")
    p.add_argument("--credit", default=None, help="data parallel: bytes in flight (or inf)")
    p.add_argument("--credit-mode", choices=CREDIT_MODES, default=None,
                   help="data parallel: strict or overdraft (default: the policy's)")
    p.add_argument("--backfill", action="store_true",
                   help="data parallel, strict credit: the most urgent partition that fits "
                   "goes when the head does not")
    p.add_argument("--algorithm", default=None, choices=ALGORITHMS,
                   help="data parallel: the all-reduce algorithm (default ring)")
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
    p.add_argument("--backprop", choices=tuple(BACKPROP_ORDERS), default=None,
                   help="in-order backprop (default) or ooo: on one device, weight gradients "
                   "on a second stream (slots chosen by the simulator); data parallel, "
                   "reverse-first-k: the weight gradients of the first k layers run after the "
                   "last input gradient, their updates just before their next forward")
    p.add_argument("--k", type=int, default=None,
                   help="data parallel, --backprop ooo: layers deferred (default: the fastest "
                   "k the simulator finds within the device's memory)")
    p.add_argument("--schedule", default=None,
                   help=f"pipeline schedule: {', '.join(SCHEDULES)}, or auto: the schedule and "
                   "micro-batch count with the shortest simulated step (default 1f1b)")
    p.add_argument("--microbatches", type=int, default=None,
                   help="pipeline micro-batches (default: 2 x stages; with --schedule auto, "
                   "every divisor of the batch)")
    p.add_argument("--microbatch-graph", action="append", default=None, metavar="FILE",
                   help="pipeline: the same model profiled at a micro-batch's size (the graph's "
                   "batch / micro-batches), whose costs one micro-batch then has instead of the "
                   "graph's divided (measured costs do not divide); it sets the micro-batch "
                   "count; with --schedule auto, one per count to try (repeatable)")
    p.add_argument("--memory-limit", default=None, metavar="SIZE",
                   help="pipeline, --schedule auto: memory per device the schedule must fit "
                   "in (default: the cluster's device memory)")
    p.add_argument("--sync", default=None, metavar="POLICY",
                   help="data parallel: sync policy, e.g. bsp, asp, ssp:S, k-of-n:K, local:H, "
                   "bsp:0.125,asp:0.875, bsp:0.5,ssp(s=4):0.5 (default bsp); simulates it over "
                   "many steps")
    p.add_argument("--servers", type=int, default=None,
                   help="data parallel, a --sync policy with asp, ssp or k-of-n: parameter "
                   "servers, one shard of the parameters each (default: the cluster's, else 1)")
    p.add_argument("--server-placement", choices=SERVER_PLACEMENTS, default=None,
                   help="data parallel, with --servers' policies: dedicated (default: hosts of "
                   "their own behind the cluster's server link) or colocated (shard j on worker "
                   "j's host, sharing its network link)")
    p.add_argument("--straggler", action="append", default=None, metavar="RANK:DELAY[:FROM-TO]",
                   help="data parallel, protocol simulation: slow a rank by a delay (1:50ms) "
                   "or a factor (2:3x), or delay every message it sends (1:20ms@link), "
                   "optionally in steps FROM to TO-1 (2:3x:100-400); repeatable")
    p.add_argument("--sync-steps", type=int, default=None,
                   help="data parallel, protocol simulation: BSP steps' worth of samples to "
                   f"simulate (default {SYNC_STEPS})")
    p.add_argument("--step-noise", type=float, default=None,
                   help="data parallel, protocol simulation: coefficient of variation of each "
                   f"rank's step time (default {STEP_NOISE})")
    p.add_argument("--switch-cost", default=None,
                   help="data parallel, protocol simulation: time one switch between phases "
                   "costs (default 0)")
    add_optimizer(p)
    p.add_argument("--trace", default=None, help="write a Chrome/Perfetto trace here (.gz ok)")
    add_json(p)
    p.set_defaults(func=run)


#: Which flags apply with which ``--parallelism`` (``plan``: ``--plan FILE``) and whether
#: ``--autotune`` is on (:func:`trainsched.cli.common.check_applicable`).
RULES = (
    Applies(flags=("parallelism",), when={"parallelism": PARALLELISMS}, where="without --plan"),
    Applies(flags=("placement",), when={"parallelism": ("placed",)},
            where="with --parallelism placed"),
    Applies(flags=("ranks",), when={"parallelism": ("data", "pipeline")},
            where="with --parallelism data or pipeline"),
    Applies(flags=("comm_policy", "credit_mode", "backfill", "algorithm", "startup_overlap",
                   "steps", "autotune", "sync", "servers", "server_placement"),
            when={"parallelism": ("data",)},
            where="with --parallelism data"),
    Applies(flags=SYNC_FLAGS, when={"parallelism": ("data", "plan")},
            where="with --parallelism data or a data-parallel --plan"),
    Applies(flags=("partition", "credit"), when={"parallelism": ("data",), "autotune": (False,)},
            where="with --parallelism data, without --autotune (the tuner picks them)"),
    Applies(flags=TUNE_FLAGS, when={"parallelism": ("data",), "autotune": (True,)},
            where="with --parallelism data --autotune"),
    Applies(flags=("backprop",), when={"parallelism": ("single", "data"), "autotune": (False,)},
            where="with --parallelism single or data, without --autotune"),
    Applies(flags=("k",), when={"parallelism": ("data",), "autotune": (False,),
                                "backprop": tuple(n for n in BACKPROP_ORDERS if n != "inorder")},
            where="with --parallelism data --backprop ooo (in-order backprop defers no layer)"),
    Applies(flags=("schedule", "microbatches", "memory_limit"),
            when={"parallelism": ("pipeline",)}, where="with --parallelism pipeline"),
    Applies(flags=("microbatch_graph",), when={"parallelism": ("pipeline", "plan")},
            where="with --parallelism pipeline or a pipeline --plan"),
)


def check_flags(args: argparse.Namespace) -> None:
    """Refuse every flag that does not apply to the run the others describe (:data:`RULES`)."""
    mode = "plan" if args.plan is not None else args.parallelism or "single"
    facts = {
        "parallelism": Fact(value=mode, text="with --plan FILE (the plan file describes the run)"
                            if mode == "plan" else f"with --parallelism {mode}"),
        "autotune": Fact(value=bool(args.autotune),
                         text="with --autotune" if args.autotune else "without --autotune"),
        "backprop": Fact(value=args.backprop or "inorder",
                         text=f"with --backprop {args.backprop or 'inorder'}"),
    }
    check_applicable(args, RULES, facts)


def costs_line(graph: Any) -> str | None:
    """Where the graph's costs come from, for the report's header: tier, device, precision."""
    tier = graph.meta.get("tier")
    if tier is None:
        return None
    where = graph.meta.get("device")
    precision = graph.meta.get("precision", "fp32")
    return f"{tier}{f' on {where}' if where and tier != 'static' else ''}, {precision}"


def batch_doc(graph: Any) -> dict[str, Any] | None:
    """The samples (and tokens per sample) the graph was captured at, where its meta says:
    one device's batch, a data-parallel rank's, or a pipeline step's."""
    samples, seq = graph.meta.get("batch_size"), graph.meta.get("seq_len")
    if not is_int(samples):
        return None
    return {"samples": samples, "seq_len": seq if is_int(seq) else None}


def build_plan(graph: Any, cluster: Any, args: argparse.Namespace, *, policy: Any = None,
               steps: int = 1, k: int = 0, slots: tuple[Any, ...] = (),
               sized: dict[int, Any] | None = None) -> Any:
    """The plan the flags describe (``--parallelism`` and its options); data parallelism runs
    ``policy`` for ``steps`` steps, deferring ``k`` layers with an out-of-order
    ``--backprop``; one device runs its weight gradients in ``slots``; a pipeline's
    micro-batches cost what ``sized`` (:func:`~.simulate_pipeline.microbatch_graphs`) says for
    their count."""
    from trainsched import plan as plans

    model = plans.ModelRef.of(graph)
    parallelism = args.parallelism or "single"
    if parallelism == "single":
        return plans.SinglePlan(model=model, slots=slots)
    if parallelism == "placed":
        if not args.placement:
            raise TrainschedError("--parallelism placed needs --placement FILE "
                                  "(trainsched place writes one)")
        return plans.PlacedPlan(model=model, placement=plans.Placement.load(args.placement))
    ranks = _ranks(args, cluster)
    if parallelism == "data":
        return plans.DataParallelPlan(model=model, ranks=ranks, comm=_comm_policy_name(args),
                                      policy=policy, algorithm=args.algorithm or "ring",
                                      steps=steps, startup_overlap=args.startup_overlap,
                                      backprop=args.backprop or "inorder", k=k,
                                      sync=args.sync or "bsp", **plan_servers(args, cluster))
    return pipeline_plan(graph, cluster, args, ranks, sized or {})


def _ranks(args: argparse.Namespace, cluster: Any) -> int:
    """``--ranks``, checked against the cluster; by default all its devices."""
    check_count("--ranks", args.ranks, 1, cluster.num_devices,
                f"the cluster {cluster.label} has {cluster.num_devices} devices")
    return args.ranks or cluster.num_devices


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
    """``--comm-policy``; by default ddp, or bytescheduler with ``--autotune`` or an
    out-of-order ``--backprop`` (its deferred layers update lazily: a policy crossing the
    barrier)."""
    if args.comm_policy is not None:
        return args.comm_policy.strip().lower()
    ooo = (args.backprop or "inorder") != "inorder"
    return "bytescheduler" if args.autotune or ooo else "ddp"


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
    partition_range, credit_range = tune_ranges(args)
    options: dict[str, Any] = {"credit_mode": args.credit_mode} if args.credit_mode else {}
    if args.backfill:
        options["backfill"] = True
    objective = simulated_objective(graph, cluster, _ranks(args, cluster),
                                    args.algorithm or "ring", steps=steps,
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


def run(args: argparse.Namespace) -> int:
    from trainsched.cluster import resolve_cluster
    from trainsched.comm import ByteSchedulerPolicy
    from trainsched.sim import bubble_fraction, simulate, write_trace

    check_flags(args)
    check_count("--ranks", args.ranks, 1)
    check_count("--microbatches", args.microbatches, 1)
    if args.plan is not None:
        return _run_plan_file(args)
    args.parallelism = args.parallelism or "single"
    graph = training_graph(args.graph, args)
    cluster = resolve_cluster(args.cluster)
    policy, steps, autotune = None, 1, None
    if args.parallelism == "data" and args.autotune:
        steps = _data_steps(args, ByteSchedulerPolicy())  # the policy it tunes
        policy, autotune = _simulate_autotune(graph, cluster, args, steps)
    elif args.parallelism == "data":
        policy = _data_policy(args)
        steps = _data_steps(args, policy)
    k, sweep, choice, pipeline_choice = 0, None, None, None
    ooo = (args.backprop or "inorder") != "inorder"
    if args.parallelism == "data" and ooo:
        k, sweep = _choose_k(graph, cluster, args, policy, steps)
    if args.parallelism == "single" and ooo:
        from trainsched.sim import choose_slots

        choice = choose_slots(graph, cluster)
    sized = microbatch_graphs(graph, args) if args.parallelism == "pipeline" else {}
    if args.parallelism == "pipeline" and (args.schedule or "").strip().lower() == "auto":
        plan, pipeline_choice = auto_pipeline(graph, cluster, args, _ranks(args, cluster),
                                              sized)
    else:
        plan = build_plan(graph, cluster, args, policy=policy, steps=steps, k=k,
                          slots=choice.slots if choice is not None else (), sized=sized)
    micro_graph = sized.get(plan.num_microbatches) if sized else None
    with collector_paused(lambda: len(graph)), \
            ProgressBar("simulating", enabled=not args.json) as bar:
        result = simulate(plan, graph, cluster, progress=bar.update,
                          microbatch_graph=micro_graph)
    slowest = (_slowest_rank_doc(cluster, _ranks(args, cluster))
               if args.parallelism == "data" else None)
    if args.trace:
        write_trace(args.trace, result, title=f"{graph.meta.get('model', 'graph')} "
                    f"{args.parallelism}", meta={"parallelism": args.parallelism,
                                                 "cluster": cluster.label,
                                                 **_slowest_meta(slowest)})
    doc = {
        "parallelism": args.parallelism,
        "cluster": cluster.label,
        "step_time_s": result.step_time_s,
        "dependency_bound_s": result.dependency_bound_s,
        "exposed_comm_s": result.exposed_comm_s,
        "bubble_fraction": bubble_fraction(result),
        "peak_memory_bytes": dict(result.peak_memory_bytes),
        "oom": dict(result.oom),
        "events": result.events, "costs": costs_line(graph), "batch": batch_doc(graph),
        "trace": args.trace,
    }
    if args.parallelism == "pipeline":
        doc["pipeline"] = pipeline_doc(plan, graph, micro_graph)
    if choice is not None:
        doc["slots"] = _slots_doc(choice)
    if pipeline_choice is not None:
        doc["choice"] = pipeline_choice.to_dict()
    if args.parallelism == "data":
        from trainsched.sim import crossing_bound_s

        ranks = _ranks(args, cluster)
        algorithm = args.algorithm or "ring"
        bound, gradient = crossing_bound_s(graph, cluster, ranks=ranks, algorithm=algorithm)
        doc.update(ranks=ranks, algorithm=algorithm, steps=steps,
                   policy=_policy_doc(policy), crossing_bound_s=bound,
                   crossing_bound_gradient=gradient, autotune=autotune,
                   backprop=_backprop_doc(plan, graph, sweep),
                   sync=sync_doc(plan, graph, cluster, result, args), **_slowest_meta(slowest))
    print(dump(doc) if args.json else simulate_report(doc, graph.meta.get("model", args.graph)))
    return 0


def _slowest_rank_doc(cluster: Any, ranks: int) -> dict[str, Any] | None:
    """The slowest-rank stretch a data-parallel simulation applied (``DeviceSpec.step_cv`` and
    ``device_cv``): None where it applied none (both 0, or one rank)."""
    from trainsched.costs import expected_max_normal, slowest_rank_factor

    device = cluster.device
    cv = device.slowest_rank_cv
    if cv == 0 or ranks == 1:
        return None
    return {"step_cv": device.step_cv, "device_cv": device.device_cv, "cv": cv,
            "ranks": ranks, "expected_max": expected_max_normal(ranks),
            "factor": slowest_rank_factor(cv, ranks)}


def _slowest_meta(slowest: dict[str, Any] | None) -> dict[str, Any]:
    """The ``slowest_rank`` entry of a report or trace header, only where it was applied (so
    that runs without it keep their bytes)."""
    return {} if slowest is None else {"slowest_rank": slowest}


def _choose_k(graph: Any, cluster: Any, args: argparse.Namespace, policy: Any,
              steps: int) -> tuple[int, Any]:
    """``--k`` checked against the model's layers, or (without it) the k the simulator picks
    within the device's memory (``sim.sweep_k``) and the sweep."""
    from trainsched.backprop.reorder import check_k
    from trainsched.plan import DataParallelPlan, ModelRef

    # the policy must suit out-of-order backprop before anything is simulated
    DataParallelPlan(model=ModelRef.of(graph), ranks=1, comm=_comm_policy_name(args),
                     policy=policy, backprop=args.backprop)
    if args.k is not None:
        check_k(graph, args.k, "--k")
        return args.k, None
    from trainsched.sim import sweep_k

    sweep = sweep_k(graph, cluster, ranks=_ranks(args, cluster), policy=policy,
                    algorithm=args.algorithm or "ring", steps=steps,
                    startup_overlap=args.startup_overlap,
                    memory_cap_bytes=cluster.device.memory_bytes)
    return sweep.k, sweep


def _slots_doc(choice: Any) -> dict[str, Any]:
    """The single-device slots the simulator chose, for the report."""
    return {"slots": [str(s) for s in choice.slots], "step_time_s": choice.step_time_s,
            "inline_step_time_s": choice.inline_step_time_s, "speedup": choice.speedup,
            "simulations": choice.simulations}


def _backprop_doc(plan: Any, graph: Any, sweep: Any) -> dict[str, Any]:
    """The backprop order of a data-parallel plan for the report: its name, k, the layer
    count and, when the simulator chose k, the sweep (step time of every k)."""
    from trainsched.backprop.reorder import deferred_bytes, layers

    doc: dict[str, Any] = {"name": plan.backprop, "k": plan.k, "layers": len(layers(graph)),
                           "deferred_bytes": deferred_bytes(graph, plan.k)}
    if sweep is not None:
        doc["sweep"] = sweep.to_dict()
    return doc


def _run_plan_file(args: argparse.Namespace) -> int:
    """``--plan FILE``: the plan file's plan, simulated on ``--cluster``."""
    from trainsched.cluster import resolve_cluster
    from trainsched.plan import DataParallelPlan, PipelinePlan, load_plan
    from trainsched.sim import bubble_fraction, crossing_bound_s, simulate, write_trace

    graph = training_graph(args.graph, args)
    cluster = resolve_cluster(args.cluster)
    plan = load_plan(args.plan)
    micro_graph = plan_microbatch_graph(plan, graph, args)
    with collector_paused(lambda: len(graph)), \
            ProgressBar("simulating", enabled=not args.json) as bar:
        result = simulate(plan, graph, cluster, progress=bar.update, microbatch_graph=micro_graph)
    slowest = (_slowest_rank_doc(cluster, plan.ranks)
               if isinstance(plan, DataParallelPlan) else None)
    if args.trace:
        write_trace(args.trace, result, title=f"{graph.meta.get('model', 'graph')} {plan.kind}",
                    meta={"parallelism": plan.kind, "cluster": cluster.label,
                          **_slowest_meta(slowest)})
    doc = {"parallelism": plan.kind, "plan": args.plan, "cluster": cluster.label,
           "step_time_s": result.step_time_s, "dependency_bound_s": result.dependency_bound_s,
           "exposed_comm_s": result.exposed_comm_s, "bubble_fraction": bubble_fraction(result),
           "peak_memory_bytes": dict(result.peak_memory_bytes), "oom": dict(result.oom),
           "events": result.events, "costs": costs_line(graph), "batch": batch_doc(graph),
           "trace": args.trace}
    if isinstance(plan, PipelinePlan):
        doc["pipeline"] = pipeline_doc(plan, graph, micro_graph)
    if isinstance(plan, DataParallelPlan):
        bound, gradient = crossing_bound_s(graph, cluster, ranks=plan.ranks,
                                           algorithm=plan.algorithm)
        doc.update(ranks=plan.ranks, algorithm=plan.algorithm, steps=plan.steps,
                   policy=_policy_doc(plan.policy), crossing_bound_s=bound,
                   crossing_bound_gradient=gradient, autotune=None,
                   backprop=_backprop_doc(plan, graph, None),
                   sync=sync_doc(plan, graph, cluster, result, args), **_slowest_meta(slowest))
    elif given(args, list(SYNC_FLAGS)):
        raise TrainschedError(f"{', '.join(given(args, list(SYNC_FLAGS)))}: the plan in "
                              f"{args.plan} is a {plan.kind} plan; the protocol simulation "
                              f"needs a data-parallel plan")
    print(dump(doc) if args.json else simulate_report(doc, graph.meta.get("model", args.graph)))
    return 0
