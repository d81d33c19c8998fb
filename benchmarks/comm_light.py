"""What the scheduled runtime costs where communication is light: 2 gloo ranks on this machine,
stock DDP against the scheduler's pass-through, FIFO, priority and ByteScheduler (fused small
gradients) with the leader's and the static collective order.

byteps #339 and #370 (``specs/comm.md`` §11) reported a scheduler that was slower than the
framework's own all-reduce on communication-light models, even with partitioning and credit
effectively off. This benchmark measures the same question here, on two models:

- ``mlp``: the zoo's MLP (4 linear layers, 8 parameters, 0.8 MB of gradients, a few ms per
  step), where the per-step and per-collective overheads are all there is;
- ``resnet50`` at 32 x 32, batch 4 per rank: 161 parameters, 102 MB of gradients, compute
  several times its all-reduce.

Per model, one 2-rank job runs every configuration interleaved (A B C ... A B C ...),
``--repeats`` rounds of ``--steps`` timed steps after ``--warmup``. Per configuration: the
median of the round medians, p10/p90 over all steps, and ``paired``: DDP's round median over
this configuration's in the same round, the median over rounds (>1: faster than DDP).

    python benchmarks/comm_light.py               # both models, about 6 minutes
    python benchmarks/comm_light.py --quick       # mlp only, 1 round of 3 steps
"""

from __future__ import annotations

import argparse
import datetime
import platform
import sys
import time

from _common import cpu_model, write_results
from comm_real import summarise_rounds
from trainsched.runtime.train import Segment, run_segments

MiB = 1 << 20
MODELS = {"mlp": {"batch_size": 64, "image_size": None, "steps": 20, "repeats": 5},
          "resnet50": {"batch_size": 4, "image_size": 32, "steps": 10, "repeats": 3}}


def configurations(steps: int, warmup: int) -> list[Segment]:
    common = {"steps": steps, "warmup": warmup}
    sched = {"kind": "sdp", "partition_bytes": 4 * MiB, "credit_bytes": 16 * MiB, **common}
    return [Segment(label="ddp-25MB", kind="ddp", **common),
            Segment(label="pass-through (enabled=False)", kind="sdp", enabled=False, **common),
            Segment(label="fifo", kind="sdp", policy="fifo", cross_barrier=False, **common),
            Segment(label="priority 4/16MiB", policy="priority", **sched),
            Segment(label="bytescheduler 4/16MiB", policy="bytescheduler", **sched),
            Segment(label="bytescheduler 4/16MiB, static order", policy="bytescheduler",
                    order="static", **sched),
            Segment(label="bytescheduler 32/64MiB, fusion 32MiB", kind="sdp",
                    policy="bytescheduler", partition_bytes=32 * MiB, credit_bytes=64 * MiB,
                    fusion_bytes=32 * MiB, **common)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="mlp only, 1 round of 3 steps")
    parser.add_argument("--out", default="benchmarks/results/comm_light.json")
    args = parser.parse_args()
    began = time.time()
    results = {"benchmark": "comm_light",
               "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "models": {}}
    names = ["mlp"] if args.quick else [m.strip() for m in args.models.split(",")]
    host = {}
    for name in names:
        spec = dict(MODELS[name])
        if args.quick:
            spec.update(steps=3, repeats=1)
        configs = configurations(spec["steps"], args.warmup)
        job = run_segments(name, [c for _ in range(spec["repeats"]) for c in configs], nproc=2,
                           batch_size=spec["batch_size"], image_size=spec["image_size"],
                           optimizer="sgd", lr=0.01, timeout_s=3600)
        host = job.host
        rows, summary = summarise_rounds(job.segments)
        size = f" {spec['image_size']}x{spec['image_size']}" if spec["image_size"] else ""
        print(f"{name}{size}, batch {spec['batch_size']} per rank, 2 gloo ranks; medians of "
              f"{spec['repeats']} rounds x {spec['steps']} steps")
        print(f"{'configuration':<40} {'median ms':>10} {'p10':>8} {'p90':>8} {'paired':>7}  "
              f"round medians (ms)")
        for label, s in summary.items():
            rounds = " ".join(f"{1e3 * m:.1f}" for m in s["round_medians_s"])
            print(f"{label:<40} {1e3 * s['median_s']:>10.2f} {1e3 * s['p10_s']:>8.2f} "
                  f"{1e3 * s['p90_s']:>8.2f} {s['paired_ddp_ratio']:>6.2f}x  {rounds}")
        print()
        results["models"][name] = {"settings": {**spec, "warmup": args.warmup, "nproc": 2,
                                                "optimizer": "sgd"},
                                   "summary": summary, "raw": rows}
    results["wall_s"] = time.time() - began
    results["machine"] = {"cpu": cpu_model(), "platform": platform.platform(),
                          "python": platform.python_version(), **host}
    write_results(args.out, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
