"""The issue order: how every rank comes to issue the collectives of a step in one order.

Every rank must issue collectives in one order, or gradients are silently summed with the
wrong partners. Three ways, behind one protocol, :class:`IssueOrder`:

- :class:`LeaderOrder` (``order="leader"``): rank 0 decides, publishing its k-th decision of
  step s as the store key ``<s>/<k>``; every other rank reads them in a thread of its own and
  its dispatch core follows that sequence (each collective once its gradients are ready
  locally and the credit gate lets it pass: it may delay, never reorder).
- :class:`StaticOrder` (``order="static"``, "simulate → compile → execute"): the order is
  compiled once per plan from the task table and rank 0's step-0 ready times by
  :func:`static_issue_order`, identically on every rank, and every rank (rank 0 too) follows
  it every step, with no store traffic per decision.
- :class:`LocalOrder` (``order="local"``): every rank decides alone. It exists to show the
  hazard, which :class:`VerifiedOrder` (``verify_order_every=N``) catches: before every N-th
  issue the ranks compare a digest of their issue sequences through the store.
"""

from __future__ import annotations

import hashlib
import json
import queue
import threading
from collections.abc import Sequence
from typing import Any, Protocol

from trainsched.comm.dispatch import Dispatcher, replay_fifo_wire
from trainsched.comm.policy import CommPolicy, Gradient, dispatches_in_plan_order
from trainsched.errors import TrainschedError
from trainsched.runtime.data_parallel.events import Decision, Failed, Inbox, TaskTable
from trainsched.runtime.data_parallel.group import Peers
from trainsched.runtime.data_parallel.layout import Layout
from trainsched.runtime.data_parallel.options import (
    STATIC_WIRE,
    DataParallelOptions,
    check_static_wire,
)

__all__ = ["IssueOrder", "LeaderOrder", "LocalOrder", "StaticOrder", "VerifiedOrder",
           "make_order", "static_issue_order"]


class IssueOrder(Protocol):
    """One rank's part in agreeing on the issue order (dispatcher thread, but ``close``)."""

    #: The dispatch core issues a sequence it is given (``Dispatcher(follow=True)``).
    follow: bool
    #: The compiled order of a step (plan positions); empty unless compiled.
    sequence: tuple[int, ...]

    def compile(self, table: TaskTable, layout: Layout) -> None:
        """A new plan (the first, or after a switch)."""

    def begin_step(self, step: int, count: int) -> tuple[int, ...]:
        """Step ``step`` of ``count`` collectives begins: the decisions known already."""

    def issued(self, step: int, position: int, collective: int, name: str) -> None:
        """This rank issues ``collective`` (called ``name``) as the ``position``-th of
        ``step``."""

    def close(self) -> None:
        """Stop any thread of this order (waits at most 0.1 s)."""


class _Unordered:
    """Nothing to agree on: the base of the orders below, each doing only its part."""

    follow = False
    sequence: tuple[int, ...] = ()

    def compile(self, table: TaskTable, layout: Layout) -> None:
        pass

    def begin_step(self, step: int, count: int) -> tuple[int, ...]:
        return ()

    def issued(self, step: int, position: int, collective: int, name: str) -> None:
        pass

    def close(self) -> None:
        pass


class LocalOrder(_Unordered):
    """Every rank decides alone (the hazard)."""


class StaticOrder(_Unordered):
    """Every rank follows the order compiled on ``wire`` (:func:`static_issue_order`)."""

    follow = True

    def __init__(self, wire: tuple[float, float]) -> None:
        self._wire = wire
        self.sequence = ()

    def compile(self, table: TaskTable, layout: Layout) -> None:
        names = static_issue_order(layout.policy, table.gradients, table.ready_s, self._wire)
        self.sequence = tuple(layout.position[name] for name in names)

    def begin_step(self, step: int, count: int) -> tuple[int, ...]:
        return self.sequence  # the whole step's sequence, known already


class LeaderOrder(_Unordered):
    """Rank 0 publishes its decisions through ``store`` (the dispatcher thread's client); the
    other ranks read them in a thread of their own and post them to ``inbox``.

    A plan that every rank dispatches in plan order by itself
    (:func:`~trainsched.comm.policy.dispatches_in_plan_order`: DDP-like ordered buckets, or a
    single collective) needs no decisions: while it runs, rank 0 publishes nothing, the other
    ranks read nothing and ``follow`` is ``False`` (no store traffic per collective)."""

    def __init__(self, peers: Peers, store: Any, inbox: Inbox) -> None:
        self._follower = peers.rank != 0
        self.follow = self._follower
        self._fixed = False  # the current plan dispatches in plan order on every rank
        self.sequence = ()
        self._peers = peers
        self._store = store
        self._publish = peers.rank == 0 and peers.world_size > 1
        self._inbox = inbox
        self._requests: queue.SimpleQueue[tuple[int, int] | None] = queue.SimpleQueue()
        self._closed = False
        self._reader: threading.Thread | None = None
        if self.follow:
            self._reader = threading.Thread(target=self._read, daemon=True,
                                            name="trainsched-decisions")
            self._reader.start()

    def compile(self, table: TaskTable, layout: Layout) -> None:
        self._fixed = dispatches_in_plan_order(layout.policy, layout.plan)
        self.follow = self._follower and not self._fixed

    def begin_step(self, step: int, count: int) -> tuple[int, ...]:
        if self.follow:
            self._requests.put((step, count))
        return ()

    def issued(self, step: int, position: int, collective: int, name: str) -> None:
        if self._publish and not self._fixed:
            self._store.set(f"{step}/{position}", str(collective))
            if step >= 2:
                self._store.delete_key(f"{step - 2}/{position}")

    def close(self) -> None:
        self._closed = True
        self._requests.put(None)
        if self._reader is not None:
            self._reader.join(0.1)  # may sit in a store read; it is a daemon thread

    def _read(self) -> None:
        """Follower: read rank 0's decisions of each step the dispatcher asks for."""
        store = self._peers.client()
        try:
            while True:
                item = self._requests.get()
                if item is None:
                    return
                step, count = item
                for k in range(count):
                    value = self._peers.get(store, f"{step}/{k}",
                                            f"rank 0's decision {k} of step {step}")
                    self._inbox.put(Decision(int(value)))
        except TrainschedError as exc:
            if not self._closed:
                self._inbox.put(Failed(exc))


class VerifiedOrder:
    """``inner``, with every rank's issue sequence compared through ``store`` before every
    ``every``-th issue; a difference raises, naming both ranks' collectives."""

    def __init__(self, inner: IssueOrder, peers: Peers, store: Any, every: int) -> None:
        self._inner = inner
        self._peers = peers
        self._store = store
        self._every = every
        self._digest = hashlib.sha1(b"trainsched")
        self._count = 0  # issues since the start
        self._checks = 0

    @property
    def follow(self) -> bool:
        return self._inner.follow

    @property
    def sequence(self) -> tuple[int, ...]:
        return self._inner.sequence

    def compile(self, table: TaskTable, layout: Layout) -> None:
        self._inner.compile(table, layout)

    def begin_step(self, step: int, count: int) -> tuple[int, ...]:
        return self._inner.begin_step(step, count)

    def close(self) -> None:
        self._inner.close()

    def issued(self, step: int, position: int, collective: int, name: str) -> None:
        self._inner.issued(step, position, collective, name)
        self._digest.update(name.encode() + b"\0")
        self._count += 1
        if self._count % self._every:
            return
        peers, store = self._peers, self._store
        mine = [self._digest.hexdigest(), name]
        key = f"order/{self._checks}"
        store.set(f"{key}/{peers.rank}", json.dumps(mine))
        for r in range(peers.world_size):
            if r == peers.rank:
                continue
            theirs = json.loads(peers.get(store, f"{key}/{r}",
                                          f"rank {r}'s order check {self._checks}"))
            if theirs != mine:
                raise TrainschedError(
                    f"collective order differs between ranks at issue {self._count} (step "
                    f"{step}): rank {peers.rank} issues {name!r}, rank {r} issues "
                    f"{theirs[1]!r} (or an earlier issue differed); the ranks would sum "
                    f"unrelated gradients. Use order='leader' or order='static'")
        if self._checks >= 2:
            store.delete_key(f"order/{self._checks - 2}/{peers.rank}")
        self._checks += 1


def make_order(options: DataParallelOptions, peers: Peers, store: Any,
               inbox: Inbox) -> IssueOrder:
    """The order ``options.order`` names, verified if ``options.verify_order_every``."""
    order: IssueOrder
    if options.order == "leader":
        order = LeaderOrder(peers, store, inbox)
    elif options.order == "static":
        order = StaticOrder(options.static_wire)
    else:
        order = LocalOrder()
    if options.verify_order_every:
        order = VerifiedOrder(order, peers, store, options.verify_order_every)
    return order


def static_issue_order(policy: CommPolicy, gradients: Sequence[Gradient],
                       ready_s: dict[str, float],
                       wire: tuple[float, float] = STATIC_WIRE) -> tuple[str, ...]:
    """The issue order ``order="static"`` compiles: ``policy``'s collectives of ``gradients``
    (names), in the order the dispatch core hands them to a fake FIFO wire on which gradient
    ``name`` becomes ready at ``ready_s[name]`` (seconds) and a collective of ``size`` bytes
    takes ``alpha_s + size / bytes_per_s`` (``wire = (alpha_s, bytes_per_s)``).

    This is :func:`~trainsched.comm.dispatch.replay_fifo_wire`, the same replay the simulator
    is checked against, so the order is the one the policy would produce at those ready
    times: a collective that is ready while the wire is idle goes first even if a more urgent
    one follows shortly, and queued collectives leave by priority (and credit). A pure
    function of its arguments: every rank that calls it with the same task table and times
    gets the same order."""
    alpha_s, bytes_per_s = check_static_wire(wire)
    records, _ = replay_fifo_wire(
        lambda transport: Dispatcher.for_policy(policy, gradients, transport, follow=False),
        ready_s, lambda size: alpha_s + size / bytes_per_s)
    order = tuple(r.name for r in records)
    assert len(set(order)) == len(order), "the fake wire ran a collective twice"
    return order
