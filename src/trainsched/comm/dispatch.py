"""The dispatch core: a policy's collectives through ready → queue → credit → transport.

One :class:`Dispatcher` per rank and step holds the state of ``specs/comm.md`` §3 for the plan of
a :class:`~trainsched.comm.policy.CommPolicy` (its :class:`~trainsched.comm.policy.Collective`
list; a partition is a contiguous byte range of one gradient, :func:`partition_spans`):

- **pending**: a collective waits until each of its member gradients is ready (and, with the
  policy's ``ordered_issue``, until the collective before it in the plan was queued);
- **queued**: it waits in the queue, ordered by ``(priority, plan position)`` for a
  ``"priority"`` queue, by ``(queue stamp, plan position)`` for ``"fifo"`` (one stamp per
  :meth:`Dispatcher.ready` call: gradients reported together arrived together);
- **in flight**: :meth:`Dispatcher.pump` hands the head of the queue to the
  :class:`Transport` while :func:`~trainsched.comm.policy.may_dispatch` allows it (always when
  nothing is in flight; ``strict``: in flight + size ≤ credit; ``overdraft``: in flight <
  credit), adding its bytes to the bytes in flight;
- **done**: the transport reports completion with :meth:`Dispatcher.done`, which returns the
  bytes and says which gradients are now fully reduced.

So bytes in flight never exceed the credit in ``strict`` mode (or one collective larger than the
credit, alone), and stay below credit + the largest collective in ``overdraft`` mode; unlimited
credit (``math.inf``) hands each collective to the transport as soon as it is queued, so a FIFO
transport sees queue order.

**Following.** With ``follow=True`` the dispatcher does not choose: it issues the collectives a
leader decided (:meth:`Dispatcher.decide`), in the leader's order, each once it is queued locally
and passes the same credit gate. The gate can delay a decision, never reorder it. This is the
follower side of the runtime's leader-decides ordering (every rank must issue collectives in one
order, ``specs/comm.md`` §6).

**Transports.** The runtime's transport launches gloo collectives; :class:`FifoWire` is the
simulated one: one collective at a time in dispatch order, each for its cost, its start-up
latency optionally overlapping the transfer ahead of it; :class:`SharedWire` is the simulated
transport of a host or library that runs several collectives at once (gloo's worker threads):
up to ``slots`` in flight, the rest waiting in dispatch order, their durations left to the
simulator's rates (collectives in flight share the wire, compute and communication slow each
other: :mod:`trainsched.sim.coupling`). The simulator
(:mod:`trainsched.sim.data_parallel`) drives a :class:`Dispatcher` on a :class:`FifoWire` from
inside the engine (an engine gate, :mod:`trainsched.sim.dispatch_gate`), so this module is the
one place the dispatch rule is written. :func:`replay_fifo_wire` drives the same pair from a
table of gradient ready times (the runtime's ``order="static"`` and the tests use it).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from trainsched.comm.policy import (
    QUEUES,
    Collective,
    CommPolicy,
    Gradient,
    check_plan,
    check_policy,
    may_dispatch,
    take_dispatchable,
)
from trainsched.errors import TrainschedError

__all__ = [
    "Dispatcher",
    "FifoWire",
    "SharedWire",
    "Transport",
    "WireRecord",
    "check_sizes",
    "partition_spans",
    "replay_fifo_wire",
]


class Transport(Protocol):
    """Where dispatched collectives go: ``issue(index)`` starts the collective at that plan
    position (it must not block); the owner reports its end with :meth:`Dispatcher.done`."""

    def issue(self, index: int) -> None: ...


def check_sizes(policy: CommPolicy) -> None:
    """Reject partition and credit sizes that cannot work together: in ``strict`` mode a credit
    smaller than a partition could never admit a second partition, so it is almost surely a
    mistake (the spec calls it a configuration error)."""
    check_policy(policy)
    partition = getattr(policy, "partition_bytes", None)
    credit = policy.credit_bytes
    if (policy.credit_mode == "strict" and partition is not None and credit is not None
            and credit < partition):
        raise TrainschedError(
            f"credit {credit} B is smaller than the partition size {partition} B in strict "
            f"mode, so at most one partition could ever be in flight; use a credit of at least "
            f"one partition (ByteScheduler: about 4 partitions) or credit mode 'overdraft'")


def partition_spans(gradients: Sequence[Gradient],
                    plan: Sequence[Collective]) -> dict[str, dict[str, tuple[int, int]]]:
    """Collective name -> {member gradient -> (first byte, end byte)} of the part of that
    gradient the collective reduces. A member reduced by one collective is reduced whole; a
    gradient split over several collectives (``name/0``, ``name/1``, ...) is cut into
    contiguous ranges in plan order, each as long as its collective."""
    size = {g.name: g.size_bytes for g in gradients}
    holders: dict[str, list[Collective]] = {}
    for c in plan:
        for m in c.members:
            holders.setdefault(m, []).append(c)
    spans: dict[str, dict[str, tuple[int, int]]] = {c.name: {} for c in plan}
    for name, cs in holders.items():
        if len(cs) == 1:
            spans[cs[0].name][name] = (0, size[name])
            continue
        offset = 0
        for c in cs:
            if len(c.members) != 1:
                raise TrainschedError(f"collective {c.name!r} holds part of gradient {name!r} "
                                      f"together with other gradients; a split gradient's "
                                      f"parts must each be their own collective")
            spans[c.name][name] = (offset, offset + c.size_bytes)
            offset += c.size_bytes
        if offset != size[name]:
            raise TrainschedError(f"the collectives holding gradient {name!r} add up to "
                                  f"{offset} B, but it has {size[name]} B")
    return spans


class Dispatcher:
    """The ready → queue → credit → transport state machine of one rank for one step (module
    docstring). Not thread-safe: one thread (the runtime's dispatcher thread, or a simulation
    loop) calls every method. Call :meth:`new_step` before reusing it for the next step."""

    def __init__(self, plan: Sequence[Collective], *, queue: str, credit_bytes: float | None,
                 credit_mode: str, ordered_issue: bool, transport: Transport,
                 follow: bool = False, backfill: bool = False) -> None:
        if queue not in QUEUES:
            raise TrainschedError(f"queue must be one of {', '.join(QUEUES)}, got {queue!r}")
        self.plan = tuple(plan)
        self.queue = queue
        self.credit_bytes = credit_bytes
        self.credit_mode = credit_mode
        self.ordered_issue = ordered_issue
        self.follow = follow
        self.backfill = backfill
        self.transport = transport
        self.sizes = [c.size_bytes for c in self.plan]
        self.index = {c.name: k for k, c in enumerate(self.plan)}
        self._holders: dict[str, list[int]] = {}
        for k, c in enumerate(self.plan):
            for m in c.members:
                self._holders.setdefault(m, []).append(k)
        self.max_in_flight_bytes = 0.0
        self.new_step()

    @classmethod
    def for_policy(cls, policy: CommPolicy, gradients: Sequence[Gradient], transport: Transport,
                   *, follow: bool = False) -> Dispatcher:
        """A dispatcher for ``policy``'s plan of ``gradients``."""
        check_policy(policy)
        plan = tuple(policy.plan(gradients))
        check_plan(gradients, plan, f"comm policy {type(policy).__name__}")
        return cls(plan, queue=policy.queue, credit_bytes=policy.credit_bytes,
                   credit_mode=policy.credit_mode, ordered_issue=policy.ordered_issue,
                   transport=transport, follow=follow,
                   backfill=bool(getattr(policy, "backfill", False)))

    # -- state ---------------------------------------------------------------------------------

    def new_step(self) -> None:
        """Forget the last step (which must be finished) and wait for fresh gradients."""
        assert not getattr(self, "_in_flight", None), "new step with collectives in flight"
        self._pending = [len(c.members) + (1 if self.ordered_issue and k else 0)
                         for k, c in enumerate(self.plan)]  # fmt: skip
        self._left = {m: len(hs) for m, hs in self._holders.items()}
        self._ready_seen: set[str] = set()
        self._waiting: list[tuple[float, int]] = []  # leader: (key, plan position)
        self._queued: set[int] = set()  # follower: queued, not yet issued
        self._decisions: deque[int] = deque()
        self._in_flight: set[int] = set()
        self.in_flight_bytes = 0.0
        self._stamp = 0
        self.issued: list[int] = []  # plan positions, in issue order
        self.done_count = 0

    @property
    def finished(self) -> bool:
        """Every collective of the step is done."""
        return self.done_count == len(self.plan)

    @property
    def idle(self) -> bool:
        """Nothing in flight and nothing queued that could be issued."""
        return not self._in_flight and not self._waiting and not (
            self._decisions and self._decisions[0] in self._queued)

    # -- events --------------------------------------------------------------------------------

    def ready(self, names: Iterable[str], *, at: float | None = None) -> list[int]:
        """Gradients ``names`` are ready (together: they share one FIFO queue stamp); return
        the plan positions this queued, in order.

        ``at``: the FIFO queue key to use instead of a fresh stamp, for a caller with a clock
        (the simulator passes the time, so that collectives queued at one instant tie and
        leave in plan order however many calls report them). A caller passes it always or
        never, never decreasing."""
        if at is None:
            self._stamp += 1
            at = self._stamp
        out: list[int] = []
        for name in names:
            if name not in self._holders:
                raise TrainschedError(f"gradient {name!r} is not in the plan")
            if name in self._ready_seen:
                raise TrainschedError(f"gradient {name!r} became ready twice in one step")
            self._ready_seen.add(name)
            for k in self._holders[name]:
                self._pending[k] -= 1
                if not self._pending[k]:
                    self._queue(k, at, out)
        return out

    def _queue(self, k: int, stamp: float, out: list[int]) -> None:
        while True:
            out.append(k)
            if self.follow:
                self._queued.add(k)
            else:
                key = self.plan[k].priority if self.queue == "priority" else stamp
                heapq.heappush(self._waiting, (key, k))
            if not self.ordered_issue or k + 1 >= len(self.plan):
                return
            k += 1
            self._pending[k] -= 1
            if self._pending[k]:
                return

    def decide(self, index: int) -> None:
        """Follower: the leader issued plan position ``index`` next."""
        assert self.follow, "decide() is for a following dispatcher"
        if not 0 <= index < len(self.plan):
            raise TrainschedError(f"the leader decided collective {index}, but the plan has "
                                  f"{len(self.plan)}: the ranks' plans differ")
        self._decisions.append(index)

    def done(self, index: int) -> tuple[str, ...]:
        """Collective ``index`` completed: return its bytes; the gradients now fully reduced."""
        if index not in self._in_flight:
            raise TrainschedError(f"collective {self.plan[index].name!r} reported done but "
                                  f"was not in flight")
        self._in_flight.remove(index)
        self.in_flight_bytes -= self.sizes[index]
        if not self._in_flight:
            self.in_flight_bytes = 0.0  # no float drift
        self.done_count += 1
        reduced = []
        for m in self.plan[index].members:
            self._left[m] -= 1
            if not self._left[m]:
                reduced.append(m)
        return tuple(reduced)

    def pump(self) -> list[int]:
        """Issue what the queue (or the leader's decisions) and the credit allow now; return
        the plan positions issued, in order."""
        out = []
        while True:
            if self.follow:
                if not (self._decisions and self._decisions[0] in self._queued):
                    break
                k = self._decisions[0]
                if not may_dispatch(self.in_flight_bytes, self.sizes[k], self.credit_bytes,
                                    self.credit_mode):
                    break
                self._decisions.popleft()
                self._queued.remove(k)
            else:
                taken = take_dispatchable(self._waiting, self.sizes, self.in_flight_bytes,
                                          self.credit_bytes, self.credit_mode, self.backfill)
                if taken is None:
                    break
                k = taken
            self._in_flight.add(k)
            self.in_flight_bytes += self.sizes[k]
            self.max_in_flight_bytes = max(self.max_in_flight_bytes, self.in_flight_bytes)
            self.issued.append(k)
            out.append(k)
            self.transport.issue(k)
        return out


# --- a simulated FIFO wire -------------------------------------------------------------------


class FifoWire:
    """A simulated :class:`Transport`: the wire runs the collectives one at a time, in the order
    they are dispatched (:meth:`issue`), collective ``k`` for ``cost_s(k)`` seconds.

    ``startup_s(k)`` (default 0; at most the cost) of that is start-up latency, which may
    overlap the transfer of the collective dispatched before it: ``k`` starts at
    ``max(now, end of the one before − startup)``. Whoever drives it sets :attr:`now` (the time
    of the dispatch) before pumping the dispatcher. Per collective it records when it was
    dispatched, started and ended, ``behind`` (the collective it waited for on the wire, or -1
    when it started on dispatch) and ``busy_s`` (the time it added to the wire's busy time:
    its cost less its overlap with the one before).
    """

    def __init__(self, cost_s: Callable[[int], float],
                 startup_s: Callable[[int], float] | None = None) -> None:
        self.cost_s = cost_s
        self.startup_s = startup_s
        self.now = 0.0
        self.free_at = 0.0  # when the collective dispatched last ends
        self.last = -1  # the collective dispatched last
        self.dispatched_s: dict[int, float] = {}
        self.start_s: dict[int, float] = {}
        self.end_s: dict[int, float] = {}
        self.behind: dict[int, int] = {}
        self.busy_s: dict[int, float] = {}

    def issue(self, index: int) -> None:
        cost = self.cost_s(index)
        free_at = self.free_at
        start = free_at - (min(self.startup_s(index), cost) if self.startup_s else 0.0)
        if start > self.now:  # behind the collective dispatched before it
            self.behind[index] = self.last
        else:
            start = self.now
            self.behind[index] = -1
        end = start + cost
        self.dispatched_s[index] = self.now
        self.start_s[index] = start
        self.end_s[index] = end
        self.busy_s[index] = end - max(start, free_at)
        self.free_at = end
        self.last = index


class SharedWire:
    """A simulated :class:`Transport` that runs up to ``slots`` collectives at once; one
    dispatched while all slots are taken waits, in dispatch order, for the next to finish.

    It does not know how long a collective takes (rates decide that, and they change while it
    runs): its driver sets :attr:`now`, reports each end with :meth:`finish` and collects the
    collectives that started since the last call with :meth:`take_started`. Per collective it
    records when it was dispatched and started and ``behind`` (the collective whose end let it
    start, or -1 when it started on dispatch); :attr:`busy_s` is the time at least one
    collective was in flight.
    """

    def __init__(self, slots: int) -> None:
        if not (isinstance(slots, int) and slots >= 1):
            raise TrainschedError(f"a shared wire needs slots >= 1, got {slots!r}")
        self.slots = slots
        self.now = 0.0
        self.in_flight = 0
        self.waiting: deque[int] = deque()
        self.started: list[int] = []
        self.dispatched_s: dict[int, float] = {}
        self.start_s: dict[int, float] = {}
        self.behind: dict[int, int] = {}
        self.busy_s = 0.0
        self._since = 0.0

    def _start(self, index: int, behind: int) -> None:
        if not self.in_flight:
            self._since = self.now
        self.in_flight += 1
        self.start_s[index] = self.now
        self.behind[index] = behind
        self.started.append(index)

    def issue(self, index: int) -> None:
        self.dispatched_s[index] = self.now
        if self.in_flight < self.slots:
            self._start(index, -1)
        else:
            self.waiting.append(index)

    def finish(self, index: int) -> None:
        """Collective ``index`` ended at :attr:`now`: its slot goes to the next waiting."""
        assert index in self.start_s, f"collective {index} finished but never started"
        self.in_flight -= 1
        if not self.in_flight:
            self.busy_s += self.now - self._since
        if self.waiting:
            self._start(self.waiting.popleft(), index)

    def take_started(self) -> list[int]:
        """The collectives started since the last call, in start order."""
        out, self.started = self.started, []
        return out


@dataclass(frozen=True)
class WireRecord:
    """One collective on the simulated wire: when it was queued, handed to the wire (dispatched),
    started and ended (seconds)."""

    name: str
    queued_s: float
    dispatched_s: float
    start_s: float
    end_s: float


def replay_fifo_wire(dispatcher_factory: Callable[[Transport], Dispatcher],
                     ready_s: Mapping[str, float],
                     cost_s: Callable[[int], float],
                     startup_s: float = 0.0) -> tuple[list[WireRecord], float]:
    """Run a dispatcher against a :class:`FifoWire`: one collective at a time in dispatch
    order, each taking ``cost_s(size_bytes)``. Gradient ``name`` becomes ready at
    ``ready_s[name]``; the events of one instant are handled together and the dispatcher is
    pumped after them, as the simulator does. Returns the records in dispatch order and the
    most bytes ever in flight.

    ``startup_s`` > 0: that much of each collective's cost (at most all of it) is start-up
    latency, which may overlap the transfer of the collective dispatched before it: a
    collective starts at ``max(dispatch, end of the one before − startup)`` (the simulator's
    ``startup_overlap``)."""
    if not (isinstance(startup_s, int | float) and startup_s >= 0):
        raise TrainschedError(f"startup_s must be a number >= 0, got {startup_s!r}")

    d: Dispatcher | None = None

    def cost(k: int) -> float:
        assert d is not None
        return cost_s(d.sizes[k])

    wire = FifoWire(cost, (lambda k: startup_s) if startup_s else None)
    d = dispatcher_factory(wire)
    missing = set(d._holders) - set(ready_s)
    if missing:
        raise TrainschedError(f"no ready time for gradient(s) {', '.join(sorted(missing))}")
    queued: dict[int, float] = {}
    times = sorted(set(ready_s.values()))
    by_time: dict[float, list[str]] = {}
    for name in sorted(ready_s, key=lambda n: (ready_s[n], n)):
        by_time.setdefault(ready_s[name], []).append(name)
    scheduled: deque[int] = deque()  # on the wire, by end
    records: dict[int, WireRecord] = {}
    t_i = 0
    while True:
        next_ready = times[t_i] if t_i < len(times) else math.inf
        next_end = wire.end_s[scheduled[0]] if scheduled else math.inf
        now = min(next_ready, next_end)
        if now == math.inf:
            break
        wire.now = now
        while scheduled and wire.end_s[scheduled[0]] == now:
            k = scheduled.popleft()
            records[k] = WireRecord(d.plan[k].name, queued[k], wire.dispatched_s[k],
                                    wire.start_s[k], wire.end_s[k])
            d.done(k)
        if next_ready == now:
            for k in d.ready(by_time[now]):
                queued[k] = now
            t_i += 1
        scheduled.extend(d.pump())
    if not d.finished:
        stuck = [c.name for k, c in enumerate(d.plan) if k not in records][:10]
        raise TrainschedError(f"fake wire stuck: collective(s) {', '.join(stuck)} never ran")
    order = sorted(records, key=lambda k: (records[k].start_s, k))
    return [records[k] for k in order], d.max_in_flight_bytes
