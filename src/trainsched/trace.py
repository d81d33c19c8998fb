"""Chrome trace files (JSON that ui.perfetto.dev and chrome://tracing open): the one writer.

The simulator's predicted steps (:mod:`trainsched.sim.trace`) and the runtime's measured
timelines (:mod:`trainsched.comm.timeline`) are both written here, so a prediction and a
measurement open side by side with the same layout:

- one process per device or rank, ``pid`` = 1 + its index, named by ``M process_name`` and
  ordered by ``M process_sort_index``; a process's own events (its name, its counters) use
  ``tid = pid``, as Perfetto assumes;
- one thread per stream, named ``<process>/<stream>`` (:func:`stream_name`): ``gpu0/compute``
  and ``gpu0/channel`` in a simulation, ``rank0/compute`` in a measured run; thread ids are
  unique in the trace and above every pid, named by ``M thread_name`` and ordered by
  ``M thread_sort_index`` = tid;
- slices on one thread must nest, so a stream whose slices overlap puts each on a lane thread
  (``<name> (lane 2)``, :func:`lane_name`), the lowest lane free at its start
  (:func:`assign_lanes`);
- ``X`` slices with ``ts`` and ``dur`` in µs rounded to the ns (:func:`to_us`).

Output is byte-stable: events sorted by (pid, tid, ts, emission order), ``json.dumps`` with
sorted keys and no spaces, NaN refused; a ``.gz`` path is gzip-compressed with a zero mtime; the
file is written atomically. Plain Python: no torch here.
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from trainsched import __version__
from trainsched.errors import TrainschedError
from trainsched.graph.io import atomic_write_bytes

__all__ = [
    "DISPLAY_TIME_UNIT",
    "TraceEvents",
    "assign_lanes",
    "lane_name",
    "stream_name",
    "to_us",
    "trace_document",
    "trace_text",
    "write_trace_text",
]

DISPLAY_TIME_UNIT = "ms"


def to_us(time_s: float) -> float:
    """Seconds to trace microseconds at nanosecond precision."""
    return round(time_s * 1e6, 3)


def stream_name(process: str, stream: str) -> str:
    """The thread name of ``stream`` (``compute``, ``channel``, ...) of device or rank
    ``process``."""
    return f"{process}/{stream}"


def lane_name(name: str, lane: int) -> str:
    """The name of lane ``lane`` (0 is the thread itself) of thread ``name``."""
    return name if lane == 0 else f"{name} (lane {lane + 1})"


def assign_lanes(spans: Iterable[tuple[float, float]]) -> list[int]:
    """The lane of each (start, end) span, taken in the order given (sort them by start
    first): the lowest lane whose last span ended by the start, else a new lane."""
    lane_end: list[float] = []
    lanes = []
    for start, end in spans:
        lane = next((k for k, free in enumerate(lane_end) if free <= start), len(lane_end))
        if lane == len(lane_end):
            lane_end.append(end)
        else:
            lane_end[lane] = end
        lanes.append(lane)
    return lanes


class TraceEvents:
    """The events of one trace, collected in any order and listed sorted by (pid, tid, ts,
    emission order)."""

    def __init__(self) -> None:
        self._events: list[tuple[tuple[int, int, float, int], dict[str, Any]]] = []

    def emit(self, pid: int, tid: int, ts: float, event: dict[str, Any]) -> None:
        """Add ``event`` (a dict with ``ph`` and its fields) at ``ts`` µs on (pid, tid)."""
        event.update(pid=pid, tid=tid, ts=ts)
        self._events.append(((pid, tid, ts, len(self._events)), event))

    def process(self, pid: int, name: str) -> None:
        """Name process ``pid`` and order it by its pid."""
        self.emit(pid, pid, 0.0, {"ph": "M", "name": "process_name", "args": {"name": name}})
        self.emit(pid, pid, 0.0, {"ph": "M", "name": "process_sort_index",
                                  "args": {"sort_index": pid}})

    def thread(self, pid: int, tid: int, name: str) -> None:
        """Name thread ``tid`` of process ``pid`` and order it by its tid."""
        self.emit(pid, tid, 0.0, {"ph": "M", "name": "thread_name", "args": {"name": name}})
        self.emit(pid, tid, 0.0, {"ph": "M", "name": "thread_sort_index",
                                  "args": {"sort_index": tid}})

    def slice(self, pid: int, tid: int, *, name: str, cat: str, start_s: float, end_s: float,
              args: dict[str, Any]) -> None:
        """An ``X`` slice from ``start_s`` to ``end_s`` (seconds; never a negative duration)."""
        ts = to_us(start_s)
        self.emit(pid, tid, ts, {"ph": "X", "name": name, "cat": cat,
                                 "dur": round(max(0.0, to_us(end_s) - ts), 3), "args": args})

    def sorted_events(self) -> list[dict[str, Any]]:
        """The events in trace order."""
        return [event for _, event in sorted(self._events, key=lambda item: item[0])]


def trace_document(events: TraceEvents, *, title: str,
                   other: Mapping[str, Any]) -> dict[str, Any]:
    """The trace as a dict: ``{"traceEvents", "displayTimeUnit", "otherData"}``, where
    ``otherData`` holds the title, trainsched's version and ``other`` (which may override
    them)."""
    return {"traceEvents": events.sorted_events(), "displayTimeUnit": DISPLAY_TIME_UNIT,
            "otherData": {"title": title, "version": __version__, **dict(other)}}


def trace_text(document: Mapping[str, Any], *, what: str = "trace meta is") -> str:
    """The trace as byte-stable JSON text; what JSON cannot hold is a TrainschedError that
    starts with ``what`` (the caller's words for where it came from)."""
    try:
        return json.dumps(document, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise TrainschedError(f"{what} not JSON-serialisable: {exc}") from None


def write_trace_text(path: str | os.PathLike[str], text: str) -> None:
    """Write trace text to ``path`` atomically; gzip-compressed when the name ends in ``.gz``."""
    path = Path(path)
    data = text.encode("utf-8")
    if path.name.endswith(".gz"):
        data = gzip.compress(data, mtime=0)
    atomic_write_bytes(path, data)
