"""Closed-form compute and communication costs at hand-computed values."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trainsched.cluster import Link, device_kind
from trainsched.costs import (
    allgather_s,
    binomial_tree_allreduce_s,
    byteps_optimal_s,
    p2p_s,
    parameter_server_s,
    reduce_scatter_s,
    ring_allreduce_s,
    roofline_s,
    tree_allreduce_s,
)
from trainsched.errors import TrainschedError

LINK = Link(bandwidth_bytes_per_s=1e9, latency_s=1e-5)
SERVER = Link(bandwidth_bytes_per_s=2e9, latency_s=5e-5)
S = 1e6  # bytes: S / B = 1 ms on LINK
V100 = device_kind("V100")


def close(actual: float, expected: float) -> bool:
    return math.isclose(actual, expected, rel_tol=1e-9, abs_tol=0.0)


def test_roofline_compute_bound():
    flops = 15.7e12 * 0.75 * 1e-3  # 1 ms at 75 % of fp32 peak
    assert close(roofline_s(flops=flops, bytes_accessed=1e6, device=V100), 1e-3 + 5e-6)
    fp16 = 125e12 * 0.75 * 1e-3
    assert close(roofline_s(flops=fp16, bytes_accessed=0, device=V100, dtype="fp16"), 1.005e-3)
    assert close(roofline_s(flops=flops, bytes_accessed=0, device=V100, compute_efficiency=1.0),
                 0.75e-3 + 5e-6)


def test_roofline_memory_bound():
    assert close(roofline_s(flops=1e6, bytes_accessed=900e6, device=V100), 1e-3 + 5e-6)
    assert close(roofline_s(flops=0, bytes_accessed=9e5, device=V100), 1e-6 + 5e-6)
    assert close(roofline_s(flops=0, bytes_accessed=900e6, device=V100, memory_efficiency=0.5),
                 2e-3 + 5e-6)


def test_roofline_free_op_and_fallback_dtype():
    assert roofline_s(flops=0, bytes_accessed=0, device=V100) == 0.0
    k80 = device_kind("K80")
    assert roofline_s(flops=1e9, bytes_accessed=0, device=k80, dtype="bf16") == roofline_s(
        flops=1e9, bytes_accessed=0, device=k80)


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [({"flops": -1, "bytes_accessed": 0}, "must be >= 0"),
     ({"flops": 1, "bytes_accessed": 0, "compute_efficiency": 0}, "efficiencies must be in"),
     ({"flops": 1, "bytes_accessed": 0, "memory_efficiency": 1.5}, "efficiencies must be in"),
     ({"flops": 1, "bytes_accessed": 0, "dtype": "fp8"}, "unknown dtype 'fp8'")],
)
def test_roofline_errors(kwargs, problem):
    with pytest.raises(TrainschedError, match=problem):
        roofline_s(device=V100, **kwargs)


def test_p2p():
    assert close(p2p_s(S, LINK), 1.01e-3)
    assert p2p_s(0, LINK) == 0.0
    baechi = Link(bandwidth_bytes_per_s=1 / 0.1754e-9, latency_s=134e-6)
    assert close(p2p_s(1e6, baechi), 134e-6 + 0.1754e-3)


def test_ring_family():
    assert close(ring_allreduce_s(S, 4, LINK), 6e-5 + 1.5e-3)
    assert close(reduce_scatter_s(S, 4, LINK), 3e-5 + 0.75e-3)
    assert close(allgather_s(S, 4, LINK), 3e-5 + 0.75e-3)
    assert close(ring_allreduce_s(S, 2, LINK), 2e-5 + 1e-3)
    for fn in (ring_allreduce_s, reduce_scatter_s, allgather_s, tree_allreduce_s,
               binomial_tree_allreduce_s):
        assert fn(S, 1, LINK) == 0.0
        assert fn(0, 8, LINK) == 0.0


def test_trees():
    assert close(tree_allreduce_s(S, 4, LINK), 4e-5 + 1.5e-3)
    assert close(tree_allreduce_s(S, 5, LINK), 6e-5 + 1.6e-3)  # ⌈log₂5⌉ = 3
    assert close(binomial_tree_allreduce_s(S, 8, LINK), 6 * 1.01e-3)
    assert close(binomial_tree_allreduce_s(S, 2, LINK), 2 * 1.01e-3)
    no_latency = Link(bandwidth_bytes_per_s=1e9, latency_s=0)
    assert close(tree_allreduce_s(S, 6, no_latency), ring_allreduce_s(S, 6, no_latency))


def test_parameter_server():
    # n=8 workers, k=2 servers: servers are the bottleneck, 8·S/(2·2e9) = 2 ms each way.
    assert close(parameter_server_s(S, 8, 2, LINK, SERVER), 2 * (5e-5 + 2e-3))
    # k=8: each server moves S/2e9 = 0.5 ms, the worker's own 1 ms dominates.
    assert close(parameter_server_s(S, 8, 8, LINK, SERVER), 2 * (5e-5 + 1e-3))
    assert parameter_server_s(0, 8, 2, LINK, SERVER) == 0.0


def test_byteps_optimum():
    assert close(byteps_optimal_s(S, 4, 2, 1e9), 2 * 4 * 3 * S / (20 * 1e9))  # 1.2 ms
    # k = 0 is the ring bandwidth term 2(n−1)S/(nB); k = n is S/B (not 2S/B).
    for n in (2, 3, 8, 64):
        assert close(byteps_optimal_s(S, n, 0, 1e9), 2 * (n - 1) / n * S / 1e9)
        assert close(byteps_optimal_s(S, n, n, 1e9), S / 1e9)
        ring_no_latency = ring_allreduce_s(S, n, Link(bandwidth_bytes_per_s=1e9, latency_s=0))
        assert close(byteps_optimal_s(S, n, 0, 1e9), ring_no_latency)
    assert byteps_optimal_s(S, 1, 3, 1e9) == 0.0
    # More CPU servers never hurt.
    times = [byteps_optimal_s(S, 8, k, 1e9) for k in range(0, 17)]
    assert times == sorted(times, reverse=True)


@pytest.mark.parametrize(
    ("call", "problem"),
    [(lambda: p2p_s(-1, LINK), "message size must be >= 0"),
     (lambda: ring_allreduce_s(S, 0, LINK), "n must be >= 1, got 0"),
     (lambda: parameter_server_s(S, 4, 0, LINK, SERVER), "n_servers must be >= 1"),
     (lambda: byteps_optimal_s(S, 4, -1, 1e9), "k must be >= 0"),
     (lambda: byteps_optimal_s(S, 4, 1, 0), "bandwidth must be > 0")],
)
def test_argument_errors(call, problem):
    with pytest.raises(TrainschedError, match=problem):
        call()


sizes = st.floats(min_value=0, max_value=1e12)


@given(sizes, sizes, st.integers(min_value=1, max_value=256))
def test_monotone_in_size(a, b, n):
    small, large = sorted((a, b))
    for fn in (ring_allreduce_s, reduce_scatter_s, allgather_s, tree_allreduce_s,
               binomial_tree_allreduce_s):
        assert fn(small, n, LINK) <= fn(large, n, LINK)
    assert p2p_s(small, LINK) <= p2p_s(large, LINK)
    assert parameter_server_s(small, n, 2, LINK, SERVER) <= parameter_server_s(
        large, n, 2, LINK, SERVER)
    assert byteps_optimal_s(small, n, 2, 1e9) <= byteps_optimal_s(large, n, 2, 1e9)


@given(st.floats(min_value=0, max_value=1e15), st.floats(min_value=0, max_value=1e12))
def test_roofline_bounds(flops, bytes_accessed):
    t = roofline_s(flops=flops, bytes_accessed=bytes_accessed, device=V100)
    if flops == 0 and bytes_accessed == 0:
        assert t == 0
        return
    compute = flops / (0.75 * 15.7e12)
    memory = bytes_accessed / 900e9
    assert t >= max(compute, memory) + 5e-6 - 1e-15
    assert t <= compute + memory + 5e-6 + 1e-15


@given(st.floats(min_value=1, max_value=1e10), st.integers(min_value=2, max_value=512))
def test_ring_bandwidth_term_below_twice_size(size, n):
    free = Link(bandwidth_bytes_per_s=1e9, latency_s=0)
    assert ring_allreduce_s(size, n, free) < 2 * size / 1e9
    assert ring_allreduce_s(size, n, free) >= size / 1e9


def test_ring_across_nodes_counts_network_hops_once_per_crossing():
    from trainsched.costs import ring_allreduce_nodes_s

    cross = Link(bandwidth_bytes_per_s=0.5e9, latency_s=1e-4)  # slower and later than LINK
    # 8 ranks on 2 nodes: 2 of the 14 steps' hops cross the network, 12 stay inside; the
    # bandwidth term runs at the slower link: 14/8 · S / 0.5 GB/s = 3.5 ms.
    assert close(ring_allreduce_nodes_s(S, 8, 2, LINK, cross), 2e-4 + 12e-5 + 3.5e-3)
    # 64 ranks on 8 nodes: 14 network hops and 112 inside, instead of 126 network hops.
    got = ring_allreduce_nodes_s(S, 64, 8, LINK, cross)
    assert close(got, 14e-4 + 112e-5 + 2 * 63 / 64 * 2e-3)
    flat = ring_allreduce_s(S, 64, Link(bandwidth_bytes_per_s=0.5e9, latency_s=1e-4))
    assert got < flat
    # One node is the plain ring on the intra-node link; nothing to move costs nothing.
    assert ring_allreduce_nodes_s(S, 4, 1, LINK, cross) == ring_allreduce_s(S, 4, LINK)
    assert ring_allreduce_nodes_s(0, 8, 2, LINK, cross) == 0.0
    with pytest.raises(TrainschedError, match="4 ranks cannot span 5 nodes"):
        ring_allreduce_nodes_s(S, 4, 5, LINK, cross)
    with pytest.raises(TrainschedError, match="nodes must be >= 1"):
        ring_allreduce_nodes_s(S, 4, 0, LINK, cross)
