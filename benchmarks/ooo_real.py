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

``--k`` takes several values (``--k 2,4,8``): each runs against k = 0 in the same job, one
segment of each per round. Unless ``--no-predict``, the simulator's view is printed beside: this
host calibrated once (``trainsched calibrate``), the model captured at each batch on both ranks
at once (``runtime.host_model``), and every k simulated with the same policy
(``sim.sweep_k``): the predicted step of k = 0 and of each measured k, the predicted speedup,
and the k the simulator would choose.

Printed as a table; written to ``--out`` (benchmarks/results/ooo_real.json).

    python benchmarks/ooo_real.py                 # about 3 minutes (batches 8, 32, 128)
    python benchmarks/ooo_real.py --k 2,4,6,8 --batch-sizes 32
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


def label(k: int) -> str:
    return "k=0 (in order)" if k == 0 else f"k={k} (reverse-first-k)"


def segment(args: argparse.Namespace, k: int) -> Segment:
    """The runtime's configuration for k (priority, partitions and credit, crossing the
    barrier); the simulator simulates its very policy object."""
    return Segment(label=label(k), kind="sdp", partition_bytes=int(args.partition_mib * MiB),
                   credit_bytes=int(args.credit_mib * MiB), steps=args.steps,
                   warmup=args.warmup, backprop_k=k)


def paired_job(args: argparse.Namespace, batch: int) -> dict[str, Any]:
    """One 2-rank job at ``batch``: k = 0 and every k of ``args.ks`` interleaved; their
    summaries and, per k, the paired speedup and how many rounds out-of-order won."""
    configs = [segment(args, k) for k in (0, *args.ks)]
    schedule = [c for _ in range(args.repeats) for c in configs]
    load_before = load()
    job = run_segments(args.model, schedule, nproc=2, batch_size=batch, optimizer="sgd",
                       lr=0.01, timeout_s=3600)
    rows: dict[str, list[list[float]]] = {}
    for seg in job.segments:
        rows.setdefault(seg.label, []).append(list(seg.step_times_s))
    summary = {name: summarise(rounds) for name, rounds in rows.items()}
    paired = {}
    for k in args.ks:
        pairs = list(zip(summary[label(0)]["round_medians_s"],
                         summary[label(k)]["round_medians_s"], strict=True))
        paired[str(k)] = {"paired_speedup": statistics.median(b / o for b, o in pairs),
                          "rounds_won": sum(o < b for b, o in pairs), "rounds": len(pairs)}
    return {"configurations": summary, "paired": paired,
            "load_average": {"before": load_before, "after": load()}, "host": job.host}


def predicted(args: argparse.Namespace, batch: int, cluster: Any) -> dict[str, Any]:
    """The simulator's view at ``batch``: the model captured on both ranks at once, every k
    simulated with the runtime's policy; the predicted step of each k and the k chosen."""
    from trainsched.runtime.host import host_model
    from trainsched.sim import sweep_k

    graph, _ = host_model(args.model, ranks=2, batch_size=batch, calibration=cluster)
    sweep = sweep_k(graph, cluster, ranks=2, policy=segment(args, 0).policy_object(), steps=3)
    return {"step_time_s": list(sweep.step_time_s), "chosen_k": sweep.k,
            "chosen_speedup": sweep.speedup}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=MODEL)
    parser.add_argument("--batch-sizes", default="8,32,128",
                        help="comma-separated; one paired job per batch size")
    parser.add_argument("--k", default="8",
                        help="deferred layers, comma-separated (default 8: all of them)")
    parser.add_argument("--no-predict", action="store_true",
                        help="measure only (no calibration, capture or simulation)")
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
    args.ks = sorted({int(k) for k in args.k.split(",")} - {0})
    if not args.ks:
        parser.error("--k needs at least one k above 0")
    began = time.time()
    cluster = calibration = None
    if not args.no_predict:
        from trainsched.runtime.calibrate import calibrate

        print("calibrating this host (2 gloo ranks) ...", flush=True)
        calibration = calibrate(world_size=2)
        cluster = calibration.to_cluster()
    results = {}
    print(f"{'batch':>5} {'k':>3} {'k=0 ms':>8} {'k ms':>8} {'paired':>7} {'rounds won':>10} "
          f"{'pred k=0':>9} {'pred k':>8} {'pred x':>7} {'load before/after':>18}")
    for batch in batches:
        r = results[batch] = paired_job(args, batch)
        if cluster is not None:
            r["predicted"] = predicted(args, batch, cluster)
        base, lo = r["configurations"][label(0)], r["load_average"]
        for k in args.ks:
            ooo, pair = r["configurations"][label(k)], r["paired"][str(k)]
            line = (f"{batch:>5} {k:>3} {base['median_s'] * 1e3:>8.1f} "
                    f"{ooo['median_s'] * 1e3:>8.1f} {pair['paired_speedup']:>6.3f}x "
                    f"{pair['rounds_won']:>5}/{pair['rounds']:<4}")
            if "predicted" in r:
                times = r["predicted"]["step_time_s"]
                line += (f" {times[0] * 1e3:>9.1f} {times[k] * 1e3:>8.1f} "
                         f"{times[0] / times[k]:>6.3f}x")
            print(f"{line} {lo['before']:>8.2f}/{lo['after']:.2f}", flush=True)
        if "predicted" in r:
            p = r["predicted"]
            print(f"      the simulator would choose k={p['chosen_k']} "
                  f"(predicted {p['chosen_speedup']:.3f}x over k=0)", flush=True)
    print(f"paired: k over k=0, the median over rounds of k=0's round median over k's (goal "
          f"{TARGET_SPEEDUP}x); pred: the simulator's step for k=0 and k and their ratio; load "
          f"average above 1.5 before a job means other work shared the cores")
    host = results[batches[0]]["host"]
    write_results(args.out, {
        "benchmark": "ooo_real", "model": args.model, "k": args.ks,
        "policy": repr(segment(args, 0).policy_object()),
        "steps": args.steps, "warmup": args.warmup, "repeats": args.repeats,
        "batches": {str(b): {k: v for k, v in r.items() if k != "host"}
                    for b, r in results.items()},
        "target": TARGET_SPEEDUP,
        "calibration": calibration.to_dict() if calibration is not None else None,
        "host": {"cpu": cpu_model(), "cpu_count": os.cpu_count(),
                 "python": platform.python_version(), **host},
        "date": datetime.date.today().isoformat(), "wall_s": time.time() - began})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
