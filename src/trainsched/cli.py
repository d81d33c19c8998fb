"""The ``trainsched`` command line: parses, calls the library, prints.

User errors (:class:`TrainschedError`) print one line on stderr and exit with status 2; ``--json``
prints machine-readable results on stdout. torch is imported only by the commands that need it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from trainsched import __version__
from trainsched.errors import TrainschedError
from trainsched.report.progress import ProgressBar


def _dump(doc: Any) -> str:
    return json.dumps(doc, indent=2, sort_keys=True)


# -- profile ------------------------------------------------------------------------------------
def cmd_profile(args: argparse.Namespace) -> int:
    from trainsched.capture import build, capture

    if args.output:
        parent = Path(args.output).resolve().parent
        if not parent.is_dir():
            raise TrainschedError(f"-o {args.output}: directory {parent} does not exist")
    started = time.perf_counter()
    zoo = build(args.model, batch_size=args.batch_size, seq_len=args.seq_len,
                image_size=args.image_size, seed=args.seed)
    meta = {"batch_size": zoo.batch_size}
    if zoo.seq_len is not None:
        meta["seq_len"] = zoo.seq_len
    if args.image_size is not None:
        meta["image_size"] = args.image_size
    with ProgressBar(f"profiling {zoo.name}", enabled=not args.json and not args.quiet) as bar, \
            _context(zoo.name):
        graph = capture(zoo.model, zoo.args, example_kwargs=zoo.kwargs,
                        granularity=args.granularity, module_depth=args.module_depth,
                        costs=args.costs, device_kind=args.device_kind, device=args.device,
                        warmup=args.warmup, repeats=args.repeats, name=zoo.name, meta=meta,
                        threads=args.threads,
                        progress=bar.update)
    elapsed = time.perf_counter() - started
    if args.output:
        graph.save(args.output)
    summary = _summary(graph, top=args.top)
    if args.json:
        print(_dump({"graph": args.output, "capture_s": round(elapsed, 3), **summary}))
    else:
        print(_describe(graph, summary, top=args.top))
        where = f"wrote {args.output}" if args.output else "no -o given: graph not written"
        print(f"\ncaptured in {elapsed:.1f} s; {where}")
    return 0


@contextlib.contextmanager
def _context(what: str) -> Iterator[None]:
    """Prefix user errors raised inside with what was being worked on."""
    try:
        yield
    except TrainschedError as exc:
        raise TrainschedError(f"{what}: {exc}") from exc


# -- show ---------------------------------------------------------------------------------------
def cmd_show(args: argparse.Namespace) -> int:
    from trainsched.graph import Graph

    graph = Graph.load(args.graph)
    summary = _summary(graph, top=args.top)
    if args.json:
        print(_dump(summary))
    else:
        print(_describe(graph, summary, top=args.top))
    return 0


def _summary(graph: Any, top: int = 10) -> dict[str, Any]:
    totals = graph.totals()
    length_s, path = graph.critical_path()
    heavy = graph.heaviest(top)
    total_s = totals.compute_s or 1.0
    return {
        "meta": graph.meta,
        "ops": len(graph.ops),
        "edges": len(graph.edges),
        "ops_by_kind": dict(totals.ops_by_kind),
        "compute_s": totals.compute_s,
        "flops": totals.flops,
        "param_bytes": totals.param_bytes,
        "buffer_bytes": totals.buffer_bytes,
        "saved_bytes": totals.saved_bytes,
        "output_bytes": totals.output_bytes,
        "critical_path_s": length_s,
        "critical_path_ops": len(path),
        "critical_path": list(path),
        "heaviest": [{"name": op.name, "kind": op.kind, "module": op.module_path,
                      "target": op.target, "compute_s": op.compute_s, "flops": op.flops,
                      "share": op.compute_s / total_s} for op in heavy],
    }


def _describe(graph: Any, s: dict[str, Any], top: int) -> str:
    from trainsched.units import format_duration, format_flops, format_size

    meta = s["meta"]
    lines = []
    title = meta.get("model", "graph")
    facts = [f"{k} {meta[k]}" for k in ("batch_size", "seq_len", "granularity", "tier",
                                         "device") if k in meta]
    lines.append(f"{title}: " + ", ".join(facts) if facts else title)
    kinds = ", ".join(f"{n} {k}" for k, n in s["ops_by_kind"].items())
    lines.append(f"  ops              {s['ops']} ({kinds}), {s['edges']} edges")
    lines.append(f"  compute          {format_duration(s['compute_s'])} total, "
                 f"{format_flops(s['flops'])}")
    lines.append(f"  parameters       {format_size(s['param_bytes'])} "
                 f"(+ {format_size(s['buffer_bytes'])} buffers)")
    lines.append(f"  saved for bwd    {format_size(s['saved_bytes'])}")
    path = s["critical_path"]
    shown = " -> ".join(path if len(path) <= 6 else [*path[:3], "...", *path[-2:]])
    lines.append(f"  critical path    {format_duration(s['critical_path_s'])} over "
                 f"{s['critical_path_ops']} ops: {shown}")
    if s["heaviest"]:
        lines.append(f"  heaviest {min(top, len(s['heaviest']))} ops:")
        width = max(len(h["name"]) for h in s["heaviest"])
        for h in s["heaviest"]:
            lines.append(f"    {h['name']:<{width}}  {format_duration(h['compute_s']):>10}  "
                         f"{100 * h['share']:5.1f}%  {format_flops(h['flops']):>12}  "
                         f"{h['module'] or '-'}  {h['target']}")
    return "\n".join(lines)


# -- simulate -----------------------------------------------------------------------------------
PARALLELISMS = ("single", "placed", "data", "pipeline")


def _training_graph(path: str, optimizer: str) -> Any:
    """A graph file as a training graph: a forward graph gets its backward and optimizer ops."""
    from trainsched.graph import Graph
    from trainsched.training import to_training

    graph = Graph.load(path)
    if all(op.kind == "forward" for op in graph.ops):
        graph = to_training(graph, optimizer=optimizer)
    return graph


def simulate_plan(graph: Any, cluster: Any, args: argparse.Namespace, *,
                  policy: Any = None, steps: int = 1) -> Any:
    """Run the executor of ``args.parallelism``; returns the SimResult. Data parallelism runs
    ``policy`` for ``steps`` steps."""
    from trainsched import sim

    if args.parallelism == "single":
        return sim.simulate_single(graph, cluster)
    if args.parallelism == "placed":
        from trainsched.plan import Placement

        if not args.placement:
            raise TrainschedError("--parallelism placed needs --placement FILE "
                                  "(trainsched place writes one)")
        placement = Placement.load(args.placement)
        placement.validate(graph, cluster)
        return sim.simulate_placed(graph, cluster, placement)
    if args.parallelism == "data":
        return sim.simulate_data_parallel(graph, cluster, ranks=args.ranks or cluster.num_devices,
                                          policy=policy, algorithm=args.algorithm, steps=steps,
                                          startup_overlap=args.startup_overlap)
    from trainsched.backprop.schedules import build_schedule
    from trainsched.stages import stage_costs_from_graph

    stages_n = args.ranks or cluster.num_devices
    micro = args.microbatches or 2 * stages_n
    stages = stage_costs_from_graph(graph, stages_n, micro)
    schedule = build_schedule(args.schedule, stages_n, micro)
    return sim.simulate_pipeline(stages, schedule, cluster)


#: The policy flags of ``simulate --parallelism data`` and the policy fields they set.
_POLICY_FLAGS = {"partition": "partition_bytes", "credit": "credit_bytes",
                 "credit_mode": "credit_mode", "backfill": "backfill"}


def _parse_credit(text: str) -> float:
    from trainsched.units import parse_size

    return float("inf") if text.strip().lower() in ("inf", "unlimited") else parse_size(text)


def _given(args: argparse.Namespace, names: Sequence[str]) -> list[str]:
    """Which of the options ``names`` (argparse destinations) were given, as flags."""
    return [f"--{n.replace('_', '-')}" for n in names if getattr(args, n) not in (None, False)]


def _data_policy(args: argparse.Namespace) -> Any:
    """The comm policy ``--comm-policy`` names, with the partition and credit flags given."""
    from trainsched.comm import comm_policy
    from trainsched.units import parse_size

    parse = {"partition": parse_size, "credit": _parse_credit}
    options = {field: parse.get(flag, lambda v: v)(getattr(args, flag))
               for flag, field in _POLICY_FLAGS.items() if getattr(args, flag) not in (None, False)}
    name = _comm_policy_name(args)
    if options and name in ("fifo", "ddp"):
        raise TrainschedError(f"{', '.join(_given(args, list(_POLICY_FLAGS)))}: --comm-policy "
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


def _tune_ranges(args: argparse.Namespace) -> tuple[tuple[int, int], tuple[int, int]]:
    """``--tune-partition`` and ``--tune-credit``, each LOW-HIGH, in bytes."""
    from trainsched.units import parse_size

    ranges = []
    for flag, text in (("--tune-partition", args.tune_partition),
                       ("--tune-credit", args.tune_credit)):
        r = tuple(parse_size(v) for v in text.split("-", 1)) if "-" in text else None
        if r is None or not 0 < r[0] <= r[1]:
            raise TrainschedError(f"{flag} takes LOW-HIGH with 0 < LOW <= HIGH, e.g. "
                                  f"1MiB-64MiB")
        ranges.append(r)
    if args.tune_trials < 1:
        raise TrainschedError(f"--tune-trials must be >= 1, got {args.tune_trials}")
    return ranges[0], ranges[1]


def _simulate_autotune(graph: Any, cluster: Any, args: argparse.Namespace,
                       steps: int) -> tuple[Any, dict[str, Any]]:
    """``simulate --parallelism data --autotune``: the tuner on the simulator (offline). Returns
    the bytescheduler policy at the point it picks (exactly the policy its trials simulated)
    and the tuner's result."""
    from trainsched.comm import ByteSchedulerPolicy
    from trainsched.comm.tune import tune, tuned_policy
    from trainsched.sim.tune import simulated_objective

    if _comm_policy_name(args) != "bytescheduler":
        raise TrainschedError(f"--autotune tunes the bytescheduler policy; drop --comm-policy "
                              f"{args.comm_policy} (or use --comm-policy bytescheduler)")
    if args.partition is not None or args.credit is not None:
        raise TrainschedError("--autotune picks --partition and --credit itself; drop them")
    partition_range, credit_range = _tune_ranges(args)
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


def cmd_simulate(args: argparse.Namespace) -> int:
    from trainsched.cluster import resolve_cluster
    from trainsched.comm import ByteSchedulerPolicy
    from trainsched.sim import bubble_fraction, write_trace

    if args.parallelism != "data":
        flags = _given(args, [*_POLICY_FLAGS, "comm_policy", "steps", "autotune",
                              "startup_overlap"])
        if args.algorithm != "ring":
            flags.append("--algorithm")
        if flags:
            raise TrainschedError(f"{', '.join(flags)}: data-parallel options; add "
                                  f"--parallelism data")
    graph = _training_graph(args.graph, args.optimizer)
    cluster = resolve_cluster(args.cluster)
    policy, steps, autotune = None, 1, None
    if args.parallelism == "data" and args.autotune:
        steps = _data_steps(args, ByteSchedulerPolicy())  # the policy it tunes
        policy, autotune = _simulate_autotune(graph, cluster, args, steps)
    elif args.parallelism == "data":
        policy = _data_policy(args)
        steps = _data_steps(args, policy)
    result = simulate_plan(graph, cluster, args, policy=policy, steps=steps)
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
    if args.json:
        print(_dump(doc))
        return 0
    from trainsched.units import format_duration, format_size

    print(f"{graph.meta.get('model', args.graph)} on {cluster.name}, {args.parallelism}:")
    if args.parallelism == "data":
        _print_data_plan(doc)
    steps = doc.get("steps", 1)
    print(f"  step time        {format_duration(result.step_time_s)} "
          f"(dependency bound {format_duration(result.dependency_bound_s)}"
          f"{f' over all {steps} steps' if steps > 1 else ''})")
    if args.parallelism == "data" and doc["crossing_bound_gradient"]:
        print(f"  crossing bound   {format_duration(doc['crossing_bound_s'])} (no comm policy "
              f"beats it: {doc['crossing_bound_gradient']}'s loop)")
    print(f"  exposed comm     {format_duration(result.exposed_comm_s)}")
    print(f"  idle compute     {100 * doc['bubble_fraction']:.1f}%")
    peaks = sorted(result.peak_memory_bytes.items())
    shown = ", ".join(f"{d} {format_size(b)}{' OOM' if result.oom.get(d) else ''}"
                      for d, b in peaks[:8])
    print(f"  peak memory      {shown}{' ...' if len(peaks) > 8 else ''}")
    if args.trace:
        print(f"  trace            {args.trace} (open in ui.perfetto.dev)")
    return 0


def _print_data_plan(doc: dict[str, Any]) -> None:
    """The data-parallel lines of ``simulate``: the policy, and the tuner's trials if any."""
    from trainsched.units import format_duration, format_size

    tuned = doc["autotune"]
    if tuned is not None:
        for t in tuned["trials"]:
            print(f"  trial {t['number']:>2} ({t['phase']:<7}) partition "
                  f"{format_size(t['partition_bytes']):>10}  credit "
                  f"{format_size(t['credit_bytes']):>10}  step "
                  f"{format_duration(t['step_time_s'])}")
        print(f"  best of {len(tuned['trials'])} trials: --partition "
              f"{tuned['partition_bytes']} --credit {tuned['credit_bytes']} (small tensors "
              f"fused up to one partition)")
    policy = doc["policy"]
    what = [policy["class"]]
    if policy.get("partition_bytes") is not None:
        what.append(f"partition {format_size(policy['partition_bytes'])}")
    if "credit_bytes" in policy and "partition_bytes" in policy:  # priority-queue policies
        credit = policy["credit_bytes"]
        if credit is None:
            what.append("one collective in flight")
        elif credit == "inf":
            what.append("credit unlimited")
        else:
            backfill = " with backfill" if policy["backfill"] else ""
            what.append(f"credit {format_size(credit)} {policy['credit_mode']}{backfill}")
    if policy.get("cross_barrier"):
        what.append("crossing the barrier")
    steady = f", steady step of {doc['steps']}" if doc["steps"] > 1 else ""
    print(f"  policy           {', '.join(what)}; {doc['ranks']} ranks, {doc['algorithm']}"
          f"{steady}")


# -- place --------------------------------------------------------------------------------------
def cmd_place(args: argparse.Namespace) -> int:
    from trainsched.cluster import resolve_cluster
    from trainsched.placement import place
    from trainsched.units import format_duration, format_size

    graph = _training_graph(args.graph, args.optimizer)
    cluster = resolve_cluster(args.cluster)
    result = place(graph, cluster, args.algorithm, comm=args.comm, fusion=not args.no_fusion,
                   coplacement=not args.no_coplacement, forward_only=args.forward_only)
    if args.output:
        result.placement.save(args.output)
    summary = result.summary()
    if args.json:
        print(_dump({**summary, "cluster": cluster.name, "output": args.output}))
        return 0
    meta = result.placement.meta
    chosen = f"; auto chose {result.placer}" if args.algorithm == "auto" else ""
    print(f"{graph.meta.get('model', args.graph)} on {cluster.name} "
          f"({cluster.num_devices} devices, {meta['comm']} channels): {args.algorithm}{chosen}")
    print(f"  placement time   {format_duration(result.wall_s)} ({result.ops_before} ops, "
          f"{result.ops_after} after reduction)")
    step = result.predicted_step_s
    print(f"  predicted step   {format_duration(step) if step is not None else '-'} "
          f"(lower bound {format_duration(result.lower_bound_s)}; placer's schedule "
          f"{format_duration(result.makespan_s)})")
    print(f"  {'device':<10}{'ops':>7}{'peak memory':>14}{'capacity':>12}")
    for name, ops in summary["ops_per_device"].items():
        peak, cap = summary["peak_bytes"][name], summary["capacity_bytes"][name]
        print(f"  {name:<10}{ops:>7}{format_size(peak):>14}{format_size(cap):>12}"
              f"{'  OOM' if peak > cap else ''}")
    if result.candidates:
        shown = ", ".join(f"{c.name} {format_duration(c.step_s)}{' OOM' if c.oom else ''}"
                          if c.step_s is not None else f"{c.name} (did not fit)"
                          for c in result.candidates)
        print(f"  candidates       {shown}")
    if args.output:
        print(f"  wrote {args.output} (trainsched simulate {args.graph} --cluster {args.cluster}"
              f" --parallelism placed --placement {args.output})")
    return 0


# -- compare ------------------------------------------------------------------------------------
def cmd_compare(args: argparse.Namespace) -> int:
    from trainsched import compare as comparing
    from trainsched.cluster import resolve_cluster
    from trainsched.graph import Graph
    from trainsched.sim import write_trace
    from trainsched.training import to_training
    from trainsched.units import format_duration, format_size

    cluster = resolve_cluster(args.cluster)
    if args.ranks is not None and not 1 <= args.ranks <= cluster.num_devices:
        raise TrainschedError(f"--ranks {args.ranks}: the cluster has {cluster.num_devices} "
                              "devices; give 1 to that many")
    if args.microbatches is not None and args.microbatches < 1:
        raise TrainschedError(f"--microbatches {args.microbatches}: give at least 1")
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if args.model.endswith(".json"):
        graph = Graph.load(args.model)
    else:
        from trainsched.capture import build, capture

        zoo = build(args.model, batch_size=args.batch_size, seq_len=args.seq_len,
                    image_size=args.image_size)
        costs = args.costs
        if costs == "auto":
            costs = "measured" if cluster.device.kind.startswith("cpu") else "roofline"
        meta = {"batch_size": zoo.batch_size}
        if zoo.seq_len is not None:
            meta["seq_len"] = zoo.seq_len
        if args.image_size is not None:
            meta["image_size"] = args.image_size
        with ProgressBar(f"capturing {zoo.name}", enabled=not args.json) as bar, \
                _context(zoo.name):
            graph = capture(zoo.model, zoo.args, example_kwargs=zoo.kwargs, costs=costs,
                            device_kind=cluster.device if costs == "roofline" else None,
                            name=zoo.name, meta=meta, progress=bar.update)
        graph.save(out_dir / "graph.json")
    if all(op.kind == "forward" for op in graph.ops):
        graph = to_training(graph, optimizer=args.optimizer)
    ranks = args.ranks or cluster.num_devices
    options = comparing.Options(ranks=ranks, microbatches=args.microbatches or 2 * ranks,
                                batch_size=int(graph.meta.get("batch_size", 1)))
    rows, results = comparing.compare(graph, cluster, options)
    model = graph.meta.get("model", args.model)
    for name, result in results.items():
        write_trace(out_dir / f"{name}.trace.json", result, title=f"{model} {name}",
                    meta={"strategy": name, "cluster": cluster.name})
    title = f"{model} (batch {options.batch_size}) on {cluster.name}, {ranks} devices"
    comparing.write_chart(str(out_dir / "compare.png"), rows, title)
    doc = {"model": model, "cluster": cluster.name, "ranks": ranks,
           "microbatches": options.microbatches, "batch_size": options.batch_size,
           "tier": graph.meta.get("tier"), "rows": [r.to_dict() for r in rows]}
    from trainsched.graph import atomic_write_text

    atomic_write_text(out_dir / "compare.json", _dump(doc) + "\n")  # same inputs, same bytes
    if args.json:
        print(_dump({**doc, "out_dir": str(out_dir)}))
        return 0
    print(f"{title}; costs: {graph.meta.get('tier')} ({graph.meta.get('device', '?')})")
    width = max(len("strategy"), *(len(r.strategy) for r in rows)) + 2
    header = (f"  {'strategy':<{width}}{'devices':>8}{'step':>11}{'samples/s':>11}"
              f"{'speedup':>9}{'peak mem':>11}{'idle':>7}{'exposed comm':>14}")
    print(header)
    for r in rows:
        print(f"  {r.strategy:<{width}}{r.devices:>8}{format_duration(r.step_time_s):>11}"
              f"{r.samples_per_s:>11.1f}{r.speedup:>8.2f}x"
              f"{format_size(r.peak_memory_bytes) + (' OOM' if r.oom else ''):>11}"
              f"{100 * r.idle_fraction:>6.1f}%{format_duration(r.exposed_comm_s):>14}")
    print(f"\n  wrote {out_dir}/compare.json, compare.png and one trace per strategy "
          f"(open *.trace.json in ui.perfetto.dev)")
    return 0


# -- calibrate ----------------------------------------------------------------------------------
def cmd_calibrate(args: argparse.Namespace) -> int:
    from trainsched.runtime.calibrate import calibrate

    if args.output:
        parent = Path(args.output).resolve().parent
        if not parent.is_dir():
            raise TrainschedError(f"-o {args.output}: directory {parent} does not exist")
    result = calibrate(world_size=args.ranks, repeats=args.repeats, backend=args.backend,
                       timeout_s=args.timeout)
    cluster = result.to_cluster(name=args.name)
    if args.output:
        from trainsched.graph import atomic_write_text

        atomic_write_text(args.output, cluster.to_json())
    if args.json:
        print(_dump({"calibration": result.to_dict(), "cluster": cluster.to_dict(),
                     "output": args.output}))
        return 0
    print(result.table())
    print()
    print(cluster.describe())
    if args.output:
        print(f"\nwrote {args.output} (use it as --cluster {args.output})")
    return 0


# -- train --------------------------------------------------------------------------------------
def cmd_train(args: argparse.Namespace) -> int:
    from trainsched.runtime.train import train
    from trainsched.units import format_duration, format_size, parse_size

    partition = parse_size(args.partition)
    credit = _parse_credit(args.credit)
    if args.autotune:
        return _autotune(args, partition, credit)
    enabled = not args.no_schedule
    result = train(args.model, args.comm, nproc=args.nproc, steps=args.steps,
                   warmup=args.warmup, partition_bytes=partition, credit_bytes=credit,
                   credit_mode=args.credit_mode, timeline_dir=args.timeline,
                   order=args.order, enabled=enabled, backfill=args.backfill,
                   batch_size=args.batch_size, image_size=args.image_size,
                   seq_len=args.seq_len, optimizer=args.optimizer, lr=args.lr,
                   timeout_s=args.timeout)
    seg = result.first
    if args.json:
        print(_dump({"comm": args.comm, "partition_bytes": partition,
                     "credit_bytes": None if credit == float("inf") else credit,
                     "credit_mode": args.credit_mode, "backfill": args.backfill,
                     "order": args.order, "schedule": enabled, "warmup": args.warmup,
                     "steps": args.steps, "median_s": seg.median_s,
                     "p10_s": seg.quantile_s(0.1), "p90_s": seg.quantile_s(0.9),
                     "throughput_samples_per_s": result.throughput(), **result.to_dict()}))
        return 0
    scheduled = (f"partition {format_size(partition)}, credit "
                 f"{'unlimited' if credit == float('inf') else format_size(credit)} "
                 f"{args.credit_mode}{' with backfill' if args.backfill else ''}, "
                 f"crossing the barrier")
    how = {"fifo": "whole tensors in ready order, barrier",
           "ddp": "torch DistributedDataParallel, 25 MiB buckets",
           "priority": scheduled,
           "bytescheduler": f"{scheduled}, gradients below 1 MiB fused"}[args.comm]
    if args.comm != "ddp":
        how += (", scheduler off (--no-schedule: stock DDP, 25 MiB buckets)" if not enabled
                else f", {args.order} order")
    print(f"{result.model}: {args.nproc} gloo ranks x batch {result.batch_size}, --comm "
          f"{args.comm} ({how}), {args.optimizer}")
    print(f"  step time  median {format_duration(seg.median_s)}  p10 "
          f"{format_duration(seg.quantile_s(0.1))}  p90 {format_duration(seg.quantile_s(0.9))}"
          f"  ({len(seg.step_times_s)} steps after {args.warmup} warm-up)")
    print(f"  throughput {result.throughput():.2f} samples/s")
    if args.timeline:
        print(f"  wrote {args.timeline}/rank<r>.trace.json (open in ui.perfetto.dev)")
    return 0


def _autotune(args: argparse.Namespace, partition: int, credit: float) -> int:
    """``train --autotune``: Bayesian search of (partition, credit) online, in one job: rank 0
    switches every rank to each trial point for ``--tune-steps`` steps, then to the best; the
    ``--steps`` timed steps run there."""
    from trainsched.runtime.train import train
    from trainsched.units import format_duration, format_size

    if args.comm not in ("priority", "bytescheduler"):
        raise TrainschedError("--autotune tunes the scheduler's partition and credit; drop "
                              f"--comm {args.comm} (or use --comm priority or bytescheduler)")
    if args.no_schedule:
        raise TrainschedError("--autotune tunes the scheduler, which --no-schedule turns off; "
                              "drop one of them")
    if args.timeline:
        raise TrainschedError("--timeline records one run; give it without --autotune, at the "
                              "partition and credit the tuner reports")
    ranges = _tune_ranges(args)
    if args.tune_steps < 1:
        raise TrainschedError(f"--tune-steps must be >= 1, got {args.tune_steps}")
    if args.tune_confirm < 0:
        raise TrainschedError(f"--tune-confirm must be >= 0, got {args.tune_confirm}")
    startup = min(10, args.tune_trials)
    options = {"partition_range": list(ranges[0]), "credit_range": list(ranges[1]),
               "startup_trials": startup, "guided_trials": args.tune_trials - startup,
               "seed": args.tune_seed, "warmup_steps": args.warmup, "settle_steps": 1,
               "trial_steps": args.tune_steps, "confirm_points": 3,
               "confirm_rounds": args.tune_confirm}
    if not args.json:
        from trainsched.comm.tune import OnlineTuner

        tuner = OnlineTuner(**{**options, "partition_range": ranges[0],
                               "credit_range": ranges[1]})
        print(f"{args.model}: tuning partition and credit online on {args.nproc} gloo ranks: "
              f"the start point, {args.tune_trials} search and {tuner.n_confirm} confirmation "
              f"trials of {args.tune_steps} steps ({tuner.total_steps} steps), then "
              f"{args.warmup} + {args.steps} at the chosen point", flush=True)
    result = train(args.model, args.comm, nproc=args.nproc, steps=args.steps,
                   warmup=args.warmup, partition_bytes=partition, credit_bytes=credit,
                   credit_mode=args.credit_mode, tune=options, order=args.order,
                   backfill=args.backfill, batch_size=args.batch_size,
                   image_size=args.image_size, seq_len=args.seq_len,
                   optimizer=args.optimizer, lr=args.lr, timeout_s=args.timeout)
    seg = result.first
    tuned = seg.autotune
    if tuned is None:
        raise TrainschedError("the tuner reported nothing (rank 0 ran no trial)")
    if args.json:
        print(_dump({"comm": args.comm, "credit_mode": args.credit_mode, "order": args.order,
                     "steps": args.steps,
                     "warmup": args.warmup, "autotune": tuned, "median_s": seg.median_s,
                     "p10_s": seg.quantile_s(0.1), "p90_s": seg.quantile_s(0.9),
                     "throughput_samples_per_s": result.throughput(), **result.to_dict()}))
        return 0
    for t in tuned["trials"]:
        print(f"  trial {t['number']:>2} ({t['phase']:<7}) partition "
              f"{format_size(t['partition_bytes']):>10}  credit "
              f"{format_size(t['credit_bytes']):>10}  median step "
              f"{format_duration(t['step_time_s'])}")
    print(f"  best: --partition {tuned['partition_bytes']} --credit {tuned['credit_bytes']} "
          f"({format_size(tuned['partition_bytes'])}, {format_size(tuned['credit_bytes'])}; "
          f"median {format_duration(tuned['step_time_s'])} in its trials), from step "
          f"{tuned['total_steps']} on every rank")
    print(f"  step time there  median {format_duration(seg.median_s)}  p10 "
          f"{format_duration(seg.quantile_s(0.1))}  p90 {format_duration(seg.quantile_s(0.9))}"
          f"  ({len(seg.step_times_s)} steps after {args.warmup} warm-up)")
    print(f"  throughput {result.throughput():.2f} samples/s")
    return 0


# -- cluster ------------------------------------------------------------------------------------
def cmd_cluster(args: argparse.Namespace) -> int:
    from trainsched import cluster as clusters

    if args.list:
        rows = [{"name": p.name, "description": p.description, "source": p.source,
                 "aliases": list(p.aliases)} for p in clusters.PRESETS.values()]
        if args.json:
            print(_dump(rows))
        else:
            width = max(len(r["name"]) for r in rows)
            for r in rows:
                print(f"{r['name']:<{width}}  {r['description']}")
        return 0
    flags = {k: getattr(args, k) for k in ("devices", "memory", "bandwidth", "latency")}
    if args.spec and any(v is not None for v in flags.values()):
        raise TrainschedError("give either a preset/file or --devices/--memory/--bandwidth/"
                              "--latency flags, not both")
    if args.spec:
        cluster = clusters.resolve_cluster(args.spec, nodes=args.nodes)
    elif all(v is not None for v in flags.values()):
        cluster = clusters.cluster_from_flags(
            devices=args.devices, memory=args.memory, bandwidth=args.bandwidth,
            latency=args.latency, nodes=args.nodes or 1, comm=args.comm,
            device_kind=args.device_kind, inter_bandwidth=args.inter_bandwidth,
            inter_latency=args.inter_latency, peak_flops=args.peak_flops,
            memory_bandwidth=args.memory_bandwidth, name=args.name)
    else:
        missing = [f"--{k}" for k, v in flags.items() if v is None]
        raise TrainschedError("name a preset or file (trainsched cluster --list shows the "
                              f"presets), or give all of {', '.join(missing)}")
    if args.output:
        from trainsched.graph import atomic_write_text

        atomic_write_text(args.output, cluster.to_json())
    print(_dump(cluster.to_dict()) if args.json else cluster.describe())
    return 0


# -- models -------------------------------------------------------------------------------------
def cmd_models(args: argparse.Namespace) -> int:
    from trainsched.capture.zoo import MODELS

    rows = [{"name": n, "family": e.family, "default_batch_size": e.default_batch_size,
             "description": e.description} for n, e in MODELS.items()]
    if args.json:
        print(_dump(rows))
    else:
        for r in rows:
            print(f"{r['name']:<20} {r['description']} (batch {r['default_batch_size']})")
    return 0


# -- parser -------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trainsched", description="Schedule deep-learning training on PyTorch: capture "
        "a model, describe a cluster, and (in later commands) place, order and simulate.")
    parser.add_argument("--version", action="version", version=f"trainsched {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--json", action="store_true", help="print machine-readable JSON")

    def tune_args(p: argparse.ArgumentParser, flag: str) -> None:
        p.add_argument("--tune-trials", type=int, default=15,
                       help=f"{flag}: trials (the first 10 random, the rest guided)")
        p.add_argument("--tune-partition", default="1MiB-128MiB", help=f"{flag}: LOW-HIGH")
        p.add_argument("--tune-credit", default="1MiB-256MiB", help=f"{flag}: LOW-HIGH")
        p.add_argument("--tune-seed", type=int, default=0, help=f"{flag}: sampler seed")

    p = sub.add_parser("profile", help="capture a model into a graph with costs")
    p.add_argument("model", help="a zoo model name (trainsched models lists them)")
    p.add_argument("--batch-size", type=int, default=None, help="examples per batch")
    p.add_argument("--seq-len", type=int, default=None, help="tokens per example (text models)")
    p.add_argument("--image-size", type=int, default=None,
                   help="image side of vision models (default 224; >= 32)")
    p.add_argument("--granularity", choices=("op", "module"), default="op")
    p.add_argument("--module-depth", type=int, default=None,
                   help="with --granularity module: group by module path truncated to this "
                   "many components (e.g. 2 gives ResNet blocks)")
    p.add_argument("--costs", choices=("measured", "roofline", "static"), default="measured",
                   help="measured on this machine, roofline for --device-kind, or static "
                   "(FLOPs and bytes only)")
    p.add_argument("--device-kind", default=None,
                   help="device of the roofline costs (default H100; see docs/cluster.md)")
    p.add_argument("--device", default=None, help="where measured costs run: cpu or cuda")
    p.add_argument("--repeats", type=int, default=10,
                   help="most timed calls per op and phase (at least 3; fewer for slow ops)")
    p.add_argument("--warmup", type=int, default=0,
                   help="untimed warm-up calls per op and phase")
    p.add_argument("--threads", type=int, default=None,
                   help="torch intra-op threads while measuring (default: torch's; use 1 on a "
                   "shared host)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    p.add_argument("--top", type=int, default=10, help="heaviest ops to show")
    p.add_argument("-o", "--output", default=None, help="write the graph JSON here")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    common(p)
    p.set_defaults(func=cmd_profile)

    p = sub.add_parser("show", help="describe a graph file")
    p.add_argument("graph", help="a graph JSON file (trainsched profile -o writes one)")
    p.add_argument("--top", type=int, default=10, help="heaviest ops to show")
    common(p)
    p.set_defaults(func=cmd_show)

    p = sub.add_parser("cluster", help="print a cluster: a preset, a file, or flags")
    p.add_argument("spec", nargs="?", default=None,
                   help="preset name, NAME:NODES (e.g. p3.16xlarge:4), or a .toml/.json file")
    p.add_argument("--list", action="store_true", help="list the presets")
    p.add_argument("--nodes", type=int, default=None, help="number of nodes")
    p.add_argument("--devices", type=int, default=None, help="devices per node")
    p.add_argument("--memory", default=None, help="memory per device, e.g. 8GiB")
    p.add_argument("--bandwidth", default=None, help="link bandwidth, e.g. 5.7GB/s")
    p.add_argument("--latency", default=None, help="link latency, e.g. 134us")
    p.add_argument("--comm", choices=("sequential", "parallel"), default="parallel",
                   help="sequential: a device's sends and receives share one channel")
    p.add_argument("--device-kind", default=None, help="catalogue kind for the other numbers")
    p.add_argument("--peak-flops", default=None,
                   help="device FLOP/s: one rate or fp32=...,bf16=... (e.g. 15.7TFLOP/s)")
    p.add_argument("--memory-bandwidth", default=None, help="device memory bandwidth")
    p.add_argument("--name", default="custom", help="name of a flag-built cluster")
    p.add_argument("--inter-bandwidth", default=None, help="between nodes, e.g. 25Gbit/s")
    p.add_argument("--inter-latency", default=None, help="between nodes, e.g. 50us")
    p.add_argument("-o", "--output", default=None, help="write the cluster JSON here")
    common(p)
    p.set_defaults(func=cmd_cluster)

    p = sub.add_parser("simulate", help="predict one training step of a graph on a cluster")
    p.add_argument("graph", help="a graph file (forward graphs get backward/optimizer ops)")
    p.add_argument("--cluster", required=True, help="preset, NAME:NODES, or a cluster file")
    p.add_argument("--parallelism", choices=PARALLELISMS, default="single")
    p.add_argument("--placement", default=None, help="placement file for --parallelism placed")
    p.add_argument("--ranks", type=int, default=None,
                   help="data-parallel ranks or pipeline stages (default: all devices)")
    p.add_argument("--comm-policy", default=None,
                   help="data parallel: fifo, ddp (default), priority, bytescheduler, tictac, p3")
    p.add_argument("--partition", default=None,
                   help="data parallel: partition size (priority, bytescheduler, p3)")
    p.add_argument("--credit", default=None, help="data parallel: bytes in flight (or inf)")
    p.add_argument("--credit-mode", choices=("overdraft", "strict"), default=None)
    p.add_argument("--backfill", action="store_true",
                   help="data parallel, strict credit: the most urgent partition that fits "
                   "goes when the head does not")
    p.add_argument("--algorithm", default="ring", choices=("ring", "tree", "ps", "ps-local"),
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
    tune_args(p, "--autotune")
    p.add_argument("--schedule", default="1f1b", help="pipeline schedule: gpipe or 1f1b")
    p.add_argument("--microbatches", type=int, default=None,
                   help="pipeline micro-batches (default: 2 x stages)")
    p.add_argument("--optimizer", default="sgd", help="sgd, momentum or adam")
    p.add_argument("--trace", default=None, help="write a Chrome/Perfetto trace here (.gz ok)")
    common(p)
    p.set_defaults(func=cmd_simulate)

    p = sub.add_parser("place", help="place a graph's ops on a cluster's devices (m-SCT, m-ETF, "
                       "m-TOPO, baselines) within their memory")
    p.add_argument("graph", help="a graph file (forward graphs get backward/optimizer ops)")
    p.add_argument("--cluster", required=True, help="preset, NAME:NODES, or a cluster file")
    p.add_argument("--algorithm", default="auto",
                   choices=("auto", "m-sct", "m-etf", "m-topo", "single", "contiguous-params",
                            "contiguous-compute", "contiguous-count"),
                   help="auto (default) runs them all and keeps the fastest predicted")
    p.add_argument("--comm", choices=("sequential", "parallel"), default=None,
                   help="how transfers contend (default: the cluster's)")
    p.add_argument("--no-fusion", action="store_true", help="do not fuse ops inside groups")
    p.add_argument("--no-coplacement", action="store_true",
                   help="do not join an op with its sole consumer")
    p.add_argument("--forward-only", action=argparse.BooleanOptionalAction, default=None,
                   help="place forward ops, backward/optimizer ops follow (default: on for "
                   "training graphs)")
    p.add_argument("--optimizer", default="sgd", help="sgd, momentum or adam")
    p.add_argument("-o", "--output", default=None, help="write the placement JSON here")
    common(p)
    p.set_defaults(func=cmd_place)

    p = sub.add_parser("compare", help="the main job: every strategy on a model and cluster, "
                       "side by side")
    p.add_argument("model", help="a zoo model, file.py:function, or a graph .json file")
    p.add_argument("--cluster", required=True, help="preset, NAME:NODES, or a cluster file")
    p.add_argument("--batch-size", type=int, default=None, help="examples per batch (per rank)")
    p.add_argument("--seq-len", type=int, default=None, help="tokens per example")
    p.add_argument("--image-size", type=int, default=None,
                   help="image side of vision models (default 224; >= 32)")
    p.add_argument("--costs", choices=("auto", "measured", "roofline", "static"), default="auto",
                   help="auto: measured on a cpu cluster, else roofline for its device")
    p.add_argument("--ranks", type=int, default=None,
                   help="ranks / pipeline stages (default: all devices)")
    p.add_argument("--microbatches", type=int, default=None,
                   help="pipeline micro-batches (default: 2 x ranks)")
    p.add_argument("--optimizer", default="sgd", help="sgd, momentum or adam")
    p.add_argument("--out-dir", default="compare-out", help="where traces, chart and table go")
    common(p)
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("calibrate", help="measure this host's communication (gloo, or NCCL "
                       "where present) and write a cluster file")
    p.add_argument("--ranks", type=int, default=2, help="processes to measure with")
    p.add_argument("--repeats", type=int, default=10, help="timed repeats per size")
    p.add_argument("--backend", default="gloo", help="gloo or nccl")
    p.add_argument("--timeout", type=float, default=300, help="seconds before giving up")
    p.add_argument("--name", default="calibrated", help="name of the cluster written")
    p.add_argument("-o", "--output", default=None, help="write the cluster JSON here")
    common(p)
    p.set_defaults(func=cmd_calibrate)

    p = sub.add_parser("train", help="train a zoo model on N real gloo ranks with scheduled "
                       "communication and print the measured step time")
    p.add_argument("model", help="a zoo model name or file.py:function")
    p.add_argument("--nproc", type=int, default=2, help="worker processes (ranks)")
    p.add_argument("--comm", choices=("fifo", "ddp", "priority", "bytescheduler"),
                   default="priority",
                   help="fifo: whole tensors, barrier; ddp: torch DDP; priority: partitions, "
                   "credit, crossing the barrier; bytescheduler: priority with gradients below "
                   "1 MiB fused into one collective")
    p.add_argument("--partition", default="4MiB", help="priority/bytescheduler: partition size")
    p.add_argument("--credit", default="16MiB",
                   help="priority/bytescheduler: bytes in flight (or inf)")
    p.add_argument("--credit-mode", choices=("overdraft", "strict"), default="overdraft")
    p.add_argument("--backfill", action="store_true",
                   help="priority, strict credit: when the most urgent partition does not fit "
                   "in the credit left, send the most urgent one that does")
    p.add_argument("--order", default="leader",
                   help="fifo/priority: the collective order every rank issues: leader (rank 0 "
                   "decides each step, published in the store) or static (compiled once from "
                   "step 0's ready times, no per-decision store traffic)")
    p.add_argument("--no-schedule", action="store_true",
                   help="fifo/priority: turn the scheduler off (its pass-through: stock DDP, one "
                   "optimizer, no hooks or threads of its own)")
    p.add_argument("--steps", type=int, default=20, help="timed steps after the warm-up")
    p.add_argument("--warmup", type=int, default=3, help="untimed first steps")
    p.add_argument("--batch-size", type=int, default=None, help="examples per rank")
    p.add_argument("--image-size", type=int, default=None, help="vision models: input side")
    p.add_argument("--seq-len", type=int, default=None, help="text models: tokens")
    p.add_argument("--optimizer", choices=("sgd", "momentum", "adam"), default="sgd")
    p.add_argument("--lr", type=float, default=0.01, help="learning rate")
    p.add_argument("--timeline", default=None,
                   help="directory for one Chrome trace per rank (first 3 timed steps)")
    p.add_argument("--timeout", type=float, default=1800, help="seconds before giving up")
    p.add_argument("--autotune", action="store_true",
                   help="priority: pick partition and credit by Bayesian search, online (every "
                   "rank switches to each trial point in one job), then time the best")
    tune_args(p, "--autotune")
    p.add_argument("--tune-steps", type=int, default=5,
                   help="--autotune: measured steps per trial (after 1 settling step)")
    p.add_argument("--tune-confirm", type=int, default=2,
                   help="--autotune: rounds re-measuring the 3 fastest points, in alternating "
                   "order, to choose among them (0: take the fastest trial)")
    common(p)
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("models", help="list the model zoo")
    common(p)
    p.set_defaults(func=cmd_models)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except TrainschedError as exc:
        print(f"trainsched: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("trainsched: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (e.g. `| head`): stop quietly, as Unix tools do.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
