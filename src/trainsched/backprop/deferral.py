"""When deferred weight-gradient work (dW) runs: the orders of the dW queue.

A split backward (``trainsched.runtime.split``) computes each layer's input gradient (dX) at
once and hands its weight gradient (dW) to a queue as a closure. This module holds the pure
rules (no torch) that say which queued dW runs when; the queue that holds the closures and
tensors lives in the runtime. An entry is described by :class:`PendingW`: its layer (forward
order), micro-batch, arrival number and the storages it keeps alive.

An order answers three questions (:class:`DeferralOrder`):

- ``run_now``: an entry was just queued (during backward); which pending entries run now?
- ``at_backward_end``: the backward pass ended (after the last dX); which run now?
- ``drain``: everything left, in which order? (``drain()`` before eval, checkpoint, end.)

The orders (:data:`DEFERRAL_ORDERS`), each a factory returning an order:

- ``standard``: in-order backprop, the baseline: each dW right after its dX (LIFO).
- ``reverse_first_k(k)``: layers >= k as ``standard``; the dW of layers < k run after the last
  dX in forward order (layer 0 first), so layer 0's gradient is ready as early as possible.
- ``fifo``: everything waits for ``drain``, then runs in arrival order (Zero Bubble, DualPipe).
- ``priority(key)``: everything waits for ``drain``, then runs by ``key(entry)`` (default: the
  layer), ties by arrival.
- ``memory_capped(cap_bytes)``: as ``fifo``, but whenever the bytes held exceed the cap the
  oldest entries run until they no longer do.
- ``slotted(deferred)``: the single-device slots (``specs/backprop.md`` §2a): layers in
  ``deferred`` (slot ``overlap_forward(j)``) wait past the end of the backward pass, into the
  next step, where the runtime runs them after layer j's forward; every other layer as
  ``standard`` (the runtime puts ``overlap_backward`` ones on a second stream).

Bytes held are storage-deduplicated (:func:`held_bytes`): tensors sharing a storage (an input
read by several layers, a view) count once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from trainsched.errors import TrainschedError
from trainsched.registry import Registry

__all__ = ["DEFERRAL_ORDERS", "DeferralOrder", "PendingW", "deferral_order", "fifo",
           "held_bytes", "memory_capped", "priority", "reverse_first_k", "slotted", "standard"]


@dataclass(frozen=True, kw_only=True)
class PendingW:
    """One queued dW: ``layer`` (index in forward order), ``microbatch`` (the layer's forward
    call since the last drain), ``seq`` (arrival number in the queue), ``params`` (names of
    the parameters it accumulates into) and ``storages``: ``(key, size_bytes)`` of every
    storage it keeps alive (parameters excluded; a key identifies one storage)."""

    layer: int
    microbatch: int
    seq: int
    params: tuple[str, ...] = ()
    storages: tuple[tuple[int, int], ...] = ()

    @property
    def size_bytes(self) -> int:
        """This entry's own bytes, its storages each counted once."""
        return held_bytes([self])


def held_bytes(pending: Iterable[PendingW]) -> int:
    """The bytes ``pending`` keeps alive: every storage once, however many entries hold it."""
    sizes: dict[int, int] = {}
    for entry in pending:
        for key, size in entry.storages:
            sizes[key] = size
    return sum(sizes.values())


class DeferralOrder(Protocol):
    """The rules of one order; indices are positions in ``pending`` (arrival order), returned
    in the order the entries are to run."""

    name: str

    def run_now(self, pending: Sequence[PendingW]) -> tuple[int, ...]:
        """An entry was just queued (the last of ``pending``): which run now."""
        ...

    def at_backward_end(self, pending: Sequence[PendingW]) -> tuple[int, ...]:
        """The backward pass ended: which run now."""
        ...

    def drain(self, pending: Sequence[PendingW]) -> tuple[int, ...]:
        """Everything left, in running order."""
        ...


def _by_arrival(pending: Sequence[PendingW]) -> tuple[int, ...]:
    return tuple(sorted(range(len(pending)), key=lambda i: pending[i].seq))


def _forward_order(pending: Sequence[PendingW], chosen: Iterable[int]) -> tuple[int, ...]:
    return tuple(sorted(chosen, key=lambda i: (pending[i].layer, pending[i].microbatch,
                                               pending[i].seq)))


@dataclass(frozen=True)
class _Standard:
    name: str = "standard"

    def run_now(self, pending: Sequence[PendingW]) -> tuple[int, ...]:
        return tuple(reversed(_by_arrival(pending)))  # LIFO: the newest first

    def at_backward_end(self, pending: Sequence[PendingW]) -> tuple[int, ...]:
        return ()

    def drain(self, pending: Sequence[PendingW]) -> tuple[int, ...]:
        return tuple(reversed(_by_arrival(pending)))


@dataclass(frozen=True)
class _ReverseFirstK:
    k: int
    name: str = "reverse_first_k"

    def run_now(self, pending: Sequence[PendingW]) -> tuple[int, ...]:
        late = [i for i in _by_arrival(pending) if pending[i].layer >= self.k]
        return tuple(reversed(late))

    def at_backward_end(self, pending: Sequence[PendingW]) -> tuple[int, ...]:
        return _forward_order(pending, range(len(pending)))

    def drain(self, pending: Sequence[PendingW]) -> tuple[int, ...]:
        return _forward_order(pending, range(len(pending)))


@dataclass(frozen=True)
class _Fifo:
    name: str = "fifo"

    def run_now(self, pending: Sequence[PendingW]) -> tuple[int, ...]:
        return ()

    def at_backward_end(self, pending: Sequence[PendingW]) -> tuple[int, ...]:
        return ()

    def drain(self, pending: Sequence[PendingW]) -> tuple[int, ...]:
        return _by_arrival(pending)


@dataclass(frozen=True)
class _Priority:
    key: Callable[[PendingW], Any]
    name: str = "priority"

    def run_now(self, pending: Sequence[PendingW]) -> tuple[int, ...]:
        return ()

    def at_backward_end(self, pending: Sequence[PendingW]) -> tuple[int, ...]:
        return ()

    def drain(self, pending: Sequence[PendingW]) -> tuple[int, ...]:
        return tuple(sorted(range(len(pending)),
                            key=lambda i: (self.key(pending[i]), pending[i].seq)))


@dataclass(frozen=True)
class _MemoryCapped:
    cap_bytes: int
    name: str = "memory_capped"

    def run_now(self, pending: Sequence[PendingW]) -> tuple[int, ...]:
        order = list(_by_arrival(pending))
        run: list[int] = []
        while order and held_bytes(pending[i] for i in order) > self.cap_bytes:
            run.append(order.pop(0))
        return tuple(run)

    def at_backward_end(self, pending: Sequence[PendingW]) -> tuple[int, ...]:
        return ()

    def drain(self, pending: Sequence[PendingW]) -> tuple[int, ...]:
        return _by_arrival(pending)


@dataclass(frozen=True)
class _Slotted:
    deferred: frozenset[int]
    name: str = "slotted"

    def run_now(self, pending: Sequence[PendingW]) -> tuple[int, ...]:
        now = [i for i in _by_arrival(pending) if pending[i].layer not in self.deferred]
        return tuple(reversed(now))

    def at_backward_end(self, pending: Sequence[PendingW]) -> tuple[int, ...]:
        return ()

    def drain(self, pending: Sequence[PendingW]) -> tuple[int, ...]:
        return _forward_order(pending, range(len(pending)))


def _count(name: str, value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise TrainschedError(f"{name} must be an integer >= 0, got {value!r}")
    return value


def standard() -> DeferralOrder:
    """In-order backprop: each dW right after its dX."""
    return _Standard()


def reverse_first_k(k: int) -> DeferralOrder:
    """The dW of layers < ``k`` after the last dX, in forward order; the rest in order."""
    return _ReverseFirstK(_count("k", k))


def fifo() -> DeferralOrder:
    """Every dW at ``drain``, in arrival order."""
    return _Fifo()


def priority(key: Callable[[PendingW], Any] | None = None) -> DeferralOrder:
    """Every dW at ``drain``, by ``key`` (default: the layer, the earliest first)."""
    if key is not None and not callable(key):
        raise TrainschedError(f"priority's key must be a function of a PendingW, got {key!r}")
    return _Priority(key if key is not None else (lambda entry: entry.layer))


def memory_capped(cap_bytes: int) -> DeferralOrder:
    """As ``fifo``, but the oldest dW run whenever more than ``cap_bytes`` are held."""
    return _MemoryCapped(_count("cap_bytes", cap_bytes))


def slotted(deferred: Iterable[int]) -> DeferralOrder:
    """Layers in ``deferred`` wait until the runtime or ``drain`` runs them (forward order
    at ``drain``); the rest as ``standard``."""
    layers = tuple(deferred)
    for layer in layers:
        _count("a deferred layer", layer)
    return _Slotted(frozenset(layers))


#: The dW orders by name: factories taking the order's parameters.
DEFERRAL_ORDERS: Registry[Callable[..., DeferralOrder]] = Registry("dW order", "dW orders")
DEFERRAL_ORDERS.register("standard", standard)
DEFERRAL_ORDERS.register("reverse_first_k", reverse_first_k)
DEFERRAL_ORDERS.register("fifo", fifo)
DEFERRAL_ORDERS.register("priority", priority)
DEFERRAL_ORDERS.register("memory_capped", memory_capped)
DEFERRAL_ORDERS.register("slotted", slotted)


def deferral_order(name: str, **params: Any) -> DeferralOrder:
    """The order registered as ``name`` built with ``params`` (``k=``, ``cap_bytes=``,
    ``key=``)."""
    factory = DEFERRAL_ORDERS.lookup(name)
    try:
        return factory(**params)
    except TypeError as exc:
        raise TrainschedError(f"dW order {name!r}: {exc}") from None
