"""DDP's buckets crossing the barrier (``buckets``, :class:`ReadyBucketPolicy`): its buckets
worked out by hand, its dispatch order (the plan's, on every rank, whatever the ready times),
the simulator and ``auto`` considering it, and on real gloo ranks the parameters and momentum
DDP reaches, with no per-collective store traffic and one optimizer step per bucket."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainsched.comm import (
    ByteSchedulerPolicy,
    Collective,
    DdpBucketPolicy,
    FifoPolicy,
    Gradient,
    PriorityPolicy,
    ReadyBucketPolicy,
    comm_policy,
    dispatches_in_plan_order,
)
from trainsched.comm.dispatch import replay_fifo_wire
from trainsched.errors import TrainschedError

KiB = 1 << 10
MiB = 1 << 20


def grad(name: str, size: int, layer: int, ready: int) -> Gradient:
    return Gradient(name=name, size_bytes=size, layer_index=layer, ready_index=ready)


#: Five gradients whose ready order is not reverse layer order (e is ready last but is the
#: layer nearest the output): 600 KiB, 600 KiB, 10 MiB, 20 MiB, 1 MiB in ready order.
GRADS = (grad("e", 1 * MiB, 4, 4), grad("a", 600 * KiB, 3, 0), grad("b", 600 * KiB, 0, 1),
         grad("c", 10 * MiB, 2, 2), grad("d", 20 * MiB, 1, 3))


def test_buckets_follow_ready_order_with_ddps_limits():
    # First bucket closes at >= 1 MiB: a + b = 1200 KiB. The next at >= 25 MiB: c + d =
    # 30 MiB (the last member may overshoot the cap). e is left alone in the last one.
    assert ReadyBucketPolicy().plan(GRADS) == (
        Collective(name="bucket0", members=("a", "b"), size_bytes=1200 * KiB, priority=0),
        Collective(name="bucket1", members=("c", "d"), size_bytes=30 * MiB, priority=1),
        Collective(name="bucket2", members=("e",), size_bytes=1 * MiB, priority=4))


def test_a_smaller_cap_closes_buckets_earlier():
    # 600 KiB >= 512 KiB closes bucket0 at a; then b + c = 10.6 MiB >= 8 MiB; d; e.
    plan = ReadyBucketPolicy(first_bucket_bytes=512 * KiB, bucket_bytes=8 * MiB).plan(GRADS)
    assert [c.members for c in plan] == [("a",), ("b", "c"), ("d",), ("e",)]


def test_the_buckets_are_ddps_ready_order_buckets():
    assert ReadyBucketPolicy().plan(GRADS) == DdpBucketPolicy().plan(GRADS)


def test_it_crosses_the_barrier_with_ordered_issue_and_no_credit_window():
    policy = comm_policy("buckets")
    assert policy == ReadyBucketPolicy()
    assert (policy.cross_barrier, policy.ordered_issue, policy.queue) == (True, True, "fifo")
    assert policy.credit_bytes == math.inf


@pytest.mark.parametrize("field", ["bucket_bytes", "first_bucket_bytes"])
def test_bucket_sizes_must_be_positive(field):
    with pytest.raises(TrainschedError, match=f"buckets policy: {field} must be a positive"):
        ReadyBucketPolicy(**{field: 0})


@pytest.mark.parametrize(("policy", "expected"), [
    (ReadyBucketPolicy(first_bucket_bytes=KiB, bucket_bytes=KiB), True),
    (DdpBucketPolicy(first_bucket_bytes=KiB, bucket_bytes=KiB), True),
    (FifoPolicy(), False),                 # issued on ready: ready times set the order
    (PriorityPolicy(), False),             # a priority queue reorders
    (ByteSchedulerPolicy(partition_bytes=KiB, fusion_bytes=0), False),
])
def test_which_plans_dispatch_in_plan_order(policy, expected):
    plan = policy.plan(GRADS)
    assert len(plan) > 1
    assert dispatches_in_plan_order(policy, plan) is expected


def test_a_plan_of_one_collective_is_in_plan_order_under_any_policy():
    one = (grad("a", 4, 0, 0),)
    for policy in (FifoPolicy(), PriorityPolicy(), ByteSchedulerPolicy()):
        assert dispatches_in_plan_order(policy, policy.plan(one))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 5), min_size=5, max_size=5),
       st.lists(st.integers(1, 40), min_size=5, max_size=5))
def test_dispatch_order_is_the_plan_order_whatever_the_ready_times(times, sizes_kib):
    gradients = tuple(grad(f"g{k}", s * KiB, 4 - k, k) for k, s in enumerate(sizes_kib))
    policy = ReadyBucketPolicy(first_bucket_bytes=8 * KiB, bucket_bytes=16 * KiB)
    ready = {g.name: float(t) for g, t in zip(gradients, times, strict=True)}
    from trainsched.comm.dispatch import Dispatcher

    records, _ = replay_fifo_wire(
        lambda wire: Dispatcher.for_policy(policy, gradients, wire), ready, lambda b: 1e-3)
    assert [r.name for r in records] == [c.name for c in policy.plan(gradients)]


# --- the simulator and auto ------------------------------------------------------------------


def test_compare_and_auto_consider_the_buckets():
    from trainsched.strategies import strategies

    names = list(strategies())
    assert "data-buckets" in names and "data-buckets+ooo" in names


def test_simulated_buckets_by_hand():
    """The three layers of ``test_sim_data_parallel``: gradients g2 = g1 = 0.6 MB ready at 5
    and 7 ms, g0 = 2 MB at 8 ms; a collective costs 0.1 ms + S/(1 GB/s). bucket0 = {g2, g1}
    (1.2 MB >= 1 MiB) runs 7-8.3 ms, bucket1 = {g0} waits for the wire, 8.3-10.4 ms. Crossing
    the barrier, L1's and L2's SGD steps (0.3 ms each) run once bucket0 is done and the
    stream is free (8.3 ms), L0's (1 ms) after bucket1: the step ends at 11.4 ms, where DDP's
    barrier (no bucket copies) ends it at 12.0 ms."""
    from test_sim_data_parallel import MS, close, make_cluster, spans_close, three_layers
    from trainsched.sim import simulate_data_parallel

    g = three_layers(2_000_000, 600_000, 600_000)
    result = simulate_data_parallel(g, make_cluster(), ranks=2,
                                    policy=ReadyBucketPolicy(bucket_copies=False))
    spans_close(result, {"bucket0": (7, 8.3), "bucket1": (8.3, 10.4), "L1:opt": (8.3, 8.6),
                         "L2:opt": (8.6, 8.9), "L0:opt": (10.4, 11.4)})
    assert close(result.step_time_s, 11.4 * MS)
    assert not any(t.category == "comm-copy" for t in result.tasks)


def test_packing_and_dividing_a_bucket_are_charged_as_ddps_copies():
    """By default each bucket costs two passes over its bytes on the compute stream (the
    runtime packs it, and divides it after the all-reduce): for bucket0, 2 x 1.2 MB (read
    and write) at the V100's memory bandwidth, each way; as many as DDP's copy in and back."""
    from test_sim_data_parallel import make_cluster, three_layers
    from trainsched.sim import simulate_data_parallel

    g = three_layers(2_000_000, 600_000, 600_000)
    cluster = make_cluster()
    copies = {}
    for policy in (ReadyBucketPolicy(), DdpBucketPolicy()):
        result = simulate_data_parallel(g, cluster, ranks=2, policy=policy)
        copies[type(policy).__name__] = sorted(
            (t.name, round(t.end_s - t.start_s, 15)) for t in result.tasks
            if t.category == "comm-copy" and t.device == "gpu0")
    per_pass = 2 * 1_200_000 / cluster.device.memory_bandwidth_bytes_per_s
    assert copies["ReadyBucketPolicy"] == copies["DdpBucketPolicy"]
    assert ("bucket0 copy-in", round(per_pass, 15)) in copies["ReadyBucketPolicy"]
    assert len(copies["ReadyBucketPolicy"]) == 4          # in and back, for each bucket


def data_plan(comm: str, **kw):
    from trainsched.plan import DataParallelPlan, ModelRef

    return DataParallelPlan(model=ModelRef(name="mlp", fingerprint="f", forward_ops=3,
                                           batch_size=8), ranks=2, comm=comm,
                            policy=comm_policy(comm), **kw)


def test_a_buckets_plan_runs_on_the_scheduler_and_a_ddp_plan_on_stock_ddp():
    from trainsched.runtime.run import data_parallel_segment

    buckets = data_parallel_segment(data_plan("buckets"), label="auto", steps=4, warmup=1)
    assert (buckets.kind, buckets.label, buckets.steps, buckets.warmup) == ("sdp", "auto", 4, 1)
    assert buckets.policy_class == "trainsched.comm.policy:ReadyBucketPolicy"
    assert buckets.policy_object() == ReadyBucketPolicy()
    ddp = data_parallel_segment(data_plan("ddp"), label="x", steps=4, warmup=1)
    assert (ddp.kind, ddp.bucket_mb) == ("ddp", 25.0)
    with pytest.raises(TrainschedError, match="cannot run this plan: sync policy"):
        data_parallel_segment(data_plan("buckets", sync="asp"), label="x", steps=1, warmup=0)


# --- real gloo ranks -------------------------------------------------------------------------

pytest.importorskip("torch")


@pytest.mark.timeout(200)
def test_on_gloo_it_equals_ddp_in_bucket_order_without_store_traffic(tmp_path):
    from test_comm_runtime import run_job

    results = run_job(tmp_path, "buckets", steps=5, limit_s=180)
    for rank, r in enumerate(results):
        for opt, diff in r["vs_ddp"].items():
            assert diff <= 1e-6, (rank, opt, diff)
        for opt, seen in r["inspect"].items():
            issued = [entry["issued"] for entry in seen["issues"]]
            assert len(issued) == 5
            plan = issued[0]
            assert plan == [f"bucket{i}" for i in range(len(plan))] and len(plan) > 1
            assert all(step == plan for step in issued), (rank, opt, issued)
            assert seen["decision_keys"] == [], (rank, opt)   # rank 0 published nothing
        # Every bucket of two or more parameters is stepped by one optimizer (>= 2 of the 3
        # or 4 buckets, whichever of fc2's two gradients is ready first), and the parameters'
        # own optimizers still hold the momentum DDP's optimizer holds.
        assert r["groups"] >= 2
        assert r["momentum_vs_ddp"] <= 1e-6, (rank, r["momentum_vs_ddp"])
