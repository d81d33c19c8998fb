"""``trainsched cluster``: print a cluster from a preset, a file, or flags (torch-free)."""

from __future__ import annotations

import argparse

from trainsched.cli.common import (
    Applies,
    Fact,
    Subcommands,
    add_alias,
    add_json,
    check_applicable,
    check_count,
    dump,
)
from trainsched.cluster import COMM_MODES
from trainsched.errors import TrainschedError
from trainsched.report.tables import preset_list

NAME = "cluster"


def add_parser(sub: Subcommands) -> None:
    p = sub.add_parser(NAME, help="print a cluster: a preset, a file, or flags")
    p.add_argument("spec", nargs="?", default=None,
                   help="preset name, NAME:NODES (e.g. p3.16xlarge:4), or a .toml/.json file")
    p.add_argument("--list", action="store_true", help="list the presets")
    p.add_argument("--nodes", type=int, default=None, help="number of nodes")
    p.add_argument("--devices", type=int, default=None, help="devices per node")
    p.add_argument("--memory", default=None, help="memory per device, e.g. 8GiB")
    p.add_argument("--bandwidth", default=None, help="link bandwidth, e.g. 5.7GB/s")
    p.add_argument("--latency", default=None, help="link latency, e.g. 134us")
    p.add_argument("--channels", choices=COMM_MODES, default=None,
                   help="sequential: a device's sends and receives share one channel; "
                   "parallel (default): a channel per direction and peer")
    add_alias(p, "--comm", "channels", choices=COMM_MODES)
    p.add_argument("--device-kind", default=None, help="catalogue kind for the other numbers")
    p.add_argument("--peak-flops", default=None,
                   help="device FLOP/s: one rate or fp32=...,bf16=... (e.g. 15.7TFLOP/s)")
    p.add_argument("--memory-bandwidth", default=None, help="device memory bandwidth")
    p.add_argument("--name", default=None, help="name of a flag-built cluster (default custom)")
    p.add_argument("--inter-bandwidth", default=None, help="between nodes, e.g. 25Gbit/s")
    p.add_argument("--inter-latency", default=None, help="between nodes, e.g. 50us")
    p.add_argument("-o", "--output", default=None, help="write the cluster JSON here")
    add_json(p)
    p.set_defaults(func=run)


#: The flags that build a cluster (without a preset or file).
BUILD_FLAGS = ("devices", "memory", "bandwidth", "latency", "channels", "device_kind", "peak_flops",
               "memory_bandwidth", "name", "inter_bandwidth", "inter_latency")

#: Which flags apply to a preset or file (``spec``), to a cluster built from flags
#: (``flags``) and to ``--list`` (:func:`trainsched.cli.common.check_applicable`).
RULES = (
    Applies(flags=BUILD_FLAGS, when={"source": ("flags",)},
            where="to a cluster built from flags (no preset or file)"),
    Applies(flags=("nodes", "output"), when={"source": ("spec", "flags")},
            where="to a cluster (not with --list)"),
)


def run(args: argparse.Namespace) -> int:
    from trainsched import cluster as clusters

    source = "list" if args.list else "spec" if args.spec else "flags"
    check_applicable(args, RULES, {"source": Fact(
        value=source, text="with --list" if args.list else f"to {args.spec}")})
    check_count("--nodes", args.nodes, 1)
    if args.list:
        rows = [{"name": p.name, "description": p.description, "source": p.source,
                 "aliases": list(p.aliases)} for p in clusters.PRESETS.values()]
        print(dump(rows) if args.json else preset_list(rows))
        return 0
    flags = {k: getattr(args, k) for k in ("devices", "memory", "bandwidth", "latency")}
    if args.spec:
        cluster = clusters.resolve_cluster(args.spec, nodes=args.nodes)
    elif all(v is not None for v in flags.values()):
        cluster = clusters.cluster_from_flags(
            devices=args.devices, memory=args.memory, bandwidth=args.bandwidth,
            latency=args.latency, nodes=1 if args.nodes is None else args.nodes,
            comm=args.channels or "parallel",
            device_kind=args.device_kind, inter_bandwidth=args.inter_bandwidth,
            inter_latency=args.inter_latency, peak_flops=args.peak_flops,
            memory_bandwidth=args.memory_bandwidth, name=args.name or "custom")
    else:
        missing = [f"--{k}" for k, v in flags.items() if v is None]
        raise TrainschedError("name a preset or file (trainsched cluster --list shows the "
                              f"presets), or give all of {', '.join(missing)}")
    if args.output:
        from trainsched.graph import atomic_write_text

        atomic_write_text(args.output, cluster.to_json())
    print(dump(cluster.to_dict()) if args.json else cluster.describe())
    return 0
