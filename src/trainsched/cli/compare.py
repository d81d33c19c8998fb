"""``trainsched compare``: every strategy on a model (or graph file) and a cluster, side by
side; writes the table, a chart and one trace per strategy. Imports torch only to capture a
model (not for a graph ``.json``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from trainsched.cli.common import Subcommands, add_json, dump, error_context
from trainsched.errors import TrainschedError
from trainsched.report.progress import ProgressBar
from trainsched.report.tables import compare_report

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
    add_json(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from trainsched import compare as comparing
    from trainsched.cluster import resolve_cluster
    from trainsched.graph import Graph, atomic_write_text
    from trainsched.report.chart import write_chart
    from trainsched.sim import write_trace
    from trainsched.training import to_training

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
                error_context(zoo.name):
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
    write_chart(str(out_dir / "compare.png"), rows, title)
    doc = {"model": model, "cluster": cluster.name, "ranks": ranks,
           "microbatches": options.microbatches, "batch_size": options.batch_size,
           "tier": graph.meta.get("tier"), "rows": [r.to_dict() for r in rows]}
    atomic_write_text(out_dir / "compare.json", dump(doc) + "\n")  # same inputs, same bytes
    if args.json:
        print(dump({**doc, "out_dir": str(out_dir)}))
        return 0
    print(compare_report(rows, title=title, tier=graph.meta.get("tier"),
                         device=graph.meta.get("device", "?"), out_dir=out_dir))
    return 0
