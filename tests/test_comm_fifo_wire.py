"""The simulated transport (FifoWire) and the dispatcher's clocked ready(): hand-worked cases."""

from __future__ import annotations

from trainsched.comm import FifoPolicy, Gradient
from trainsched.comm.dispatch import Dispatcher, FifoWire
from trainsched.comm.policy import Collective


def test_the_wire_runs_collectives_one_at_a_time_in_dispatch_order():
    wire = FifoWire([2.0, 1.0, 3.0].__getitem__)
    wire.issue(1)
    wire.issue(0)
    assert (wire.start_s, wire.end_s) == ({1: 0.0, 0: 1.0}, {1: 1.0, 0: 3.0})
    assert wire.behind == {1: -1, 0: 1}  # 0 waited for 1 on the wire
    assert wire.busy_s == {1: 1.0, 0: 2.0}


def test_a_collective_dispatched_to_an_idle_wire_starts_on_dispatch():
    wire = FifoWire([2.0, 1.0].__getitem__)
    wire.issue(0)
    wire.now = 5.0
    wire.issue(1)
    assert (wire.dispatched_s[1], wire.start_s[1], wire.behind[1]) == (5.0, 5.0, -1)


def test_start_up_overlaps_the_transfer_ahead_and_is_capped_at_the_cost():
    # 0 runs on [0, 2]; 1 (start-up 0.5 of 1.5) starts at 1.5, so it adds 1.0 of busy time;
    # 2 asks for a start-up of 9 but costs 0.25: it starts 0.25 before 1 ends, adding nothing.
    wire = FifoWire([2.0, 1.5, 0.25].__getitem__, [0.5, 0.5, 9.0].__getitem__)
    for k in range(3):
        wire.issue(k)
    assert wire.start_s == {0: 0.0, 1: 1.5, 2: 2.75}
    assert wire.busy_s == {0: 2.0, 1: 1.0, 2: 0.0}


class ListWire:
    def __init__(self) -> None:
        self.log: list[int] = []

    def issue(self, index: int) -> None:
        self.log.append(index)


def two_gradients(wire: ListWire) -> Dispatcher:
    """FIFO, one collective in flight: g0 (plan position 0) and g1 (position 1)."""
    gradients = [Gradient(name=f"g{k}", size_bytes=10, layer_index=k, ready_index=k)
                 for k in range(2)]  # fmt: skip
    return Dispatcher.for_policy(FifoPolicy(), gradients, wire)


def test_ready_at_one_time_ties_and_leaves_in_plan_order():
    wire = ListWire()
    d = two_gradients(wire)
    d.ready(["g1"], at=1.0)
    d.ready(["g0"], at=1.0)
    d.pump()
    assert wire.log == [0]


def test_ready_without_a_time_orders_by_call():
    wire = ListWire()
    d = two_gradients(wire)
    d.ready(["g1"])
    d.ready(["g0"])
    d.pump()
    assert wire.log == [1]


def test_ready_returns_what_it_queued_with_ordered_issue():
    plan = [Collective(name=f"b{k}", members=(f"g{k}",), size_bytes=1) for k in range(3)]
    d = Dispatcher(plan, queue="fifo", credit_bytes=None, credit_mode="strict",
                   ordered_issue=True, transport=ListWire())
    assert d.ready(["g1"]) == []  # b1 waits for b0's issue
    assert d.ready(["g2", "g0"]) == [0, 1, 2]
