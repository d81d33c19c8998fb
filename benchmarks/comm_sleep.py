"""Communication scheduling with sleep compute: measured on 2 gloo ranks, and predicted.

``specs/comm.md`` §13.8: a VGG-16-shaped network whose compute is sleep (``_sleepnet.py``: VGG-16's
layer sizes times 0.25, 138 MB of gradients; forward 40 ms, backward 80 ms, spread over the
layers by their FLOPs), so that compute leaves the cores to gloo and the scheduling of
communication is what differs between configurations. The scheduled runtime reduces on a gloo
group with one worker thread (``comm_threads=1``: one FIFO wire, the simulator's model).

1. A 2-rank job measures all-reduce times on such a group (64 KiB to 64 MiB) and this host's
   zero-fill and SGD-update bandwidths; α and β of the 2-rank ring (2α + S/B) are fitted to the
   all-reduce times (least squares on relative error).
2. One 2-rank job runs every configuration, interleaved (A B C ... A B C ...), ``--repeats``
   rounds of ``--steps`` timed steps after ``--warmup``: ``fifo`` (whole tensors in ready order,
   the barrier), ``tictac`` (whole tensors by layer priority, crossing the barrier), priority
   with partitions and credit (crossing), and stock DDP (25 MiB buckets, on the default group).
3. The simulator predicts each configuration from the same profile (``simulate_data_parallel``,
   2 ranks, 3 steps, the steady step) on a one-node cluster with the fitted link; its policy
   objects are the runtime's (DDP: ``DdpBucketPolicy``).

Printed: per configuration the median of the round medians, p10/p90 over all steps, the
prediction and its error, and Kendall's tau between measured and predicted order. Written to
``--out`` (``benchmarks/results/comm_sleep.json``).

    python benchmarks/comm_sleep.py            # about 5 minutes
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

import _sleepnet
from _common import cpu_model, write_results
from trainsched.cluster import Cluster, Link, device_kind
from trainsched.comm import DdpBucketPolicy, FifoPolicy, PriorityPolicy
from trainsched.graph import Edge, Graph, Op, to_training
from trainsched.runtime.launch import free_port, run_workers
from trainsched.runtime.train import Segment, run_segments
from trainsched.sim import simulate_data_parallel

HERE = Path(__file__).resolve().parent

MiB = 1 << 20
SIZES = [64 << 10, 256 << 10, MiB, 4 * MiB, 16 * MiB, 64 * MiB]
MODEL = f"{HERE / '_sleepnet.py'}:build"
BATCH = 4


def configurations() -> list[tuple[str, dict[str, Any], Any]]:
    """(label, Segment fields, the simulator's policy) per configuration."""
    out: list[tuple[str, dict[str, Any], Any]] = [
        ("fifo", {"kind": "sdp", "policy": "fifo", "cross_barrier": False, "comm_threads": 1},
         FifoPolicy()),
        ("tictac", {"kind": "sdp", "policy": "priority", "partition_bytes": None,
                    "credit_bytes": None, "comm_threads": 1},
         PriorityPolicy(cross_barrier=True)),
    ]
    for p, c, mode in ((4, 16, "overdraft"), (16, 64, "overdraft"), (4, 16, "strict"),
                       (16, 32, "strict")):
        out.append((f"priority {p}/{c}MiB {mode}",
                    {"kind": "sdp", "policy": "priority", "partition_bytes": p * MiB,
                     "credit_bytes": c * MiB, "credit_mode": mode, "comm_threads": 1},
                    PriorityPolicy(partition_bytes=p * MiB, credit_bytes=c * MiB,
                                   credit_mode=mode, cross_barrier=True)))
    out.append(("ddp-25MB", {"kind": "ddp", "bucket_mb": 25.0},
                DdpBucketPolicy(bucket_copies=True)))
    return out


def measure_link(repeats: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="comm-sleep-") as tmp:
        out = Path(tmp) / "link.json"
        port = free_port()
        configs = [{"rank": r, "port": port, "sizes": SIZES, "repeats": repeats,
                    "out": str(out)} for r in range(2)]  # fmt: skip
        run_workers(str(HERE / "_sleepnet.py"), configs, workdir=Path(tmp), timeout_s=600)
        data = json.loads(out.read_text())
    sizes = np.array([s for s, _ in data["allreduce"]], dtype=float)
    times = np.array([t for _, t in data["allreduce"]], dtype=float)
    # t = a + b·S, least squares on the relative error (every size counts alike)
    design = np.stack([np.ones_like(sizes), sizes], axis=1) / times[:, None]
    (a, b), *_ = np.linalg.lstsq(design, np.ones_like(times), rcond=None)
    a = max(float(a), 0.0)
    fitted = a + b * sizes
    data.update(alpha_s=a / 2, bandwidth_bytes_per_s=1 / float(b),
                fit_errors=[float(x) for x in (fitted - times) / times])
    return data


def sleep_graph(zero_fill_bytes_per_s: float, update_bytes_per_s: float) -> Graph:
    """The training graph of ``_sleepnet``: each layer's sleeps, its weight gradient's zero
    fill on top of dW, and per parameter the runtime's update: the division of the reduced
    gradient by the world size (gloo has no average: read and write the gradient) and the SGD
    step (read parameter and gradient, write the parameter), 5 bytes moved per gradient byte
    where ``to_training`` counts SGD's 3, so the measured bandwidth is scaled by 3/5."""
    act = BATCH * _sleepnet.WIDTH * 4
    ops = [Op(name=name, compute_s=f, backward_input_s=i,
              backward_weight_s=w + 4 * n / zero_fill_bytes_per_s, param_bytes=4 * n,
              output_bytes=act, saved_bytes=act, layer_index=k)
           for k, (name, n, f, i, w) in enumerate(_sleepnet.PROFILE)]  # fmt: skip
    edges = [Edge(src=a.name, dst=b.name, size_bytes=act) for a, b in itertools.pairwise(ops)]
    return to_training(Graph(ops, edges), optimizer="sgd",
                       memory_bandwidth_bytes_per_s=update_bytes_per_s * 3 / 5)


def kendall_tau(xs: list[float], ys: list[float]) -> float:
    pairs = list(itertools.combinations(range(len(xs)), 2))
    score = sum(math.copysign(1, (xs[i] - xs[j]) * (ys[i] - ys[j]))
                for i, j in pairs if xs[i] != xs[j] and ys[i] != ys[j])  # fmt: skip
    return score / len(pairs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--link-repeats", type=int, default=15)
    ap.add_argument("--out", default="benchmarks/results/comm_sleep.json")
    args = ap.parse_args()
    began = time.perf_counter()

    link = measure_link(args.link_repeats)
    print(f"1-thread gloo group, 2 ranks: alpha {link['alpha_s'] * 1e3:.3f} ms, "
          f"B {link['bandwidth_bytes_per_s'] / 1e9:.2f} GB/s (fit errors "
          f"{min(link['fit_errors']):+.0%} .. {max(link['fit_errors']):+.0%}); zero fill "
          f"{link['zero_fill_bytes_per_s'] / 1e9:.1f} GB/s, update "
          f"{link['update_bytes_per_s'] / 1e9:.1f} GB/s", flush=True)

    configs = configurations()
    segments = [Segment(label=label, steps=args.steps, warmup=args.warmup, **fields)
                for _ in range(args.repeats) for label, fields, _ in configs]  # fmt: skip
    result = run_segments(MODEL, segments, nproc=2, batch_size=BATCH, optimizer="sgd",
                          timeout_s=3600)
    rounds: dict[str, list[list[float]]] = {}
    for seg in result.segments:
        rounds.setdefault(seg.label, []).append(list(seg.step_times_s))

    graph = sleep_graph(link["zero_fill_bytes_per_s"], link["update_bytes_per_s"])
    cluster = Cluster(name="gloo-1thread", device=device_kind("V100"), devices_per_node=2,
                      num_nodes=1, intra_node=Link(bandwidth_bytes_per_s=link[
                          "bandwidth_bytes_per_s"], latency_s=link["alpha_s"]))
    rows = []
    print(f"\n{'configuration':<28} {'median s':>9} {'p10':>7} {'p90':>7} {'predicted':>9} "
          f"{'error':>7}  round medians")
    for label, _, policy in configs:
        steps = rounds[label]
        medians = [statistics.median(r) for r in steps]
        every = sorted(t for r in steps for t in r)
        predicted = simulate_data_parallel(graph, cluster, ranks=2, policy=policy,
                                           steps=3).step_time_s
        median = statistics.median(medians)
        row = {"label": label, "median_s": median, "round_medians_s": medians,
               "p10_s": every[len(every) // 10], "p90_s": every[(9 * len(every)) // 10],
               "predicted_s": predicted, "error": predicted / median - 1, "raw": steps}
        rows.append(row)
        print(f"{label:<28} {median:>9.3f} {row['p10_s']:>7.3f} {row['p90_s']:>7.3f} "
              f"{predicted:>9.3f} {row['error']:>+7.1%}  "
              + " ".join(f"{m:.3f}" for m in medians), flush=True)
    tau = kendall_tau([r["median_s"] for r in rows], [r["predicted_s"] for r in rows])
    errors = sorted(abs(r["error"]) for r in rows)
    fifo = next(r for r in rows if r["label"] == "fifo")["median_s"]
    ddp = next(r for r in rows if r["label"] == "ddp-25MB")["median_s"]
    best = min((r for r in rows if r["label"].startswith("priority")), key=lambda r: r["median_s"])
    compute = sum(f + i + w for _, _, f, i, w in _sleepnet.PROFILE)
    print(f"\nmedian |error| {statistics.median(errors):.1%}, worst {errors[-1]:.1%}; Kendall tau "
          f"{tau:.2f}; best priority ({best['label']}) {fifo / best['median_s']:.2f}x fifo, "
          f"{ddp / best['median_s']:.2f}x DDP; sleep compute {compute * 1e3:.0f} ms per step")
    import torch

    write_results(args.out, {
        "benchmark": "comm_sleep", "machine": cpu_model(), "python": platform.python_version(),
        "torch": torch.__version__, "settings": vars(args), "link": link,
        "profile": _sleepnet.PROFILE, "rows": rows, "kendall_tau": tau,
        "median_abs_error": statistics.median(errors), "sleep_compute_s": compute,
        "wall_s": time.perf_counter() - began})
    return 0


if __name__ == "__main__":
    sys.exit(main())
