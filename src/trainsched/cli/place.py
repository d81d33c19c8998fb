"""``trainsched place``: place a graph's ops on a cluster's devices within their memory
(torch-free)."""

from __future__ import annotations

import argparse

from trainsched.cli.common import (
    Subcommands,
    add_alias,
    add_json,
    add_optimizer,
    dump,
    training_graph,
)
from trainsched.cluster import COMM_MODES
from trainsched.placement import PLACERS, SCT_THRESHOLD
from trainsched.report.tables import place_report

NAME = "place"


def add_parser(sub: Subcommands) -> None:
    p = sub.add_parser(NAME, help="place a graph's ops on a cluster's devices (m-SCT, m-ETF, "
                       "m-TOPO, baselines) within their memory")
    p.add_argument("graph", help="a graph file (forward graphs get backward/optimizer ops)")
    p.add_argument("--cluster", required=True, help="preset, NAME:NODES, or a cluster file")
    p.add_argument("--algorithm", default="auto",
                   choices=("auto", *PLACERS),
                   help="auto (default) runs them all and keeps the fastest predicted")
    p.add_argument("--channels", choices=COMM_MODES, default=None,
                   help="how transfers contend (default: the cluster's)")
    add_alias(p, "--comm", "channels", choices=COMM_MODES)
    p.add_argument("--no-fusion", action="store_true", help="do not fuse ops inside groups")
    p.add_argument("--no-coplacement", action="store_true",
                   help="do not join an op with its sole consumer")
    p.add_argument("--forward-only", action=argparse.BooleanOptionalAction, default=None,
                   help="place forward ops, backward/optimizer ops follow (default: on for "
                   "training graphs)")
    p.add_argument("--sct-threshold", type=float, default=SCT_THRESHOLD, metavar="THETA",
                   help="m-SCT's rounding threshold in [0, 1]: an edge whose LP value is at "
                   f"most THETA can make its child the favourite (default {SCT_THRESHOLD:g}, "
                   "Baechi's function default; its command line used 0.1)")
    add_optimizer(p)
    p.add_argument("-o", "--output", default=None, help="write the placement JSON here")
    add_json(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from trainsched.cluster import resolve_cluster
    from trainsched.placement import place
    from trainsched.sim import check_costs_fit, predict_placement

    graph = training_graph(args.graph, args)
    cluster = resolve_cluster(args.cluster)
    check_costs_fit(graph, cluster)
    result = place(graph, cluster, args.algorithm, comm=args.channels, fusion=not args.no_fusion,
                   coplacement=not args.no_coplacement, forward_only=args.forward_only,
                   sct_threshold=args.sct_threshold, predict=predict_placement)
    if args.output:
        result.placement.save(args.output)
    summary = result.summary()
    if args.json:
        print(dump({**summary, "cluster": cluster.label, "output": args.output}))
        return 0
    print(place_report(result, summary, model=graph.meta.get("model", args.graph),
                       cluster=cluster, algorithm=args.algorithm, graph_path=args.graph,
                       cluster_spec=args.cluster, output=args.output))
    return 0
