"""``trainsched profile``: capture a zoo model into a graph with costs (imports torch)."""

from __future__ import annotations

import argparse
import sys
import time

from trainsched.cli.common import (
    COST_CHOICES,
    Applies,
    Fact,
    Subcommands,
    add_json,
    add_precision,
    check_applicable,
    check_output_dir,
    dump,
    error_context,
    size_rules_and_facts,
)
from trainsched.graph.core import SPREAD_LIMIT
from trainsched.report.graph_summary import describe_graph, graph_summary
from trainsched.report.progress import ProgressBar

NAME = "profile"


def add_parser(sub: Subcommands) -> None:
    p = sub.add_parser(NAME, help="capture a model into a graph with costs")
    p.add_argument("model", help="a zoo model name (trainsched models lists them)")
    p.add_argument("--batch-size", type=int, default=None, help="examples per batch")
    p.add_argument("--seq-len", type=int, default=None, help="tokens per example (text models)")
    p.add_argument("--image-size", type=int, default=None,
                   help="image side of vision models (default 224; >= 32)")
    p.add_argument("--granularity", choices=("op", "module"), default="op",
                   help="op (default): one op per ATen op; module: one per module call")
    p.add_argument("--module-depth", type=int, default=None,
                   help="with --granularity module: group by module path truncated to this "
                   "many components (e.g. 2 gives ResNet blocks)")
    p.add_argument("--costs", choices=COST_CHOICES, default="auto",
                   help="auto: roofline when --device-kind is given, else measured; measured "
                   "on this machine, roofline for --device-kind, or static (FLOPs and bytes "
                   "only)")
    p.add_argument("--device-kind", default=None,
                   help="device of the roofline costs (default H100; see docs/cluster.md)")
    add_precision(p)
    p.add_argument("--device", default=None,
                   help="where measured costs run: cpu or cuda (default cuda where present)")
    p.add_argument("--repeats", type=int, default=None,
                   help=f"measured costs: most timed calls per op and phase (at least 3; fewer "
                   f"for slow ops; default {DEFAULTS['repeats']})")
    p.add_argument("--warmup", type=int, default=None,
                   help=f"measured costs: untimed warm-up calls per op and phase (default "
                   f"{DEFAULTS['warmup']})")
    p.add_argument("--threads", type=int, default=None,
                   help="torch intra-op threads while measuring (default: 1 on the CPU, as "
                   "the runtime runs each rank; torch's own on a GPU)")
    p.add_argument("--no-step-overhead", action="store_true",
                   help="measured costs: keep each op's time as timed alone (by default "
                   "whole eager training steps are timed too, and what the ops miss of them "
                   "is charged to the ops; see docs/capture.md)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    p.add_argument("--top", type=int, default=10, help="heaviest ops to show")
    p.add_argument("-o", "--output", default=None, help="write the graph JSON here")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    add_json(p)
    p.set_defaults(func=run)


#: Defaults of the measured tier's flags (given in code: other tiers do not take them).
DEFAULTS = {"repeats": 10, "warmup": 0}


def check_flags(args: argparse.Namespace) -> None:
    """Refuse every flag that does not apply: the model's sizes it does not take,
    ``--module-depth`` at op granularity, a cost tier's options with another tier
    (:func:`trainsched.cli.common.check_applicable`). ``--costs auto`` becomes the tier the
    other flags ask for."""
    if args.costs == "auto":
        args.costs = "roofline" if args.device_kind is not None else "measured"
    rules, facts = size_rules_and_facts(args.model)
    rules += [Applies(flags=("module_depth",), when={"granularity": ("module",)},
                      where="with --granularity module"),
              Applies(flags=("device_kind",), when={"costs": ("roofline",)},
                      where="with --costs roofline"),
              Applies(flags=("device", "repeats", "warmup", "threads", "no_step_overhead"),
                      when={"costs": ("measured",)}, where="with --costs measured")]
    facts.update(granularity=Fact(value=args.granularity,
                                  text=f"with --granularity {args.granularity}"),
                 costs=Fact(value=args.costs, text=f"with --costs {args.costs}"))
    check_applicable(args, rules, facts)


def run(args: argparse.Namespace) -> int:
    from trainsched.capture import build, capture, measure_device

    check_flags(args)
    for option, default in DEFAULTS.items():
        if getattr(args, option) is None:
            setattr(args, option, default)
    check_output_dir(args.output)
    if args.device is not None:
        measure_device(args.device)  # no CUDA device here, say, before building the model
    started = time.perf_counter()
    zoo = build(args.model, batch_size=args.batch_size, seq_len=args.seq_len,
                image_size=args.image_size, seed=args.seed)
    meta = {"batch_size": zoo.batch_size}
    if zoo.seq_len is not None:
        meta["seq_len"] = zoo.seq_len
    if args.image_size is not None:
        meta["image_size"] = args.image_size
    with ProgressBar(f"profiling {zoo.name}", enabled=not args.json and not args.quiet) as bar, \
            error_context(zoo.name):
        graph = capture(zoo.model, zoo.args, example_kwargs=zoo.kwargs,
                        granularity=args.granularity, module_depth=args.module_depth,
                        costs=args.costs, device_kind=args.device_kind, device=args.device,
                        warmup=args.warmup, repeats=args.repeats, name=zoo.name, meta=meta,
                        threads=args.threads, precision=args.precision or "fp32",
                        step_overhead=not args.no_step_overhead, progress=bar.update)
    elapsed = time.perf_counter() - started
    noisy = graph.meta.get("noisy_phases", 0)
    if noisy:
        print(f"trainsched: warning: {noisy} measured phases still spread more than "
              f"{SPREAD_LIMIT:g}x (p90/p10) after being timed again: the host was busy; "
              "profile again on a quiet machine (show lists the widest)", file=sys.stderr)
    if args.output:
        graph.save(args.output)
    summary = graph_summary(graph, top=args.top)
    if args.json:
        print(dump({"graph": args.output, "capture_s": round(elapsed, 3), **summary}))
    else:
        print(describe_graph(summary, top=args.top))
        where = f"wrote {args.output}" if args.output else "no -o given: graph not written"
        print(f"\ncaptured in {elapsed:.1f} s; {where}")
    return 0
