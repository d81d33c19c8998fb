"""The dispatch core on a fake FIFO wire: golden orders, credit invariants, following a leader,
agreement with the simulator, partition spans and size checks."""

from __future__ import annotations

import dataclasses
import math
import random

import pytest

from trainsched.cluster import Cluster, Link, device_kind
from trainsched.comm import (
    Collective,
    DdpBucketPolicy,
    FifoPolicy,
    Gradient,
    PriorityPolicy,
    comm_policy,
    graph_gradients,
)
from trainsched.comm.dispatch import (
    Dispatcher,
    check_sizes,
    partition_spans,
    replay_fifo_wire,
)
from trainsched.errors import TrainschedError
from trainsched.graph import Edge, Graph, Op, to_training
from trainsched.sim import collective_s, simulate_data_parallel
from trainsched.sim.data_parallel import collective_startup_s

MB = 1_000_000
MS = 1e-3


def per_mb(size_bytes: int) -> float:
    """A wire of 1 GB/s without latency: 1 ms per MB."""
    return size_bytes / MB * MS


def replay(policy, gradients, ready_s, cost=per_mb, startup=0.0):
    return replay_fifo_wire(lambda wire: Dispatcher.for_policy(policy, gradients, wire),
                            ready_s, cost, startup)


def layers_of(records) -> list[int]:
    return [int(r.name[1:].split("/")[0]) for r in records]


# --- golden orders ---------------------------------------------------------------------------


def contrived():
    """ByteScheduler's contrived example, in 1 MB partitions on a 1 ms-per-MB wire: layer 2
    (3 partitions) is ready first, at 0 ms; layer 1 (6 partitions) at 1.5 ms; layer 0 (3
    partitions) at 3.5 ms."""
    gradients = [Gradient(name="g2", size_bytes=3 * MB, layer_index=2, ready_index=0),
                 Gradient(name="g1", size_bytes=6 * MB, layer_index=1, ready_index=1),
                 Gradient(name="g0", size_bytes=3 * MB, layer_index=0, ready_index=2)]
    ready_s = {"g2": 0.0, "g1": 1.5 * MS, "g0": 3.5 * MS}
    return gradients, ready_s


def test_golden_order_of_the_contrived_example():
    gradients, ready_s = contrived()
    golden = [2, 2, 1, 1, 0, 0, 0, 1, 1, 1, 1, 2]
    for policy in (PriorityPolicy(partition_bytes=MB),  # one at a time
                   PriorityPolicy(partition_bytes=MB, credit_bytes=MB),  # strict, 1 partition
                   PriorityPolicy(partition_bytes=MB, credit_bytes=MB // 2,
                                  credit_mode="overdraft"),
                   comm_policy("p3", partition_bytes=MB)):  # P3: slices, one in flight
        records, peak = replay(policy, gradients, ready_s)
        assert layers_of(records) == golden, policy
        assert [r.name for r in records][:4] == ["g2/0", "g2/1", "g1/0", "g1/1"]
        assert peak == MB
    # Whole tensors in FIFO order: 2, 1, 0, and layer 0 ends last (12 ms instead of 7 ms).
    fifo, _ = replay(FifoPolicy(), gradients, ready_s)
    assert layers_of(fifo) == [2, 1, 0]
    prio, _ = replay(PriorityPolicy(partition_bytes=MB), gradients, ready_s)
    end = {r.name: r.end_s for r in prio}
    assert math.isclose(end["g0/2"], 7 * MS) and math.isclose(fifo[-1].end_s, 12 * MS)


def test_unlimited_credit_is_ready_order():
    rng = random.Random(3)
    for _ in range(20):
        n = rng.randrange(2, 9)
        layers = rng.sample(range(n), n)
        gradients = [Gradient(name=f"g{layer}", size_bytes=rng.randrange(1, 5 * MB),
                              layer_index=layer, ready_index=k)
                     for k, layer in enumerate(layers)]  # fmt: skip
        ready_s = {g.name: g.ready_index * rng.uniform(0.1, 3) * MS + k * 1e-9
                   for k, g in enumerate(gradients)}  # fmt: skip
        order = sorted(ready_s, key=ready_s.get)
        for policy in (PriorityPolicy(credit_bytes=math.inf),
                       PriorityPolicy(credit_bytes=math.inf, credit_mode="overdraft")):
            records, _ = replay(policy, gradients, ready_s)
            assert [r.name for r in records] == order
            assert all(r.dispatched_s == r.queued_s for r in records)
        fifo, _ = replay(FifoPolicy(), gradients, ready_s)
        assert [r.name for r in fifo] == order


def test_whole_tensors_one_at_a_time_is_tictac():
    """Whole tensors, one in flight: whenever the wire frees, the most urgent ready tensor."""
    gradients = [Gradient(name=f"g{k}", size_bytes=MB, layer_index=k, ready_index=3 - k)
                 for k in range(4)]  # fmt: skip
    ready_s = {"g3": 0.0, "g2": 0.2 * MS, "g1": 0.4 * MS, "g0": 0.6 * MS}
    for policy in (PriorityPolicy(), comm_policy("tictac")):
        records, _ = replay(policy, gradients, ready_s)
        assert [r.name for r in records] == ["g3", "g0", "g1", "g2"]


# --- credit ----------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["strict", "overdraft", "backfill"])
def test_credit_invariant_on_random_steps(mode):
    """Strict (also with backfill): bytes in flight <= credit, unless one collective is alone.
    Overdraft: < credit + the largest collective."""
    rng = random.Random({"strict": 11, "overdraft": 12, "backfill": 13}[mode])
    backfill = mode == "backfill"
    mode = "strict" if backfill else mode
    for _ in range(40):
        n = rng.randrange(1, 10)
        gradients = [Gradient(name=f"g{k}", size_bytes=rng.randrange(1, 6 * MB),
                              layer_index=n - 1 - k, ready_index=k) for k in range(n)]
        partition = rng.choice([None, MB // 2, MB, 3 * MB])
        credit = rng.choice([MB, 2 * MB, 5 * MB, 8 * MB])
        if mode == "strict" and partition is not None:
            credit = max(credit, partition)
        policy = PriorityPolicy(partition_bytes=partition, credit_bytes=credit, credit_mode=mode,
                                backfill=backfill)
        ready_s = {g.name: g.ready_index * rng.uniform(0, 2) * MS for g in gradients}
        largest = max(c.size_bytes for c in policy.plan(gradients))
        wire_log = []

        def factory(wire, policy=policy, gradients=gradients, wire_log=wire_log):
            d = Dispatcher.for_policy(policy, gradients, wire)
            original = wire.issue

            def issue(index):
                original(index)
                wire_log.append((d.in_flight_bytes, d.sizes[index]))
            wire.issue = issue
            return d

        records, peak = replay_fifo_wire(factory, ready_s, per_mb)
        assert len(records) == len(policy.plan(gradients))
        for in_flight, size in wire_log:
            if mode == "strict":
                assert in_flight <= credit or in_flight == size
            else:
                assert in_flight < credit + largest
        assert peak == max(f for f, _ in wire_log)


def test_backfill_lets_a_smaller_collective_use_the_credit_left():
    """Strict credit 3 MB. g2 (2 MB) is on the wire from 0 to 2 ms; g0 (2 MB, most urgent) and
    g1 (1 MB) are ready at 0.5 ms. g0 does not fit beside g2 (4 > 3 MB): without backfill
    nothing goes until g2 ends, then g0 and g1; with it g1 (3 MB in flight) goes at 0.5 ms,
    ahead of g0 on the FIFO wire: the credit is used, priority is given up (g0 ends at 5 ms
    instead of 4)."""
    gradients = [Gradient(name="g0", size_bytes=2 * MB, layer_index=0, ready_index=2),
                 Gradient(name="g1", size_bytes=MB, layer_index=1, ready_index=1),
                 Gradient(name="g2", size_bytes=2 * MB, layer_index=2, ready_index=0)]
    ready_s = {"g2": 0.0, "g1": 0.5 * MS, "g0": 0.5 * MS}
    exact, _ = replay(PriorityPolicy(credit_bytes=3 * MB), gradients, ready_s)
    assert [(r.name, r.dispatched_s / MS) for r in exact] == [
        ("g2", 0.0), ("g0", 2.0), ("g1", 2.0)]
    filled, peak = replay(PriorityPolicy(credit_bytes=3 * MB, backfill=True), gradients,
                          ready_s)
    assert [(r.name, r.dispatched_s / MS) for r in filled] == [
        ("g2", 0.0), ("g1", 0.5), ("g0", 2.0)]
    end = {r.name: r.end_s / MS for r in exact}, {r.name: r.end_s / MS for r in filled}
    assert end[0]["g0"] == 4.0 and end[1]["g0"] == 5.0 and peak == 3 * MB
    for bad in ({"credit_mode": "overdraft", "credit_bytes": 3 * MB}, {"credit_bytes": None},
                {"credit_bytes": math.inf}, {"credit_bytes": 3 * MB, "backfill": 1}):
        with pytest.raises(TrainschedError, match="backfill"):
            PriorityPolicy(**{"backfill": True, **bad})


def test_strict_credit_smaller_than_a_partition_is_rejected():
    with pytest.raises(TrainschedError, match="smaller than the partition size"):
        check_sizes(PriorityPolicy(partition_bytes=4 * MB, credit_bytes=MB))
    check_sizes(PriorityPolicy(partition_bytes=4 * MB, credit_bytes=MB, credit_mode="overdraft"))
    check_sizes(PriorityPolicy(partition_bytes=4 * MB, credit_bytes=4 * MB))
    check_sizes(FifoPolicy())


# --- following a leader ----------------------------------------------------------------------


class ListWire:
    def __init__(self) -> None:
        self.log: list[int] = []

    def issue(self, index: int) -> None:
        self.log.append(index)


def test_follower_issues_the_leaders_order_once_ready_and_under_credit():
    gradients = [Gradient(name=f"g{k}", size_bytes=2 * MB, layer_index=k, ready_index=2 - k)
                 for k in range(3)]  # fmt: skip
    policy = PriorityPolicy(partition_bytes=MB, credit_bytes=2 * MB)
    wire = ListWire()
    f = Dispatcher.for_policy(policy, gradients, wire, follow=True)
    names = [c.name for c in f.plan]
    # The leader decided g1/0 first, but g1 is not ready here yet: nothing goes.
    f.decide(names.index("g1/0"))
    f.decide(names.index("g2/0"))
    f.ready(["g2"])
    assert f.pump() == [] and wire.log == []
    f.ready(["g1"])
    assert [names[k] for k in f.pump()] == ["g1/0", "g2/0"]
    # Credit (2 MB strict) is full: the next decision waits for a completion.
    f.decide(names.index("g2/1"))
    assert f.pump() == []
    assert f.done(names.index("g1/0")) == ()
    assert [names[k] for k in f.pump()] == ["g2/1"]
    with pytest.raises(TrainschedError, match="plan has 6"):
        f.decide(6)


def test_leader_and_followers_agree_under_random_readiness():
    """A follower whose gradients become ready in another order still issues exactly the
    leader's sequence."""
    rng = random.Random(5)
    for _ in range(30):
        n = rng.randrange(2, 8)
        gradients = [Gradient(name=f"g{k}", size_bytes=rng.randrange(1, 4 * MB),
                              layer_index=k, ready_index=n - 1 - k) for k in range(n)]
        policy = PriorityPolicy(partition_bytes=MB, credit_bytes=rng.choice([MB, 3 * MB]),
                                credit_mode=rng.choice(["strict", "overdraft"]))
        lw, fw = ListWire(), ListWire()
        leader = Dispatcher.for_policy(policy, gradients, lw)
        follower = Dispatcher.for_policy(policy, gradients, fw, follow=True)
        lorder = [g.name for g in gradients][::-1]
        forder = rng.sample(lorder, len(lorder))
        done_l: list[int] = []
        while not (leader.finished and follower.finished):
            step = rng.random()
            if lorder and step < 0.3:
                leader.ready([lorder.pop(0)])
            elif forder and step < 0.6:
                follower.ready([forder.pop(0)])
            for k in leader.pump():
                follower.decide(k)
            follower.pump()
            # A collective completes once both ranks issued it.
            both = [k for k in lw.log if k in fw.log and k not in done_l]
            if both and rng.random() < 0.5:
                k = both[0]
                done_l.append(k)
                leader.done(k)
                follower.done(k)
        assert lw.log == fw.log == leader.issued == follower.issued


# --- agreement with the simulator ------------------------------------------------------------


def chain_graph(rng: random.Random, layers: int) -> Graph:
    ops = [Op(name=f"L{i}", compute_s=rng.uniform(0.1, 2) * MS,
              backward_input_s=rng.uniform(0.1, 2) * MS,
              backward_weight_s=rng.uniform(0.1, 2) * MS,
              param_bytes=rng.randrange(1, 4 * MB), output_bytes=4096, saved_bytes=4096,
              layer_index=i) for i in range(layers)]  # fmt: skip
    edges = [Edge(src=f"L{i}", dst=f"L{i + 1}", size_bytes=4096) for i in range(layers - 1)]
    return to_training(Graph(ops, edges), memory_bandwidth_bytes_per_s=60e9)


@pytest.mark.parametrize("overlap", [False, True])
def test_same_dispatch_order_and_times_as_the_simulator(overlap):
    """The dispatch core on the fake wire and the simulator's replay give the same collectives
    at the same times, with and without start-up overlap (the latency large enough here,
    0.5 ms per hop, that overlapping it changes the schedules)."""
    rng = random.Random(21)
    plain = dataclasses.replace(device_kind("V100"), compute_rate_with_comm=1.0,
                                device_cv=0.0)  # FIFO wire, no spread
    cluster = Cluster(name="t", device=plain, devices_per_node=2, num_nodes=1,
                      intra_node=Link(bandwidth_bytes_per_s=1e9,
                                      latency_s=500e-6 if overlap else 50e-6))
    startup = collective_startup_s(2, cluster) if overlap else 0.0
    changed = 0
    for _ in range(10):
        g = chain_graph(rng, rng.randrange(2, 9))
        gradients = graph_gradients(g)
        for policy in (FifoPolicy(), DdpBucketPolicy(first_bucket_bytes=MB, bucket_bytes=3 * MB,
                                                        bucket_copies=False),
                       PriorityPolicy(),
                       PriorityPolicy(partition_bytes=MB, credit_bytes=2 * MB),
                       PriorityPolicy(partition_bytes=MB // 2, credit_bytes=MB,
                                      credit_mode="overdraft"),
                       PriorityPolicy(credit_bytes=math.inf),
                       PriorityPolicy(partition_bytes=MB // 2, credit_bytes=3 * MB,
                                      backfill=True)):
            sim = simulate_data_parallel(g, cluster, ranks=2, policy=policy,
                                         startup_overlap=overlap)
            ready_s = {t.name.replace(":dW", ":grad"): t.end_s for t in sim.tasks
                       if t.category == "backward_weight"}  # fmt: skip
            records, _ = replay(policy, gradients, ready_s,
                                cost=lambda s: collective_s(s, 2, cluster), startup=startup)
            if overlap:
                plain = simulate_data_parallel(g, cluster, ranks=2, policy=policy)
                changed += plain.step_time_s != sim.step_time_s
            comm = sorted((t for t in sim.tasks if t.category == "comm"),
                          key=lambda t: (t.start_s, t.name))
            assert [r.name for r in records] == [t.name for t in comm], policy
            for r, t in zip(records, comm, strict=True):
                assert math.isclose(r.start_s, t.start_s, rel_tol=1e-9, abs_tol=1e-15)
                assert math.isclose(r.dispatched_s, t.args["dispatched_s"], rel_tol=1e-9,
                                    abs_tol=1e-15)
                assert math.isclose(r.queued_s, t.args["issued_s"], rel_tol=1e-9,
                                    abs_tol=1e-15)
    assert not overlap or changed > 0


# --- partitions and errors -------------------------------------------------------------------


def test_partition_spans_are_contiguous_byte_ranges():
    gradients = [Gradient(name="a", size_bytes=10, layer_index=0, ready_index=1),
                 Gradient(name="b", size_bytes=4, layer_index=1, ready_index=0)]
    plan = PriorityPolicy(partition_bytes=4).plan(gradients)
    spans = partition_spans(gradients, plan)
    assert spans == {"a/0": {"a": (0, 4)}, "a/1": {"a": (4, 8)}, "a/2": {"a": (8, 10)},
                     "b": {"b": (0, 4)}}
    buckets = DdpBucketPolicy(first_bucket_bytes=100, bucket_bytes=100).plan(gradients)
    assert partition_spans(gradients, buckets) == {"bucket0": {"b": (0, 4), "a": (0, 10)}}
    bad = (Collective(name="x", members=("a", "b"), size_bytes=5),
           Collective(name="y", members=("a",), size_bytes=5))
    with pytest.raises(TrainschedError, match="together with other gradients"):
        partition_spans(gradients, bad)
    short = (Collective(name="x", members=("a",), size_bytes=5),
             Collective(name="y", members=("a",), size_bytes=4),
             Collective(name="z", members=("b",), size_bytes=4))
    with pytest.raises(TrainschedError, match="add up to 9 B"):
        partition_spans(gradients, short)


def test_misuse_is_reported():
    gradients, _ = contrived()
    d = Dispatcher.for_policy(PriorityPolicy(), gradients, ListWire())
    with pytest.raises(TrainschedError, match="not in the plan"):
        d.ready(["nope"])
    d.ready(["g2"])
    with pytest.raises(TrainschedError, match="ready twice"):
        d.ready(["g2"])
    with pytest.raises(TrainschedError, match="was not in flight"):
        d.done(1)
    (k,) = d.pump()
    assert d.done(k) == ("g2",) and not d.finished
    d.ready(["g1", "g0"])
    while not d.finished:
        for k in d.pump():
            d.done(k)
    d.new_step()
    assert d.issued == [] and not d.finished and d.idle
    with pytest.raises(TrainschedError, match="queue must be"):
        Dispatcher((), queue="lifo", credit_bytes=None, credit_mode="strict",
                   ordered_issue=False, transport=ListWire())
