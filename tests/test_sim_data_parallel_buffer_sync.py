"""DDP's buffer broadcast before each forward: charged by the data-parallel simulator at the
start of every step of a model with buffers, worked by hand on a three-layer graph."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from trainsched.cluster import Cluster, Link, device_kind
from trainsched.comm import DdpBucketPolicy, FifoPolicy
from trainsched.errors import TrainschedError
from trainsched.graph import Edge, Graph, Op, to_training
from trainsched.sim import buffer_sync_s, simulate_data_parallel

MS = 1e-3
MB = 1_000_000  # 1 ms on the 1 GB/s link
NO_COPIES = DdpBucketPolicy(bucket_copies=False)


def close(actual: float, expected: float) -> bool:
    return math.isclose(actual, expected, rel_tol=1e-9, abs_tol=1e-15)


def cluster(sync_s: float = 0.5 * MS) -> Cluster:
    """Two V100s whose collectives run one at a time beside full-speed compute, on a 1 GB/s
    link with 50 µs latency; DDP's buffer broadcast costs ``sync_s`` plus bytes / 1 GB/s."""
    device = replace(device_kind("V100"), compute_rate_with_comm=1.0, buffer_sync_s=sync_s,
                     device_cv=0.0)
    return Cluster(name="test", device=device, devices_per_node=2, num_nodes=1,
                   intra_node=Link(bandwidth_bytes_per_s=1e9, latency_s=50e-6))


def three_layers(buffer_bytes: int = MB) -> Graph:
    """L0 -> L1 -> L2 (parameters 2 MB, 0.6 MB, 0.6 MB), 1 ms per forward, dX and dW; L0
    holds ``buffer_bytes`` of buffers. Without buffers DDP's step is 12.0 ms on 2 ranks
    (tests/test_sim_data_parallel.py, test_fifo_versus_ddp_buckets_by_hand): buckets {g2, g1}
    over [7, 8.3] and {g0} over [8.3, 10.4], then the SGD steps (1 + 0.3 + 0.3 ms)."""
    ops = [Op(name=f"L{i}", compute_s=MS, backward_input_s=MS, backward_weight_s=MS,
              param_bytes=size, output_bytes=4096, saved_bytes=4096, layer_index=i,
              buffer_bytes=buffer_bytes if i == 0 else 0)
           for i, size in enumerate((2 * MB, 600_000, 600_000))]  # fmt: skip
    edges = [Edge(src=f"L{i}", dst=f"L{i + 1}", size_bytes=4096) for i in range(2)]
    return to_training(Graph(ops, edges), memory_bandwidth_bytes_per_s=6e9)


def span(result, name: str, device: str = "gpu0") -> tuple[float, float]:
    t = next(t for t in result.tasks if t.name == name and t.device == device)
    return t.start_s / MS, t.end_s / MS


def test_the_broadcast_costs_its_fixed_part_plus_the_buffers_bytes():
    # 0.5 ms + 1 MB / 1 GB/s
    assert close(buffer_sync_s(three_layers(), cluster(), ranks=2, policy=NO_COPIES), 1.5 * MS)


def test_the_step_starts_with_the_broadcast_on_every_rank():
    """Every op moves 1.5 ms later: L0 over [1.5, 2.5], bucket0 over [8.5, 9.8], 13.5 ms."""
    result = simulate_data_parallel(three_layers(), cluster(), ranks=2, policy=NO_COPIES,
                                    expand=True)
    for device in ("gpu0", "gpu1"):
        assert span(result, "buffer sync", device) == pytest.approx((0.0, 1.5))
        assert span(result, "L0", device) == pytest.approx((1.5, 2.5))
    assert span(result, "bucket0") == pytest.approx((8.5, 9.8))
    assert close(result.step_time_s, 13.5 * MS)


def test_every_step_pays_it_again():
    """Two steps: step 1's broadcast runs after step 0's boundary, so the period from first
    op to first op is 12.0 + 1.5 ms."""
    result = simulate_data_parallel(three_layers(), cluster(), ranks=2, policy=NO_COPIES,
                                    steps=2)
    syncs = [t for t in result.tasks if t.name == "buffer sync"]
    assert len(syncs) == 2
    assert close(result.step_time_s, 13.5 * MS)


@pytest.mark.parametrize("case", ["no buffers", "policy off", "fifo policy", "device 0",
                                  "one rank"])
def test_nothing_is_charged_where_ddp_broadcasts_nothing(case):
    graph = three_layers(buffer_bytes=0 if case == "no buffers" else MB)
    policy = {"policy off": DdpBucketPolicy(bucket_copies=False, buffer_sync=False),
              "fifo policy": FifoPolicy()}.get(case, NO_COPIES)
    ranks = 1 if case == "one rank" else 2
    result = simulate_data_parallel(graph, cluster(0.0 if case == "device 0" else 0.5 * MS),
                                    ranks=ranks, policy=policy)
    assert not [t for t in result.tasks if t.name == "buffer sync"]


def test_the_policy_flag_must_be_a_bool():
    with pytest.raises(TrainschedError, match="buffer_sync must be True or False"):
        DdpBucketPolicy(buffer_sync="yes")
