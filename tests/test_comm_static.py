"""The static issue order (``order="static"``, ``specs/comm.md`` §6): what
:func:`~trainsched.runtime.data_parallel.static_issue_order` compiles from a task table and
ready times, on hand-made examples. The runtime side (every rank issues it) is in
``tests/test_comm_runtime.py``."""

from __future__ import annotations

import json

import pytest

from trainsched.comm import ByteSchedulerPolicy, DdpBucketPolicy, PriorityPolicy
from trainsched.comm.policy import Gradient
from trainsched.errors import TrainschedError
from trainsched.runtime.data_parallel import STATIC_WIRE, static_issue_order

KiB = 1024


def grads(*rows: tuple[str, int, int]) -> tuple[Gradient, ...]:
    """(name, size, layer) rows; the ready index is the row's position."""
    return tuple(Gradient(name=n, size_bytes=size, layer_index=layer, ready_index=i)
                 for i, (n, size, layer) in enumerate(rows))  # fmt: skip


def test_the_gradient_ready_first_goes_first_even_with_a_lower_priority():
    # "a" is layer 0 (more urgent), but "b" is ready 2 ms earlier on an idle wire.
    g = grads(("b", 4 * KiB, 1), ("a", 4 * KiB, 0))
    assert [c.name for c in PriorityPolicy().plan(g)] == ["a", "b"]  # priority order
    assert static_issue_order(PriorityPolicy(), g, {"b": 0.0, "a": 0.002}) == ("b", "a")
    # Ready together, priority decides.
    assert static_issue_order(PriorityPolicy(), g, {"b": 0.0, "a": 0.0}) == ("a", "b")


def test_collectives_queued_behind_a_running_one_leave_by_priority_and_the_wire_matters():
    g = grads(("c", 4 * KiB, 2), ("b", 4 * KiB, 1), ("a", 4 * KiB, 0))
    ready = {"c": 0.0, "b": 1e-4, "a": 2e-4}
    # α = 1 ms: "c" still runs when "b" and "a" arrive; "a" overtakes "b".
    assert static_issue_order(PriorityPolicy(), g, ready) == ("c", "a", "b")
    # A wire 1000x faster: each collective is done before the next gradient is ready.
    assert static_issue_order(PriorityPolicy(), g, ready, (1e-6, 1e12)) == ("c", "b", "a")


def test_partitions_under_a_strict_credit_let_an_urgent_gradient_in_between():
    # "big": 4 partitions of 1 KiB (layer 1) at t = 0; "small" (layer 0) at 1.5 ms. Credit
    # 2 KiB: big/0 and big/1 go at once, big/2 when big/0 ends (≈1.001 ms); at 1.5 ms two
    # partitions are in flight, so "small" waits for big/1 to end (≈2.002 ms) and then
    # overtakes big/3.
    g = grads(("big", 4 * KiB, 1), ("small", KiB, 0))
    policy = PriorityPolicy(partition_bytes=KiB, credit_bytes=2 * KiB, credit_mode="strict")
    assert static_issue_order(policy, g, {"big": 0.0, "small": 0.0015}) == (
        "big/0", "big/1", "big/2", "small", "big/3")


def test_ddp_buckets_keep_their_launch_order_whatever_the_ready_times():
    g = grads(("w3", 8 * KiB, 3), ("w2", 8 * KiB, 2), ("w1", 8 * KiB, 1), ("w0", 8 * KiB, 0))
    policy = DdpBucketPolicy(first_bucket_bytes=8 * KiB, bucket_bytes=16 * KiB)
    plan = [c.name for c in policy.plan(g)]
    ready = {"w3": 0.01, "w2": 0.0, "w1": 0.0, "w0": 0.0}  # the first bucket is ready last
    assert static_issue_order(policy, g, ready) == tuple(plan)


def test_the_order_is_deterministic_holds_every_collective_once_and_survives_json():
    rows = [(f"l{i}.w", (i % 5 + 1) * 3 * KiB, i) for i in range(12)]
    rows += [(f"l{i}.b", 256, i) for i in range(12)]
    g = grads(*rows)
    ready = {n: 1e-4 * (30 - k) + 1e-7 * k for k, (n, _, _) in enumerate(rows)}
    policy = ByteSchedulerPolicy(partition_bytes=4 * KiB, credit_bytes=8 * KiB,
                                 fusion_bytes=KiB)
    order = static_issue_order(policy, g, ready)
    assert sorted(order) == sorted(c.name for c in policy.plan(g))
    assert static_issue_order(policy, g, json.loads(json.dumps(ready))) == order
    assert static_issue_order(policy, g, dict(reversed(ready.items()))) == order


def test_bad_input_is_refused_with_a_message():
    g = grads(("a", KiB, 0), ("b", KiB, 1))
    with pytest.raises(TrainschedError, match="no ready time for gradient"):
        static_issue_order(PriorityPolicy(), g, {"a": 0.0})
    for wire in ((1e-3, 0), (-1.0, 1e9), (float("nan"), 1e9), (1e-3,), "fast"):
        with pytest.raises(TrainschedError, match=r"static_wire must be \(alpha_s, bytes_per_s\)"):
            static_issue_order(PriorityPolicy(), g, {"a": 0.0, "b": 0.0}, wire)
    assert STATIC_WIRE == (1e-3, 1e9)
