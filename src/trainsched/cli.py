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
    zoo = build(args.model, batch_size=args.batch_size, seq_len=args.seq_len, seed=args.seed)
    meta = {"batch_size": zoo.batch_size}
    if zoo.seq_len is not None:
        meta["seq_len"] = zoo.seq_len
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

    p = sub.add_parser("profile", help="capture a model into a graph with costs")
    p.add_argument("model", help="a zoo model name (trainsched models lists them)")
    p.add_argument("--batch-size", type=int, default=None, help="examples per batch")
    p.add_argument("--seq-len", type=int, default=None, help="tokens per example (text models)")
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
