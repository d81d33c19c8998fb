"""A measured run as a Chrome trace: the runtime's timeline (``specs/comm.md`` §12).

The same family as the simulator's traces (:mod:`trainsched.sim.trace`): ``X`` slices with
``ts``/``dur`` in µs, ``M`` metadata naming the process and its threads, sorted events and
byte-stable JSON. One file per rank; ``pid`` is 1 + the rank. Tracks (threads):

- ``compute``: ``FWD`` and ``BWD`` per layer (a module owning parameters), in the training
  thread;
- ``update``: ``UPDATE`` per parameter (the per-parameter optimizer step, in the dispatcher
  thread, which runs beside compute), and ``SWITCH`` (zero length) where the policy changed
  (``args``: the new policy's fields);
- ``comm/<parameter>``: per collective, ``QUEUE`` (ready → issued) and ``COMM`` (issued →
  done). Overlapping slices of one track go on lanes (``comm/<parameter> (lane 2)``), the lowest
  free lane first, so slices on a thread always nest.

Every slice's ``args`` hold ``phase`` (its kind), ``step`` and what it concerns (``layer``,
``param``, ``task``, ``bytes``), which is what tests and tools read.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainsched import __version__
from trainsched.errors import TrainschedError
from trainsched.graph import atomic_write_bytes

__all__ = ["PHASES", "Span", "timeline_json", "timeline_trace", "write_timeline"]

PHASES = ("FWD", "BWD", "UPDATE", "QUEUE", "COMM", "WAIT", "SWITCH")


@dataclass(frozen=True)
class Span:
    """One measured interval: ``phase`` (one of :data:`PHASES`) on ``track`` from ``start_s``
    to ``end_s`` (seconds since the run's origin), labelled ``label`` (a layer, a parameter or
    a collective)."""

    track: str
    phase: str
    label: str
    start_s: float
    end_s: float
    step: int
    args: Mapping[str, Any] = field(default_factory=dict)


def _us(time_s: float) -> float:
    return round(time_s * 1e6, 3)


def _track_key(track: str) -> tuple[int, str]:
    rank = {"compute": 0, "update": 1}.get(track, 2)
    return rank, track


def timeline_trace(spans: Iterable[Span], *, rank: int, title: str = "trainsched run",
                   meta: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The trace of one rank as a dict (``traceEvents``, ``displayTimeUnit``, ``otherData``)."""
    pid = rank + 1
    by_track: dict[str, list[Span]] = {}
    for s in spans:
        if s.phase not in PHASES:
            raise TrainschedError(f"unknown timeline phase {s.phase!r}")
        by_track.setdefault(s.track, []).append(s)
    events: list[tuple[tuple[int, float, int], dict[str, Any]]] = []

    def emit(tid: int, ts: float, event: dict[str, Any]) -> None:
        event.update(pid=pid, tid=tid, ts=ts)
        events.append(((tid, ts, len(events)), event))

    emit(pid, 0.0, {"ph": "M", "name": "process_name", "args": {"name": f"rank {rank}"}})
    emit(pid, 0.0, {"ph": "M", "name": "process_sort_index", "args": {"sort_index": pid}})
    tid = pid + 1
    for track in sorted(by_track, key=_track_key):
        items = sorted(by_track[track], key=lambda s: (s.start_s, s.end_s, s.phase, s.label))
        lane_end: list[float] = []
        lanes: list[int] = []
        for s in items:
            lane = next((k for k, end in enumerate(lane_end) if end <= s.start_s),
                        len(lane_end))
            if lane == len(lane_end):
                lane_end.append(s.end_s)
            else:
                lane_end[lane] = s.end_s
            lanes.append(lane)
        for lane in range(len(lane_end)):
            name = track if lane == 0 else f"{track} (lane {lane + 1})"
            emit(tid + lane, 0.0, {"ph": "M", "name": "thread_name", "args": {"name": name}})
            emit(tid + lane, 0.0, {"ph": "M", "name": "thread_sort_index",
                                   "args": {"sort_index": tid + lane}})
        for s, lane in zip(items, lanes, strict=True):
            ts = _us(s.start_s)
            args = {"phase": s.phase, "step": s.step, **dict(s.args)}
            emit(tid + lane, ts, {"ph": "X", "name": f"{s.phase} {s.label}", "cat": s.phase,
                                  "dur": round(max(0.0, _us(s.end_s) - ts), 3), "args": args})
        tid += len(lane_end)
    events.sort(key=lambda item: item[0])
    other = {"title": title, "version": __version__, "rank": rank, **dict(meta or {})}
    return {"traceEvents": [e for _, e in events], "displayTimeUnit": "ms", "otherData": other}


def timeline_json(spans: Iterable[Span], *, rank: int, title: str = "trainsched run",
                  meta: Mapping[str, Any] | None = None) -> str:
    """The trace as byte-stable JSON text."""
    trace = timeline_trace(spans, rank=rank, title=title, meta=meta)
    try:
        return json.dumps(trace, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise TrainschedError(f"timeline args are not JSON-serialisable: {exc}") from None


def write_timeline(path: str | os.PathLike[str], spans: Iterable[Span], *, rank: int,
                   title: str = "trainsched run", meta: Mapping[str, Any] | None = None) -> None:
    """Write one rank's trace to ``path`` (its directory must exist)."""
    data = timeline_json(spans, rank=rank, title=title, meta=meta).encode("utf-8")
    atomic_write_bytes(Path(path), data)
