"""The first collective of each step starts as the ranks' compute ends and pays the device's
``collective_after_compute_s`` beyond its alpha-beta cost: worked by hand on the three-layer
graph of tests/test_sim_data_parallel_buffer_sync.py."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from trainsched.cluster import Cluster, Link, device_kind
from trainsched.comm import DdpBucketPolicy, FifoPolicy
from trainsched.errors import TrainschedError
from trainsched.graph import Edge, Graph, Op, to_training
from trainsched.sim import simulate_data_parallel

MS = 1e-3
MB = 1_000_000  # 1 ms on the 1 GB/s link
NO_COPIES = DdpBucketPolicy(bucket_copies=False)


def cluster(after_s: float = 0.4 * MS) -> Cluster:
    """Two V100s, collectives one at a time beside full-speed compute, 1 GB/s and 50 us."""
    device = replace(device_kind("V100"), compute_rate_with_comm=1.0, device_cv=0.0,
                     collective_after_compute_s=after_s)
    return Cluster(name="test", device=device, devices_per_node=2, num_nodes=1,
                   intra_node=Link(bandwidth_bytes_per_s=1e9, latency_s=50e-6))


def three_layers() -> Graph:
    """L0 -> L1 -> L2 (parameters 2 MB, 0.6 MB, 0.6 MB), 1 ms per forward, dX and dW. DDP's
    step on 2 ranks without the charge is 12.0 ms: buckets {g2, g1} over [7, 8.3] and {g0}
    over [8.3, 10.4], then the SGD steps in program order (1 + 0.3 + 0.3 ms)."""
    ops = [Op(name=f"L{i}", compute_s=MS, backward_input_s=MS, backward_weight_s=MS,
              param_bytes=size, output_bytes=4096, saved_bytes=4096, layer_index=i)
           for i, size in enumerate((2 * MB, 600_000, 600_000))]  # fmt: skip
    edges = [Edge(src=f"L{i}", dst=f"L{i + 1}", size_bytes=4096) for i in range(2)]
    return to_training(Graph(ops, edges), memory_bandwidth_bytes_per_s=6e9)


def spans(result, name: str) -> list[tuple[float, float]]:
    return [(t.start_s / MS, t.end_s / MS) for t in result.tasks
            if t.name == name and t.device == "gpu0"]


def test_the_first_ready_bucket_takes_longer_and_the_step_with_it():
    """bucket0 (g2 and g1, the first gradients ready) over [7, 8.7] instead of [7, 8.3];
    bucket1 keeps its 2.1 ms, now over [8.7, 10.8]; the step is 12.4 ms."""
    result = simulate_data_parallel(three_layers(), cluster(), ranks=2, policy=NO_COPIES)
    assert spans(result, "bucket0") == [pytest.approx((7.0, 8.7))]
    assert spans(result, "bucket1") == [pytest.approx((8.7, 10.8))]
    assert math.isclose(result.step_time_s, 12.4 * MS, rel_tol=1e-9)


def test_per_gradient_collectives_charge_only_the_first_ready():
    """FIFO: one collective per gradient, g2's first (ready at 7 ms). Only it is 0.4 ms
    longer than its cost: 50 us x 2 + 0.6 MB / 1 GB/s = 0.7 ms becomes 1.1 ms."""
    result = simulate_data_parallel(three_layers(), cluster(), ranks=2, policy=FifoPolicy())
    comm = {t.name: (t.end_s - t.start_s) / MS for t in result.tasks
            if t.category == "comm" and t.device == "gpu0"}
    assert len(comm) == 3
    first = min((t for t in result.tasks if t.category == "comm"), key=lambda t: t.start_s)
    assert comm.pop(first.name) == pytest.approx(1.1)
    assert sorted(comm.values()) == pytest.approx([0.7, 2.1])


def test_every_step_pays_it_once():
    two = simulate_data_parallel(three_layers(), cluster(), ranks=2, policy=NO_COPIES, steps=2)
    durations = sorted(round((t.end_s - t.start_s) / MS, 6) for t in two.tasks
                       if t.category == "comm" and t.device == "gpu0")
    assert durations == pytest.approx([1.7, 1.7, 2.1, 2.1])


@pytest.mark.parametrize(("after_s", "ranks"), [(0.0, 2), (0.4 * MS, 1)])
def test_nothing_is_charged_without_the_figure_or_on_one_rank(after_s, ranks):
    plain = simulate_data_parallel(three_layers(), cluster(0.0), ranks=ranks, policy=NO_COPIES)
    result = simulate_data_parallel(three_layers(), cluster(after_s), ranks=ranks,
                                    policy=NO_COPIES)
    assert result.step_time_s == plain.step_time_s
    if ranks == 2:
        assert math.isclose(plain.step_time_s, 12.0 * MS, rel_tol=1e-9)


def test_a_negative_figure_is_refused():
    with pytest.raises(TrainschedError,
                       match="collective_after_compute_s must be a duration >= 0 s"):
        replace(device_kind("V100"), collective_after_compute_s=-1e-3)
