"""What a simulation predicts: step time, busy and idle time, memory, critical path, the timeline.

:func:`build_result` turns an engine :class:`~trainsched.sim.engine.Replay` plus the memory an
executor allocates (a list of :class:`Allocation`) into a :class:`SimResult`. The summaries are
the same for every executor:

- **critical path**: the realised chain, walked back from the last finish through whichever
  predecessor fixed each start (a dependency that ended last, or the task that last held a
  resource it needed); its durations plus waits add up to the step time.
- **dependency bound**: the longest chain of task durations ignoring resources (infinitely many
  streams and channels); no schedule is faster.
- **exposed communication**: the measure of the set of instants at which some communication task
  runs while the compute streams of the device it delivers to are all idle. Each instant counts
  once, however many devices or transfers are exposed at it, so ``exposed_comm_s <= step_time_s``.
- **memory**: every allocation is made when its task starts and freed when the last of its
  ``until`` tasks ends (never, when there are none). At one instant frees go before allocations,
  so a buffer freed at t makes room for one allocated at t; an allocation freed at the very
  instant it is made (a zero-time op's workspace) still counts at that instant.

``to_json`` is byte-stable: sorted keys, floats by ``repr``, no wall-clock time (``wall_s`` is an
attribute outside the JSON), so equal inputs give identical text in any process.
"""

from __future__ import annotations

import bisect
import itertools
import json
import math
import operator
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any

import numpy

from trainsched.sim.engine import Replay, TaskGraph, longest_path_s

__all__ = ["Allocation", "Allocations", "Dependencies", "PathStep", "PathSteps",
           "ResourceRecord", "SimResult", "TaskRecord", "TaskRecords", "build_result"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Allocation:
    """``size_bytes`` on device ``device`` (an executor device index), allocated when task
    ``at_task`` starts (-1: resident from time 0) and freed when the last of ``until_tasks``
    ends (empty: held to the end of the step)."""

    device: int
    size_bytes: int
    at_task: int = -1
    until_tasks: tuple[int, ...] = ()


class Allocations(Sequence[Allocation]):
    """A list of :class:`Allocation` kept as four columns (device, size, task, until tasks):
    an executor adds a million in a few calls (:meth:`extend`), and the memory summary reads
    the columns rather than a million objects. Reading an item makes its Allocation."""

    __slots__ = ("at_task", "device", "size_bytes", "until_tasks")

    def __init__(self) -> None:
        self.device: list[int] = []
        self.size_bytes: list[int] = []
        self.at_task: list[int] = []
        self.until_tasks: list[tuple[int, ...]] = []

    def append(self, allocation: Allocation) -> None:
        self.add(allocation.device, allocation.size_bytes, allocation.at_task,
                 allocation.until_tasks)

    def add(self, device: int, size_bytes: int, at_task: int = -1,
            until_tasks: tuple[int, ...] = ()) -> None:
        """``append(Allocation(...))`` of values an executor has checked, without the object."""
        self.device.append(device)
        self.size_bytes.append(size_bytes)
        self.at_task.append(at_task)
        self.until_tasks.append(until_tasks)

    def extend(self, devices: Sequence[int], sizes: Sequence[int], at_tasks: Sequence[int],
               until_tasks: Sequence[tuple[int, ...]]) -> None:
        """Allocations ``k`` of ``(devices[k], sizes[k], at_tasks[k], until_tasks[k])``, checked
        as an executor makes them (ints; tuples of task indices)."""
        assert len(devices) == len(sizes) == len(at_tasks) == len(until_tasks)
        self.device += devices
        self.size_bytes += sizes
        self.at_task += at_tasks
        self.until_tasks += until_tasks

    def __len__(self) -> int:
        return len(self.device)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [self[k] for k in range(len(self))[index]]
        k = range(len(self))[index]
        return Allocation(device=self.device[k], size_bytes=self.size_bytes[k],
                          at_task=self.at_task[k], until_tasks=self.until_tasks[k])

    def __repr__(self) -> str:
        return f"Allocations({len(self)})"


@dataclass(frozen=True, kw_only=True, slots=True)
class ResourceRecord:
    """A resource as results and traces show it; ``device`` is a device name or ``""``."""

    name: str
    device: str
    kind: str
    policy: str
    capacity: int


@dataclass(frozen=True, kw_only=True, slots=True)
class TaskRecord:
    """One task as it ran: ``resources`` are names (a transfer on sequential channels holds two);
    ``device`` is the device it works for (a transfer: its destination)."""

    name: str
    category: str
    device: str
    resources: tuple[str, ...]
    start_s: float
    end_s: float
    args: Mapping[str, Any]


@dataclass(frozen=True, kw_only=True, slots=True)
class PathStep:
    """One task of the realised critical path. ``via`` says what fixed its start: ``"start"``
    (the first step), ``"dependency"`` or ``"resource"`` (the previous step, which ended
    ``wait_s`` before it started)."""

    name: str
    category: str
    start_s: float
    end_s: float
    wait_s: float
    via: str


@dataclass(frozen=True, kw_only=True)
class SimResult:
    """A simulated step. Mappings are keyed by device name or resource name, read-only.

    ``busy_s`` is the summed duration of the tasks a resource ran, ``idle_s`` is
    ``capacity · step_time_s − busy_s``. ``peak_op`` names the task whose allocation first
    brought its device to its peak (``None`` when resident state alone is the peak); ``oom`` is
    true where the peak exceeds ``memory_capacity_bytes`` (never when no capacity is known).
    ``memory_timeline`` holds ``(time_s, bytes)`` after every change, from time 0.
    ``dependencies`` are task index pairs ``(before, after)`` into ``tasks``.
    """

    step_time_s: float
    dependency_bound_s: float
    exposed_comm_s: float
    events: int
    devices: tuple[str, ...]
    resources: tuple[ResourceRecord, ...]
    busy_s: Mapping[str, float]
    idle_s: Mapping[str, float]
    memory_capacity_bytes: int | None
    peak_memory_bytes: Mapping[str, int]
    peak_op: Mapping[str, str | None]
    oom: Mapping[str, bool]
    memory_timeline: Mapping[str, tuple[tuple[float, int], ...]]
    critical_path: Sequence[PathStep]  # a PathSteps or a tuple: equal when their steps are
    tasks: Sequence[TaskRecord]  # a TaskRecords or a tuple: equal when their records are
    dependencies: Sequence[tuple[int, int]]  # a Dependencies or a tuple, likewise
    wall_s: float = field(default=0.0, compare=False)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON values for every field except ``wall_s``."""
        return {f.name: _plain(getattr(self, f.name)) for f in fields(self) if f.name != "wall_s"}

    def to_json(self) -> str:
        """Byte-stable JSON text: sorted keys, compact separators, floats by ``repr``."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"),
                          allow_nan=False) + "\n"


class _EqualsTuple:
    """Compares equal to any sequence (not a string) with equal items in order, as the tuple
    it stands for would; unhashable, as a mutable sequence is."""

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str):
            return NotImplemented
        return len(self) == len(other) and all(map(operator.eq, self, other))  # type: ignore

    __hash__ = None  # type: ignore[assignment]


class _MadeWhenRead(_EqualsTuple):
    """A sequence whose k-th item :meth:`_item` makes when it is read (indexing, slices as
    tuples, iteration); subclasses give ``__len__`` and ``_item``."""

    __slots__ = ()

    def _item(self, k: int) -> Any:
        raise NotImplementedError

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return tuple(map(self._item, range(len(self))[index]))  # type: ignore[arg-type]
        return self._item(range(len(self))[index])  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[Any]:
        return map(self._item, range(len(self)))  # type: ignore[arg-type]


class TaskRecords(_MadeWhenRead, Sequence[TaskRecord]):
    """The tasks of a replay as :class:`TaskRecord` s, made when read: a read-only sequence
    that equals the tuple of the same records (a million-task result need not hold a million
    records, with a copy of each one's trace arguments, that nobody reads)."""

    __slots__ = ("_args", "_category", "_device", "_end", "_label", "_needs", "_resources",
                 "_start")

    def __init__(self, tasks: TaskGraph, replay: Replay, devices: Sequence[str]) -> None:
        # Copies of the lists (not of their items): the task graph may grow after this.
        self._label, self._category = list(tasks.label), list(tasks.category)
        names = [*devices, ""]  # a device of -1 is no device
        self._device = list(map(names.__getitem__, tasks.device))
        self._needs, self._args = list(tasks.needs), list(tasks.args)
        self._resources = tuple(r.name for r in tasks.resources)
        self._start, self._end = replay.start_s, replay.end_s

    def __len__(self) -> int:
        return len(self._label)

    def _item(self, t: int) -> TaskRecord:
        names = self._resources
        return TaskRecord(name=self._label[t], category=self._category[t],
                          device=self._device[t],
                          resources=tuple(names[x] for x in self._needs[t]),
                          start_s=self._start[t], end_s=self._end[t],
                          args=MappingProxyType(dict(self._args[t])))

    def __repr__(self) -> str:
        return f"TaskRecords({len(self)} tasks)"


class Dependencies(_EqualsTuple, Sequence[tuple[int, int]]):
    """The dependencies of a task graph as ``(before, after)`` pairs, in task order and, per
    task, in the order they were added: a read-only sequence equal to the tuple of those pairs,
    read from the task graph's successor lists rather than copied."""

    __slots__ = ("_count", "_successors")

    def __init__(self, successors: Sequence[Sequence[int]]) -> None:
        self._successors = list(successors)  # a copy of the list: the graph may grow
        self._count = list(itertools.accumulate(map(len, successors), initial=0))

    def __len__(self) -> int:
        return self._count[-1]

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return tuple(self[k] for k in range(len(self))[index])
        k = range(len(self))[index]
        t = bisect.bisect_right(self._count, k) - 1
        return (t, self._successors[t][k - self._count[t]])

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return ((t, s) for t, succ in enumerate(self._successors) for s in succ)

    def __repr__(self) -> str:
        return f"Dependencies({len(self)} pairs)"


def _plain(value: Any) -> Any:
    if isinstance(value, ResourceRecord | TaskRecord | PathStep):
        return {f.name: _plain(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, tuple | list | TaskRecords | Dependencies | PathSteps):
        return [_plain(v) for v in value]
    return value


def build_result(tasks: TaskGraph, replay: Replay, *, devices: Sequence[str],
                 allocations: Sequence[Allocation] = (), memory_capacity_bytes: int | None = None,
                 wall_s: float = 0.0) -> SimResult:
    """The :class:`SimResult` of ``replay``; task and resource devices index ``devices``."""
    step = replay.makespan_s
    names = tuple(devices)

    def device_name(d: int) -> str:
        return names[d] if d >= 0 else ""

    resources = tuple(ResourceRecord(name=r.name, device=device_name(r.device), kind=r.kind,
                                     policy=r.policy, capacity=r.capacity)
                      for r in tasks.resources)  # fmt: skip
    busy = {r.name: b for r, b in zip(resources, replay.busy_s, strict=True)}
    idle = {r.name: r.capacity * step - busy[r.name] for r in resources}
    memory = _memory(tasks, replay, len(names), allocations)
    peak = {names[d]: memory[d][0] for d in range(len(names))}
    return SimResult(
        step_time_s=step,
        dependency_bound_s=longest_path_s(tasks),
        exposed_comm_s=_exposed_comm_s(tasks, replay),
        events=replay.events,
        devices=names,
        resources=resources,
        busy_s=MappingProxyType(busy),
        idle_s=MappingProxyType(idle),
        memory_capacity_bytes=memory_capacity_bytes,
        peak_memory_bytes=MappingProxyType(peak),
        peak_op=MappingProxyType({names[d]: memory[d][1] for d in range(len(names))}),
        oom=MappingProxyType({name: memory_capacity_bytes is not None
                              and peak[name] > memory_capacity_bytes for name in names}),
        memory_timeline=MappingProxyType({names[d]: memory[d][2] for d in range(len(names))}),
        critical_path=_critical_path(tasks, replay),
        tasks=TaskRecords(tasks, replay, names),
        dependencies=Dependencies(tasks.successors),
        wall_s=wall_s,
    )


def _critical_path(tasks: TaskGraph, replay: Replay) -> PathSteps:
    """Walk back from the last finish (ties: the lowest task index) through ``fixed_by``."""
    if not len(tasks):
        return PathSteps([], tasks, replay)
    end = replay.end_s
    t = end.index(max(end))  # the last finish; ties: the lowest index
    fixed_by = replay.fixed_by
    if tasks.is_chain():  # each task fixed by the one before it: the walk, in C
        return PathSteps(list(range(t + 1)), tasks, replay)
    chain = []
    while t >= 0:
        chain.append(t)
        t = fixed_by[t]
    chain.reverse()
    return PathSteps(chain, tasks, replay)


class PathSteps(_MadeWhenRead, Sequence[PathStep]):
    """The realised critical path as :class:`PathStep` s, made when read: a read-only sequence
    that equals the tuple of the same steps (on one device the path of a million-op step is a
    million steps, which a summary never reads)."""

    __slots__ = ("_by_resource", "_category", "_chain", "_end", "_label", "_start")

    def __init__(self, chain: list[int], tasks: TaskGraph, replay: Replay) -> None:
        self._chain = chain
        self._label, self._category = list(tasks.label), list(tasks.category)
        self._start, self._end = replay.start_s, replay.end_s
        self._by_resource = replay.by_resource

    def __len__(self) -> int:
        return len(self._chain)

    def _item(self, k: int) -> PathStep:
        chain = self._chain
        t = chain[k]
        start = self._start[t]
        return PathStep(name=self._label[t], category=self._category[t], start_s=start,
                        end_s=self._end[t],
                        wait_s=start - (self._end[chain[k - 1]] if k else 0.0),
                        via="start" if k == 0 else "resource" if self._by_resource[t]
                        else "dependency")

    def __repr__(self) -> str:
        return f"PathSteps({len(self)} steps)"


_first = operator.itemgetter(0)



def _merge(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of intervals, as sorted disjoint intervals (empty ones dropped)."""
    merged: list[tuple[float, float]] = []
    for a, b in sorted(intervals):
        if b <= a:
            continue
        if merged and a <= merged[-1][1]:
            if b > merged[-1][1]:
                merged[-1] = (merged[-1][0], b)
        else:
            merged.append((a, b))
    return merged


def _subtract(spans: list[tuple[float, float]],
              holes: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """``spans`` minus ``holes``, both sorted and disjoint."""
    out = []
    k = 0
    for a, b in spans:
        while k < len(holes) and holes[k][1] <= a:
            k += 1
        j = k
        while a < b and j < len(holes) and holes[j][0] < b:
            if holes[j][0] > a:
                out.append((a, holes[j][0]))
            a = max(a, holes[j][1])
            j += 1
        if a < b:
            out.append((a, b))
    return out


def _exposed_comm_s(tasks: TaskGraph, replay: Replay) -> float:
    if "comm" not in tasks.category:
        return 0.0  # nothing to expose (one device, no transfers)
    comm: dict[int, list[tuple[float, float]]] = {}
    compute: dict[int, list[tuple[float, float]]] = {}
    for t in range(len(tasks)):
        span = (replay.start_s[t], replay.end_s[t])
        if tasks.category[t] == "comm":
            comm.setdefault(tasks.device[t], []).append(span)
        for x in tasks.needs[t]:
            r = tasks.resources[x]
            if r.kind == "compute":
                compute.setdefault(r.device, []).append(span)
    exposed = []
    for d in sorted(comm):
        exposed += _subtract(_merge(comm[d]), _merge(compute.get(d, [])))
    return math.fsum(b - a for a, b in _merge(exposed))


_size_of = operator.attrgetter("size_bytes")
_device_of = operator.attrgetter("device")
_at_of = operator.attrgetter("at_task")
_until_of = operator.attrgetter("until_tasks")


def _memory(tasks: TaskGraph, replay: Replay, num_devices: int,
            allocations: Sequence[Allocation]) -> list[tuple[int, str | None, tuple]]:
    """Per device: (peak bytes, the task whose allocation reached it, the timeline).

    Each allocation is a change at its task's start (phase 1) and, if it is freed, one at the
    latest end of its ``until_tasks`` (phase 0; phase 2 when that is not after it was made: it
    counts at that instant, after the allocations). Changes apply in order of (time, phase,
    allocation); the timeline has the level after each instant (and, where a buffer was freed
    the instant it was made, the level before those frees). The changes are sorted and added
    up in numpy when every level fits in 64 bits, else in Python (:func:`_memory_slowly`)."""
    if isinstance(allocations, Allocations):  # columns already
        sizes, devices = allocations.size_bytes, allocations.device
        at_tasks, until = allocations.at_task, allocations.until_tasks
    else:
        sizes, devices = list(map(_size_of, allocations)), list(map(_device_of, allocations))
        at_tasks, until = list(map(_at_of, allocations)), list(map(_until_of, allocations))
    if sum(map(abs, sizes)) >= 2**62:
        return _memory_slowly(tasks, replay, num_devices, allocations)
    size = numpy.array(sizes, dtype=numpy.int64)
    device = numpy.array(devices, dtype=numpy.int64)
    at_task = numpy.array(at_tasks, dtype=numpy.int64)
    counts = numpy.array(list(map(len, until)), dtype=numpy.int64)
    live = size != 0
    resident = [0] * num_devices
    held = live & (at_task < 0)
    for d, b in zip(device[held].tolist(), size[held].tolist(), strict=True):
        resident[d] += b
    # When each is made (task -1 picks the 0.0 appended: resident from the start).
    at = numpy.array([*replay.start_s, 0.0], dtype=numpy.float64)[at_task]
    made = numpy.flatnonzero(live & (at_task >= 0))
    freed = numpy.flatnonzero(live & (counts > 0))
    free = numpy.empty(0, dtype=numpy.float64)
    if len(freed):  # the latest end of each freed one's until_tasks
        ends = numpy.array(replay.end_s, dtype=numpy.float64)
        flat = numpy.fromiter(itertools.chain.from_iterable(map(until.__getitem__,
                                                                freed.tolist())),
                              dtype=numpy.int64)
        first = numpy.r_[0, numpy.cumsum(counts[freed])[:-1]]
        free = numpy.maximum.reduceat(ends[flat], first)
    time = numpy.r_[at[made], free]
    phase = numpy.r_[numpy.ones(len(made), dtype=numpy.int64),
                     numpy.where(free <= at[freed], 2, 0)]
    k = numpy.r_[made, freed]
    delta = numpy.r_[size[made], -size[freed]]
    task = numpy.r_[at_task[made], numpy.full(len(freed), -1, dtype=numpy.int64)]
    dev = numpy.r_[device[made], device[freed]]
    # (device, time, phase, allocation) is unique per change: one order. Phase and allocation
    # sort as one int, and one device needs no device key: fewer passes, the same order.
    minor = phase * (len(size) + 1) + k
    order = numpy.lexsort((minor, time) if num_devices == 1 else (minor, time, dev))
    time, phase, delta, task, dev = time[order], phase[order], delta[order], task[order], \
        dev[order]
    bounds = numpy.searchsorted(dev, numpy.arange(num_devices + 1))
    levels = [_levels(resident[d], time[a:b], phase[a:b], delta[a:b], task[a:b])
              for d, (a, b) in enumerate(itertools.pairwise(bounds.tolist()))]
    if any(level is None for level in levels):  # a level below 0: hand-made allocations
        return _memory_slowly(tasks, replay, num_devices, allocations)
    return [(peak, tasks.label[t] if t >= 0 else None, timeline)
            for peak, t, timeline in levels]  # type: ignore[misc]


def _levels(resident: int, time: Any, phase: Any, delta: Any, task: Any
            ) -> tuple[int, int, tuple] | None:
    """One device's (peak, the task whose allocation first reached it or -1, timeline) from
    its changes in order (numpy arrays), or None if a level goes below 0."""
    if not len(time):
        return resident, -1, ((0.0, resident),)
    level = numpy.cumsum(delta) + resident
    if int(level.min()) < 0:
        return None
    top = int(level.max())
    peak, peak_task = resident, -1
    if top > resident:  # the first change that reached the highest level: an allocation
        peak, peak_task = top, int(task[int(level.argmax())])
    # An instant is a run of equal times; within it phases 0, 1, 2 follow each other. Its
    # points: the level after it, and before that the level before its phase-2 frees when
    # it also made something.
    first = numpy.flatnonzero(numpy.r_[True, time[1:] != time[:-1]])
    last = numpy.r_[first[1:] - 1, len(time) - 1]
    highs = numpy.flatnonzero((phase[1:] == 2) & (phase[:-1] == 1) & (time[1:] == time[:-1]))
    points = numpy.sort(numpy.r_[last, highs])
    instant = numpy.searchsorted(first, points, side="right") - 1
    times = time[first[instant]].tolist()
    head = [] if times[0] == 0.0 else [(0.0, resident)]
    return peak, peak_task, (*head, *zip(times, level[points].tolist(), strict=True))


def _memory_slowly(tasks: TaskGraph, replay: Replay, num_devices: int,
                   allocations: Sequence[Allocation]) -> list[tuple[int, str | None, tuple]]:
    """:func:`_memory` one change at a time, in Python's ints."""
    resident = [0] * num_devices
    changes: list[list[tuple[float, int, int, int, int]]] = [[] for _ in range(num_devices)]
    start_s, end_of = replay.start_s, replay.end_s.__getitem__
    for k, a in enumerate(allocations):
        size = a.size_bytes
        if size == 0:
            continue
        task, mine = a.at_task, changes[a.device]
        if task < 0:
            resident[a.device] += size
            at = 0.0
        else:
            at = start_s[task]
            mine.append((at, 1, k, size, task))
        if a.until_tasks:
            free = max(map(end_of, a.until_tasks))
            # Freed the instant it is made: count it at that instant, after the allocations.
            mine.append((free, 2 if free <= at else 0, k, -size, -1))
    out = []
    for d in range(num_devices):
        current = peak = resident[d]
        peak_task = -1
        timeline = [(0.0, current)]
        for time_s, group in itertools.groupby(sorted(changes[d]), key=_first):
            high = -1  # the level after this instant's allocations, before instant frees
            for _, phase, _, delta, task in group:
                current += delta
                if phase == 1:
                    high = current
                if current > peak:
                    peak, peak_task = current, task
            if timeline[-1][0] == time_s:
                timeline.pop()  # the resident point at 0, when something happens at 0
            if high > current:  # a buffer freed the instant it was made: show its high too
                timeline.append((time_s, high))
            timeline.append((time_s, current))
        out.append((peak, tasks.label[peak_task] if peak_task >= 0 else None, tuple(timeline)))
    return out
