"""The dW queue: the pure order rules of ``backprop/deferral`` and the runtime queue that holds
closures (run order, end of backward, drain, storage-deduplicated held bytes)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from trainsched.backprop.deferral import (
    DEFERRAL_ORDERS,
    PendingW,
    deferral_order,
    fifo,
    held_bytes,
    memory_capped,
    priority,
    reverse_first_k,
    standard,
)
from trainsched.errors import TrainschedError
from trainsched.runtime.split import WGradQueue, storage_sizes


def entry(layer: int, seq: int, microbatch: int = 0, storages=()) -> PendingW:
    return PendingW(layer=layer, microbatch=microbatch, seq=seq, storages=tuple(storages))


# -- the pure rules ----------------------------------------------------------------------------


def test_held_bytes_counts_a_storage_shared_by_two_entries_once():
    a = entry(0, 0, storages=[(1, 100), (2, 40)])
    b = entry(1, 1, storages=[(2, 40), (3, 8)])
    assert held_bytes([a, b]) == 148  # 100 + 40 + 8: storage 2 once
    assert a.size_bytes == 140


def test_standard_runs_the_newest_entry_at_once():
    pending = [entry(3, 0)]
    assert standard().run_now(pending) == (0,)
    assert standard().at_backward_end(pending) == ()


def test_reverse_first_k_runs_layers_from_k_at_once_and_the_rest_at_the_end_in_forward_order():
    order = reverse_first_k(2)
    # backward order: layer 3 and 2 arrive and run at once; 1 and 0 wait
    assert order.run_now([entry(3, 0)]) == (0,)
    assert order.run_now([entry(1, 0)]) == ()
    waiting = [entry(1, 0), entry(0, 1)]
    assert order.run_now(waiting) == ()
    assert order.at_backward_end(waiting) == (1, 0)  # layer 0 first


def test_reverse_first_k_orders_micro_batches_of_a_layer_together():
    waiting = [entry(1, 0, 0), entry(0, 1, 0), entry(1, 2, 1), entry(0, 3, 1)]
    assert reverse_first_k(2).at_backward_end(waiting) == (1, 3, 0, 2)


def test_fifo_waits_for_drain_and_runs_in_arrival_order():
    waiting = [entry(2, 5), entry(0, 6), entry(1, 7)]
    assert fifo().run_now(waiting) == ()
    assert fifo().at_backward_end(waiting) == ()
    assert fifo().drain(waiting) == (0, 1, 2)


def test_priority_drains_by_key_ties_by_arrival():
    waiting = [entry(2, 0), entry(0, 1), entry(2, 2), entry(1, 3)]
    assert priority().drain(waiting) == (1, 3, 0, 2)
    assert priority(lambda e: -e.layer).drain(waiting) == (0, 2, 3, 1)


def test_memory_capped_runs_the_oldest_until_the_rest_fits():
    waiting = [entry(2, 0, storages=[(1, 60)]), entry(1, 1, storages=[(2, 50)]),
               entry(0, 2, storages=[(3, 30)])]
    assert memory_capped(100).run_now(waiting) == (0,)  # 140 > 100; without the oldest: 80
    assert memory_capped(140).run_now(waiting) == ()
    assert memory_capped(20).run_now(waiting) == (0, 1, 2)


def test_orders_are_registered_by_name_and_bad_parameters_are_refused():
    assert list(DEFERRAL_ORDERS) == ["standard", "reverse_first_k", "fifo", "priority",
                                     "memory_capped", "slotted"]
    assert deferral_order("reverse_first_k", k=3).drain([entry(1, 0), entry(0, 1)]) == (1, 0)
    with pytest.raises(TrainschedError, match="k must be an integer >= 0"):
        reverse_first_k(-1)
    with pytest.raises(TrainschedError, match="unknown dW order 'lifo'"):
        deferral_order("lifo")
    with pytest.raises(TrainschedError, match="dW order 'fifo'"):
        deferral_order("fifo", k=2)


# -- the queue -----------------------------------------------------------------------------------


def fresh(n: int) -> torch.Tensor:
    return torch.zeros(n, dtype=torch.float64)


def test_storage_sizes_counts_views_as_their_whole_storage_and_leaves_parameters_out():
    base = fresh(10)  # 80 bytes
    param = nn.Parameter(fresh(4))
    other = fresh(3)  # 24 bytes
    sizes = storage_sizes([base[2:5], base.view(2, 5), param, other], exclude=[param])
    assert sorted(size for _, size in sizes) == [24, 80]


def test_queue_runs_in_drain_order_and_holds_bytes_until_then():
    ran = []
    queue = WGradQueue(fifo())
    shared = fresh(8)  # 64 bytes, read by two entries
    for layer, own in ((2, fresh(2)), (1, fresh(4))):  # 16 and 32 bytes
        queue.push(layer=layer, microbatch=0, params=[], tensors=(shared, own),
                   run=lambda layer=layer: ran.append(layer), in_backward=False)
    assert ran == []
    assert queue.held_bytes == 64 + 16 + 32
    assert queue.peak_held_bytes == 112
    queue.drain()
    assert ran == [2, 1]
    assert queue.held_bytes == 0 and len(queue) == 0


def test_queue_accumulates_micro_batches_into_grad_with_their_tags():
    p = nn.Parameter(torch.zeros(2, dtype=torch.float64))
    queue = WGradQueue(fifo())
    key = object()
    tags = [queue.forward_call(key) for _ in range(3)]
    assert tags == [(0, 0), (0, 1), (0, 2)]
    for (layer, mb), value in zip(tags, (1.0, 2.0, 4.0), strict=True):
        queue.push(layer=layer, microbatch=mb, params=[("p", p)], tensors=(),
                   in_backward=False,
                   run=lambda value=value: p.grad.add_(value) if p.grad is not None
                   else setattr(p, "grad", torch.full((2,), value, dtype=torch.float64)))
    assert [e.microbatch for e in queue.pending] == [0, 1, 2]
    queue.drain()
    assert p.grad.tolist() == [7.0, 7.0]
    assert queue.forward_call(key) == (0, 0)  # micro-batches count again after a drain


def test_discard_drops_waiting_entries_without_running_them():
    ran = []
    queue = WGradQueue(fifo())
    queue.push(layer=0, microbatch=0, params=[], tensors=(fresh(2),),
               run=lambda: ran.append(0), in_backward=False)
    queue.discard()
    queue.drain()
    assert ran == [] and queue.held_bytes == 0
