"""``trainsched show``: describe a graph file (torch-free)."""

from __future__ import annotations

import argparse

from trainsched.cli.common import Subcommands, add_json, dump, load_graph
from trainsched.report.graph_summary import describe_graph, graph_summary

NAME = "show"


def add_parser(sub: Subcommands) -> None:
    p = sub.add_parser(NAME, help="describe a graph file")
    p.add_argument("graph", help="a graph file, JSON or binary (.tsg) (trainsched "
                   "profile -o writes one)")
    p.add_argument("--top", type=int, default=10, help="heaviest ops to show")
    add_json(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    graph = load_graph(args.graph, args)
    summary = graph_summary(graph, top=args.top)
    if args.json:
        print(dump(summary))
    else:
        print(describe_graph(summary, top=args.top))
    return 0
