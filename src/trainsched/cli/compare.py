"""``trainsched compare``: every strategy on a model (or graph file) and a cluster, side by
side; writes the table, a chart and one trace per strategy. Imports torch only to capture a
model (not for a graph ``.json``)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from trainsched.cli.common import Subcommands, add_json, dump, error_context
from trainsched.cli.outputs import OutputDir
from trainsched.errors import TrainschedError
from trainsched.report.chart import write_measured_chart
from trainsched.report.progress import ProgressBar
from trainsched.report.tables import compare_report, measured_report

NAME = "compare"


def add_parser(sub: Subcommands) -> None:
    p = sub.add_parser(NAME, help="the main job: every strategy on a model and cluster, "
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
    p.add_argument("--run", action="store_true",
                   help="also run every strategy this host can run (its plan, for real) and "
                   "show measured beside predicted")
    p.add_argument("--steps", type=int, default=5, help="--run: timed steps per strategy")
    p.add_argument("--warmup", type=int, default=2, help="--run: untimed first steps")
    p.add_argument("--calibration", default=None,
                   help="--run on a cpu cluster: a cluster file from trainsched calibrate to "
                   "predict with (default: calibrate this host first)")
    add_json(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from trainsched import compare as comparing
    from trainsched.cluster import resolve_cluster
    from trainsched.graph import Graph, atomic_write_text, to_training
    from trainsched.plan import Prediction, save_plan
    from trainsched.report.chart import write_chart
    from trainsched.sim import write_trace

    for flag, value, minimum in (("--steps", args.steps, 1), ("--warmup", args.warmup, 0)):
        if value < minimum:
            raise TrainschedError(f"{flag} {value}: give at least {minimum}")
    if args.calibration is not None and not args.run:
        raise TrainschedError("--calibration sets what --run predicts with; add --run")
    cluster = resolve_cluster(args.cluster)
    if args.ranks is not None and not 1 <= args.ranks <= cluster.num_devices:
        raise TrainschedError(f"--ranks {args.ranks}: the cluster has {cluster.num_devices} "
                              "devices; give 1 to that many")
    if args.microbatches is not None and args.microbatches < 1:
        raise TrainschedError(f"--microbatches {args.microbatches}: give at least 1")
    # Checked now, written at the end: a failure or an interrupt leaves no partial folder.
    out = OutputDir(args.out_dir, "--out-dir", inputs=_input_files(args))
    calibrating = args.run and args.calibration is None and cluster.device.kind.startswith("cpu")
    out.check_names(["compare.json", "compare.png"]
                    + ["graph.json"] * (not args.model.endswith(".json"))
                    + ["measured.png"] * args.run + ["calibration.json"] * calibrating)
    out_dir = out.path
    files: dict[str, Callable[[Path], None]] = {}  # written at the end, in this order
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
                error_context(zoo.name):
            # --run trains each rank on one thread (ranks share this host's cores): measure
            # the costs the same way, so that predicted and measured time the same work
            graph = capture(zoo.model, zoo.args, example_kwargs=zoo.kwargs, costs=costs,
                            device_kind=cluster.device if costs == "roofline" else None,
                            name=zoo.name, meta=meta, progress=bar.update,
                            threads=1 if args.run and costs == "measured" else None)
        files["graph.json"] = graph.save  # the captured graph (a graph file given is an input)
    if all(op.kind == "forward" for op in graph.ops):
        graph = to_training(graph, optimizer=args.optimizer)
    ranks = args.ranks or cluster.num_devices
    options = comparing.Options(ranks=ranks, microbatches=args.microbatches or 2 * ranks,
                                batch_size=int(graph.meta.get("batch_size", 1)))
    if args.run and cluster.device.kind.startswith("cpu"):
        cluster = _host_cluster(args, cluster, out_dir, files)
    planned = comparing.make_plans(graph, cluster, options)
    rows, results = comparing.compare_plans(graph, cluster, planned, options.batch_size)
    model = graph.meta.get("model", args.model)
    for name, result in results.items():
        files[f"{name}.trace.json"] = partial(
            write_trace, result=result, title=f"{model} {name}",
            meta={"strategy": name, "cluster": cluster.name})
        files[f"{name}.plan.json"] = partial(
            save_plan, planned[name].plan,
            prediction=Prediction(cluster=cluster.name, step_time_s=result.step_time_s,
                                  samples_per_step=planned[name].samples_per_step))
    title = f"{model} (batch {options.batch_size}) on {cluster.name}, {ranks} devices"
    files["compare.png"] = lambda path: write_chart(str(path), rows, title)
    doc = {"model": model, "cluster": cluster.name, "ranks": ranks,
           "microbatches": options.microbatches, "batch_size": options.batch_size,
           "tier": graph.meta.get("tier"), "rows": [r.to_dict() for r in rows]}
    measured = None
    if args.run:
        measured = _run_rows(args, planned, rows, model)
        doc["measured"] = measured
        pairs = [(r.strategy, r.step_time_s, measured[r.strategy]["median_s"]) for r in rows
                 if "median_s" in measured[r.strategy]]
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
                         device=graph.meta.get("device", "?"), out_dir=out_dir))
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
    calibrated = calibrate(world_size=cluster.num_devices, repeats=5).to_cluster()
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
                         optimizer=args.optimizer)
        out[r.strategy] = {"median_s": result.median_s, "p10_s": result.p10_s,
                           "p90_s": result.p90_s, "samples_per_s": result.samples_per_s,
                           "ranks": result.ranks,
                           "measured_over_predicted": result.median_s / r.step_time_s
                           if r.step_time_s else None}
    return out
