"""``trainsched search-sync``: the offline sync policy, found by short real runs.

For a recurring job, the smallest fraction f of the samples trained under BSP (the rest under
``--relaxed``, ASP by default) whose held-out accuracy stays within ``--epsilon`` points of pure
BSP's, by :func:`trainsched.sync.search_bsp_fraction` (repeats per probe, a one-sided Student-t
lower bound, halving while a candidate passes). Every trial is a real run of the sync runtime on
a built-in task; the report lists each with its accuracy and measured time, and the policy text
to reuse (``train TASK --sync bsp:F,asp:1-F``). Each trial's seed draws its own instance of
the task (teacher, data, student initialisation, sample order), so the bound covers the spread
over instances of the task as well as the relaxed protocol's timing noise.
"""

from __future__ import annotations

import argparse
from fractions import Fraction
from typing import Any

from trainsched.cli.common import Subcommands, add_json, check_count, dump
from trainsched.errors import TrainschedError

NAME = "search-sync"
DEFAULTS = {"ranks": 2, "batch_size": 32, "samples": 8192, "lr": 0.1, "repeats": 3,
            "epsilon": 0.5, "min_fraction": 1 / 64, "confidence": 0.9, "seed": 0}


def add_parser(sub: Subcommands) -> None:
    p = sub.add_parser(NAME, help="find the smallest BSP fraction within epsilon of pure "
                       "BSP's accuracy, by real runs of a built-in task")
    p.add_argument("task", help="a built-in task (teacher-student)")
    p.add_argument("--relaxed", default="asp",
                   help="the protocol after the BSP phase: asp (default), ssp:S, k-of-n:K, "
                   "local:H (or ssp(s=S), k-of-n(k=K), local(h=H))")
    p.add_argument("--ranks", type=int, default=DEFAULTS["ranks"], help="worker ranks")
    p.add_argument("--batch-size", type=int, default=DEFAULTS["batch_size"],
                   help="samples per worker batch")
    p.add_argument("--samples", type=int, default=DEFAULTS["samples"],
                   help="samples per run (rounded down to the phases' common update size)")
    p.add_argument("--lr", type=float, default=DEFAULTS["lr"], help="BSP's learning rate")
    p.add_argument("--repeats", type=int, default=DEFAULTS["repeats"],
                   help="runs per probed fraction (and of pure BSP)")
    p.add_argument("--epsilon", type=float, default=DEFAULTS["epsilon"],
                   help="accuracy points a fraction may lose against pure BSP")
    p.add_argument("--min-fraction", type=float, default=DEFAULTS["min_fraction"],
                   help="the smallest fraction probed (default 1/64)")
    p.add_argument("--confidence", type=float, default=DEFAULTS["confidence"],
                   help="level of the one-sided lower bound")
    p.add_argument("--seed", type=int, default=DEFAULTS["seed"], help="seeds every trial")
    p.add_argument("--timeout", type=float, default=600, help="seconds per run before giving up")
    add_json(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from trainsched.runtime.sync import phase_quantum, policy_phases, run_sync
    from trainsched.runtime.tasks import TASKS
    from trainsched.sync import Bsp, parse_policy, parse_protocol
    from trainsched.sync.search import search_bsp_fraction

    if args.task not in TASKS:
        raise TrainschedError(f"unknown task {args.task!r}; the sync runtime trains the "
                              f"built-in tasks: {', '.join(TASKS)}")
    relaxed = parse_protocol(args.relaxed)
    for flag in ("ranks", "batch_size", "repeats"):
        check_count(f"--{flag.replace('_', '-')}", getattr(args, flag), 2 if flag == "repeats"
                    else 1)
    quantum = phase_quantum((Bsp(), relaxed), args.ranks, args.batch_size)
    # every probed fraction 1/2^j must fall on a multiple of the common update size
    probes = 1
    while Fraction(1, 2 * probes) >= Fraction(args.min_fraction).limit_denominator(1 << 20):
        probes *= 2
    unit = quantum * probes
    check_count("--samples", args.samples, unit, None,
                f"{probes} x the {quantum} samples of one update of both protocols, so that "
                f"every probed fraction down to 1/{probes} is whole updates")
    total = args.samples - args.samples % unit
    task = TASKS[args.task]()
    walls: dict[tuple[float, int], float] = {}

    def trial(fraction: float, seed: int) -> float:
        text = "bsp" if fraction >= 1 else \
            f"bsp:{fraction:g},{args.relaxed}:{1 - fraction:g}"
        phases = policy_phases(parse_policy(text), total, ranks=args.ranks,
                               batch_per_rank=args.batch_size)
        result = run_sync(_seeded(task, seed), phases, ranks=args.ranks,
                          batch_per_rank=args.batch_size, lr=args.lr,
                          timeout_s=min(args.timeout, 120.0), deadline_s=args.timeout)
        walls[(fraction, seed)] = result.wall_s
        return 100 * result.final_accuracy

    found = search_bsp_fraction(trial, epsilon_points=args.epsilon, repeats=args.repeats,
                                min_fraction=args.min_fraction, confidence=args.confidence,
                                seed=args.seed)
    doc = _document(found, walls, args.relaxed, total)
    print(dump(doc) if args.json else report(doc))
    return 0


def _seeded(task: Any, seed: int) -> Any:
    """The task with its data and student initialised from ``seed`` (the teacher stays)."""
    from dataclasses import replace

    return replace(task, seed=seed) if hasattr(task, "seed") else task


def _document(found: Any, walls: dict[tuple[float, int], float], relaxed: str,
              total: int) -> dict[str, Any]:
    f = found.fraction
    policy = "bsp" if f >= 1 else f"bsp:{f:g},{relaxed}:{1 - f:g}"
    return {"fraction": f, "policy": policy, "samples_per_run": total,
            "reference_accuracy": found.reference_accuracy,
            "candidates": [c.__dict__ for c in found.candidates],
            "trials": [{**t.__dict__, "wall_s": walls[(t.fraction, t.seed)]}
                       for t in found.trials],
            "total_wall_s": sum(walls.values())}


def report(doc: dict[str, Any]) -> str:
    lines = [f"search-sync: pure BSP reaches {doc['reference_accuracy']:.2f}% on average "
             f"({doc['samples_per_run']} samples per run)",
             f"  {'fraction':>9}{'mean diff':>11}{'lower bound':>13}  verdict"]
    for c in doc["candidates"]:
        lines.append(f"  {c['fraction']:>9.4g}{c['mean_difference']:>+11.2f}"
                     f"{c['lower_bound']:>+13.2f}  {'pass' if c['passed'] else 'fail'}")
    lines.append(f"  {len(doc['trials'])} real runs, {doc['total_wall_s']:.1f} s in all:")
    for t in doc["trials"]:
        lines.append(f"    f {t['fraction']:<8.4g} seed {t['seed']:<11} accuracy "
                     f"{t['accuracy']:6.2f}%  {t['wall_s']:.2f} s")
    lines.append(f"  chosen: {doc['policy']} (reuse it: trainsched train TASK --sync "
                 f"{doc['policy']})")
    return "\n".join(lines)
