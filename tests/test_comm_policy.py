"""Communication policies: gradients from a graph, FIFO, DDP buckets, priority, credit, registry."""

from __future__ import annotations

import math
import random

import pytest

from trainsched.comm import (
    COMM_POLICIES,
    P3_SLICE_BYTES,
    ByteSchedulerPolicy,
    Collective,
    CommPolicy,
    DdpBucketPolicy,
    FifoPolicy,
    Gradient,
    PriorityPolicy,
    check_plan,
    check_policy,
    comm_policy,
    graph_gradients,
    may_dispatch,
)
from trainsched.errors import TrainschedError
from trainsched.graph import Edge, Graph, Op, to_training

MiB = 1 << 20


def grads(*sizes: int, layers: list[int] | None = None) -> list[Gradient]:
    """Gradients ready in the order given; by default layer i is ready (len - 1 - i)-th, i.e.
    ``sizes`` lists the gradients in ready order, last layer first."""
    n = len(sizes)
    layers = layers if layers is not None else [n - 1 - k for k in range(n)]
    return [Gradient(name=f"g{layers[k]}", size_bytes=s, layer_index=layers[k], ready_index=k)
            for k, s in enumerate(sizes)]  # fmt: skip


def members(plan: tuple[Collective, ...]) -> list[tuple[str, ...]]:
    return [c.members for c in plan]


# --- values ----------------------------------------------------------------------------------


def test_gradient_and_collective_are_checked():
    with pytest.raises(TrainschedError, match="size_bytes"):
        Gradient(name="g", size_bytes=-1, layer_index=0, ready_index=0)
    with pytest.raises(TrainschedError, match="ready_index"):
        Gradient(name="g", size_bytes=1, layer_index=0, ready_index=1.5)
    with pytest.raises(TrainschedError, match="needs a name"):
        Gradient(name="", size_bytes=1, layer_index=0, ready_index=0)
    with pytest.raises(TrainschedError, match="non-empty tuple"):
        Collective(name="c", members=(), size_bytes=1)
    with pytest.raises(TrainschedError, match="twice"):
        Collective(name="c", members=("a", "a"), size_bytes=1)
    with pytest.raises(TrainschedError, match="priority"):
        Collective(name="c", members=("a",), size_bytes=1, priority=0.5)
    assert Collective(name="c", members=["a", "b"], size_bytes=2).members == ("a", "b")


def test_graph_gradients_in_ready_order():
    ops = [Op(name=f"L{i}", compute_s=1.0, param_bytes=100 * (i + 1), output_bytes=8,
              saved_bytes=8, layer_index=i) for i in range(3)]  # fmt: skip
    edges = [Edge(src="L0", dst="L1", size_bytes=8), Edge(src="L1", dst="L2", size_bytes=8)]
    train = to_training(Graph(ops, edges))
    got = graph_gradients(train)
    assert [(g.name, g.size_bytes, g.layer_index, g.ready_index) for g in got] == [
        ("L2:grad", 300, 2, 0), ("L1:grad", 200, 1, 1), ("L0:grad", 100, 0, 2)]
    # Another compute order gives another ready order; layers stay.
    order = list(train.topological_order())
    order.remove("L2:dW")
    order.insert(order.index("L0:dW") + 1, "L2:dW")
    assert [g.name for g in graph_gradients(train, order)] == ["L1:grad", "L0:grad", "L2:grad"]
    # Without layer indices the forward order stands in.
    bare = to_training(Graph([Op(name=op.name, compute_s=1.0, param_bytes=op.param_bytes,
                                 output_bytes=8, saved_bytes=8) for op in ops], edges))
    assert [(g.name, g.layer_index) for g in graph_gradients(bare)] == [
        ("L2:grad", 2), ("L1:grad", 1), ("L0:grad", 0)]


# --- FIFO --------------------------------------------------------------------------------------


def test_fifo_is_one_collective_per_gradient_in_ready_order():
    gs = grads(5, 7, 9)
    plan = FifoPolicy().plan(list(reversed(gs)))
    assert [(c.name, c.members, c.size_bytes, c.priority) for c in plan] == [
        ("g2", ("g2",), 5, 2), ("g1", ("g1",), 7, 1), ("g0", ("g0",), 9, 0)]
    policy = FifoPolicy()
    assert (policy.queue, policy.credit_bytes, policy.ordered_issue, policy.cross_barrier) == (
        "fifo", None, False, False)
    assert FifoPolicy(cross_barrier=True).cross_barrier


# --- DDP buckets ---------------------------------------------------------------------------


def test_ddp_first_bucket_closes_at_one_mib_including_the_crossing_gradient():
    gs = grads(600_000, 600_000, 2_000_000)
    plan = DdpBucketPolicy().plan(gs)
    assert [(c.name, c.members, c.size_bytes, c.priority) for c in plan] == [
        ("bucket0", ("g2", "g1"), 1_200_000, 1), ("bucket1", ("g0",), 2_000_000, 0)]
    # Without the small first bucket, everything fits one 25 MiB bucket.
    one = DdpBucketPolicy(first_bucket_bytes=25 * MiB).plan(gs)
    assert members(one) == [("g2", "g1", "g0")]
    assert DdpBucketPolicy().ordered_issue and DdpBucketPolicy().queue == "fifo"


def test_ddp_buckets_of_25_mib_after_the_first():
    gs = grads(*[10 * MiB] * 10)
    plan = DdpBucketPolicy().plan(gs)
    # 10 MiB >= 1 MiB closes the first bucket at once; then 10+10 < 25 <= 10+10+10.
    assert [len(c.members) for c in plan] == [1, 3, 3, 3]
    assert [c.size_bytes for c in plan] == [10 * MiB, 30 * MiB, 30 * MiB, 30 * MiB]
    assert [m for c in plan for m in c.members] == [g.name for g in gs]
    exact = DdpBucketPolicy(bucket_bytes=20 * MiB).plan(gs)  # reaching the cap closes too
    assert [len(c.members) for c in exact] == [1, 2, 2, 2, 2, 1]
    assert DdpBucketPolicy().plan([]) == ()


def test_ddp_order_ready_versus_reverse_layer():
    # Ready order differs from reverse layer order (a reordered backward): g0 ready first.
    gs = grads(MiB // 2, MiB // 2, MiB // 2, layers=[0, 2, 1])
    assert members(DdpBucketPolicy().plan(gs)) == [("g0", "g2"), ("g1",)]
    assert members(DdpBucketPolicy(order="reverse_layer").plan(gs)) == [("g2", "g1"), ("g0",)]
    with pytest.raises(TrainschedError, match="order must be one of ready, reverse_layer"):
        DdpBucketPolicy(order="forward")
    with pytest.raises(TrainschedError, match="bucket_bytes must be a positive integer"):
        DdpBucketPolicy(bucket_bytes=0)


# --- priority ----------------------------------------------------------------------------


def test_priority_plan_partitions_and_orders_by_layer():
    gs = grads(10, 4, 3)  # g2 (10 B) ready first, g0 last
    plan = PriorityPolicy(partition_bytes=4).plan(gs)
    assert [(c.name, c.size_bytes, c.priority) for c in plan] == [
        ("g0", 3, 0), ("g1", 4, 1), ("g2/0", 4, 2), ("g2/1", 4, 2), ("g2/2", 2, 2)]
    assert all(c.members == (c.name.split("/")[0],) for c in plan)
    whole = PriorityPolicy().plan(gs)
    assert [c.name for c in whole] == ["g0", "g1", "g2"]
    policy = PriorityPolicy(credit_bytes=8, credit_mode="overdraft")
    assert (policy.queue, policy.credit_bytes, policy.credit_mode, policy.ordered_issue) == (
        "priority", 8, "overdraft", False)
    assert PriorityPolicy(credit_bytes=math.inf).credit_bytes == math.inf
    for bad in ({"partition_bytes": 0}, {"credit_bytes": -1}, {"credit_bytes": 1.5},
                {"credit_mode": "loose"}):
        with pytest.raises(TrainschedError, match="priority policy"):
            PriorityPolicy(**bad)


def test_credit_rule():
    assert may_dispatch(0, 100, None)  # nothing in flight: always
    assert not may_dispatch(1, 1, None)  # no credit window: one at a time
    assert may_dispatch(0, 100, 10)  # larger than the credit, but alone
    assert may_dispatch(6, 4, 10) and not may_dispatch(6, 5, 10)  # strict
    assert may_dispatch(9, 50, 10, "overdraft") and not may_dispatch(10, 1, 10, "overdraft")
    assert may_dispatch(10**12, 10**12, math.inf)


# --- registry, protocol, plan checks ---------------------------------------------------------


def test_registry_and_lookup():
    assert list(COMM_POLICIES) == ["fifo", "ddp", "priority", "bytescheduler", "buckets",
                                   "tictac", "p3"]
    assert comm_policy("ddp") == DdpBucketPolicy()
    assert comm_policy(" FIFO ") == FifoPolicy()
    assert comm_policy("ddp", bucket_bytes=MiB).bucket_bytes == MiB
    with pytest.raises(TrainschedError, match="unknown comm policy 'horovod'; known policies: "
                                              "fifo, ddp, priority, bytescheduler, buckets, "
                                              "tictac, p3"):
        comm_policy("horovod")
    with pytest.raises(TrainschedError, match="comm policy 'fifo'"):
        comm_policy("fifo", bucket_bytes=1)
    for name in COMM_POLICIES:
        policy = comm_policy(name)
        assert isinstance(policy, CommPolicy)
        check_policy(policy)


def test_check_policy_and_plan():
    class NoQueue:
        queue = "lifo"
        credit_bytes = None
        credit_mode = "strict"
        ordered_issue = False
        cross_barrier = False

        def plan(self, gradients):
            return ()

    with pytest.raises(TrainschedError, match="queue must be one of fifo, priority"):
        check_policy(NoQueue())
    with pytest.raises(TrainschedError, match="needs queue"):
        check_policy(object())
    gs = grads(1, 2)
    c = Collective(name="x", members=("g1",), size_bytes=1)
    with pytest.raises(TrainschedError, match="no collective reduces gradient"):
        check_plan(gs, [c])
    with pytest.raises(TrainschedError, match="unknown gradient"):
        check_plan(gs, [Collective(name="x", members=("g9",), size_bytes=1)])
    with pytest.raises(TrainschedError, match="two collectives are called 'x'"):
        check_plan(gs, [c, Collective(name="x", members=("g0",), size_bytes=1)])
    check_plan(gs, [c, Collective(name="y", members=("g0", "g1"), size_bytes=3)])


def test_tictac_and_p3_are_named_priority_settings():
    tictac, p3 = comm_policy("tictac"), comm_policy("P3")
    assert tictac == PriorityPolicy(partition_bytes=None, credit_bytes=None, cross_barrier=True)
    assert p3 == PriorityPolicy(partition_bytes=P3_SLICE_BYTES, credit_bytes=None,
                                cross_barrier=True)
    assert comm_policy("p3", partition_bytes=4 * MiB).partition_bytes == 4 * MiB  # override
    gs = grads(3 * MiB, 100)  # g1 (ready first) 3 MiB, g0 100 bytes
    assert [c.name for c in tictac.plan(gs)] == ["g0", "g1"]  # whole, by layer
    assert [(c.name, c.size_bytes) for c in p3.plan(gs)] == [
        ("g0", 100), ("g1/0", MiB), ("g1/1", MiB), ("g1/2", MiB)]
    with pytest.raises(TrainschedError, match="comm policy 'tictac'"):
        comm_policy("tictac", fusion_bytes=1)


# --- bytescheduler ---------------------------------------------------------------------------


def test_bytescheduler_defaults_and_registry():
    policy = ByteSchedulerPolicy()
    assert (policy.partition_bytes, policy.credit_bytes, policy.credit_mode, policy.fusion_bytes,
            policy.cross_barrier) == (4 * MiB, 16 * MiB, "overdraft", MiB, True)
    assert (policy.queue, policy.ordered_issue) == ("priority", False)
    assert comm_policy("ByteScheduler") == policy
    assert comm_policy("bytescheduler", partition_bytes=MiB).partition_bytes == MiB
    check_policy(policy)


def test_bytescheduler_golden_plan_fuses_small_neighbours_and_splits_large_ones():
    # Ready order g5 ... g0 (backward); priority order g0 ... g5.
    gs = grads(5000, 40, 30, 10_000, 50, 100)  # g5=5000, g4=40, g3=30, g2=10000, g1=50, g0=100
    plan = ByteSchedulerPolicy(partition_bytes=4096, fusion_bytes=1000).plan(gs)
    assert [(c.name, c.members, c.size_bytes, c.priority) for c in plan] == [
        ("g0+1", ("g0", "g1"), 150, 0),  # fused, keyed by its most urgent member
        ("g2/0", ("g2",), 4096, 2), ("g2/1", ("g2",), 4096, 2), ("g2/2", ("g2",), 1808, 2),
        ("g3+1", ("g3", "g4"), 70, 3),
        ("g5/0", ("g5",), 4096, 5), ("g5/1", ("g5",), 904, 5)]
    check_plan(gs, plan)
    # A fused group never grows past a partition: 900 B tensors, 2000 B partitions.
    small = grads(*[900] * 5)
    plan = ByteSchedulerPolicy(partition_bytes=2000, fusion_bytes=1000).plan(small)
    assert [c.members for c in plan] == [("g0", "g1"), ("g2", "g3"), ("g4",)]
    assert [c.name for c in plan] == ["g0+1", "g2+1", "g4"]
    # A large tensor between two small ones breaks the run: no fusion across it.
    plan = ByteSchedulerPolicy(partition_bytes=2000, fusion_bytes=1000).plan(grads(10, 5000, 10))
    assert [c.name for c in plan] == ["g0", "g1/0", "g1/1", "g1/2", "g2"]
    # fusion_bytes=0 fuses nothing: the plan of PriorityPolicy with the same partitions.
    plain = ByteSchedulerPolicy(partition_bytes=4096, fusion_bytes=0).plan(gs)
    assert plain == PriorityPolicy(partition_bytes=4096).plan(gs)


def test_bytescheduler_plans_reduce_every_byte_once():
    rng = random.Random(3)
    for _ in range(200):
        n = rng.randrange(1, 30)
        sizes = [rng.choice([0, rng.randrange(1, 100), rng.randrange(100, 5000)])
                 for _ in range(n)]
        layers = rng.sample(range(n), n)  # any ready order
        gs = grads(*sizes, layers=layers)
        policy = ByteSchedulerPolicy(partition_bytes=rng.randrange(1, 3000),
                                     fusion_bytes=rng.randrange(0, 3000))
        plan = policy.plan(gs)
        check_plan(gs, plan)
        size = {g.name: g.size_bytes for g in gs}
        layer = {g.name: g.layer_index for g in gs}
        got = dict.fromkeys(size, 0)
        for c in plan:
            if len(c.members) > 1:  # fused: whole small tensors, within one partition
                assert all(size[m] < policy.fusion_bytes for m in c.members)
                assert c.size_bytes == sum(size[m] for m in c.members)
                assert c.priority == min(layer[m] for m in c.members)
            assert c.size_bytes <= policy.partition_bytes or size[c.members[0]] == 0
            for m in c.members:
                got[m] += c.size_bytes if len(c.members) == 1 else size[m]
        assert got == size
        # Plan order is priority order.
        assert [c.priority for c in plan] == sorted(c.priority for c in plan)


def test_bytescheduler_rejects_bad_settings():
    for bad, problem in (({"partition_bytes": 0}, "partition_bytes must be a positive"),
                         ({"fusion_bytes": -1}, "fusion_bytes must be an integer >= 0"),
                         ({"fusion_bytes": 1.5}, "fusion_bytes must be an integer >= 0"),
                         ({"credit_bytes": -1}, "credit_bytes must be None"),
                         ({"credit_mode": "loose"}, "credit_mode must be one of"),
                         ({"credit_bytes": MiB, "credit_mode": "strict"},
                          "with credit_mode .strict. the credit .1048576 bytes. must hold")):
        with pytest.raises(TrainschedError, match=f"bytescheduler policy: {problem}"):
            ByteSchedulerPolicy(**bad)
    ByteSchedulerPolicy(credit_bytes=MiB)  # overdraft: a credit below a partition is fine
    ByteSchedulerPolicy(credit_bytes=None, credit_mode="strict")
