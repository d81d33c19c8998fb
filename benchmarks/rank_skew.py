"""Do two gloo ranks on this host compute together? Each step's timestamps on both ranks.

The simulator under-predicts DDP on the smallest models (``validate_sim``: the zoo MLP at batch
64 and 256, the small CNN at batch 8), and ``ddp_overhead.py`` found the missing time in the
all-reduce that follows each rank's compute. This looks at it step by step: one 2-rank gloo
job per case (one thread each), every step forward + backward, the gradients flattened, one
blocking all-reduce, no barrier, as a DDP step with one bucket; each rank records the
monotonic clock (one clock for every process of a host) at its compute's start and end and at
the all-reduce's end. Per case it prints the medians and how many steps the two ranks
**started more than half a compute apart**: steps where they did not compute together but one
after the other, and by how much (the lag).

    python benchmarks/rank_skew.py        # MLP 64 and 256, small CNN 8, ResNet-50 8 at 32 px
    python benchmarks/rank_skew.py --cases mlp:256 --steps 100
    python benchmarks/rank_skew.py --pin --out benchmarks/results/rank_skew_pinned.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import tempfile
from pathlib import Path

from _common import cpu_model, write_results
from trainsched.runtime.launch import PIN_ENV

HERE = Path(__file__).resolve().parent
CASES = ("mlp:64", "mlp:256", "small-cnn:8", "resnet50:8:32")


def worker() -> None:  # pragma: no cover - runs in the ranks
    import time

    import torch
    import torch.distributed as dist

    from trainsched.capture import build

    cfg = json.loads(sys.argv[1])
    name, batch, *image = cfg["case"].split(":")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{cfg['port']}",
                            rank=cfg["rank"], world_size=2)
    torch.manual_seed(0)
    z = build(name, batch_size=int(batch), **({"image_size": int(image[0])} if image else {}))
    params = [p for p in z.model.parameters() if p.requires_grad]
    rows = []
    for _ in range(cfg["steps"] + 10):
        t0 = time.perf_counter()
        z.model(*z.args, **z.kwargs).float().sum().backward()
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        t1 = time.perf_counter()
        dist.all_reduce(flat)
        t2 = time.perf_counter()
        for p in params:
            p.grad = None
        rows.append((t0, t1, t2))
    Path(cfg["out"], f"times{cfg['rank']}.json").write_text(json.dumps(rows[10:]))
    dist.destroy_process_group()


def run_case(case: str, steps: int) -> dict:
    """One 2-rank job through trainsched's launcher (which binds the ranks to a CPU each
    where ``TRAINSCHED_PIN_CPUS=1``); the medians and the steps the ranks started apart."""
    from trainsched.runtime.launch import free_port, run_workers

    with tempfile.TemporaryDirectory(prefix="rank-skew-") as tmp:
        port = free_port()
        configs = [{"rank": r, "port": port, "case": case, "steps": steps, "out": tmp}
                   for r in range(2)]
        run_workers(str(Path(__file__).resolve()), configs, workdir=Path(tmp), timeout_s=900)
        a, b = (json.loads(Path(tmp, f"times{r}.json").read_text()) for r in range(2))
    ms = 1e3
    compute = statistics.median([r[1] - r[0] for r in a + b])
    apart = [abs(x[0] - y[0]) for x, y in zip(a, b, strict=True)]
    lags = [d for d in apart if d > compute / 2]
    steps_a = [a[i + 1][0] - a[i][0] for i in range(len(a) - 1)]
    return {"case": case, "steps": len(a), "step_ms": statistics.median(steps_a) * ms,
            "compute_ms": compute * ms,
            "allreduce_seen_ms": statistics.median([r[2] - r[1] for r in a + b]) * ms,
            "after_both_arrived_ms": statistics.median(
                [max(x[2], y[2]) - max(x[1], y[1]) for x, y in zip(a, b, strict=True)]) * ms,
            "apart_steps": len(lags),
            "lag_ms": statistics.median(lags) * ms if lags else 0.0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", default=list(CASES),
                        help="model:batch[:image] (zoo names)")
    parser.add_argument("--steps", type=int, default=60, help="timed steps per case")
    parser.add_argument("--pin", action="store_true",
                        help="bind rank k to the k-th CPU (TRAINSCHED_PIN_CPUS=1)")
    parser.add_argument("--out", default=str(HERE / "results" / "rank_skew.json"))
    args = parser.parse_args()
    os.environ[PIN_ENV] = "1" if args.pin else "0"
    load = os.getloadavg()[0]
    rows = []
    print(f"{'case':16s} {'step':>7s} {'compute':>8s} {'all-reduce':>10s} {'after both':>10s} "
          f"{'apart':>9s} {'lag':>7s}   (ms; rank 0's step, medians)")
    for case in args.cases:
        r = run_case(case, args.steps)
        rows.append(r)
        print(f"{case:16s} {r['step_ms']:7.2f} {r['compute_ms']:8.2f} "
              f"{r['allreduce_seen_ms']:10.2f} {r['after_both_arrived_ms']:10.2f} "
              f"{r['apart_steps']:>4d}/{r['steps']:<4d} {r['lag_ms']:7.2f}", flush=True)
    write_results(args.out, {
        "benchmark": "rank_skew", "machine": cpu_model(), "python": platform.python_version(),
        "when": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "load_before": load, "load_after": os.getloadavg()[0], "pinned": args.pin,
        "rows": rows})


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1].startswith("{"):
        worker()
    else:
        main()
