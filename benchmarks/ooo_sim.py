"""Simulated out-of-order backprop (reverse-first-k) on the published data-parallel setups.

ResNet-50 at batch 128 and ResNet-101 at batch 96 per GPU, captured with roofline costs for a
V100 in two precisions: ``fp32`` (fp32 compute and gradients) and ``fp16`` (capture's ``fp16``
precision: 16-bit weights, activations and gradients, tensor-core compute, fp32 master weights).
Clusters are built from the catalogue's V100 kind as the published runs had them: 4 V100 per
node on NVLink with 10 Gbit/s between nodes (p3.8xlarge), 8 per node with 25 Gbit/s
(p3.16xlarge); 4, 8, 16, 32 and 48 GPUs. Gradients are all-reduced by ring with the
``bytescheduler`` policy (priority, 4 MiB partitions, 16 MiB credit, updates crossing the
barrier), the baseline out-of-order backprop was measured against (BytePS priority scheduling,
k = 0). ``ooo`` is reverse-first-k with k chosen by simulating every k in [0, L]
(``sim.sweep_k``, steady step of 3, within the V100's 16 GiB unless k = 0 is over it already).

Layers are the ops with a weight gradient that are not normalisations, as the runtime's split
backward counts them (the convolutions and the classifier: L = 54 for ResNet-50, 105 for
ResNet-101; batch norms keep their small dW with their dX); ``convs`` counts the convolutions
among the k deferred,
beside the published k (45 of 53 convolutions at 4-32 GPUs and 30 at 48 for ResNet-50; 70 of
104 for ResNet-101). ``extra`` is the peak memory the deferral adds over k = 0. Results: a table
on stdout and ``benchmarks/results/ooo_sim.json``.

    python benchmarks/ooo_sim.py           # about 10 minutes on 2 shared cores
    python benchmarks/ooo_sim.py --quick   # ResNet-50 only, every other k
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from typing import Any

from _common import cpu_model, write_results
from trainsched.backprop.reorder import layers
from trainsched.cluster import Cluster, Link, device_kind
from trainsched.comm import comm_policy
from trainsched.sim import sweep_k

MODELS = [("resnet50", 128), ("resnet101", 96)]
PRECISIONS = ["fp32", "fp16"]
GPUS = [4, 8, 16, 32, 48]
NETWORKS = [(10, 4), (25, 8)]  # Gbit/s between nodes, V100s per node
PAPER_K = {("resnet50", g): (45 if g <= 32 else 30) for g in GPUS} | {
    ("resnet101", g): 70 for g in GPUS}
PAPER_CONVS = {"resnet50": 53, "resnet101": 104}
POLICY = "bytescheduler"
STEPS = 3


def capture_graph(name: str, batch: int, precision: str) -> Any:
    """The model's training graph (SGD with momentum), roofline costs for a V100."""
    import torch
    import torchvision

    from trainsched.capture import capture
    from trainsched.graph import to_training

    model = getattr(torchvision.models, name)(weights=None)
    example = torch.randn(batch, 3, 224, 224)
    graph = capture(model, (example,), costs="roofline", device_kind="V100", name=name,
                    meta={"batch_size": batch}, precision=precision)
    return to_training(graph, optimizer="momentum")


def cluster(gpus: int, gbit: int, per_node: int) -> Cluster:
    nodes = -(-gpus // per_node)
    return Cluster(name=f"v100-{per_node}x{nodes}-{gbit}g", device=device_kind("V100"),
                   devices_per_node=per_node, num_nodes=nodes,
                   intra_node=Link(bandwidth_bytes_per_s=150e9, latency_s=10e-6),
                   inter_node=Link(bandwidth_bytes_per_s=gbit * 1e9 / 8, latency_s=50e-6))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="ResNet-50 only")
    parser.add_argument("--out", default="benchmarks/results/ooo_sim.json")
    args = parser.parse_args()
    models = MODELS[:1] if args.quick else MODELS
    began = time.perf_counter()
    rows = []
    header = (f"{'model':<10}{'prec':>5}{'GPUs':>5}{'Gb/s':>5}{'k=0 ms':>9}{'ooo ms':>9}"
              f"{'speedup':>9}{'k':>5}{'/L':>5}{'convs':>7}{'paper':>7}{'extra':>9}")
    print(header)
    for name, batch in models:
        for precision in PRECISIONS:
            graph = capture_graph(name, batch, precision)
            names = layers(graph)
            conv = [("conv" in (graph.op(n).target or n)) for n in names]
            for gbit, per_node in NETWORKS:
                for gpus in GPUS:
                    sweep = sweep_k(graph, cluster(gpus, gbit, per_node), ranks=gpus,
                                    policy=comm_policy(POLICY), steps=STEPS,
                                    memory_cap_bytes=device_kind("V100").memory_bytes)
                    k = sweep.k
                    row = {"model": name, "batch_size": batch, "precision": precision,
                           "gpus": gpus, "gbit_per_s": gbit, "gpus_per_node": per_node,
                           "baseline_step_s": sweep.step_time_s[0],
                           "ooo_step_s": sweep.step_time_s[k], "speedup": sweep.speedup,
                           "k": k, "layers": sweep.layers, "convs_deferred": sum(conv[:k]),
                           "convs": sum(conv), "paper_k_convs": PAPER_K[name, gpus],
                           "paper_convs": PAPER_CONVS[name],
                           "extra_memory_bytes": sweep.peak_memory_bytes[k]
                           - sweep.peak_memory_bytes[0],
                           "baseline_peak_memory_bytes": sweep.peak_memory_bytes[0],
                           "step_time_s_per_k": list(sweep.step_time_s)}
                    rows.append(row)
                    print(f"{name:<10}{precision:>5}{gpus:>5}{gbit:>5}"
                          f"{1e3 * row['baseline_step_s']:>9.1f}{1e3 * row['ooo_step_s']:>9.1f}"
                          f"{row['speedup']:>8.3f}x{k:>5}{sweep.layers:>5}"
                          f"{row['convs_deferred']:>4}/{row['convs']:<2}"
                          f"{row['paper_k_convs']:>4}/{row['paper_convs']:<3}"
                          f"{row['extra_memory_bytes'] / 2**20:>7.0f}Mi", flush=True)
    speedups = [r["speedup"] for r in rows]
    summary = {"min_speedup": min(speedups), "max_speedup": max(speedups),
               "rows_at_or_above_1.1": sum(s >= 1.1 for s in speedups), "rows": len(rows)}
    for precision in PRECISIONS:
        mine = [r["speedup"] for r in rows if r["precision"] == precision]
        summary[f"{precision}_speedup_range"] = [min(mine), max(mine)]
    print(f"speedup {summary['min_speedup']:.3f}-{summary['max_speedup']:.3f}x; "
          f"{summary['rows_at_or_above_1.1']} of {len(rows)} rows >= 1.1x "
          f"(published: 1.10-1.27x over BytePS priority scheduling)")
    write_results(args.out, {
        "benchmark": "ooo_sim", "policy": POLICY, "algorithm": "ring", "steps": STEPS,
        "machine": {"cpu": cpu_model(), "python": platform.python_version(),
                    "loadavg": os.getloadavg()},
        "wall_s": time.perf_counter() - began, "summary": summary, "rows": rows})


if __name__ == "__main__":
    main()
