"""Out-of-order backprop (reverse-first-k) on 2 real gloo ranks: k = 0 against a chosen k.

``specs/backprop.md`` §2b on this host: a communication-bound model (``_widemlp.py``: eight
1024 x 1024 linear layers, 32 MiB of fp32 gradients, batch 8) trained with
``ScheduledDataParallel`` under the priority policy (partitions, credit, crossing the
barrier), once in order (``backprop_k=0``) and once with the dW of the ``--k`` layers nearest
the input deferred after the last dX (layer 0 first). Per batch size (``--batch-sizes``), one
2-rank job runs the two configurations paired and interleaved (k0, kK, k0, kK, ...),
``--repeats`` rounds of ``--steps`` timed steps after ``--warmup``, so drift between rounds
cancels in the paired ratio: the median over rounds of k0's round median over kK's. The
batch sets how much of the step is compute (forward and backward about 3 x 8 x batch x 1024²
multiply-adds: 0.2 G at batch 8, 3.2 G at 128), against the same 32 MiB of gradients.

Compute and gloo share this host's two cores (and, here, other jobs): the load average before
and after is written beside the numbers, and a run at a load above 1.5 says so.

Printed as a table; written to ``--out`` (benchmarks/results/ooo_real.json).

    python benchmarks/ooo_real.py                 # about 3 minutes (batches 8, 32, 128)
    python benchmarks/ooo_real.py --quick         # a smoke run: 3 steps, 1 round
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

from _common import cpu_model, write_results
from trainsched.runtime.train import Segment, run_segments

MiB = 1 << 20
MODEL = str(Path(__file__).with_name("_widemlp.py")) + ":build"
TARGET_SPEEDUP = 1.05


def load() -> float:
    return os.getloadavg()[0]


def summarise(rounds: list[list[float]]) -> dict[str, Any]:
    medians = [statistics.median(r) for r in rounds]
    pooled = sorted(t for r in rounds for t in r)

    def q(x: float) -> float:
        return pooled[min(len(pooled) - 1, round(x * (len(pooled) - 1)))]

    return {"median_s": statistics.median(medians), "round_medians_s": medians,
            "p10_s": q(0.1), "p90_s": q(0.9), "steps": len(pooled)}


def paired_job(args: argparse.Namespace, batch: int) -> dict[str, Any]:
    """One 2-rank job at ``batch``: k = 0 and k = ``args.k`` interleaved; their summaries,
    the paired speedup and how many rounds out-of-order won."""
    labels = {0: "k=0 (in order)", args.k: f"k={args.k} (reverse-first-k)"}
    configs = [Segment(label=labels[k], kind="sdp", partition_bytes=int(args.partition_mib * MiB),
                       credit_bytes=int(args.credit_mib * MiB), steps=args.steps,
                       warmup=args.warmup, backprop_k=k) for k in (0, args.k)]
    schedule = [c for _ in range(args.repeats) for c in configs]
    load_before = load()
    job = run_segments(args.model, schedule, nproc=2, batch_size=batch, optimizer="sgd",
                       lr=0.01, timeout_s=3600)
    rows: dict[str, list[list[float]]] = {}
    for seg in job.segments:
        rows.setdefault(seg.label, []).append(list(seg.step_times_s))
    summary = {label: summarise(rounds) for label, rounds in rows.items()}
    pairs = list(zip(summary[labels[0]]["round_medians_s"],
                     summary[labels[args.k]]["round_medians_s"], strict=True))
    return {"configurations": summary,
            "paired_speedup": statistics.median(b / o for b, o in pairs),
            "rounds_won": sum(o < b for b, o in pairs), "rounds": len(pairs),
            "load_average": {"before": load_before, "after": load()}, "host": job.host}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=MODEL)
    parser.add_argument("--batch-sizes", default="8,32,128",
                        help="comma-separated; one paired job per batch size")
    parser.add_argument("--k", type=int, default=8, help="deferred layers (default: all 8)")
    parser.add_argument("--partition-mib", type=float, default=1.0)
    parser.add_argument("--credit-mib", type=float, default=4.0)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--quick", action="store_true", help="3 steps, 1 round")
    parser.add_argument("--out", default="benchmarks/results/ooo_real.json")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.warmup, args.repeats = 3, 1, 1
    batches = [int(b) for b in args.batch_sizes.split(",")]
    began = time.time()
    results = {}
    print(f"{'batch':>5} {'k=0 ms':>8} {f'k={args.k} ms':>8} {'paired':>7} {'rounds won':>10} "
          f"{'load before/after':>18}")
    for batch in batches:
        r = results[batch] = paired_job(args, batch)
        (base, ooo), lo = r["configurations"].values(), r["load_average"]
        print(f"{batch:>5} {base['median_s'] * 1e3:>8.1f} {ooo['median_s'] * 1e3:>8.1f} "
              f"{r['paired_speedup']:>6.3f}x {r['rounds_won']:>5}/{r['rounds']:<4} "
              f"{lo['before']:>8.2f}/{lo['after']:.2f}", flush=True)
    print(f"paired: k={args.k} over k=0, the median over rounds of k=0's round median over "
          f"k={args.k}'s (goal {TARGET_SPEEDUP}x); load average above 1.5 before a job means "
          f"other work shared the cores")
    host = results[batches[0]]["host"]
    write_results(args.out, {
        "benchmark": "ooo_real", "model": args.model, "k": args.k,
        "policy": {"name": "priority", "partition_bytes": int(args.partition_mib * MiB),
                   "credit_bytes": int(args.credit_mib * MiB), "cross_barrier": True},
        "steps": args.steps, "warmup": args.warmup, "repeats": args.repeats,
        "batches": {str(b): {k: v for k, v in r.items() if k != "host"}
                    for b, r in results.items()},
        "target": TARGET_SPEEDUP,
        "host": {"cpu": cpu_model(), "cpu_count": os.cpu_count(),
                 "python": platform.python_version(), **host},
        "date": datetime.date.today().isoformat(), "wall_s": time.time() - began})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
