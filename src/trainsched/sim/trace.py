"""A simulated step as a Chrome trace (JSON) that ui.perfetto.dev and chrome://tracing open.

Layout: one process per device (``M`` ``process_name``), one thread per resource (its compute
stream, its channel or its outgoing links; ``M`` ``thread_name``) and one ``X`` slice per task
and resource it holds, with ``cat`` = the op kind or ``comm`` and the task's args (op, bytes,
tensor, ...). A transfer on sequential channels shows on the sender's and the receiver's channel.
Slices on one thread must nest, so a resource that runs overlapping tasks (capacity > 1, or
tasks that need no resource, shown on a ``tasks`` thread of their device) puts each on a lane
thread, always the lowest free lane. Every dependency between tasks on different threads is a
flow arrow (``s`` on the earlier task's slice, ``f`` bound to the later one's), e.g. producer →
transfer → consumer. ``C`` counters show each device's memory over time.

Byte-identical output for equal results: events sorted by (pid, tid, ts, creation order),
timestamps in µs rounded to ns, ``json.dumps(sort_keys=True, separators=(",", ":"))``; a ``.gz``
path is gzip-compressed with a zero mtime.
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trainsched import __version__
from trainsched.errors import TrainschedError
from trainsched.graph import atomic_write_bytes
from trainsched.sim.result import SimResult, TaskRecord

__all__ = ["chrome_trace", "trace_json", "write_trace"]

DEFAULT_TITLE = "trainsched simulation"


def _us(time_s: float) -> float:
    """Seconds to trace microseconds at nanosecond precision."""
    return round(time_s * 1e6, 3)


def _lanes(spans: list[tuple[float, float, int]]) -> dict[int, int]:
    """Task -> lane: spans (start, end, task) by start, then task, take the lowest free lane."""
    lane_end: list[float] = []
    lane_of = {}
    for start, end, task in sorted(spans, key=lambda span: (span[0], span[2])):
        lane = next((k for k, free in enumerate(lane_end) if free <= start), len(lane_end))
        if lane == len(lane_end):
            lane_end.append(end)
        else:
            lane_end[lane] = end
        lane_of[task] = lane
    return lane_of


def chrome_trace(result: SimResult, *, title: str = DEFAULT_TITLE,
                 meta: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The trace as a dict: ``{"traceEvents", "displayTimeUnit", "otherData"}``.

    Process ids are 1 + the device's index (the last one, "global", holds what belongs to no
    device); a process's own events (its name, its memory counter) use ``tid = pid``, as
    Perfetto assumes; thread ids are unique across the trace and above every pid.
    """
    pid_of = {name: k + 1 for k, name in enumerate(result.devices)}
    pid_of[""] = len(result.devices) + 1  # tasks and resources of no device
    # Threads: each resource in order, then a "tasks" thread per device for resource-free tasks.
    threads: dict[str, list[tuple[float, float, int]]] = {r.name: [] for r in result.resources}
    thread_pid = {r.name: pid_of[r.device] for r in result.resources}
    for t, rec in enumerate(result.tasks):
        for name in rec.resources or (_free_thread(rec.device),):
            if name not in threads:
                threads[name], thread_pid[name] = [], pid_of[rec.device]
            threads[name].append((rec.start_s, rec.end_s, t))

    events: list[tuple[tuple[int, int, float, int], dict[str, Any]]] = []

    def emit(pid: int, tid: int, ts: float, event: dict[str, Any]) -> None:
        event.update(pid=pid, tid=tid, ts=ts)
        events.append(((pid, tid, ts, len(events)), event))

    pids = sorted(set(thread_pid.values()) | set(pid_of.values()) - {pid_of[""]})
    for pid in pids:
        name = result.devices[pid - 1] if pid <= len(result.devices) else "global"
        emit(pid, pid, 0.0, {"ph": "M", "name": "process_name", "args": {"name": name}})
        emit(pid, pid, 0.0, {"ph": "M", "name": "process_sort_index",
                             "args": {"sort_index": pid}})
    next_tid = pid_of[""] + 1
    where: dict[tuple[int, str], tuple[int, int]] = {}  # (task, thread) -> (pid, tid)
    for name, spans in threads.items():
        pid = thread_pid[name]
        lane_of = _lanes(spans)
        lanes = max(lane_of.values(), default=0) + 1
        for lane in range(lanes):
            label = name if lane == 0 else f"{name} (lane {lane + 1})"
            emit(pid, next_tid + lane, 0.0, {"ph": "M", "name": "thread_name",
                                             "args": {"name": label}})
            emit(pid, next_tid + lane, 0.0, {"ph": "M", "name": "thread_sort_index",
                                             "args": {"sort_index": next_tid + lane}})
        for start, end, t in spans:
            rec = result.tasks[t]
            tid = next_tid + lane_of[t]
            where[t, name] = (pid, tid)
            ts = _us(start)
            emit(pid, tid, ts, {"ph": "X", "name": rec.name, "cat": rec.category or "task",
                                "dur": round(_us(end) - ts, 3), "args": dict(rec.args)})
        next_tid += lanes

    # Flow points sit mid-slice, where the slice surely encloses them.
    flow = 0
    for a, b in result.dependencies:
        pa, ta = where[a, _thread_of(result.tasks[a], last=True)]
        pb, tb = where[b, _thread_of(result.tasks[b], last=False)]
        if (pa, ta) == (pb, tb):
            continue
        flow += 1
        common = {"name": "dependency", "cat": "flow", "id": flow}
        emit(pa, ta, _middle_us(result.tasks[a]), {"ph": "s", **common})
        emit(pb, tb, _middle_us(result.tasks[b]), {"ph": "f", "bp": "e", **common})

    for name, timeline in result.memory_timeline.items():
        pid = pid_of[name]
        for time_s, size in timeline:
            emit(pid, pid, _us(time_s), {"ph": "C", "name": "memory", "args": {"bytes": size}})

    events.sort(key=lambda item: item[0])
    other = {"title": title, "version": __version__, "devices": list(result.devices),
             "step_time_s": result.step_time_s, **dict(meta or {})}
    return {"traceEvents": [e for _, e in events], "displayTimeUnit": "ms", "otherData": other}


def _free_thread(device: str) -> str:
    """The thread of tasks that hold no resource."""
    return f"{device}/tasks" if device else "tasks"


def _thread_of(rec: TaskRecord, last: bool) -> str:
    """The thread a flow leaves a task from (its last resource) or enters it on (its first)."""
    if rec.resources:
        return rec.resources[-1 if last else 0]
    return _free_thread(rec.device)


def _middle_us(rec: TaskRecord) -> float:
    start = _us(rec.start_s)
    return round(start + (_us(rec.end_s) - start) / 2, 3)


def trace_json(result: SimResult, *, title: str = DEFAULT_TITLE,
               meta: Mapping[str, Any] | None = None) -> str:
    """The trace as byte-stable JSON text."""
    trace = chrome_trace(result, title=title, meta=meta)
    try:
        return json.dumps(trace, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise TrainschedError(f"trace meta is not JSON-serialisable: {exc}") from None


def write_trace(path: str | os.PathLike[str], result: SimResult, *, title: str = DEFAULT_TITLE,
                meta: Mapping[str, Any] | None = None) -> None:
    """Write the trace to ``path`` atomically; gzip-compressed when the name ends in ``.gz``."""
    path = Path(path)
    data = trace_json(result, title=title, meta=meta).encode("utf-8")
    if path.name.endswith(".gz"):
        data = gzip.compress(data, mtime=0)
    atomic_write_bytes(path, data)
