"""A hand-sized cluster and training graph for the slowest-rank tests (worked by hand there)."""

from __future__ import annotations

from dataclasses import replace

from trainsched.cluster import Cluster, Link, device_kind
from trainsched.graph import Edge, Graph, Op, to_training

MS = 1e-3
MB = 1_000_000  # 1 ms on the 1 GB/s two-rank ring below


def two_ranks(*, step_cv: float = 0.0, device_cv: float = 0.0) -> Cluster:
    """Two ranks, 1 GB/s, no latency, collectives at full speed: S bytes take S / 1 GB/s."""
    device = replace(device_kind("V100"), compute_rate_with_comm=1.0, step_cv=step_cv,
                     device_cv=device_cv)
    return Cluster(name="t", device=device, devices_per_node=2,
                   intra_node=Link(bandwidth_bytes_per_s=1e9, latency_s=0.0))


def three_layers() -> Graph:
    """L0 -> L1 -> L2, 1 ms per forward, dX and dW, 1 MB of parameters each (1 ms all-reduce);
    an SGD step costs 3 MB / 6 GB/s = 0.5 ms."""
    ops = [Op(name=f"L{i}", compute_s=MS, backward_input_s=MS, backward_weight_s=MS,
              param_bytes=MB, output_bytes=4096, saved_bytes=4096, layer_index=i)
           for i in range(3)]  # fmt: skip
    edges = [Edge(src=f"L{i}", dst=f"L{i + 1}", size_bytes=4096) for i in range(2)]
    return to_training(Graph(ops, edges), memory_bandwidth_bytes_per_s=6e9)
