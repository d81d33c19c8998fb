"""Data-parallel executor: collective costs, hand-worked FIFO / DDP / priority / credit steps,
symmetry (collapsed = expanded), stragglers, determinism, memory and results."""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
from dataclasses import dataclass, replace

import pytest

from trainsched.cluster import Cluster, Link, device_kind
from trainsched.comm import Collective, DdpBucketPolicy, FifoPolicy, PriorityPolicy
from trainsched.costs import parameter_server_s, ring_allreduce_s, tree_allreduce_s
from trainsched.errors import TrainschedError
from trainsched.graph import Edge, Graph, Op, to_training
from trainsched.sim import (
    chrome_trace,
    collective_link,
    collective_s,
    rank_classes,
    simulate_data_parallel,
    simulate_single,
)

MS = 1e-3
MB = 1_000_000  # 1 ms on the 1 GB/s intra-node link
ALPHA = 50e-6  # intra-node latency: a 2-rank ring costs 2α + S/B = 0.1 ms + S/B


# The wire's rules alone: the hand-worked steps leave out the scheduled runtime's passes over a
# collective's bytes (charged on their own, test_the_scheduled_runtime_packs_...).
FIFO = FifoPolicy(runtime_passes=False)


def priority(**options):
    return PriorityPolicy(runtime_passes=False, **options)


def fifo(**options):
    return FifoPolicy(runtime_passes=False, **options)


def close(actual: float, expected: float) -> bool:
    return math.isclose(actual, expected, rel_tol=1e-9, abs_tol=1e-15)


def plain_v100():
    """A V100 whose collectives run one at a time beside full-speed compute: the rules of the
    wire by hand here (collectives by rate: tests/test_sim_collective_rates.py), every rank
    as fast as the others (no spread across devices)."""
    return replace(device_kind("V100"), compute_rate_with_comm=1.0, device_cv=0.0)


def make_cluster(per_node: int = 4, nodes: int = 1, servers: int = 0) -> Cluster:
    return Cluster(name="test", device=plain_v100(), devices_per_node=per_node,
                   num_nodes=nodes, intra_node=Link(bandwidth_bytes_per_s=1e9, latency_s=ALPHA),
                   inter_node=Link(bandwidth_bytes_per_s=2e9, latency_s=100e-6),
                   parameter_servers=servers,
                   ps_link=Link(bandwidth_bytes_per_s=4e9, latency_s=20e-6) if servers else None)


def three_layers(*sizes: int) -> Graph:
    """L0 -> L1 -> L2, 1 ms per forward, dX and dW; SGD steps cost 3·param / 6 GB/s (a 2 MB
    parameter: 1 ms, 0.6 MB: 0.3 ms). Backward runs L2:dX, L2:dW, L1:dX, L1:dW, L0:dW in
    [3, 8] ms, so the gradients are ready at 5 (g2), 7 (g1) and 8 ms (g0)."""
    ops = [Op(name=f"L{i}", compute_s=MS, backward_input_s=MS, backward_weight_s=MS,
              param_bytes=size, output_bytes=4096, saved_bytes=4096, layer_index=i)
           for i, size in enumerate(sizes)]  # fmt: skip
    edges = [Edge(src=f"L{i}", dst=f"L{i + 1}", size_bytes=4096) for i in range(len(sizes) - 1)]
    return to_training(Graph(ops, edges), memory_bandwidth_bytes_per_s=6e9)


def comm(result, rank_device: str | None = None):
    return [t for t in result.tasks if t.category == "comm"
            and (rank_device is None or t.device == rank_device)]  # fmt: skip


def span(result, name: str, device: str = "gpu0") -> tuple[float, float]:
    t = next(t for t in result.tasks if t.name == name and t.device == device)
    return t.start_s, t.end_s


def spans_close(result, expected: dict[str, tuple[float, float]], device: str = "gpu0"):
    for name, (a, b) in expected.items():
        start, end = span(result, name, device)
        assert close(start, a * MS) and close(end, b * MS), (name, start, end, a, b)


# --- costs -----------------------------------------------------------------------------------


def test_one_gradient_costs_the_ring_formula():
    g = to_training(Graph([Op(name="fc", compute_s=MS, param_bytes=3 * MB, output_bytes=8,
                              saved_bytes=8)], []))  # fmt: skip
    cluster = make_cluster(nodes=2)
    for n in (2, 3, 4):  # one node: intra-node link
        (task,) = comm(simulate_data_parallel(g, cluster, ranks=n, policy="fifo"))
        expected = 2 * (n - 1) * ALPHA + 2 * (n - 1) / n * 3 * MB / 1e9
        assert close(task.end_s - task.start_s, expected)
        assert close(expected, ring_allreduce_s(3 * MB, n, cluster.intra_node))
    # 8 ranks on two nodes, ring: one ring edge crosses each NIC (2 GB/s, above the 1 GB/s
    # intra-node link), the larger latency; of the 14 steps' hops 2 cross the network
    # (100 µs), 12 stay inside a node (α); tree: the 4 devices of a node share the NIC.
    link = collective_link(cluster, 8)
    assert (link.bandwidth_bytes_per_s, link.latency_s) == (1e9, 100e-6)
    (task,) = comm(simulate_data_parallel(g, cluster, ranks=8, policy="fifo"))
    assert close(task.end_s - task.start_s, 2 * 100e-6 + 12 * ALPHA + 14 / 8 * 3 * MB / 1e9)
    tree_link = collective_link(cluster, 8, "tree")
    assert (tree_link.bandwidth_bytes_per_s, tree_link.latency_s) == (0.5e9, 100e-6)
    assert close(collective_s(3 * MB, 8, cluster, "tree"),
                 tree_allreduce_s(3 * MB, 8, tree_link))
    ps = make_cluster(nodes=2, servers=2)
    worker = Link(bandwidth_bytes_per_s=0.5e9, latency_s=100e-6)
    assert close(collective_s(3 * MB, 8, ps, "ps"),
                 parameter_server_s(3 * MB, 8, 2, worker, ps.ps_link))
    with pytest.raises(TrainschedError, match="needs parameter servers"):
        collective_s(MB, 2, cluster, "ps")
    with pytest.raises(TrainschedError, match="unknown collective algorithm 'mesh'"):
        simulate_data_parallel(g, cluster, ranks=2, policy="fifo", algorithm="mesh")
    assert collective_s(MB, 1, cluster) == 0.0


def test_one_rank_communicates_nothing():
    g = three_layers(600_000, 600_000, 2 * MB)
    cluster = make_cluster()
    result = simulate_data_parallel(g, cluster, ranks=1, policy="ddp")
    single = simulate_single(g, cluster)
    assert comm(result) == [] and result.exposed_comm_s == 0.0
    assert [r.name for r in result.resources] == ["gpu0/compute"]
    assert result.step_time_s == single.step_time_s
    assert [(t.name, t.start_s) for t in result.tasks] == [(t.name, t.start_s)
                                                           for t in single.tasks]
    assert result.peak_memory_bytes == single.peak_memory_bytes


# --- hand-worked steps -----------------------------------------------------------------------


def test_fifo_versus_ddp_buckets_by_hand():
    """Two ranks, gradients g2 = g1 = 0.6 MB ready at 5 and 7 ms, g0 = 2 MB at 8 ms; a
    collective costs 0.1 ms + S/(1 GB/s); with the barrier the SGD steps (1 + 0.3 + 0.3 ms) run
    after the last collective."""
    g = three_layers(2 * MB, 600_000, 600_000)
    cluster = make_cluster()
    fifo = simulate_data_parallel(g, cluster, ranks=2, policy=FIFO)
    spans_close(fifo, {"L2:dW": (4, 5), "L1:dW": (6, 7), "L0:dW": (7, 8),
                       "L2:grad": (5, 5.7), "L1:grad": (7, 7.7), "L0:grad": (8, 10.1),
                       "barrier": (10.1, 10.1), "L0:opt": (10.1, 11.1), "L1:opt": (11.1, 11.4),
                       "L2:opt": (11.4, 11.7)})  # fmt: skip
    assert close(fifo.step_time_s, 11.7 * MS)

    # DDP: the first bucket closes at >= 1 MiB: {g2, g1} (1.2 MB) issued at 7 ms; {g0} at 8 ms
    # waits for the wire until 8.3 ms.
    ddp = simulate_data_parallel(g, cluster, ranks=2, policy=DdpBucketPolicy(bucket_copies=False))
    spans_close(ddp, {"bucket0": (7, 8.3), "bucket1": (8.3, 10.4), "L0:opt": (10.4, 11.4),
                      "L2:opt": (11.7, 12.0)})
    assert close(ddp.step_time_s, 12.0 * MS)
    bucket1 = next(t for t in comm(ddp) if t.name == "bucket1")
    assert close(bucket1.args["issued_s"], 8 * MS) and bucket1.args["members"] == ("L0:grad",)

    # One 25 MiB bucket (no small first bucket): all 3.2 MB at 8 ms.
    one = simulate_data_parallel(g, cluster, ranks=2,
                                 policy=DdpBucketPolicy(first_bucket_bytes=25 << 20,
                                                        bucket_copies=False))
    spans_close(one, {"bucket0": (8, 11.3)})
    assert close(one.step_time_s, 12.9 * MS)

    # Compute C and communication M: max(C, M) <= step <= C + M.
    for result in (fifo, ddp, one):
        c = sum(t.end_s - t.start_s for t in result.tasks if "gpu0/compute" in t.resources)
        m = sum(t.end_s - t.start_s for t in comm(result))
        assert max(c, m) <= result.step_time_s <= c + m
        assert close(c, 9.6 * MS)


def test_optimizer_waits_for_its_own_collective_when_crossing_the_barrier():
    g = three_layers(2 * MB, 600_000, 600_000)
    cluster = make_cluster()
    result = simulate_data_parallel(g, cluster, ranks=2, policy=fifo(cross_barrier=True))
    # L2:opt and L1:opt may start at 5.7 and 7.7 ms, but backward holds the stream until 8 ms;
    # then program order puts L1:opt first.
    spans_close(result, {"L1:opt": (8, 8.3), "L2:opt": (8.3, 8.6), "L0:opt": (10.1, 11.1)})
    assert close(result.step_time_s, 11.1 * MS)
    assert not any(t.name == "barrier" for t in result.tasks)
    for layer in range(3):
        assert span(result, f"L{layer}:opt")[0] >= span(result, f"L{layer}:grad")[1]
    # With the barrier every optimizer step waits for the last collective.
    barrier = simulate_data_parallel(g, cluster, ranks=2, policy=FIFO)
    last = max(t.end_s for t in comm(barrier))
    assert all(t.start_s >= last for t in barrier.tasks if t.category == "optimizer")


def test_priority_and_credit_by_hand():
    """g2 = 4 MB (4.1 ms on the wire from 5 ms), g1 = 0.6 MB issued at 7, g0 = 2 MB at 8; at
    9.1 ms FIFO sends g1 then g0, priority g0 then g1."""
    g = three_layers(2 * MB, 600_000, 4 * MB)
    cluster = make_cluster()

    def run(policy):
        return simulate_data_parallel(g, cluster, ranks=2, policy=policy)

    fifo_order = {"L2:grad": (5, 9.1), "L1:grad": (9.1, 9.8), "L0:grad": (9.8, 11.9)}
    prio_order = {"L2:grad": (5, 9.1), "L0:grad": (9.1, 11.2), "L1:grad": (11.2, 11.9)}
    spans_close(run(FIFO), fifo_order)
    spans_close(run(priority()), prio_order)
    # Per-layer optimizer steps show the gain: L0:opt at 11.2 instead of 11.9.
    fifo_x = run(fifo(cross_barrier=True))
    prio_x = run(priority(cross_barrier=True))
    spans_close(fifo_x, {"L2:opt": (9.1, 11.1), "L1:opt": (11.1, 11.4), "L0:opt": (11.9, 12.9)})
    spans_close(prio_x, {"L2:opt": (9.1, 11.1), "L0:opt": (11.2, 12.2), "L1:opt": (12.2, 12.5)})
    assert close(fifo_x.step_time_s, 12.9 * MS) and close(prio_x.step_time_s, 12.5 * MS)

    # Credit 5 MB (strict): at 7 ms 4 + 0.6 <= 5, so g1 is dispatched behind g2 and g0 cannot
    # overtake it: FIFO's order. 4.5 MB holds g1 back: priority's order. Unlimited credit hands
    # everything to the FIFO wire on issue: FIFO's order.
    five = run(priority(credit_bytes=5 * MB))
    spans_close(five, fifo_order)
    dispatched = {t.name: t.args["dispatched_s"] for t in comm(five, "gpu0")}
    assert close(dispatched["L1:grad"], 7 * MS) and close(dispatched["L0:grad"], 9.1 * MS)
    spans_close(run(priority(credit_bytes=4_500_000)), prio_order)
    spans_close(run(priority(credit_bytes=math.inf)), fifo_order)
    # Overdraft dispatches while in flight < credit: 4 < 4.5 lets g1 go at 7 ms.
    spans_close(run(priority(credit_bytes=4_500_000, credit_mode="overdraft")),
                fifo_order)


def test_partitions_let_urgent_gradients_overtake_between_chunks():
    """1.5 MB partitions: g2 = 4 MB is 1.5 + 1.5 + 1 MB (1.6, 1.6, 1.1 ms from 5 ms), g0 = 2 MB
    is 1.5 + 0.5 MB; when g2's second chunk ends at 8.2 ms, g0's chunks (layer 0) and g1 go
    before g2's last one. Every chunk pays its own 2α."""
    g = three_layers(2 * MB, 600_000, 4 * MB)
    result = simulate_data_parallel(g, make_cluster(), ranks=2,
                                    policy=priority(partition_bytes=1_500_000))
    spans_close(result, {"L2:grad/0": (5, 6.6), "L2:grad/1": (6.6, 8.2),
                         "L0:grad/0": (8.2, 9.8), "L0:grad/1": (9.8, 10.4),
                         "L1:grad": (10.4, 11.1), "L2:grad/2": (11.1, 12.2),
                         "L0:opt": (12.2, 13.2)})  # fmt: skip
    assert close(result.step_time_s, 15.5 * MS)
    assert [t.args["bytes"] for t in comm(result) if t.name.startswith("L2")] == [
        1_500_000, 1_500_000, 1_000_000]
    # Crossing the barrier, layer 0's step starts when its last chunk ends.
    crossing = simulate_data_parallel(g, make_cluster(), ranks=2,
                                      policy=priority(partition_bytes=1_500_000,
                                                      cross_barrier=True))
    spans_close(crossing, {"L0:opt": (10.4, 11.4), "L1:opt": (11.4, 11.7),
                           "L2:opt": (12.2, 14.2)})


def test_startup_overlap_hides_the_latency_of_collectives_in_flight_together():
    """Unlimited credit dispatches g2's three chunks at 5 ms, g1 at 7 and g0's two at 8. With
    ``startup_overlap`` each chunk's start-up (2α = 0.1 ms) runs under the transfer before it:
    a chunk starts 0.1 ms before the one ahead of it ends, saving 0.1 ms per chunk after the
    first (0.5 ms by g0's last). One in flight at a time (no credit) overlaps nothing."""
    from dataclasses import replace

    g = three_layers(2 * MB, 600_000, 4 * MB)
    cluster = make_cluster()
    policy = PriorityPolicy(partition_bytes=1_500_000, credit_bytes=math.inf)
    plain = simulate_data_parallel(g, cluster, ranks=2, policy=policy)
    spans_close(plain, {"L2:grad/0": (5, 6.6), "L2:grad/1": (6.6, 8.2), "L2:grad/2": (8.2, 9.3),
                        "L1:grad": (9.3, 10.0), "L0:grad/0": (10.0, 11.6),
                        "L0:grad/1": (11.6, 12.2)})  # fmt: skip
    over = simulate_data_parallel(g, cluster, ranks=2, policy=policy, startup_overlap=True)
    spans_close(over, {"L2:grad/0": (5, 6.6), "L2:grad/1": (6.5, 8.1), "L2:grad/2": (8.0, 9.1),
                       "L1:grad": (9.0, 9.7), "L0:grad/0": (9.6, 11.2),
                       "L0:grad/1": (11.1, 11.7)})  # fmt: skip
    assert close(plain.step_time_s - over.step_time_s, 0.5 * MS)
    # the channel is busy for the union of its collectives, so never over the step
    channel = "gpu0/channel"
    union = 11.7 - 5.0
    assert close(over.busy_s[channel], union * MS) and over.idle_s[channel] >= 0
    # the critical path still adds up to the step (a waited-for start-up: a negative wait)
    assert close(sum(p.end_s - p.start_s + p.wait_s for p in over.critical_path),
                 over.step_time_s)
    one_at_a_time = PriorityPolicy(partition_bytes=1_500_000)
    assert (simulate_data_parallel(g, cluster, ranks=2, policy=one_at_a_time,
                                   startup_overlap=True).step_time_s
            == simulate_data_parallel(g, cluster, ranks=2, policy=one_at_a_time).step_time_s)
    # host-driven communication starts with its collective, also one that starts later than
    # its dispatch
    shared = replace(cluster, device=replace(cluster.device, comm_compute_share=0.5))
    host = simulate_data_parallel(g, shared, ranks=2, policy=policy, startup_overlap=True)
    starts = {t.name: t.start_s for t in comm(host, "gpu0")}
    hosts = [t for t in host.tasks if t.category == "comm-host" and t.device == "gpu0"]
    assert len(hosts) == 6
    for t in hosts:
        assert t.start_s >= starts[t.args["collective"]] - 1e-15
    # over several steps the channel's busy time is the union too
    steady = simulate_data_parallel(g, cluster, ranks=2, policy=policy, startup_overlap=True,
                                    steps=3)
    assert 0 < steady.busy_s[channel] <= steady.step_time_s and steady.idle_s[channel] >= 0
    with pytest.raises(TrainschedError, match="startup_overlap"):
        simulate_data_parallel(g, cluster, ranks=2, policy=policy, startup_overlap=1)


def test_crossing_bound_by_hand_and_never_beaten():
    """Three layers: L0's loop is its forward at 0 ms, everything the stream runs up to L0:dW
    (ends at 8 ms), the all-reduce of 2 MB (2.1 ms) and its 1 ms update: 11.1 ms, above
    compute-or-comm alone. No policy, partition, credit or start-up overlap beats the bound on
    random graphs."""
    from trainsched.comm import ByteSchedulerPolicy
    from trainsched.sim import crossing_bound_s

    g = three_layers(2 * MB, 600_000, 4 * MB)
    bound, name = crossing_bound_s(g, make_cluster(), ranks=2)
    assert close(bound, 11.1 * MS) and name == "L0:grad"
    assert crossing_bound_s(g, make_cluster(), ranks=1) == (0.0, None)
    rng = random.Random(17)
    policies = [FifoPolicy(), DdpBucketPolicy(), PriorityPolicy(cross_barrier=True),
                ByteSchedulerPolicy(partition_bytes=MB, credit_bytes=4 * MB),
                ByteSchedulerPolicy(partition_bytes=MB // 4, credit_bytes=math.inf),
                ByteSchedulerPolicy(partition_bytes=8 * MB, credit_bytes=8 * MB,
                                    credit_mode="strict")]
    ratios = []
    for _ in range(20):
        graph = random_graph(rng, rng.randrange(2, 9))
        cluster = make_cluster(per_node=2, nodes=2)
        ranks = rng.choice([2, 4])
        bound, _ = crossing_bound_s(graph, cluster, ranks=ranks)
        assert bound > 0
        for policy in policies:
            for overlap in (False, True):
                for steps in (1, 3):
                    step = simulate_data_parallel(graph, cluster, ranks=ranks, policy=policy,
                                                  steps=steps, startup_overlap=overlap)
                    assert step.step_time_s >= bound * (1 - 1e-9), (policy, overlap, steps)
                    ratios.append(step.step_time_s / bound)
    assert min(ratios) < 1.01  # some schedule reaches it: the bound is not a loose one


# --- symmetry and stragglers -----------------------------------------------------------------


def test_rank_classes():
    assert rank_classes(4) == ((0, 1, 2, 3),)
    assert rank_classes(4, {2: 1.5}) == ((0, 1, 3), (2,))
    assert rank_classes(5, {0: 2, 3: 2.0, 4: 1.0}) == ((0, 3), (1, 2, 4))
    assert rank_classes(3, {1: 2}, expand=True) == ((0,), (1,), (2,))
    with pytest.raises(TrainschedError, match="rank 4 is not one of the 4 ranks"):
        rank_classes(4, {4: 2.0})
    with pytest.raises(TrainschedError, match="finite factor > 0"):
        rank_classes(4, {1: 0})


def test_collapsed_equals_expanded():
    g = three_layers(2 * MB, 600_000, 4 * MB, 1_500_000)
    cluster = make_cluster(nodes=2)
    policies = [FifoPolicy(), DdpBucketPolicy(), PriorityPolicy(partition_bytes=MB),
                FifoPolicy(cross_barrier=True)]
    for n in range(1, 9):
        for stragglers in (None, {n - 1: 1.7}, {0: 2.5}):
            for policy in policies:
                collapsed = simulate_data_parallel(g, cluster, ranks=n, policy=policy,
                                                   stragglers=stragglers)
                expanded = simulate_data_parallel(g, cluster, ranks=n, policy=policy,
                                                  stragglers=stragglers, expand=True)
                assert collapsed.step_time_s == expanded.step_time_s
                assert len(expanded.devices) == n
                reps = len(rank_classes(n, stragglers))
                assert len(collapsed.devices) == reps
                for device in collapsed.devices:  # every representative ran the same
                    assert [(t.name, t.start_s, t.end_s) for t in collapsed.tasks
                            if t.device == device] == [
                        (t.name, t.start_s, t.end_s) for t in expanded.tasks
                        if t.device == device]  # fmt: skip


def test_many_identical_ranks_cost_one_representative():
    g = three_layers(2 * MB, 600_000, 4 * MB)
    cluster = make_cluster(per_node=8, nodes=128)
    result = simulate_data_parallel(g, cluster, ranks=1024, policy="ddp")
    assert result.devices == ("n0.gpu0",)
    assert len(result.tasks) == len(simulate_data_parallel(g, cluster, ranks=2,
                                                           policy="ddp").tasks)
    assert all(t.args["ranks"] == 1024 for t in comm(result))
    two = simulate_data_parallel(g, cluster, ranks=1024, policy="ddp", stragglers={517: 1.2})
    assert two.devices == ("n0.gpu0", "n64.gpu5")


def test_a_straggler_delays_every_rendezvous():
    g = three_layers(2 * MB, 600_000, 600_000)
    cluster = make_cluster()
    base = simulate_data_parallel(g, cluster, ranks=4, policy=FIFO)
    slow = simulate_data_parallel(g, cluster, ranks=4, policy=FIFO, stragglers={3: 2.0})
    assert slow.devices == ("gpu0", "gpu3")
    before = {t.name: t.start_s for t in comm(base)}
    for t in comm(slow):
        ready = span(slow, t.name.replace(":grad", ":dW"), "gpu3")[1]  # the straggler's dW end
        assert t.start_s >= ready > before[t.name]
        assert close(t.args["issued_s"], ready)
        assert t.start_s == span(slow, t.name, "gpu0")[0]  # every rank starts it together
    # Straggler's dW end at 10, 14, 16 ms; a 4-rank ring costs 6α + 1.5·S/B (1.2 and 3.3 ms);
    # the optimizer steps follow the barrier at 19.3 ms, twice as long on the straggler.
    spans_close(slow, {"L2:grad": (10, 11.2), "L1:grad": (14, 15.2), "L0:grad": (16, 19.3)})
    spans_close(slow, {"L0:opt": (19.3, 20.3), "L2:opt": (20.6, 20.9)}, device="gpu0")
    spans_close(slow, {"L0:opt": (19.3, 21.3), "L2:opt": (21.9, 22.5)}, device="gpu3")
    assert close(slow.step_time_s, 22.5 * MS)
    # The fast rank idles while it waits; its exposed communication grows.
    assert slow.exposed_comm_s > base.exposed_comm_s
    assert close(slow.idle_s["gpu0/compute"], 22.5 * MS - 9.6 * MS)


def random_graph(rng: random.Random, layers: int) -> Graph:
    """A chain of ``layers`` forward ops with skip edges, random costs and parameter sizes
    (some without parameters)."""
    ops = [Op(name=f"op{i}", compute_s=rng.uniform(0.1, 2) * MS,
              backward_input_s=rng.uniform(0.1, 2) * MS,
              backward_weight_s=rng.uniform(0.1, 2) * MS,
              param_bytes=rng.choice([0, rng.randrange(1, 4 * MB)]), output_bytes=4096,
              saved_bytes=rng.randrange(0, 8192)) for i in range(layers)]  # fmt: skip
    edges = [Edge(src=f"op{i}", dst=f"op{j}", size_bytes=4096)
             for i in range(layers) for j in (i + 1, i + 3) if j < layers]  # fmt: skip
    if not any(op.param_bytes for op in ops):
        ops[0] = Op(name="op0", compute_s=MS, param_bytes=MB, output_bytes=4096)
    return to_training(Graph(ops, edges), memory_bandwidth_bytes_per_s=rng.choice([6e9, 60e9]))


def test_properties_on_random_graphs():
    rng = random.Random(7)
    cluster = make_cluster(nodes=2)
    for _ in range(12):
        g = random_graph(rng, rng.randrange(2, 12))
        n = rng.choice([2, 3, 5, 8])
        stragglers = rng.choice([None, {rng.randrange(n): rng.uniform(1.1, 3)}])
        policies = [FifoPolicy(), DdpBucketPolicy(first_bucket_bytes=MB, bucket_bytes=3 * MB),
                    PriorityPolicy(partition_bytes=MB, credit_bytes=rng.choice([None, 2 * MB])),
                    FifoPolicy(cross_barrier=True)]
        for policy in policies:
            result = simulate_data_parallel(g, cluster, ranks=n, policy=policy,
                                            stragglers=stragglers)
            expanded = simulate_data_parallel(g, cluster, ranks=n, policy=policy,
                                              stragglers=stragglers, expand=True)
            assert result.step_time_s == expanded.step_time_s
            compute = {d: result.busy_s[f"{d}/compute"] for d in result.devices}
            wire = result.busy_s[f"{result.devices[0]}/channel"]
            assert max(*compute.values(), wire) <= result.step_time_s * (1 + 1e-12)
            assert result.step_time_s <= (sum(compute.values()) + wire) * (1 + 1e-12)
            assert result.dependency_bound_s <= result.step_time_s * (1 + 1e-12)
            # Every collective after its members, every optimizer step after its collectives.
            for d in result.devices:
                tasks = [t for t in result.tasks if t.device == d]
                end = {t.name: t.end_s for t in tasks}
                colls = [t for t in tasks if t.category == "comm"]
                for t in colls:
                    assert t.args["issued_s"] <= t.args["dispatched_s"] <= t.start_s
                    assert t.start_s >= max(end[m.replace(":grad", ":dW")]
                                            for m in t.args["members"])
                for t in tasks:
                    if t.category == "optimizer":
                        grad = t.name.replace(":opt", ":grad")
                        mine = [c.end_s for c in colls if grad in c.args["members"]]
                        assert mine and t.start_s >= max(mine)
                        assert t.start_s >= end[t.name.replace(":opt", ":dW")]
        # Unlimited credit hands everything to the FIFO wire on issue: FIFO's step.
        fifo = simulate_data_parallel(g, cluster, ranks=n, policy="fifo", stragglers=stragglers)
        unlimited = simulate_data_parallel(g, cluster, ranks=n, stragglers=stragglers,
                                           policy=PriorityPolicy(credit_bytes=math.inf))
        assert unlimited.step_time_s == fifo.step_time_s


# --- results, memory, determinism, errors ----------------------------------------------------


def test_result_fields_memory_and_trace():
    g = three_layers(2 * MB, 600_000, 600_000)
    cluster = make_cluster()
    result = simulate_data_parallel(g, cluster, ranks=2, policy="fifo", stragglers={1: 1.5})
    assert result.devices == ("gpu0", "gpu1")
    assert {r.name for r in result.resources} == {"gpu0/compute", "gpu0/channel",
                                                  "gpu1/compute", "gpu1/channel"}
    for device in result.devices:
        busy = result.busy_s[f"{device}/channel"]
        assert close(busy, sum(t.end_s - t.start_s for t in comm(result, device)))
        assert close(result.idle_s[f"{device}/channel"], result.step_time_s - busy)
    # Memory: parameters + gradients resident, activations until backward used them.
    single = simulate_single(g, cluster)
    assert dict(result.peak_memory_bytes) == {d: single.peak_memory_bytes["gpu0"]
                                              for d in result.devices}
    assert result.peak_memory_bytes["gpu0"] >= 2 * (2 * MB + 2 * 600_000)
    assert result.dependency_bound_s <= result.step_time_s
    path = result.critical_path
    assert close(sum(s.end_s - s.start_s + s.wait_s for s in path), result.step_time_s)
    trace = chrome_trace(result)
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    assert names == {"gpu0", "gpu1"}  # one process per representative rank
    slices = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["cat"] == "comm"]
    assert len(slices) == 2 * 3


def test_determinism_across_processes():
    code = ("import sys; sys.path.insert(0, 'tests')\n"
            "from test_sim_data_parallel import three_layers, make_cluster, MB\n"
            "from trainsched.sim import simulate_data_parallel\n"
            "g = three_layers(2 * MB, 600_000, 4 * MB, 700_000)\n"
            "r = simulate_data_parallel(g, make_cluster(nodes=2), ranks=6, policy='ddp',"
            " stragglers={4: 1.3}, expand=True)\n"
            "sys.stdout.write(r.to_json())\n")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    outputs = []
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=120, cwd=root, env=env)
        assert done.returncode == 0, done.stderr
        outputs.append(done.stdout)
    assert outputs[0] == outputs[1]
    g = three_layers(2 * MB, 600_000, 4 * MB, 700_000)
    again = simulate_data_parallel(g, make_cluster(nodes=2), ranks=6, policy="ddp",
                                   stragglers={4: 1.3}, expand=True)
    assert again.to_json() == outputs[0]
    assert json.loads(outputs[0])["step_time_s"] > 0


@dataclass(frozen=True)
class Reversed:
    """A user policy: whole gradients, most recent layer first, on a priority queue."""

    queue = "priority"
    credit_bytes = None
    credit_mode = "strict"
    ordered_issue = False
    cross_barrier = True

    def plan(self, gradients):
        return tuple(Collective(name=g.name, members=(g.name,), size_bytes=g.size_bytes,
                                priority=-g.layer_index) for g in gradients)


def test_user_policies_and_errors():
    g = three_layers(2 * MB, 600_000, 4 * MB)
    cluster = make_cluster()
    result = simulate_data_parallel(g, cluster, ranks=2, policy=Reversed())
    # At 9.1 ms g1 (priority -1) goes before g0 (priority 0).
    spans_close(result, {"L1:grad": (9.1, 9.8), "L0:grad": (9.8, 11.9)})

    class Partial(Reversed):
        def plan(self, gradients):
            return super().plan(gradients)[:1]

    with pytest.raises(TrainschedError, match="no collective reduces gradient"):
        simulate_data_parallel(g, cluster, ranks=2, policy=Partial())
    with pytest.raises(TrainschedError, match="unknown comm policy 'nccl'"):
        simulate_data_parallel(g, cluster, ranks=2, policy="nccl")
    with pytest.raises(TrainschedError, match="9 ranks need 9 devices"):
        simulate_data_parallel(g, cluster, ranks=9, policy="fifo")
    with pytest.raises(TrainschedError, match="ranks must be an integer >= 1"):
        simulate_data_parallel(g, cluster, ranks=0, policy="fifo")
    with pytest.raises(TrainschedError, match="not topological"):
        simulate_data_parallel(g, cluster, ranks=2, policy="fifo",
                               order=list(reversed(g.topological_order())))


def test_host_driven_communication_takes_its_share_of_compute():
    """γ = 1: each collective also holds its rank's compute stream for its duration, ahead of
    waiting ops (the stream is free at 5 ms when L2:grad starts), so compute and communication
    take turns: step = C + M = 9.6 + 3.5 ms. γ = 0 is the overlapped FIFO step of 11.7 ms."""
    from dataclasses import replace

    g = three_layers(2 * MB, 600_000, 600_000)
    base = make_cluster()
    steps = {}
    for share in (0.0, 0.5, 1.0):
        cluster = replace(base, device=replace(base.device, comm_compute_share=share))
        steps[share] = simulate_data_parallel(g, cluster, ranks=2, policy=FIFO)
    assert close(steps[0.0].step_time_s, 11.7 * MS)
    full = steps[1.0]
    spans_close(full, {"L2:grad (host)": (5, 5.7), "L1:dX": (5.7, 6.7), "L1:dW": (6.7, 7.7),
                       "L1:grad": (7.7, 8.4), "L1:grad (host)": (7.7, 8.4),
                       "L0:dW": (8.4, 9.4), "L0:grad": (9.4, 11.5),
                       "L0:grad (host)": (9.4, 11.5), "L2:opt": (12.8, 13.1)})  # fmt: skip
    assert close(full.step_time_s, 13.1 * MS)
    assert steps[0.0].step_time_s < steps[0.5].step_time_s < full.step_time_s
    # the host tasks sit on the compute stream, and the critical path still spans the step
    host = [t for t in full.tasks if t.category == "comm-host"]
    assert len(host) == 3 and all("gpu0/compute" in t.resources for t in host)
    assert close(sum(s.end_s - s.start_s for s in full.critical_path), full.step_time_s)


def test_ddp_bucket_copies_run_on_the_compute_stream():
    """DDP copies each bucket's gradients in before its all-reduce and out after it, at
    the device's memory bandwidth (4 GB/s of reads and writes here: 2 GB/s of copying).
    bucket0 (g2 + g1, 1.2 MB) copies in over [7, 7.6] when L1:dW ends, ahead of L0:dW
    ([7.6, 8.6]), and reduces over [7.6, 8.9]; bucket1 (g0, 2 MB) copies in over [8.6, 9.6],
    so bucket0's copy-out waits until 9.6 ([9.6, 10.2]); bucket1 reduces over [9.6, 11.7]
    and copies out over [11.7, 12.7]; then the SGD steps (1 + 0.3 + 0.3 ms): 14.3 ms."""
    from dataclasses import replace

    g = three_layers(2 * MB, 600_000, 600_000)
    base = make_cluster()
    cluster = replace(base, device=replace(base.device, memory_bandwidth_bytes_per_s=4e9))
    result = simulate_data_parallel(g, cluster, ranks=2, policy=DdpBucketPolicy())
    spans_close(result, {"bucket0 copy-in": (7, 7.6), "L0:dW": (7.6, 8.6),
                         "bucket0": (7.6, 8.9), "bucket1 copy-in": (8.6, 9.6),
                         "bucket0 copy-out": (9.6, 10.2), "bucket1": (9.6, 11.7),
                         "bucket1 copy-out": (11.7, 12.7), "L2:opt": (14.0, 14.3)})
    assert close(result.step_time_s, 14.3 * MS)
    copies = [t for t in result.tasks if t.category == "comm-copy"]
    assert len(copies) == 4 and all("gpu0/compute" in t.resources for t in copies)
    plain = simulate_data_parallel(g, cluster, ranks=2, policy=DdpBucketPolicy(bucket_copies=False))
    assert plain.step_time_s < result.step_time_s
    assert close(sum(s.end_s - s.start_s for s in result.critical_path), result.step_time_s)


# --- ring across nodes, parameter servers with local aggregation, several steps -------------


def test_ring_across_nodes_and_ps_with_local_aggregation():
    from trainsched.costs import ring_allreduce_nodes_s

    cluster = make_cluster(nodes=4, servers=4)  # 4 nodes of 4, NIC 2 GB/s 100 µs, servers 4 GB/s
    size = 3 * MB
    # Ring over 12 ranks on 3 nodes: 4 network hops (100 µs), 18 intra-node hops (α).
    expected = 4 * 100e-6 + 18 * ALPHA + 22 / 12 * size / 1e9
    assert close(collective_s(size, 12, cluster), expected)
    assert close(expected, ring_allreduce_nodes_s(size, 12, 3, cluster.intra_node,
                                                  collective_link(cluster, 12)))
    # ps-local over 12 ranks: the 4 ranks of a node all-reduce on the intra-node ring, then 3
    # nodes push and pull through the 4 servers, each node over its whole NIC (2 GB/s):
    # per direction 100 µs + max(S / 2 GB/s, 3·S / (4 · 4 GB/s)) = 1.6 ms.
    local = 6 * ALPHA + 6 / 4 * size / 1e9
    assert close(collective_s(size, 12, cluster, "ps-local"), local + 2 * (100e-6 + 1.5e-3))
    assert close(collective_s(size, 12, cluster, "ps-local"),
                 local + parameter_server_s(size, 3, 4, cluster.inter_node, cluster.ps_link))
    # Without local aggregation every rank pushes through a quarter of the NIC:
    # 2 · (100 µs + S / 0.5 GB/s) = 12.2 ms.
    assert close(collective_s(size, 12, cluster, "ps"), 2 * (100e-6 + 6e-3))
    # One node: the local all-reduce is all there is.
    assert close(collective_s(size, 4, cluster, "ps-local"),
                 ring_allreduce_s(size, 4, cluster.intra_node))
    with pytest.raises(TrainschedError, match="'ps-local' needs parameter servers"):
        collective_s(size, 8, make_cluster(nodes=2), "ps-local")
    g = three_layers(600_000, 600_000, 2 * MB)
    result = simulate_data_parallel(g, cluster, ranks=12, policy="fifo", algorithm="ps-local")
    (task,) = [t for t in comm(result) if t.name == "L2:grad"]
    assert close(task.end_s - task.start_s, collective_s(2 * MB, 12, cluster, "ps-local"))
    assert task.args["algorithm"] == "ps-local"


def test_steps_let_the_next_forward_cross_the_barrier():
    """L2 holds 4 MB (1 MB partitions, 1.1 ms each on the wire; its SGD step 2 ms), L0 and L1
    0.6 MB (0.7 ms; 0.3 ms). Step 0 as in the one-step runs: L2's partitions from 5 ms, L1 at
    7.2, L2/2 at 7.9, L0 (ready at 8) at 9.0-9.7, L2/3 until 10.8. Backward returned at 8, so
    step 1's L0 starts when its update ends (L0:opt 9.7-10.0), while L2/3 is still on the wire;
    L2's update (11-13) then runs ahead of step 1's L1 (priority of the older step). From then
    on every step takes 12 ms (L0 at 10, 22, ...). FIFO with the barrier: 13.1 ms a step,
    whatever the number of steps."""
    g = three_layers(600_000, 600_000, 4 * MB)
    cluster = make_cluster()
    policy = priority(partition_bytes=MB, cross_barrier=True)
    one = simulate_data_parallel(g, cluster, ranks=2, policy=policy)
    assert close(one.step_time_s, 12.8 * MS)  # L2:opt ends last
    three = simulate_data_parallel(g, cluster, ranks=2, policy=policy, steps=3)
    assert close(three.step_time_s, 12.0 * MS)

    def at(name: str, step: int) -> tuple[float, float]:
        (t,) = [t for t in three.tasks if t.name == name and t.args.get("step") == step
                and t.device == "gpu0"]
        return t.start_s / MS, t.end_s / MS

    expected = {("L0:opt", 0): (9.7, 10.0), ("L2:grad/3", 0): (9.7, 10.8),
                ("L0", 1): (10.0, 11.0), ("L2:opt", 0): (11.0, 13.0), ("L1", 1): (13.0, 14.0),
                ("step boundary", 1): (8.0, 8.0), ("L0", 2): (22.0, 23.0)}
    for key, (a, b) in expected.items():
        got = at(*key)
        assert math.isclose(got[0], a, abs_tol=1e-9) and math.isclose(got[1], b, abs_tol=1e-9), \
            (key, got)
    assert at("L0", 1)[0] < at("L2:grad/3", 0)[1]  # the next forward overlaps communication
    # Per-step figures over the period: 10.6 ms of compute (3 forward, 5 backward, 2.6 SGD).
    assert math.isclose(three.busy_s["gpu0/compute"], 10.6 * MS, rel_tol=1e-9)
    assert math.isclose(three.idle_s["gpu0/compute"], 1.4 * MS, rel_tol=1e-9)
    # In the period [10, 22] the stream idles only over [20.3, 21.7] (after L1:opt, before
    # L0:opt), while L2/2 and L0's all-reduce run: 1.4 ms of exposed communication.
    assert math.isclose(three.exposed_comm_s, 1.4 * MS, rel_tol=1e-9)
    assert len(comm(three, "gpu0")) == 3 * len(comm(one, "gpu0"))
    for policy in (FIFO, DdpBucketPolicy(bucket_copies=False)):
        steps = [simulate_data_parallel(g, cluster, ranks=2, policy=policy, steps=n).step_time_s
                 for n in (1, 2, 4)]
        assert all(close(s, steps[0]) for s in steps), (policy, steps)
        if isinstance(policy, FifoPolicy):
            assert close(steps[0], 13.1 * MS)
        runs = [simulate_data_parallel(g, cluster, ranks=2, policy=policy, steps=n)
                for n in (1, 3)]
        for field in ("busy_s", "idle_s"):
            a, b = (getattr(r, field) for r in runs)
            assert a.keys() == b.keys()
            assert all(math.isclose(a[k], b[k], rel_tol=1e-9, abs_tol=1e-15) for k in a), field
        assert math.isclose(runs[0].exposed_comm_s, runs[1].exposed_comm_s, rel_tol=1e-9)
    with pytest.raises(TrainschedError, match="steps must be an integer >= 1, got 0"):
        simulate_data_parallel(g, cluster, ranks=2, policy=policy, steps=0)


def test_steps_keep_symmetry_memory_and_determinism():
    rng = random.Random(5)
    cluster = make_cluster()
    for _ in range(4):
        g = random_graph(rng, rng.randrange(3, 8))
        policy = rng.choice([PriorityPolicy(partition_bytes=MB, credit_bytes=2 * MB,
                                            credit_mode="overdraft", cross_barrier=True),
                             FifoPolicy(cross_barrier=True), DdpBucketPolicy()])
        stragglers = {1: 1.5}
        args = {"ranks": 3, "policy": policy, "stragglers": stragglers, "steps": 3}
        collapsed = simulate_data_parallel(g, cluster, **args)
        expanded = simulate_data_parallel(g, cluster, expand=True, **args)
        assert collapsed.step_time_s == expanded.step_time_s
        assert collapsed.to_json() == simulate_data_parallel(g, cluster, **args).to_json()
        one = simulate_data_parallel(g, cluster, ranks=3, policy=policy, stragglers=stragglers)
        # Parameters, optimizer state and gradients are held once, however many steps.
        assert collapsed.peak_memory_bytes == one.peak_memory_bytes
        if not policy.cross_barrier:  # the barrier: each step as the one before
            assert math.isclose(collapsed.step_time_s, one.step_time_s, rel_tol=1e-9)


def test_the_scheduled_runtime_packs_fused_groups_and_averages_every_collective():
    """The scheduled runtime divides every reduced collective by the world size (one pass over
    its bytes after it) and packs a fused group into one buffer (one pass before it), on the
    rank's compute stream at the device's memory bandwidth (4 GB/s of reads and writes: a
    pass over S bytes takes 2S / 4 GB/s). L1 and L2's gradients (0.6 MB each, below the
    1 MB fusion size) are one fused group of 1.2 MB: in and out 0.6 ms each; L0's (2 MB)
    goes alone: no packing, 1 ms to average."""
    from dataclasses import replace

    from trainsched.comm import ByteSchedulerPolicy

    g = three_layers(2 * MB, 600_000, 600_000)
    base = make_cluster()
    cluster = replace(base, device=replace(base.device, memory_bandwidth_bytes_per_s=4e9))
    result = simulate_data_parallel(g, cluster, ranks=2, policy=ByteSchedulerPolicy())
    colls = {t.name: t for t in comm(result, "gpu0")}
    copies = {t.name: t for t in result.tasks
              if t.category == "comm-copy" and t.device == "gpu0"}
    (fused,) = [n for n in colls if "+" in n]
    (alone,) = [n for n in colls if "+" not in n]
    assert sorted(copies) == sorted([f"{fused} copy-in", f"{fused} copy-out",
                                     f"{alone} copy-out"])
    durations = {n: t.end_s - t.start_s for n, t in copies.items()}
    assert close(durations[f"{fused} copy-in"], 0.6 * MS)
    assert close(durations[f"{fused} copy-out"], 0.6 * MS)
    assert close(durations[f"{alone} copy-out"], 1.0 * MS)
    assert copies[f"{fused} copy-in"].end_s <= colls[fused].start_s
    assert copies[f"{fused} copy-out"].start_s >= colls[fused].end_s
    assert copies[f"{alone} copy-out"].start_s >= colls[alone].end_s
    assert all("gpu0/compute" in t.resources for t in copies.values())
    none = simulate_data_parallel(g, cluster, ranks=2,
                                  policy=ByteSchedulerPolicy(runtime_passes=False))
    assert not [t for t in none.tasks if t.category == "comm-copy"]
    assert none.step_time_s < result.step_time_s
