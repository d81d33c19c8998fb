"""``trainsched compare``: every strategy on a model (or graph file) and a cluster, side by
side; writes the table, a chart and one trace per strategy. Imports torch only to capture a
model (not for a graph ``.json``)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from trainsched.cli.common import (
    COST_CHOICES,
    GRAPH_SUFFIXES,
    OPTIMIZER_DEFAULT,
    Applies,
    Fact,
    Subcommands,
    add_json,
    add_optimizer,
    add_precision,
    as_training,
    check_applicable,
    check_count,
    dump,
    error_context,
    load_graph,
    size_rules_and_facts,
)
from trainsched.cli.outputs import OutputDir
from trainsched.errors import TrainschedError
from trainsched.report.chart import write_measured_chart
from trainsched.report.progress import ProgressBar
from trainsched.report.tables import compare_report, measured_report, sync_report
from trainsched.strategies import default_microbatches

NAME = "compare"


def add_parser(sub: Subcommands) -> None:
    p = sub.add_parser(NAME, help="the main job: every strategy on a model and cluster, "
                       "side by side")
    p.add_argument("model", help="a zoo model, file.py:function, or a graph file (.json, or .tsg: "
                   "binary)")
    p.add_argument("--cluster", required=True, help="preset, NAME:NODES, or a cluster file")
    p.add_argument("--batch-size", type=int, default=None, help="examples per batch (per rank)")
    p.add_argument("--seq-len", type=int, default=None, help="tokens per example")
    p.add_argument("--image-size", type=int, default=None,
                   help="image side of vision models (default 224; >= 32)")
    p.add_argument("--costs", choices=COST_CHOICES, default=None,
                   help="auto (default): measured on a cpu cluster, else roofline for its "
                   "device")
    add_precision(p)
    p.add_argument("--ranks", type=int, default=None,
                   help="ranks / pipeline stages (default: all devices)")
    p.add_argument("--microbatches", type=int, default=None,
                   help="pipeline micro-batches (default: 2 x ranks)")
    add_optimizer(p)
    p.add_argument("--out-dir", default="compare-out", help="where traces, chart and table go")
    p.add_argument("--run", action="store_true",
                   help="also run every strategy this host can run (its plan, for real) and "
                   "show measured beside predicted")
    p.add_argument("--steps", type=int, default=None,
                   help=f"--run: timed steps per strategy (default {RUN_DEFAULTS['steps']})")
    p.add_argument("--warmup", type=int, default=None,
                   help=f"--run: untimed first steps (default {RUN_DEFAULTS['warmup']})")
    p.add_argument("--calibration", default=None,
                   help="--run on a cpu cluster: a cluster file from trainsched calibrate to "
                   "predict with (default: calibrate this host first)")
    add_json(p)
    p.set_defaults(func=run)


#: ``--run``'s flags' defaults (given in code: without ``--run`` the flags do not apply).
RUN_DEFAULTS = {"steps": 5, "warmup": 2}


def check_flags(args: argparse.Namespace) -> None:
    """Refuse every flag that does not apply: the model's sizes and costs to a graph file,
    ``--seq-len``/``--image-size`` to a model that takes no such input, ``--run``'s options
    without it (:func:`trainsched.cli.common.check_applicable`)."""
    graph_file = args.model.endswith(GRAPH_SUFFIXES)
    rules, facts = size_rules_and_facts(None if graph_file else args.model)
    rules += [Applies(flags=("batch_size", "costs", "precision"), when={"model": (True,)},
                      where="to a model (a graph file has its batch and costs)"),
              Applies(flags=("steps", "warmup", "calibration"), when={"run": (True,)},
                      where="with --run")]
    facts.update(model=Fact(value=not graph_file, text="to a graph file"),
                 run=Fact(value=bool(args.run), text="without --run"))
    check_applicable(args, rules, facts)
    if args.run and args.precision not in (None, "fp32"):
        raise TrainschedError(f"--run trains in fp32: drop --precision {args.precision} to "
                              "run, or compare without --run to predict it")


def run(args: argparse.Namespace) -> int:
    from trainsched import compare as comparing
    from trainsched.cluster import resolve_cluster
    from trainsched.graph import atomic_write_text
    from trainsched.plan import Prediction, save_plan
    from trainsched.report.chart import write_chart
    from trainsched.sim import write_trace

    check_flags(args)
    for option, default in RUN_DEFAULTS.items():
        setattr(args, option, default if getattr(args, option) is None else getattr(args, option))
    check_count("--steps", args.steps, 1)
    check_count("--warmup", args.warmup, 0)
    check_count("--ranks", args.ranks, 1)
    check_count("--microbatches", args.microbatches, 1)
    cluster = resolve_cluster(args.cluster)
    check_count("--ranks", args.ranks, 1, cluster.num_devices,
                f"the cluster {cluster.label} has {cluster.num_devices} devices")
    # Checked now, written at the end: a failure or an interrupt leaves no partial folder.
    out = OutputDir(args.out_dir, "--out-dir", inputs=_input_files(args))
    calibrating = args.run and args.calibration is None and cluster.device.kind.startswith("cpu")
    out.check_names(["compare.json", "compare.png"]
                    + ["graph.json"] * (not args.model.endswith(GRAPH_SUFFIXES))
                    + ["measured.png"] * args.run + ["calibration.json"] * calibrating)
    out_dir = out.path
    files: dict[str, Callable[[Path], None]] = {}  # written at the end, in this order
    if args.model.endswith(GRAPH_SUFFIXES):
        graph = load_graph(args.model, args)
    else:
        from trainsched.capture import build, capture

        zoo = build(args.model, batch_size=args.batch_size, seq_len=args.seq_len,
                    image_size=args.image_size)
        costs = args.costs or "auto"
        if costs == "auto":
            costs = "measured" if cluster.device.kind.startswith("cpu") else "roofline"
        meta = {"batch_size": zoo.batch_size}
        if zoo.seq_len is not None:
            meta["seq_len"] = zoo.seq_len
        if args.image_size is not None:
            meta["image_size"] = args.image_size

        def captured(batch_size: int, what: str) -> Any:
            with ProgressBar(f"capturing {what}", enabled=not args.json) as bar, \
                    error_context(zoo.name):
                if costs == "measured" and args.run:
                    # as --run trains: one thread per rank, the ranks at work at once on this
                    # host (as many as it runs: no more than its cores)
                    from trainsched.runtime.host import HOST_PASSES, capture_beside

                    at_once = min(args.ranks or cluster.num_devices, os.cpu_count() or 1)
                    return capture_beside(args.model, ranks=at_once, batch_size=batch_size,
                                          image_size=args.image_size, seq_len=args.seq_len,
                                          meta={**meta, "batch_size": batch_size},
                                          progress=bar.update, passes=HOST_PASSES,
                                          precision=args.precision or "fp32")
                # measured on the CPU: one thread, as --run trains each rank
                sized = zoo if batch_size == zoo.batch_size else build(
                    args.model, batch_size=batch_size, seq_len=args.seq_len,
                    image_size=args.image_size)
                return capture(sized.model, sized.args, example_kwargs=sized.kwargs, costs=costs,
                               device_kind=cluster.device if costs == "roofline" else None,
                               name=zoo.name, meta={**meta, "batch_size": batch_size},
                               progress=bar.update, precision=args.precision or "fp32")

        graph = captured(zoo.batch_size, zoo.name)
        files["graph.json"] = graph.save  # the captured graph (a graph file given is an input)
    graph = as_training(graph, args, runs=args.run)
    ranks = args.ranks or cluster.num_devices
    batch = graph.meta.get("batch_size")
    microbatches = args.microbatches or default_microbatches(ranks, batch)
    micro_graph = None
    if (not args.model.endswith(GRAPH_SUFFIXES) and graph.meta.get("tier") == "measured"
            and microbatches > 1 and batch and batch % microbatches == 0):
        # measured costs do not scale with the batch: time a micro-batch as it runs
        micro_graph = as_training(captured(batch // microbatches, f"{zoo.name} at micro-batch "
                                                                  f"{batch // microbatches}"),
                                  args, runs=args.run)
    options = comparing.Options(ranks=ranks, batch_size=int(batch or 1),
                                microbatches=microbatches, microbatch_graph=micro_graph)
    if args.run and cluster.device.kind.startswith("cpu"):
        cluster = _host_cluster(args, cluster, out_dir, files)
    planned, skipped = comparing.plan_strategies(graph, cluster, options)
    rows, results = comparing.compare_plans(graph, cluster, planned, options.batch_size,
                                            micro_graph)
    model = graph.meta.get("model", args.model)
    for name, result in results.items():
        files[f"{name}.trace.json"] = partial(
            write_trace, result=result, title=f"{model} {name}",
            meta={"strategy": name, "cluster": cluster.label})
        files[f"{name}.plan.json"] = partial(
            save_plan, planned[name].plan,
            prediction=Prediction(cluster=cluster.label, step_time_s=result.step_time_s,
                                  samples_per_step=planned[name].samples_per_step))
    sizes = [f"batch {options.batch_size} per rank"]
    if graph.meta.get("seq_len") is not None:
        sizes.append(f"seq {graph.meta['seq_len']}")
    if any(planned[name].plan.kind == "pipeline" for name in planned):
        sizes.append(f"{options.microbatches} micro-batches per pipeline step"
                     + (" (costs timed at that size)" if micro_graph is not None else ""))
    title = f"{model} ({', '.join(sizes)}) on {cluster.label}, {ranks} devices"
    files["compare.png"] = lambda path: write_chart(str(path), rows, title)
    doc = {"model": model, "cluster": cluster.label, "ranks": ranks,
           "microbatches": options.microbatches, "microbatch_costs_timed": micro_graph is not None,
           "batch_size": options.batch_size,
           "tier": graph.meta.get("tier"), "rows": [r.to_dict() for r in rows]}
    sync_rows = comparing.compare_sync(
        graph, cluster, ranks=ranks, batch_size=options.batch_size,
        bsp_step_s=results["data-ddp"].step_time_s) if "data-ddp" in results else []
    if sync_rows:
        doc["sync"] = {"steps": comparing.SYNC_STEPS, "step_noise": comparing.SYNC_NOISE,
                       "rows": [r.to_dict() for r in sync_rows]}
    if skipped:  # only then, so that a run that builds every strategy writes what it did
        doc["skipped"] = [{"strategy": name, "reason": reason}
                          for name, reason in skipped.items()]
    measured = None
    if args.run:
        measured = _run_rows(args, planned, rows, model)
        doc["measured"] = measured
        pairs = [(r.strategy, r.step_time_s, measured[r.strategy]["mean_s"]) for r in rows
                 if "mean_s" in measured[r.strategy]]
        files["measured.png"] = lambda path: write_measured_chart(
            str(path), pairs, f"{model}: predicted and measured step on this host")
    text = dump(doc) + "\n"  # same inputs, same bytes
    files["compare.json"] = lambda path: atomic_write_text(path, text)
    with out.writing(files) as folder:
        for name, write in files.items():
            write(folder / name)
    if args.json:
        print(dump({**doc, "out_dir": str(out_dir)}))
        return 0
    print(compare_report(rows, title=title, tier=graph.meta.get("tier"),
                         device=graph.meta.get("device", "?"), out_dir=out_dir,
                         skipped=skipped, precision=graph.meta.get("precision", "fp32")))
    if sync_rows:
        servers = (f"the cluster's {cluster.parameter_servers} parameter servers"
                   if cluster.parameter_servers else "a server behind each node's network link "
                   "(the cluster describes no parameter servers)")
        print(sync_report(sync_rows, steps=comparing.SYNC_STEPS, noise=comparing.SYNC_NOISE,
                          servers=servers))
    if measured is not None:
        print(measured_report(rows, measured, out_dir=out_dir))
    return 0


def _input_files(args: argparse.Namespace) -> list[str]:
    """The files this run reads, which no output may replace."""
    inputs = [args.model.rsplit(":", 1)[0] if ".py:" in args.model else args.model,
              args.cluster.rsplit(":", 1)[0] if ":" in args.cluster else args.cluster]
    return [p for p in (*inputs, args.calibration) if p is not None]


def _host_cluster(args: argparse.Namespace, cluster: Any, out_dir: Path,
                  files: dict[str, Callable[[Path], None]]) -> Any:
    """The cluster ``--run`` predicts with on a cpu cluster: the ``--calibration`` file, else
    this host calibrated now (written with the other files, to OUT_DIR/calibration.json, for
    the next run)."""
    from trainsched.cluster import resolve_cluster
    from trainsched.graph import atomic_write_text

    if args.calibration is not None:
        return resolve_cluster(args.calibration)
    from trainsched.runtime.calibrate import calibrate

    if not args.json:
        print(f"calibrating this host's gloo on {cluster.num_devices} ranks (reuse it with "
              f"--calibration {out_dir}/calibration.json)", file=sys.stderr, flush=True)
    calibrated = calibrate(world_size=cluster.num_devices).to_cluster()
    text = calibrated.to_json()
    files["calibration.json"] = lambda path: atomic_write_text(path, text)
    return calibrated


def _run_rows(args: argparse.Namespace, planned: dict[str, Any], rows: list[Any],
              model: str) -> dict[str, dict[str, Any]]:
    """Run each row's plan that this host can run; its measured figures, or why not."""
    from trainsched.runtime import run, runnable

    out: dict[str, dict[str, Any]] = {}
    for k, r in enumerate(rows):
        plan = planned[r.strategy].plan
        reason = runnable(plan, model)
        if reason is not None:
            out[r.strategy] = {"skipped": reason}
            continue
        if not args.json:
            print(f"running {r.strategy} ({k + 1}/{len(rows)})", file=sys.stderr, flush=True)
        with error_context(f"running {r.strategy}"):
            result = run(plan, model, steps=args.steps, warmup=args.warmup,
                         optimizer=args.optimizer or OPTIMIZER_DEFAULT)
        out[r.strategy] = {"mean_s": result.mean_s, "median_s": result.median_s,
                           "p10_s": result.p10_s, "p90_s": result.p90_s,
                           "samples_per_s": result.samples_per_s, "ranks": result.ranks,
                           "measured_over_predicted": result.mean_s / r.step_time_s
                           if r.step_time_s else None}
    return out
