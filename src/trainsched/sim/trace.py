"""A simulated step as a Chrome trace (JSON) that ui.perfetto.dev and chrome://tracing open.

Written by the one trace writer, :mod:`trainsched.trace`, in its layout: one process per device,
one thread per resource (its compute stream, its channel or its outgoing links) and one ``X``
slice per task and resource it holds, with ``cat`` = the op kind or ``comm`` and the task's args
(op, bytes, tensor, ...). A transfer on sequential channels shows on the sender's and the
receiver's channel. A resource that runs overlapping tasks (capacity > 1, or tasks that need no
resource, shown on a ``tasks`` thread of their device) puts each on a lane thread, always the
lowest free lane. Every dependency between tasks on different threads is a flow arrow (``s`` on
the earlier task's slice, ``f`` bound to the later one's), e.g. producer → transfer → consumer.
``C`` counters show each device's memory over time. Equal results give byte-identical files.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from trainsched.sim.result import SimResult, TaskRecord
from trainsched.trace import (
    TraceEvents,
    assign_lanes,
    lane_name,
    stream_name,
    to_us,
    trace_document,
    trace_text,
    write_trace_text,
)

__all__ = ["chrome_trace", "trace_json", "write_trace"]

DEFAULT_TITLE = "trainsched simulation"


def _lanes(spans: list[tuple[float, float, int]]) -> dict[int, int]:
    """Task -> lane: spans (start, end, task) by start, then task, take the lowest free lane."""
    order = sorted(spans, key=lambda span: (span[0], span[2]))
    lanes = assign_lanes((start, end) for start, end, _ in order)
    return {task: lane for (_, _, task), lane in zip(order, lanes, strict=True)}


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

    events = TraceEvents()
    pids = sorted(set(thread_pid.values()) | set(pid_of.values()) - {pid_of[""]})
    for pid in pids:
        events.process(pid, result.devices[pid - 1] if pid <= len(result.devices) else "global")
    next_tid = pid_of[""] + 1
    where: dict[tuple[int, str], tuple[int, int]] = {}  # (task, thread) -> (pid, tid)
    for name, spans in threads.items():
        pid = thread_pid[name]
        lane_of = _lanes(spans)
        lanes = max(lane_of.values(), default=0) + 1
        for lane in range(lanes):
            events.thread(pid, next_tid + lane, lane_name(name, lane))
        for start, end, t in spans:
            rec = result.tasks[t]
            tid = next_tid + lane_of[t]
            where[t, name] = (pid, tid)
            events.slice(pid, tid, name=rec.name, cat=rec.category or "task", start_s=start,
                         end_s=end, args=dict(rec.args))
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
        events.emit(pa, ta, _middle_us(result.tasks[a]), {"ph": "s", **common})
        events.emit(pb, tb, _middle_us(result.tasks[b]), {"ph": "f", "bp": "e", **common})

    for name, timeline in result.memory_timeline.items():
        pid = pid_of[name]
        for time_s, size in timeline:
            events.emit(pid, pid, to_us(time_s), {"ph": "C", "name": "memory",
                                                  "args": {"bytes": size}})

    return trace_document(events, title=title, other={
        "devices": list(result.devices), "step_time_s": result.step_time_s, **dict(meta or {})})


def _free_thread(device: str) -> str:
    """The thread of tasks that hold no resource."""
    return stream_name(device, "tasks") if device else "tasks"


def _thread_of(rec: TaskRecord, last: bool) -> str:
    """The thread a flow leaves a task from (its last resource) or enters it on (its first)."""
    if rec.resources:
        return rec.resources[-1 if last else 0]
    return _free_thread(rec.device)


def _middle_us(rec: TaskRecord) -> float:
    start = to_us(rec.start_s)
    return round(start + (to_us(rec.end_s) - start) / 2, 3)


def trace_json(result: SimResult, *, title: str = DEFAULT_TITLE,
               meta: Mapping[str, Any] | None = None) -> str:
    """The trace as byte-stable JSON text."""
    return trace_text(chrome_trace(result, title=title, meta=meta), what="trace meta is")


def write_trace(path: str | os.PathLike[str], result: SimResult, *, title: str = DEFAULT_TITLE,
                meta: Mapping[str, Any] | None = None) -> None:
    """Write the trace to ``path`` atomically; gzip-compressed when the name ends in ``.gz``."""
    write_trace_text(path, trace_json(result, title=title, meta=meta))
