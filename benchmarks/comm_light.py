"""What the scheduled runtime costs where communication is light: 2 gloo ranks on this machine,
stock DDP against the scheduler's pass-through, FIFO, priority and ByteScheduler (fused small
gradients) with the leader's and the static collective order, and DDP's own buckets crossing
the barrier (``buckets``: ready-order buckets of 25 MiB, no per-collective order traffic).

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

from _common import DDP_LABEL, cpu_model, print_rounds, run_rounds, write_results
from trainsched.comm.policy import ReadyBucketPolicy
from trainsched.runtime.run import policy_segment
from trainsched.runtime.train import Segment

MiB = 1 << 20
MODELS = {"mlp": {"batch_size": 64, "image_size": None, "steps": 20, "repeats": 5},
          "resnet50": {"batch_size": 4, "image_size": 32, "steps": 10, "repeats": 3}}


def configurations(steps: int, warmup: int) -> list[Segment]:
    common = {"steps": steps, "warmup": warmup}
    sched = {"kind": "sdp", "partition_bytes": 4 * MiB, "credit_bytes": 16 * MiB, **common}
    return [Segment(label=DDP_LABEL, kind="ddp", **common),
            Segment(label="pass-through (enabled=False)", kind="sdp", enabled=False, **common),
            Segment(label="fifo", kind="sdp", policy="fifo", cross_barrier=False, **common),
            Segment(label="priority 4/16MiB", policy="priority", **sched),
            Segment(label="bytescheduler 4/16MiB", policy="bytescheduler", **sched),
            Segment(label="bytescheduler 4/16MiB, static order", policy="bytescheduler",
                    order="static", **sched),
            Segment(label="bytescheduler 32/64MiB, fusion 32MiB", kind="sdp",
                    policy="bytescheduler", partition_bytes=32 * MiB, credit_bytes=64 * MiB,
                    fusion_bytes=32 * MiB, **common),
            policy_segment(ReadyBucketPolicy(), label="buckets 1/25MiB, ready order", **common)]


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
        rows, summary, host = run_rounds(name, configs, repeats=spec["repeats"],
                                         batch_size=spec["batch_size"],
                                         image_size=spec["image_size"])
        size = f" {spec['image_size']}x{spec['image_size']}" if spec["image_size"] else ""
        print_rounds(f"{name}{size}, batch {spec['batch_size']} per rank, 2 gloo ranks; medians "
                     f"of {spec['repeats']} rounds x {spec['steps']} steps", summary)
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
