"""A measured run as a Chrome trace: the runtime's timeline (``specs/comm.md`` §12).

Written by the one trace writer, :mod:`trainsched.trace`, so it has the simulator's layout
(:mod:`trainsched.sim.trace`): one file per rank, whose process ``rank<r>`` has ``pid`` 1 + r,
and one thread per track named ``rank<r>/<track>``, as a simulated device ``gpu0`` has
``gpu0/compute``. Tracks:

- ``compute``: ``FWD`` and ``BWD`` per layer (a module owning parameters), in the training
  thread (the simulator's compute stream);
- ``update``: ``UPDATE`` per parameter (the per-parameter optimizer step, in the dispatcher
  thread, which runs beside compute), and ``SWITCH`` (zero length) where the policy changed
  (``args``: the new policy's fields);
- ``comm/<parameter>``: per collective, ``QUEUE`` (ready → issued) and ``COMM`` (issued →
  done). Overlapping slices of one track go on lanes (``rank0/comm/<parameter> (lane 2)``), the
  lowest free lane first, so slices on a thread always nest.

Every slice's ``args`` hold ``phase`` (its kind), ``step`` and what it concerns (``layer``,
``param``, ``task``, ``bytes``), which is what tests and tools read.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from trainsched.errors import TrainschedError
from trainsched.trace import (
    TraceEvents,
    assign_lanes,
    lane_name,
    stream_name,
    trace_document,
    trace_text,
    write_trace_text,
)

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


def _track_key(track: str) -> tuple[int, str]:
    rank = {"compute": 0, "update": 1}.get(track, 2)
    return rank, track


def timeline_trace(spans: Iterable[Span], *, rank: int, title: str = "trainsched run",
                   meta: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The trace of one rank as a dict (``traceEvents``, ``displayTimeUnit``, ``otherData``)."""
    pid = rank + 1
    process = f"rank{rank}"
    by_track: dict[str, list[Span]] = {}
    for s in spans:
        if s.phase not in PHASES:
            raise TrainschedError(f"unknown timeline phase {s.phase!r}")
        by_track.setdefault(s.track, []).append(s)
    events = TraceEvents()
    events.process(pid, process)
    tid = pid + 1
    for track in sorted(by_track, key=_track_key):
        items = sorted(by_track[track], key=lambda s: (s.start_s, s.end_s, s.phase, s.label))
        lanes = assign_lanes((s.start_s, s.end_s) for s in items)
        for lane in range(max(lanes) + 1):
            events.thread(pid, tid + lane, lane_name(stream_name(process, track), lane))
        for s, lane in zip(items, lanes, strict=True):
            events.slice(pid, tid + lane, name=f"{s.phase} {s.label}", cat=s.phase,
                         start_s=s.start_s, end_s=s.end_s,
                         args={"phase": s.phase, "step": s.step, **dict(s.args)})
        tid += max(lanes) + 1
    return trace_document(events, title=title, other={"rank": rank, **dict(meta or {})})


def timeline_json(spans: Iterable[Span], *, rank: int, title: str = "trainsched run",
                  meta: Mapping[str, Any] | None = None) -> str:
    """The trace as byte-stable JSON text."""
    return trace_text(timeline_trace(spans, rank=rank, title=title, meta=meta),
                      what="timeline args are")


def write_timeline(path: str | os.PathLike[str], spans: Iterable[Span], *, rank: int,
                   title: str = "trainsched run", meta: Mapping[str, Any] | None = None) -> None:
    """Write one rank's trace to ``path`` atomically (its directory must exist);
    gzip-compressed when the name ends in ``.gz``."""
    write_trace_text(path, timeline_json(spans, rank=rank, title=title, meta=meta))
