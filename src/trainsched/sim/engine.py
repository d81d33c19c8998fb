"""The discrete-event engine: tasks on exclusive resources, replayed in time order.

Every executor lowers its input (a graph, a placement, later a data-parallel or pipeline plan)
to one :class:`TaskGraph` and hands it to :func:`run_tasks`. A task is an int indexing flat lists
(duration, resources it needs, successors, in-degree, priority key, label, category, device,
trace args), so the inner loop touches lists, ints and tuples only.

The replay rule (Daydream, dPRO, Lumos): a task is *ready* when its last predecessor ends; it
then waits in the queue of every resource it needs and *starts* once all of them are free, at
``max(ready, resources free)``; it holds them for its duration. A task with no resource (a
rendezvous, a latency) runs as soon as it is ready. A resource's queue is FIFO (ready time, then
arrival) or priority (the task's priority key, then arrival). A free resource goes to the first
task in its queue whose other resources are free too: a task that needs two resources (a transfer
on sequential channels holds the sender's and the receiver's) never makes a free resource idle
while another queued task could use it.

Events live on a heap of ``(time_s, entry)`` pairs; the int ``entry`` packs the task's priority
key, ``seq`` and the task so that it orders as the tuple ``(priority, seq, task)``. ``seq`` is one
global counter, so ties break by insertion and never by payload; with the priority key first,
tasks ending at one instant are handled in a stable order that does not depend on how they were
started. Queues are served only after every event of the current instant has been handled, so a
priority queue chooses among all tasks that became ready at that instant. Nothing depends on the
wall clock, hashes or set order. A heap that empties with tasks left (a cycle, an impossible
dependency) raises :class:`TrainschedError` naming the blocked tasks and what they wait for.

**Stream pairs.** Two exclusive resources of one device may form a *pair*
(:meth:`TaskGraph.add_stream_pair`): a device's main and side compute streams, where kernels
of both run at once and share the device. A task's duration is then its *work* at the full
rate. While both streams of a pair hold a task, each runs at rate ``1/(1+ε)`` when both tasks
*fit* together (each at most ``fit_s`` of work: short kernels leave room on the device), else at
rate 1/2; alone, a task runs at rate 1. Whenever a pair's active set changes (a start or an end
on either stream), the engine takes the work each running task has done at its old rate, and
re-posts its end at the new rate; the end it had posted is dropped when popped (the heap entry
is remembered per task). So two tasks of work ``a <= b`` started together end at
``(1+ε)a`` and ``b + ε·a`` when they fit (equal tasks: ``max(a, b)·(1+ε)``), and at ``2a``
and ``a + b`` when they do not. A zero-work task never changes its partner's rate. The replay
rule above is unchanged (start = max(ready, resource free)): only when a running task ends
moves; ties, queues and the stuck-run error behave as without pairs, and a replay without
pairs costs what it did. ``busy_s`` of a paired stream is the time its tasks held it.

**Chains.** A task graph that is one chain (every task needs the one resource, task k's only
successor is k + 1: a one-device simulation, whose lowering chains the ops in topological order
and so needs no edge dependencies) is replayed in closed form: each task starts when the one
before it ends. The rule is the one above; the floating-point additions are the event loop's,
in its order, so the replay is identical to the loop's, only without a million events.

**Couplings.** Tasks may be *coupled* (:meth:`TaskGraph.couple`) into a group of
:class:`~trainsched.sim.coupling.Coupling` with two sides (a device's compute and its
collectives): while both sides run, each side's tasks run at a reduced rate, and several
second-side tasks running at once share their rate (:mod:`trainsched.sim.coupling` holds the
rule and the state). As for stream pairs, a coupled task's duration is its work at rate 1
(a part of it may be a delay that no rate stretches, :meth:`TaskGraph.couple`);
each start or end in a group re-posts the ends of the group's running tasks whose rate
changed, and a stale end is dropped when popped. Only when a running coupled task ends moves;
a replay without couplings costs what it did (one ``is None`` test per start without a
resource and per popped event).

**Gates.** An executor whose tasks follow a rule the queues cannot express (the data-parallel
collectives: issue at a rendezvous, a queue, a byte credit, a wire) attaches a :class:`Gate`.
The gate *holds* some tasks: when one becomes ready the engine tells the gate
(:meth:`Gate.on_ready`) instead of queueing it. It hears when the tasks it *watches* end
(:meth:`Gate.on_end`). Once an instant in which it heard anything is over, and before the
queues are served, the engine asks it what to release (:meth:`Gate.flush`): each released task
becomes ready at a time ``at >= now`` the gate chooses; then it queues for its resources like
any ready task, or, needing none, runs from ``at``. A gate may *own* resources: only its held
tasks need them, the engine never queues on them (they do not delay a released task) and takes
their busy time from the gate. Without gates the replay costs what it did; with them every
rule above (ordering, ties, the stuck-run error) still holds, a held task that is never
released being named as held by its gate.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import math
import operator
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from trainsched.errors import TrainschedError
from trainsched.sim.coupling import Coupling, CouplingState

__all__ = ["POLICIES", "Coupling", "Gate", "Release", "Replay", "Resource", "StreamPair",
           "TaskGraph", "longest_path_s", "run_tasks"]

POLICIES = ("fifo", "priority")
_SHOWN_BLOCKED = 10  # blocked tasks named in a stuck-simulation error


@dataclass(frozen=True, kw_only=True)
class Resource:
    """Something tasks hold exclusively while they run: a compute stream, a channel, a link.

    ``device`` is the index (into the executor's device list) of the device it belongs to, or
    -1; ``kind`` is ``"compute"`` or ``"channel"`` (exposed-communication accounting and the
    trace read it); ``capacity`` tasks may hold it at once (1: exclusive).
    """

    name: str
    device: int = -1
    kind: str = "compute"
    policy: str = "fifo"
    capacity: int = 1

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise TrainschedError(f"resource {self.name!r}: unknown queue policy "
                                  f"{self.policy!r}; expected one of {', '.join(POLICIES)}")
        if not (isinstance(self.capacity, int) and self.capacity >= 1):
            raise TrainschedError(f"resource {self.name!r}: capacity must be an integer >= 1, "
                                  f"got {self.capacity!r}")


@dataclass(frozen=True, kw_only=True)
class StreamPair:
    """Two resources that run at once and share a device (module docstring, *Stream pairs*):
    ``slowdown`` is ε (each runs at ``1/(1+ε)`` when the two tasks fit), ``fit_s`` the most
    work a task may have and still fit beside another."""

    first: int
    second: int
    slowdown: float
    fit_s: float


class TaskGraph:
    """A mutable builder of tasks, resources and dependencies, kept as flat parallel lists.

    Task ``i`` is described by ``duration_s[i]``, ``needs[i]`` (resource indices),
    ``successors[i]``, ``indegree[i]``, ``priority[i]`` (a number: smaller runs first on a
    priority queue, and it breaks ties between simultaneous ends), ``label[i]`` (its name in
    results and traces), ``category[i]`` (an op kind or ``"comm"``), ``device[i]`` (the device
    it works for: a transfer belongs to its destination) and ``args[i]`` (shown in the trace).
    """

    def __init__(self) -> None:
        self.resources: list[Resource] = []
        self.duration_s: list[float] = []
        self.needs: list[tuple[int, ...]] = []
        self.successors: list[list[int]] = []
        self.indegree: list[int] = []
        self.priority: list[float] = []
        self.label: list[str] = []
        self.category: list[str] = []
        self.device: list[int] = []
        self.args: list[Mapping[str, Any]] = []
        self.pairs: list[StreamPair] = []
        self.couplings: list[Coupling] = []
        self.coupled: dict[int, tuple[int, int]] = {}  # task -> (coupling group, side)
        self.fixed_s: dict[int, float] = {}  # coupled task -> its part at rate 1 (a delay)
        self._chain: bool | None = None  # is_chain(), known until the graph changes

    def __len__(self) -> int:
        return len(self.duration_s)

    def is_chain(self) -> bool:
        """Whether these are two or more tasks that form a chain (module docstring, *Chains*):
        checked with list operations in C, once until the graph changes."""
        if self._chain is None:
            n = len(self)
            succ = self.successors
            self._chain = (n >= 2 and not self.pairs and not self.coupled
                           and len(self.resources) == 1 and self.resources[0].capacity == 1
                           and self.needs.count((0,)) == n and not succ[-1]
                           and list(map(len, succ[:-1])).count(1) == n - 1
                           and list(map(operator.itemgetter(0), succ[:-1]))
                           == list(range(1, n)))
        return self._chain

    def add_resource(self, name: str, *, device: int = -1, kind: str = "compute",
                     policy: str = "fifo", capacity: int = 1) -> int:
        """A new resource; returns its index."""
        self._chain = None
        self.resources.append(Resource(name=name, device=device, kind=kind, policy=policy,
                                       capacity=capacity))
        return len(self.resources) - 1

    def add_task(self, label: str, duration_s: float, needs: Iterable[int] = (), *,
                 priority: float = 0, category: str = "", device: int = -1,
                 args: Mapping[str, Any] | None = None) -> int:
        """A new task needing the resources ``needs`` (distinct indices); returns its index."""
        needs = self._checked_needs(label, tuple(needs))
        self._chain = None
        if not 0.0 <= duration_s < math.inf:  # NaN fails too
            raise TrainschedError(f"task {label!r}: duration must be a finite number >= 0 s, "
                                  f"got {duration_s!r}")
        self.duration_s.append(float(duration_s))
        self.needs.append(needs)
        self.successors.append([])
        self.indegree.append(0)
        self.priority.append(priority)
        self.label.append(label)
        self.category.append(category)
        self.device.append(device)
        self.args.append(args if args is not None else {})
        return len(self.duration_s) - 1

    def _checked_needs(self, label: str, needs: tuple[int, ...]) -> tuple[int, ...]:
        count = len(self.resources)
        if (len(needs) > 1 and len(set(needs)) != len(needs)) or any(
                not 0 <= r < count for r in needs):
            raise TrainschedError(f"task {label!r}: needs {needs!r} must be distinct indices of "
                                  f"the {count} resources")
        return needs

    def add_tasks(self, labels: Sequence[str], durations_s: Sequence[float],
                  needs: Sequence[tuple[int, ...]], *, priorities: Sequence[float],
                  categories: Sequence[str], devices: Sequence[int],
                  args: Sequence[Mapping[str, Any]]) -> range:
        """Many tasks at once, as :meth:`add_task` would add them one by one (task k needs
        ``needs[k]``, works for ``devices[k]``, ...); returns their indices."""
        count = len(labels)
        assert (len(durations_s) == len(needs) == len(priorities) == len(categories)
                == len(devices) == len(args) == count)
        if count and not (min(durations_s) >= 0.0 and math.fsum(durations_s) < math.inf):
            t = next((t for t, d in enumerate(durations_s) if not 0.0 <= d < math.inf), 0)
            raise TrainschedError(f"task {labels[t]!r}: duration must be a finite number >= 0 "
                                  f"s, got {durations_s[t]!r}")
        for distinct in dict.fromkeys(needs):  # a few distinct tuples, each checked once
            self._checked_needs(labels[needs.index(distinct)], distinct)
        first = len(self.duration_s)
        self._chain = None
        self.duration_s += map(float, durations_s)
        self.needs += needs
        self.successors += ([] for _ in range(count))
        self.indegree += itertools.repeat(0, count)
        self.priority += priorities
        self.label += labels
        self.category += categories
        self.device += devices
        self.args += args
        return range(first, first + count)

    def add_dependencies(self, before: Sequence[int], after: Sequence[int]) -> None:
        """``after[k]`` may start only once ``before[k]`` has ended, for every k, in order."""
        successors, indegree = self.successors, self.indegree
        self._chain = None
        for a, b in zip(before, after, strict=True):
            successors[a].append(b)
            indegree[b] += 1

    def add_stream_pair(self, first: int, second: int, *, slowdown: float,
                        fit_s: float) -> None:
        """Make resources ``first`` and ``second`` (exclusive, in no other pair) a stream pair
        (module docstring, *Stream pairs*)."""
        taken = {x for p in self.pairs for x in (p.first, p.second)}
        count = len(self.resources)
        if first == second or not (0 <= first < count and 0 <= second < count) or \
                {first, second} & taken:
            raise TrainschedError(f"a stream pair needs two distinct resources in no other "
                                  f"pair, got {first!r} and {second!r}")
        if self.resources[first].capacity != 1 or self.resources[second].capacity != 1:
            raise TrainschedError("the resources of a stream pair must have capacity 1")
        if not (0.0 <= slowdown < math.inf and 0.0 <= fit_s < math.inf):
            raise TrainschedError(f"a stream pair needs slowdown >= 0 and fit_s >= 0, got "
                                  f"{slowdown!r} and {fit_s!r}")
        self._chain = None
        self.pairs.append(StreamPair(first=first, second=second, slowdown=float(slowdown),
                                     fit_s=float(fit_s)))

    def add_coupling(self, coupling: Coupling) -> int:
        """A new coupling group (module docstring, *Couplings*); returns its index."""
        assert isinstance(coupling, Coupling), coupling
        self.couplings.append(coupling)
        return len(self.couplings) - 1

    def couple(self, task: int, group: int, side: int, *, fixed_s: float = 0.0) -> None:
        """Put ``task`` on ``side`` (0: first, 1: second) of coupling ``group``. The first
        ``fixed_s`` of its duration is a delay that runs at rate 1 whatever the group's rates
        (the task still counts as running in its group meanwhile); the rest is work at the
        group's rate."""
        assert 0 <= group < len(self.couplings) and side in (0, 1), (group, side)
        assert task not in self.coupled, f"task {self.label[task]!r} is coupled twice"
        assert 0.0 <= fixed_s <= self.duration_s[task], (fixed_s, self.duration_s[task])
        self._chain = None
        self.coupled[task] = (group, side)
        if fixed_s:
            self.fixed_s[task] = float(fixed_s)

    def add_dependency(self, before: int, after: int) -> None:
        """``after`` may start only once ``before`` has ended."""
        self._chain = None
        self.successors[before].append(after)
        self.indegree[after] += 1

    def predecessors(self) -> list[list[int]]:
        """Predecessors of every task (with repeats for repeated dependencies), in task order."""
        preds: list[list[int]] = [[] for _ in self.duration_s]
        for t, succ in enumerate(self.successors):
            for s in succ:
                preds[s].append(t)
        return preds


@dataclass(frozen=True, kw_only=True)
class Replay:
    """When every task ran, as :func:`run_tasks` found it.

    ``fixed_by[i]`` is the task whose end fixed task i's start (-1: it started at time 0 with
    nothing before it); ``by_resource[i]`` says whether that task held a resource i needed
    (``True``) or was a dependency (``False``). ``busy_s`` is per resource: the summed durations
    of the tasks it ran (for a resource a gate owns: what the gate reports). ``events`` counts
    the events handled (one per task end).
    """

    start_s: tuple[float, ...]
    end_s: tuple[float, ...]
    fixed_by: tuple[int, ...]
    by_resource: tuple[bool, ...]
    busy_s: tuple[float, ...]
    makespan_s: float
    events: int


#: What :meth:`Gate.flush` returns per task it releases: ``(task, at_s, fixed_by, by_resource)``.
#: The task becomes ready at ``at_s`` (>= the current time); ``fixed_by`` and ``by_resource``
#: are what the replay reports as fixing its start (overridden, as for any task, if it then
#: waits for a resource).
Release = tuple[int, float, int, bool]


class Gate(Protocol):
    """An executor's hook into :func:`run_tasks` (module docstring, *Gates*).

    ``name`` names it in a stuck-run error; ``held`` are the tasks it holds back (each held by
    one gate), ``watched`` those whose end it hears about, ``resources`` those it schedules
    itself (no task it does not hold may need one).
    """

    name: str
    held: Sequence[int]
    watched: Sequence[int]
    resources: Sequence[int]

    def on_ready(self, task: int, now: float, by: int) -> None:
        """Held ``task``'s last predecessor ``by`` (-1: it has none) ended at ``now``."""

    def on_end(self, task: int, now: float) -> None:
        """Watched ``task`` ended at ``now`` (called before its successors are made ready)."""

    def flush(self, now: float) -> Iterable[Release]:
        """The instant ``now`` is over: the held, ready tasks to release, in order."""

    def busy_s(self) -> Mapping[int, float]:
        """Per resource it owns: the seconds it was busy."""


def run_tasks(tasks: TaskGraph, gates: Sequence[Gate] = ()) -> Replay:
    """Replay ``tasks`` on their resources and return when each ran (see the module docstring);
    ``gates`` hold back and release some tasks (*Gates* there)."""
    if not gates:
        chain = _chain_replay(tasks)
        if chain is not None:
            return chain
    n = len(tasks.duration_s)
    dur = tasks.duration_s
    needs = tasks.needs
    succ = tasks.successors
    indeg = list(tasks.indegree)
    nres = len(tasks.resources)
    avail = [r.capacity for r in tasks.resources]
    by_key = [r.policy == "priority" for r in tasks.resources]
    gated = bool(gates)
    holder: list[Gate | None] = []
    watcher: list[Gate | None] = []
    if gated:  # needs without the resources gates own; tasks n..2n-1: wake-ups (below)
        holder, watcher, needs = _gate_tables(tasks, gates)
    # Events and queue entries are ints made of three bit fields, key | seq | task, which order
    # exactly as the tuples (key, seq, task) and compare far faster; ``entry & mask`` is the
    # task. ``key`` is the task's priority (its rank among all priorities unless they are all
    # ints) in the event heap and on a priority queue, and 0 on a FIFO queue, where arrival
    # order is ready-time order. ``keyed[t]`` holds t's key and t, ``stamp`` holds seq, so an
    # entry is one addition; seq counts pushes and stays below 2 ** seq_bits. With gates, the
    # event of task ``n + t`` is the wake-up of held task t, released to queue later than now.
    prio = tasks.priority  # also breaks ties between simultaneous ends
    if not set(map(type, prio)) <= {int}:
        rank = {key: k for k, key in enumerate(sorted(set(prio)))}
        prio = [rank[key] for key in prio]
    ids = 2 * n if gated else n
    task_bits = max(ids - 1, 0).bit_length()
    mask = (1 << task_bits) - 1
    unit = 1 << task_bits  # adding it to an entry adds 1 to its seq
    paired = _Pairs(tasks) if tasks.pairs else None
    coupled = None
    if tasks.coupled:
        coupled = CouplingState(tasks, {t for t in range(n) if paired.on[t]} if paired else None)
    seq_bits = (ids + sum(map(len, needs)) + 1 + (2 * n if paired else 0)
                + (coupled.max_posts() if coupled else 0)).bit_length()
    # prio · 2 ** (seq_bits + task_bits) + t, built in C rather than a Python loop.
    keyed = list(map(operator.add, map(operator.mul, prio, itertools.repeat(unit << seq_bits)),
                     range(n)))
    queues: list[list[int]] = [[] for _ in range(nres)]
    last_user = [-1] * nres
    busy = [0.0] * nres
    start = [0.0] * n
    end = [0.0] * n
    ready = [0.0] * n
    fixed = [-1] * n
    via = [False] * n
    started = [False] * n  # lists of bools: indexed faster than a bytearray
    dirty: list[int] = []  # resources to serve once the current instant is over
    is_dirty = [False] * nres
    due = False  # a gate heard something in the current instant: flush the gates
    heap: list[tuple[float, int]] = []  # (end time, entry): flat pairs, ties by the entry
    push = heapq.heappush  # bound once, not looked up per event
    pop = heapq.heappop
    stamp = 0
    now = 0.0

    # Tasks without predecessors are ready at time 0, in index order (picked out in C).
    for t in itertools.compress(range(n), map(operator.not_, indeg)):
        if gated and holder[t] is not None:
            holder[t].on_ready(t, 0.0, -1)
            due = True
        elif needs[t]:
            for x in needs[t]:
                push(queues[x], (keyed[t] if by_key[x] else t) + stamp)
                stamp += unit
                if not is_dirty[x]:
                    is_dirty[x] = True
                    dirty.append(x)
        elif coupled is not None and coupled.on[t]:
            started[t] = True
            stamp = _post(coupled.start(t, 0.0), heap, end, coupled.entry, keyed, stamp, unit)
        else:
            started[t] = True
            end[t] = dur[t]
            push(heap, (dur[t], keyed[t] + stamp))
            stamp += unit

    while True:
        # Serve the queues of resources that changed, once the current instant is over.
        if (dirty or due) and not (heap and heap[0][0] <= now):
            if due:  # first the gates' releases: a task released now joins its queues now
                due = False
                for gate in gates:
                    for t, at, by, by_resource in gate.flush(now):
                        assert holder[t] is gate and not indeg[t] and not started[t], t
                        assert at >= now, (t, at, now)
                        fixed[t] = by
                        via[t] = by_resource
                        ready[t] = at
                        rs = needs[t]
                        if not rs and coupled is not None and coupled.on[t]:
                            started[t] = True
                            start[t] = at
                            if at > now:  # its rate is settled when it starts: wake it then
                                push(heap, (at, keyed[t] + n + stamp))
                            else:
                                stamp = _post(coupled.start(t, at), heap, end, coupled.entry,
                                              keyed, stamp, unit)
                            stamp += unit
                        elif not rs:  # runs from ``at``
                            started[t] = True
                            start[t] = at
                            end[t] = d = at + dur[t]
                            push(heap, (d, keyed[t] + stamp))
                            stamp += unit
                        elif at > now:  # queues at ``at``: a wake-up event then
                            push(heap, (at, keyed[t] + n + stamp))
                            stamp += unit
                        else:
                            for x in rs:
                                push(queues[x], (keyed[t] if by_key[x] else t) + stamp)
                                stamp += unit
                                if avail[x] and not is_dirty[x]:
                                    is_dirty[x] = True
                                    dirty.append(x)
            if len(dirty) > 1:
                dirty.sort()
            for r in dirty:
                is_dirty[r] = False
                q = queues[r]
                while avail[r] and q:  # avail first: it ends the loop after a start
                    t = q[0] & mask
                    if started[t]:  # a multi-resource task started from another queue
                        pop(q)
                        continue
                    rs = needs[t]
                    if len(rs) == 1:
                        pop(q)
                        d = dur[t]
                        avail[r] -= 1
                        busy[r] += d
                        if now > ready[t]:  # waited: the task that last held r fixed it
                            fixed[t] = last_user[r]
                            via[t] = True
                    else:
                        if len(rs) == 2:  # inlined for the common two-channel transfer
                            a, b = rs
                            free = avail[a] and avail[b]
                        else:
                            free = all(map(avail.__getitem__, rs))
                        if free:
                            pop(q)
                        elif len(q) == 1:
                            break
                        else:
                            t = _first_startable(q, mask, needs, avail, started)
                            if t < 0:
                                break
                            rs = needs[t]  # left in its queues; skipped there as started
                        d = dur[t]
                        for x in rs:
                            avail[x] -= 1
                            busy[x] += d
                        if now > ready[t]:  # waited: the last task to free a resource fixed it
                            best = -1.0
                            for y in rs:
                                u = last_user[y]
                                if u >= 0 and end[u] > best:
                                    best, fixed[t] = end[u], u
                            via[t] = True
                    started[t] = True
                    start[t] = now
                    if coupled is not None and coupled.on[t]:
                        stamp = _post(coupled.start(t, now), heap, end, coupled.entry, keyed,
                                      stamp, unit)
                        continue
                    if paired is not None and paired.partner[r] >= 0:
                        for u, at in paired.start(t, r, now):
                            end[u] = at
                            paired.entry[u] = e = keyed[u] + stamp
                            push(heap, (at, e))
                            stamp += unit
                        continue
                    end[t] = d = now + d
                    push(heap, (d, keyed[t] + stamp))
                    stamp += unit
            dirty = []  # cheaper than dirty.clear()
        if not heap:
            break
        now, t = pop(heap)
        if paired is not None and (t & mask) < n and paired.on[t & mask]:
            e, t = t, t & mask
            if e != paired.entry[t]:  # an end re-posted since: this one is stale
                continue
            for x in needs[t]:
                busy[x] += (now - start[t]) - dur[t]  # held longer than its work alone
            for u, at in paired.end(t, now):
                end[u] = at
                paired.entry[u] = e = keyed[u] + stamp
                push(heap, (at, e))
                stamp += unit
        if coupled is not None and (t & mask) < n and coupled.on[t & mask]:
            e, t = t, t & mask
            if e != coupled.entry[t]:  # an end re-posted since: this one is stale
                continue
            for x in needs[t]:
                busy[x] += (now - start[t]) - dur[t]  # held longer than its work alone
            stamp = _post(coupled.end(t, now), heap, end, coupled.entry, keyed, stamp, unit)
        t &= mask
        if gated:
            if t >= n:  # a released task's wake-up: it joins its queues now
                t -= n
                if not needs[t]:  # a coupled task released to start later: it starts now
                    assert coupled is not None and coupled.on[t], t
                    stamp = _post(coupled.start(t, now), heap, end, coupled.entry, keyed,
                                  stamp, unit)
                    continue
                for x in needs[t]:
                    push(queues[x], (keyed[t] if by_key[x] else t) + stamp)
                    stamp += unit
                    if avail[x] and not is_dirty[x]:
                        is_dirty[x] = True
                        dirty.append(x)
                continue
            if watcher[t] is not None:
                watcher[t].on_end(t, now)
                due = True
        for x in needs[t]:
            avail[x] += 1
            last_user[x] = t
            if queues[x] and not is_dirty[x]:
                is_dirty[x] = True
                dirty.append(x)
        for s in succ[t]:
            k = indeg[s] - 1
            indeg[s] = k
            if k == 0:
                fixed[s] = t
                ready[s] = now
                if gated and holder[s] is not None:
                    holder[s].on_ready(s, now, t)
                    due = True
                    continue
                rs = needs[s]
                if rs:
                    for x in rs:
                        push(queues[x], (keyed[s] if by_key[x] else s) + stamp)
                        stamp += unit
                        # Only a free resource needs serving: a busy one is marked when it frees
                        # (its queue is not empty then), and serving it now would do nothing.
                        if avail[x] and not is_dirty[x]:
                            is_dirty[x] = True
                            dirty.append(x)
                elif coupled is not None and coupled.on[s]:
                    started[s] = True
                    start[s] = now
                    stamp = _post(coupled.start(s, now), heap, end, coupled.entry, keyed, stamp,
                                  unit)
                else:
                    started[s] = True
                    start[s] = now
                    end[s] = d = now + dur[s]
                    push(heap, (d, keyed[s] + stamp))
                    stamp += unit

    done = n - started.count(False)  # with the heap empty, every task that started has ended
    if done < n:
        raise TrainschedError(_stuck_message(tasks, indeg, started, now, n - done, holder))
    for gate in gates:
        for r, b in gate.busy_s().items():
            busy[r] += b
    return Replay(
        start_s=tuple(start),
        end_s=tuple(end),
        fixed_by=tuple(fixed),
        by_resource=tuple(via),
        busy_s=tuple(busy),
        makespan_s=max(end, default=0.0),
        events=done,
    )


def _chain_replay(tasks: TaskGraph) -> Replay | None:
    """The replay of a *chain* in closed form, or None if ``tasks`` is not one: every task
    needs the one resource (capacity 1, no pairs, no couplings) and task k's one successor is
    k + 1 (a one-device simulation). Each task is ready when the one before ends and finds the
    resource free then, so the rule of the module docstring starts it at that end: the same
    additions, in the same order, as the event loop makes, without its events."""
    if not tasks.is_chain():
        return None
    n, dur = len(tasks), tasks.duration_s
    times = list(itertools.accumulate(dur, initial=0.0))  # each end = its start + duration
    end = tuple(times[1:])
    return Replay(start_s=tuple(times[:-1]), end_s=end, fixed_by=(-1, *range(n - 1)),
                  by_resource=(False,) * n, busy_s=(functools.reduce(operator.add, dur, 0.0),),
                  makespan_s=max(end), events=n)


def _post(posts: list[tuple[int, float]], heap: list[tuple[float, int]], end: list[float],
          entry: list[int], keyed: list[int], stamp: int, unit: int) -> int:
    """Post the (task, end) pairs of a coupling change; return the next stamp."""
    for u, at in posts:
        end[u] = at
        entry[u] = e = keyed[u] + stamp
        heapq.heappush(heap, (at, e))
        stamp += unit
    return stamp


class _Pairs:
    """The state of the stream pairs during one replay (module docstring, *Stream pairs*):
    per resource its partner (-1: none) and running task; per paired task its work left, rate,
    since when, and the heap entry of its posted end."""

    def __init__(self, tasks: TaskGraph) -> None:
        nres, n = len(tasks.resources), len(tasks)
        self.partner = [-1] * nres
        self.param: list[tuple[float, float]] = [(0.0, 0.0)] * nres
        for p in tasks.pairs:
            self.partner[p.first], self.partner[p.second] = p.second, p.first
            self.param[p.first] = self.param[p.second] = (p.slowdown, p.fit_s)
        self.dur = tasks.duration_s
        self.running = [-1] * nres
        self.on = [False] * n  # the task runs on a paired resource
        for t, rs in enumerate(tasks.needs):
            if any(self.partner[x] >= 0 for x in rs):
                assert len(rs) == 1, f"task {tasks.label[t]!r}: a paired stream is its only need"
                self.on[t] = True
        self.where = [-1] * n
        self.left = [0.0] * n
        self.rate = [1.0] * n
        self.since = [0.0] * n
        self.entry = [-1] * n

    def _shared(self, t: int, u: int, r: int) -> float:
        slowdown, fit = self.param[r]
        return 1.0 / (1.0 + slowdown) if self.dur[t] <= fit and self.dur[u] <= fit else 0.5

    def _advance(self, u: int, now: float) -> None:
        self.left[u] = max(0.0, self.left[u] - self.rate[u] * (now - self.since[u]))
        self.since[u] = now

    def start(self, t: int, r: int, now: float) -> list[tuple[int, float]]:
        """Task ``t`` starts on paired resource ``r``: the (task, end) pairs to post."""
        self.running[r], self.where[t] = t, r
        self.left[t], self.since[t], self.rate[t] = self.dur[t], now, 1.0
        u = self.running[self.partner[r]]
        if u < 0 or self.dur[t] == 0.0 or self.left[u] == 0.0:
            return [(t, now + self.dur[t])]
        self._advance(u, now)
        rate = self._shared(t, u, r)
        self.rate[t] = self.rate[u] = rate
        return [(u, now + self.left[u] / rate), (t, now + self.dur[t] / rate)]

    def end(self, t: int, now: float) -> list[tuple[int, float]]:
        """Task ``t`` ended: its partner, if running shared, goes on at rate 1."""
        r = self.where[t]
        self.running[r] = -1
        u = self.running[self.partner[r]]
        if u < 0 or self.rate[u] == 1.0:
            return []
        self._advance(u, now)
        self.rate[u] = 1.0
        return [(u, now + self.left[u])]


def _gate_tables(tasks: TaskGraph, gates: Sequence[Gate]
                 ) -> tuple[list[Gate | None], list[Gate | None], list[tuple[int, ...]]]:
    """Per task its holding gate and its watching gate (or None), and the resources it takes
    through the engine's queues: those no gate owns."""
    n = len(tasks)
    holder: list[Gate | None] = [None] * n
    watcher: list[Gate | None] = [None] * n
    owned: set[int] = set()
    for gate in gates:
        for t in gate.held:
            assert holder[t] is None, f"task {tasks.label[t]!r} is held by two gates"
            holder[t] = gate
        for t in gate.watched:
            assert watcher[t] is None, f"task {tasks.label[t]!r} is watched by two gates"
            watcher[t] = gate
        owned.update(gate.resources)
    needs = tasks.needs
    if owned:
        needs = list(needs)
        uses = 0  # needs of held tasks for owned resources: all there are
        for gate in gates:
            for t in gate.held:
                rs = needs[t]
                kept = tuple(x for x in rs if x not in owned)
                uses += len(rs) - len(kept)
                needs[t] = kept
        assert uses == sum(map(owned.__contains__, itertools.chain.from_iterable(tasks.needs))), \
            "a task no gate holds needs a resource a gate owns"
    return holder, watcher, needs


def _first_startable(q: list[int], mask: int, needs: list[tuple[int, ...]], avail: list[int],
                     started: list[bool]) -> int:
    """The first task in queue order (after the blocked head) whose resources are all free,
    or -1. A long queue is walked lazily in heap order (a frontier of positions), so finding a
    task near the head costs O(k log k) for the k entries inspected, not a sort of the queue."""
    free = avail.__getitem__  # bound once, not per entry
    size = len(q)
    if size <= 32:
        for item in sorted(q)[1:]:
            t = item & mask
            if not started[t] and all(map(free, needs[t])):
                return t
        return -1
    frontier = [(q[1], 1)]
    if size > 2:
        frontier.append((q[2], 2))
    while frontier:
        item, i = heapq.heappop(frontier)
        t = item & mask
        if not started[t] and all(map(free, needs[t])):
            return t
        i = 2 * i + 1
        if i < size:
            heapq.heappush(frontier, (q[i], i))
            if i + 1 < size:
                heapq.heappush(frontier, (q[i + 1], i + 1))
    return -1


def _stuck_message(tasks: TaskGraph, indeg: list[int], started: Sequence[int], now: float,
                   left: int, holder: Sequence[Gate | None] = ()) -> str:
    preds = tasks.predecessors()
    label = tasks.label
    lines = []
    for t in range(len(tasks)):
        if started[t]:
            continue
        if indeg[t] > 0:
            waiting = [label[p] for p in dict.fromkeys(preds[t]) if not started[p]]
            lines.append(f"{label[t]} waits for {', '.join(waiting)}")
        elif holder and holder[t] is not None:
            lines.append(f"{label[t]} is held by {holder[t].name}")
        else:
            names = [tasks.resources[x].name for x in tasks.needs[t]]
            lines.append(f"{label[t]} waits for resources {', '.join(names)}")
        if len(lines) == _SHOWN_BLOCKED:
            break
    more = f"; ... ({left - len(lines)} more)" if left > len(lines) else ""
    return (f"simulation stuck at t={now!r} s: {left} of {len(tasks)} tasks never ran "
            f"(a dependency cycle?): {'; '.join(lines)}{more}")


def longest_path_s(tasks: TaskGraph) -> float:
    """The longest chain of task durations along dependencies, ignoring resources.

    A lower bound on any schedule's makespan; a cycle raises as :func:`run_tasks` does.
    """
    n = len(tasks)
    duration, successors = tasks.duration_s, tasks.successors
    if tasks.is_chain():  # the loop below, its additions in its order, in C
        return max(itertools.accumulate(duration))
    reach = [0.0] * n  # latest end among a task's predecessors so far
    longest = 0.0
    for t in range(n):  # one pass while every dependency runs to a later task (the usual)
        f = reach[t] + duration[t]
        if f > longest:
            longest = f
        for s in successors[t]:
            if s <= t:
                return _longest_path_sorting(tasks)
            if f > reach[s]:
                reach[s] = f
    return longest


def _longest_path_sorting(tasks: TaskGraph) -> float:
    """:func:`longest_path_s` for tasks in any order: Kahn's algorithm."""
    n = len(tasks)
    indeg = list(tasks.indegree)
    finish = [0.0] * n
    reach = [0.0] * n  # latest end among a task's predecessors so far
    stack = [t for t in range(n) if indeg[t] == 0]
    seen = 0
    while stack:
        t = stack.pop()
        seen += 1
        finish[t] = reach[t] + tasks.duration_s[t]
        for s in tasks.successors[t]:
            if finish[t] > reach[s]:
                reach[s] = finish[t]
            indeg[s] -= 1
            if indeg[s] == 0:
                stack.append(s)
    if seen < n:
        started = bytearray(1 if indeg[t] == 0 else 0 for t in range(n))
        raise TrainschedError(_stuck_message(tasks, indeg, started, 0.0, n - seen))
    return max(finish, default=0.0)
