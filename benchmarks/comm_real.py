"""Real communication scheduling on this machine: 2 gloo ranks train VGG-16 (32 x 32, batch 4
per rank), stock DDP against trainsched's FIFO and priority scheduling.

One 2-rank job runs every configuration in turn, interleaved (A B C ... A B C ...), ``--repeats``
rounds of ``--steps`` timed steps after ``--warmup`` untimed ones (step drift on this host is up
to 30%, so interleaving matters more than step count). Configurations:

- ``ddp-25MB`` / ``ddp-1MB``: ``torch.nn.parallel.DistributedDataParallel``, bucket caps 25 MB
  (the default, first bucket 1 MB) and 1 MB;
- ``fifo``: trainsched's runtime, whole tensors in ready order, the full barrier;
- ``priority p/c mode``: partitions of p, credit c, ``overdraft`` or ``strict``, crossing the
  barrier, each partition's slice stepped as soon as it is reduced (``update="auto"``, SGD);
  one point again with whole-parameter updates, to show what partition updates add;
- ``flat``: backward, then one all-reduce of every gradient packed flat (no overlap at all);
- ``compute-2``: both ranks compute with no communication (the two cores both busy);
- ``allreduce``: one flat all-reduce of all 553 MB of gradients, alone.

Before the rounds, one 2-rank job tunes partition and credit online (``--tune-trials`` trials of
``--tune-steps`` steps: optuna's TPE, every rank switching at the same step, as ``trainsched
train --autotune``); its best point joins the rounds as ``priority tuned p/c``, so the tuner's
pick is timed beside the hand-picked grid of priority points in the same interleaved run.

A separate 1-rank job measures compute alone (``compute-1``). The ideal step time is max(compute,
communication) = max(compute-1, allreduce); "gap closed" is how much of DDP's distance to it the
best priority configuration removes: (ddp - priority) / (ddp - ideal).

Per configuration: the median of each round's median (``median_s``), the rounds' medians, p10
and p90 over all timed steps, and ``paired_ddp_ratio``: the median over rounds of DDP's round
median over this configuration's in the same round (drift between rounds cancels). Printed as
a table; written to ``--out`` (benchmarks/results/comm_real.json).

    python benchmarks/comm_real.py                 # the full run, about 30 minutes
    python benchmarks/comm_real.py --quick         # a smoke run: mlp, 3 steps, 1 round
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

from _common import cpu_model, summarise_rounds, write_results
from trainsched.runtime.train import Segment, run_segments

MiB = 1 << 20
TARGET_SPEEDUP = 1.10
TOLERANCE = 0.03


def tuned_segment(point: tuple[int, int], steps: int, warmup: int) -> Segment:
    p, c = point
    return Segment(label=f"priority tuned {p / MiB:.1f}/{c / MiB:.1f}MiB overdraft", kind="sdp",
                   partition_bytes=p, credit_bytes=c, credit_mode="overdraft", steps=steps,
                   warmup=warmup)


def configurations(steps: int, warmup: int) -> list[Segment]:
    common = {"steps": steps, "warmup": warmup}
    out = [Segment(label="ddp-25MB", kind="ddp", bucket_mb=25.0, **common),
           Segment(label="ddp-1MB", kind="ddp", bucket_mb=1.0, **common),
           Segment(label="fifo", kind="sdp", policy="fifo", cross_barrier=False, **common)]
    for p, c in ((4, 16), (16, 64), (64, 128)):
        for mode in ("overdraft", "strict"):
            out.append(Segment(label=f"priority {p}/{c}MiB {mode}", kind="sdp",
                               partition_bytes=p * MiB, credit_bytes=c * MiB, credit_mode=mode,
                               **common))
    out.append(Segment(label="priority 16/64MiB overdraft, whole-parameter updates",
                       kind="sdp", partition_bytes=16 * MiB, credit_bytes=64 * MiB,
                       update="parameter", **common))
    out.append(Segment(label="priority 16/64MiB overdraft, static order", kind="sdp",
                       partition_bytes=16 * MiB, credit_bytes=64 * MiB, order="static",
                       **common))
    out += [Segment(label="flat", kind="flat", **common),
            Segment(label="compute-2", kind="compute", **common),
            Segment(label="allreduce", kind="allreduce", steps=max(5, steps // 4), warmup=1)]
    return out


def union_s(spans: list[tuple[float, float]]) -> float:
    """Total time covered by possibly overlapping (start, end) spans."""
    total, reach = 0.0, float("-inf")
    for a, b in sorted(spans):
        if b > reach:
            total += b - max(a, reach)
            reach = b
    return total


def anatomy(trace_path: Path) -> dict[str, float]:
    """Where one rank's steps go, from its timeline: per step, seconds of forward, backward,
    waiting at forward gates, updating, and the link busy (union of COMM slices)."""
    events = [e for e in json.loads(trace_path.read_text())["traceEvents"] if e["ph"] == "X"]
    steps = sorted({e["args"]["step"] for e in events})
    out = {}
    for phase in ("FWD", "BWD", "WAIT", "UPDATE"):
        spans = [(e["ts"], e["ts"] + e["dur"]) for e in events if e["args"]["phase"] == phase]
        out[f"{phase.lower()}_s"] = union_s(spans) / 1e6 / len(steps)
    comm = [(e["ts"], e["ts"] + e["dur"]) for e in events if e["args"]["phase"] == "COMM"]
    out["comm_busy_s"] = union_s(comm) / 1e6 / len(steps)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="vgg16")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tune-trials", type=int, default=15)
    parser.add_argument("--tune-steps", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="mlp, 3 steps, 1 round")
    parser.add_argument("--out", default="benchmarks/results/comm_real.json")
    args = parser.parse_args()
    if args.quick:
        args.model, args.image_size, args.steps, args.warmup, args.repeats = "mlp", None, 3, 1, 1
        args.batch_size = 32
        args.tune_trials, args.tune_steps = 2, 1
    began = time.time()
    startup = min(10, args.tune_trials)
    tune_options = {"startup_trials": startup, "guided_trials": args.tune_trials - startup,
                    "seed": 0, "warmup_steps": args.warmup, "settle_steps": 1,
                    "trial_steps": args.tune_steps}
    tuning = run_segments(args.model, [Segment(
        label="online-tune", kind="sdp", partition_bytes=4 * MiB, credit_bytes=16 * MiB,
        steps=args.steps, warmup=args.warmup, tune=tune_options)], nproc=2,
        batch_size=args.batch_size, image_size=args.image_size, optimizer="sgd", lr=0.01,
        timeout_s=7200).first
    tuned = dict(tuning.autotune)
    tuned_config = tuned_segment((tuned["partition_bytes"], tuned["credit_bytes"]), args.steps,
                                 args.warmup)
    configs = configurations(args.steps, args.warmup)
    configs.insert(-3, tuned_config)
    schedule = [c for _ in range(args.repeats) for c in configs]
    job = run_segments(args.model, schedule, nproc=2, batch_size=args.batch_size,
                       image_size=args.image_size, optimizer="sgd", lr=0.01, timeout_s=7200)
    compute_1 = run_segments(args.model, [Segment(label="compute-1", kind="compute",
                                                  steps=args.steps, warmup=args.warmup)] *
                             args.repeats, nproc=1, batch_size=args.batch_size,
                             image_size=args.image_size, timeout_s=3600)
    # One more short run of a priority point with the timeline on, to see where time goes.
    with tempfile.TemporaryDirectory() as tmp:
        traced = Segment(label="traced", kind="sdp", partition_bytes=16 * MiB,
                         credit_bytes=64 * MiB, steps=3, warmup=args.warmup, timeline_dir=tmp)
        run_segments(args.model, [traced], nproc=2, batch_size=args.batch_size,
                     image_size=args.image_size, timeout_s=3600)
        parts = anatomy(Path(tmp) / "rank0.trace.json")
    rows, summary = summarise_rounds((*job.segments, *compute_1.segments))

    ddp = summary["ddp-25MB"]["median_s"]
    compute = summary["compute-1"]["median_s"]
    comm = summary["allreduce"]["median_s"]
    ideal = max(compute, comm)
    scheduled = [s for s in summary if s == "fifo" or s.startswith("priority")]
    best = min((s for s in scheduled if s.startswith("priority")),
               key=lambda s: summary[s]["median_s"])
    grid_best = min((s for s in scheduled if s.startswith("priority") and s != tuned_config.label),
                    key=lambda s: summary[s]["median_s"])
    tuned_s = summary[tuned_config.label]["median_s"]
    best_s = summary[best]["median_s"]
    worst = max(scheduled, key=lambda s: summary[s]["median_s"])
    verdict = {
        "ddp_s": ddp, "ideal_s": ideal, "compute_1_s": compute, "allreduce_s": comm,
        "best_priority": best, "best_priority_s": best_s, "speedup_vs_ddp": ddp / best_s,
        "gap_closed": (ddp - best_s) / (ddp - ideal) if ddp > ideal else None,
        "worst_scheduled": worst, "worst_vs_ddp": summary[worst]["median_s"] / ddp,
        "target_speedup_met": ddp / best_s >= TARGET_SPEEDUP,
        "no_config_3pct_slower": summary[worst]["median_s"] <= ddp * (1 + TOLERANCE),
        "tuned": tuned_config.label, "tuned_s": tuned_s, "grid_best": grid_best,
        "tuned_vs_grid_best": tuned_s / summary[grid_best]["median_s"],
        "tuning_wall_steps": tuned["total_steps"],
    }

    print(f"{args.model} {args.image_size}x{args.image_size}, batch {args.batch_size} per rank, "
          f"2 gloo ranks; medians of {args.repeats} rounds x {args.steps} steps")
    print(f"{'configuration':<52} {'median s':>9} {'p10':>7} {'p90':>7} {'DDP/this':>9} "
          f"{'paired':>7}  round medians")
    for label, s in summary.items():
        rounds = " ".join(f"{m:.3f}" for m in s["round_medians_s"])
        print(f"{label:<52} {s['median_s']:>9.3f} {s['p10_s']:>7.3f} {s['p90_s']:>7.3f} "
              f"{ddp / s['median_s']:>8.2f}x {s['paired_ddp_ratio']:>6.2f}x  {rounds}")
    print("anatomy of priority 16/64MiB overdraft, rank 0, per step: " + ", ".join(
        f"{k[:-2]} {v:.3f} s" for k, v in parts.items()))
    print("online tuning (rank 0's trials, median step of each): " + "; ".join(
        f"{t['partition_bytes'] / MiB:.1f}/{t['credit_bytes'] / MiB:.1f}MiB "
        f"{t['step_time_s']:.3f} s" for t in tuned["trials"]))
    print(f"tuned point {tuned_s:.3f} s in the rounds = {verdict['tuned_vs_grid_best']:.3f}x the "
          f"best hand-picked point ({grid_best})")
    print(f"ideal max(compute-1, allreduce) = {ideal:.3f} s; best priority {best} "
          f"{best_s:.3f} s = {ddp / best_s:.2f}x DDP, closes "
          f"{100 * (verdict['gap_closed'] or 0):.0f}% of the gap; worst scheduled {worst} "
          f"{verdict['worst_vs_ddp']:.2f}x DDP's time")
    results = {
        "benchmark": "comm_real",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "wall_s": time.time() - began,
        "machine": {"cpu": cpu_model(), "platform": platform.platform(),
                    "python": platform.python_version(), **job.host},
        "settings": {"model": args.model, "batch_size": args.batch_size,
                     "image_size": args.image_size, "steps": args.steps,
                     "warmup": args.warmup, "repeats": args.repeats, "nproc": 2,
                     "optimizer": "sgd", "order": [c.label for c in configs]},
        "summary": summary, "verdict": verdict, "anatomy_priority_16_64": parts,
        "online_tuning": {"options": tune_options, **tuned,
                          "after_tuning_step_times_s": list(tuning.step_times_s)},
        "raw": {label: rounds for label, rounds in rows.items()},
    }
    write_results(args.out, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
