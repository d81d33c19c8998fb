"""``trainsched calibrate``: measure this host's communication with real processes and write a
cluster file (imports torch, through the runtime)."""

from __future__ import annotations

import argparse

from trainsched.cli.common import Subcommands, add_json, check_output_dir, dump
from trainsched.cluster import INTERFERENCE_MODELS

NAME = "calibrate"


def add_parser(sub: Subcommands) -> None:
    p = sub.add_parser(NAME, help="measure this host's communication (gloo, or NCCL "
                       "where present) and write a cluster file")
    p.add_argument("--ranks", type=int, default=2, help="processes to measure with")
    p.add_argument("--repeats", type=int, default=30, help="timed repeats per size")
    p.add_argument("--backend", default="gloo", help="gloo or nccl")
    p.add_argument("--timeout", type=float, default=300, help="seconds before giving up")
    p.add_argument("--name", default="calibrated", help="name of the cluster written")
    p.add_argument("--comm-model", choices=INTERFERENCE_MODELS, default="rates",
                   help="how the written cluster charges compute and communication that run "
                   "at once: 'rates' (each slows the other, collectives in flight share the "
                   "wire) or 'turns' (a collective takes a measured share of compute)")
    p.add_argument("-o", "--output", default=None, help="write the cluster JSON here")
    add_json(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from trainsched.runtime.calibrate import calibrate

    check_output_dir(args.output)
    result = calibrate(world_size=args.ranks, repeats=args.repeats, backend=args.backend,
                       timeout_s=args.timeout)
    cluster = result.to_cluster(name=args.name, comm_model=args.comm_model)
    if args.output:
        from trainsched.graph import atomic_write_text

        atomic_write_text(args.output, cluster.to_json())
    if args.json:
        print(dump({"calibration": result.to_dict(), "cluster": cluster.to_dict(),
                    "output": args.output}))
        return 0
    print(result.table())
    print()
    print(cluster.describe())
    if args.output:
        print(f"\nwrote {args.output} (use it as --cluster {args.output})")
    return 0
