"""The one Chrome-trace writer (trainsched.trace) and the layout simulated and measured traces
share."""

from __future__ import annotations

import gzip
import json

import pytest

from trainsched import __version__
from trainsched.comm.timeline import Span, timeline_trace, write_timeline
from trainsched.errors import TrainschedError
from trainsched.graph import Graph, Op
from trainsched.sim import chrome_trace, simulate_single
from trainsched.trace import (
    TraceEvents,
    assign_lanes,
    lane_name,
    stream_name,
    trace_document,
    trace_text,
    write_trace_text,
)


def test_assign_lanes_takes_the_lowest_lane_free_at_the_start():
    spans = [(0, 2), (1, 3), (2, 4), (3, 5), (3, 4)]
    # (0,2) lane 0; (1,3) lane 1; (2,4) lane 0 again (free at 2); (3,5) lane 1 (free at 3);
    # (3,4) finds both busy: a third lane.
    assert assign_lanes(spans) == [0, 1, 0, 1, 2]


def test_lane_names_number_lanes_from_one_and_leave_the_first_unmarked():
    assert [lane_name("gpu0/channel", k) for k in range(3)] == [
        "gpu0/channel", "gpu0/channel (lane 2)", "gpu0/channel (lane 3)"]


def test_stream_names_put_the_process_first():
    assert stream_name("gpu3", "compute") == "gpu3/compute"


def test_events_are_listed_by_pid_tid_time_then_emission():
    events = TraceEvents()
    events.emit(2, 3, 0.0, {"ph": "i", "name": "a"})
    events.emit(1, 5, 7.0, {"ph": "i", "name": "b"})
    events.emit(1, 5, 7.0, {"ph": "i", "name": "c"})
    events.emit(1, 4, 9.0, {"ph": "i", "name": "d"})
    events.emit(1, 5, 1.0, {"ph": "i", "name": "e"})
    assert [e["name"] for e in events.sorted_events()] == ["d", "e", "b", "c", "a"]


def test_slices_are_in_microseconds_rounded_to_the_nanosecond():
    events = TraceEvents()
    events.slice(1, 2, name="op", cat="forward", start_s=0.0012345678, end_s=0.0022345678,
                 args={})
    (event,) = events.sorted_events()
    assert (event["ts"], event["dur"]) == (1234.568, 1000.0)


def test_a_slice_that_ends_before_it_starts_has_zero_duration():
    events = TraceEvents()
    events.slice(1, 2, name="op", cat="forward", start_s=2.0, end_s=1.0, args={})
    assert events.sorted_events()[0]["dur"] == 0.0


def test_process_and_thread_names_come_with_their_sort_index():
    events = TraceEvents()
    events.process(3, "gpu2")
    events.thread(3, 9, "gpu2/compute")
    assert events.sorted_events() == [
        {"ph": "M", "name": "process_name", "args": {"name": "gpu2"}, "pid": 3, "tid": 3,
         "ts": 0.0},
        {"ph": "M", "name": "process_sort_index", "args": {"sort_index": 3}, "pid": 3, "tid": 3,
         "ts": 0.0},
        {"ph": "M", "name": "thread_name", "args": {"name": "gpu2/compute"}, "pid": 3, "tid": 9,
         "ts": 0.0},
        {"ph": "M", "name": "thread_sort_index", "args": {"sort_index": 9}, "pid": 3, "tid": 9,
         "ts": 0.0},
    ]


def test_the_document_holds_title_version_and_the_callers_fields():
    doc = trace_document(TraceEvents(), title="t", other={"rank": 2})
    assert doc == {"traceEvents": [], "displayTimeUnit": "ms",
                   "otherData": {"title": "t", "version": __version__, "rank": 2}}


def test_trace_text_is_compact_with_sorted_keys():
    assert trace_text({"b": 1, "a": [1, {"d": 2, "c": 3}]}) == '{"a":[1,{"c":3,"d":2}],"b":1}'


def test_trace_text_refuses_nan_in_the_callers_words():
    with pytest.raises(TrainschedError, match=r"^timeline args are not JSON-serialisable"):
        trace_text({"a": float("nan")}, what="timeline args are")


def test_a_gz_path_gets_the_text_gzipped_with_stable_bytes(tmp_path):
    first, second = tmp_path / "a.json.gz", tmp_path / "b.json.gz"
    write_trace_text(first, '{"x":1}')
    write_trace_text(second, '{"x":1}')
    assert first.read_bytes() == second.read_bytes()  # zero mtime: no timestamp inside
    assert gzip.decompress(first.read_bytes()) == b'{"x":1}'


def test_a_plain_path_gets_the_text_as_is(tmp_path):
    path = tmp_path / "a.json"
    write_trace_text(path, '{"x":1}')
    assert path.read_bytes() == b'{"x":1}'


def _names(trace: dict, kind: str) -> dict[int, str]:
    return {e["tid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == kind}


def test_simulated_and_measured_traces_name_the_compute_stream_alike():
    graph = Graph([Op(name="a", compute_s=1e-3)], [])
    simulated = chrome_trace(simulate_single(graph, allow_forward_only=True))
    span = Span(track="compute", phase="FWD", label="a", start_s=0.0, end_s=1e-3, step=0)
    measured = timeline_trace([span], rank=0)
    # Device 0 and rank 0 are both process 1, whose compute thread is "<process>/compute".
    assert _names(simulated, "process_name") == {1: "device0"}
    assert _names(measured, "process_name") == {1: "rank0"}
    assert "device0/compute" in _names(simulated, "thread_name").values()
    assert list(_names(measured, "thread_name").values()) == ["rank0/compute"]


def test_a_measured_trace_puts_overlapping_collectives_on_lanes():
    spans = [Span(track="comm/w", phase="COMM", label="w", start_s=0.0, end_s=2.0, step=1),
             Span(track="comm/w", phase="COMM", label="w", start_s=1.0, end_s=3.0, step=1)]
    threads = _names(timeline_trace(spans, rank=1), "thread_name")
    assert sorted(threads.values()) == ["rank1/comm/w", "rank1/comm/w (lane 2)"]


def test_write_timeline_gzips_a_gz_path(tmp_path):
    span = Span(track="compute", phase="FWD", label="a", start_s=0.0, end_s=1e-3, step=0)
    write_timeline(tmp_path / "rank0.trace.json.gz", [span], rank=0)
    doc = json.loads(gzip.decompress((tmp_path / "rank0.trace.json.gz").read_bytes()))
    assert [e["name"] for e in doc["traceEvents"] if e["ph"] == "X"] == ["FWD a"]
