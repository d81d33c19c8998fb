"""Large graphs (issue 16): the line-by-line reader, the lean simulation results, progress.

The reader of the ``trainsched.graph/1`` writer's layout (:mod:`trainsched.graph.fastread`) must
give exactly the graph
the ordinary reader gives, or step aside so that the ordinary reader words the error; the
single-device simulation must give the step a hand computation gives, the same result however
the graph was read, and the same task records as built one by one. Speed is the benchmark's
(``benchmarks/graph_scale.py``), not a test's.
"""

from __future__ import annotations

import io
import json
import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings

from test_graph_properties import forward_dags
from trainsched.errors import TrainschedError
from trainsched.graph import FORMAT_V1, Edge, Graph, Op, to_training
from trainsched.graph.fastread import read_layout
from trainsched.report.progress import ProgressBar
from trainsched.sim import simulate_single
from trainsched.sim.executors import PHASES


def resnet_like(blocks: int) -> Graph:
    """A forward chain of residual blocks (conv, conv, add with a skip edge), as a training
    graph: every kind of op and edge the training transform makes."""
    ops = [Op(name="stem", compute_s=2e-3, param_bytes=4096, output_bytes=1 << 16,
              saved_bytes=1 << 16, module_path="stem", target="aten.conv2d.default",
              layer_index=0)]
    edges = []
    x = "stem"
    for b in range(blocks):
        c1, c2, add = f"b{b}.conv1", f"b{b}.conv2", f"b{b}.add"
        ops += [Op(name=c1, compute_s=1e-3 + b * 1e-6, flops=2e9, param_bytes=9216,
                   output_bytes=1 << 16, saved_bytes=1 << 16, module_path=f"b{b}",
                   target="aten.conv2d.default", backward_input_flops=2e9, layer_index=2 * b + 1),
                Op(name=c2, compute_s=1e-3, flops=2e9, param_bytes=9216, temp_bytes=512,
                   output_bytes=1 << 16, saved_bytes=1 << 16, module_path=f"b{b}",
                   target="aten.conv2d.default", layer_index=2 * b + 2),
                Op(name=add, compute_s=5e-5, output_bytes=1 << 16, module_path=f"b{b}",
                   target="aten.add.Tensor")]
        edges += [Edge(src=s, dst=d, size_bytes=1 << 16)
                  for s, d in ((x, c1), (c1, c2), (c2, add), (x, add))]
        x = add
    return to_training(Graph(ops, edges, {"model": "resnet-like", "tier": "static"}))


@pytest.fixture(scope="module")
def mid_graph() -> Graph:
    return resnet_like(60)  # 300 ops of four kinds, 600 edges


def test_fast_reader_gives_the_graph_the_ordinary_reader_gives(tmp_path, mid_graph):
    path = tmp_path / "g.json"
    mid_graph.save(path, format=FORMAT_V1)
    fast = read_layout(path)
    assert fast is not None  # the file is in the writer's layout: read line by line
    assert fast == Graph.from_json(path.read_text()) == mid_graph
    assert fast.to_json(format=FORMAT_V1) == path.read_text()
    assert fast.topological_order() == mid_graph.topological_order()


@settings(max_examples=60, deadline=None)
@given(forward_dags())
def test_fast_reader_equals_the_ordinary_reader_on_random_graphs(forward):
    # shuffled listings (the sort runs), grouped ops (lists of member names), training ops
    for graph in (forward, to_training(forward)):
        fd, name = tempfile.mkstemp(suffix=".json")
        os.close(fd)
        try:
            graph.save(name, format=FORMAT_V1)
            fast = read_layout(name)
            text = Path(name).read_text()
        finally:
            os.unlink(name)
        assert fast is not None
        assert fast == Graph.from_json(text) == graph
        assert fast.topological_order() == graph.topological_order()
        assert fast.critical_path() == graph.critical_path()
        assert [fast.in_edges(op.name) for op in graph.ops] == [
            graph.in_edges(op.name) for op in graph.ops]


def test_fast_reader_shares_repeated_strings(tmp_path, mid_graph):
    mid_graph.save(tmp_path / "g.json", format=FORMAT_V1)
    g = read_layout(tmp_path / "g.json")
    convs = [op for op in g.ops if op.target == "aten.conv2d.default"]
    assert len(convs) > 2 and all(op.target is convs[0].target for op in convs)
    dx = g.op("b3.conv1:dX")
    assert dx.forward_op is g.op("b3.conv1").name  # the name object, not a copy
    edge = next(e for e in g.edges if e.src == "b3.conv1")
    assert edge.src is g.op("b3.conv1").name


def test_fast_reader_takes_records_in_other_valid_types(tmp_path):
    text = Graph([Op(name="a", compute_s=1.5), Op(name="b")],
                 [Edge(src="a", dst="b", size_bytes=4)]).to_json(format=FORMAT_V1)
    text = text.replace('"compute_s": 1.5', '"compute_s": 2')  # an int for a float field
    path = tmp_path / "g.json"
    path.write_text(text)
    g = read_layout(path)
    assert g is not None and g.op("a").compute_s == 2.0 and type(g.op("a").compute_s) is float


@pytest.mark.parametrize("edit, message", [
    (lambda t: t.replace('"compute_s": 1.5', '"compute_s": -1.5'),
     "compute_s must be >= 0, got -1.5"),
    (lambda t: t.replace('"kind": "forward"', '"kind": "fwd"', 1), "unknown kind 'fwd'"),
    (lambda t: t.replace('"size_bytes": 4', '"size_bytes": 4,'), "malformed JSON at line"),
    (lambda t: t.replace('"dst": "b"', '"dst": "zz"'), "destination 'zz' is not an op"),
    (lambda t: t.replace('"compute_s": 1.5', '"compute_s": NaN'), "compute_s must be finite"),
])
def test_a_bad_file_gets_the_ordinary_readers_error(tmp_path, edit, message):
    text = edit(Graph([Op(name="a", compute_s=1.5), Op(name="b")],
                      [Edge(src="a", dst="b", size_bytes=4)]).to_json(format=FORMAT_V1))
    path = tmp_path / "g.json"
    path.write_text(text)
    assert read_layout(path) is None  # the line reader steps aside ...
    with pytest.raises(TrainschedError) as load_error:
        Graph.load(path)
    with pytest.raises(TrainschedError) as text_error:
        Graph.from_json(text, source=str(path))
    assert str(load_error.value) == str(text_error.value)  # ... and the error is the same
    assert message in str(load_error.value)


def test_a_hand_written_layout_is_read_the_ordinary_way(tmp_path):
    path = tmp_path / "g.json"
    path.write_text(json.dumps({"format": "trainsched.graph/1",
                                "ops": [{"name": "a"}, {"name": "b"}],
                                "edges": [{"src": "a", "dst": "b", "size_bytes": 1}]}))
    assert read_layout(path) is None
    assert Graph.load(path).topological_order() == ("a", "b")


def test_a_listing_out_of_order_is_still_sorted():
    g = Graph([Op(name="c"), Op(name="a"), Op(name="b")],
              [Edge(src="a", dst="b", size_bytes=1), Edge(src="b", dst="c", size_bytes=1)])
    assert g.topological_order() == ("a", "b", "c")


def test_duplicate_edge_is_named_with_its_first_twin():
    with pytest.raises(TrainschedError, match=r"edges\[1\] and edges\[3\] are duplicates"):
        Graph([Op(name="a"), Op(name="b"), Op(name="c")],
              [Edge(src="a", dst="c", size_bytes=1), Edge(src="a", dst="b", size_bytes=1),
               Edge(src="b", dst="c", size_bytes=1), Edge(src="a", dst="b", size_bytes=2)])


def test_single_device_step_by_hand():
    # f1 -> f2 -> b2 -> w1 and f1 -> w1, on one stream in listing order: 1 + 2 + 3 + 0.5 s.
    # Memory: resident f1's 100 parameter bytes + w1's 100-byte gradient = 200; f1's output
    # (10 B) from 0 to w1's end (6.5), f2's (20 B) from 1 to b2's end (6), b2's (5 B) from 3
    # to 6.5: the peak is 235 B, reached when b2 starts.
    g = Graph([Op(name="f1", compute_s=1.0, param_bytes=100, output_bytes=10),
               Op(name="f2", compute_s=2.0, output_bytes=20),
               Op(name="b2", kind="backward_input", compute_s=3.0, output_bytes=5),
               Op(name="w1", kind="backward_weight", compute_s=0.5, output_bytes=100)],
              [Edge(src="f1", dst="f2", size_bytes=10), Edge(src="f2", dst="b2", size_bytes=20),
               Edge(src="f1", dst="w1", size_bytes=10), Edge(src="b2", dst="w1", size_bytes=5)])
    r = simulate_single(g)
    assert r.step_time_s == 6.5 and r.dependency_bound_s == 6.5
    assert r.peak_memory_bytes == {"device0": 235} and r.peak_op == {"device0": "b2"}
    assert r.memory_timeline["device0"] == ((0.0, 210), (1.0, 230), (3.0, 235), (6.0, 215),
                                            (6.5, 200))
    assert [s.name for s in r.critical_path] == ["f1", "f2", "b2", "w1"]
    assert [(t.name, t.start_s, t.end_s) for t in r.tasks] == [
        ("f1", 0.0, 1.0), ("f2", 1.0, 3.0), ("b2", 3.0, 6.0), ("w1", 6.0, 6.5)]
    # The stream chain (0->1, 1->2, 2->3) alone: the order is topological, so it implies every
    # edge (f1 -> w1 is 0 -> 3, after 0 -> 1 -> 2 -> 3).
    assert tuple(r.dependencies) == ((0, 1), (1, 2), (2, 3))


def test_task_records_read_lazily_equal_records_built_one_by_one(mid_graph):
    r = simulate_single(mid_graph)
    order = mid_graph.topological_order()
    assert len(r.tasks) == len(order)
    for t in (0, 7, len(order) - 1, -1):
        rec = r.tasks[t]
        op = mid_graph.op(order[t])
        assert (rec.name, rec.category, rec.device, rec.resources) == (
            op.name, op.kind, "device0", ("device0/compute",))
        assert dict(rec.args) == {"op": op.name, "bytes": op.output_bytes}
    assert r.tasks[2:4] == (r.tasks[2], r.tasks[3])
    assert list(r.dependencies) == [r.dependencies[k] for k in range(len(r.dependencies))]
    with pytest.raises(IndexError):
        r.tasks[len(order)]


@pytest.mark.parametrize("form", ["trainsched.graph/1", "trainsched.graph/2"])
def test_simulation_is_the_same_however_the_graph_was_read(tmp_path, mid_graph, form):
    path = tmp_path / "g.json"
    mid_graph.save(path, format=form)
    fast = simulate_single(Graph.load(path))
    ordinary = simulate_single(Graph.from_json(path.read_text()))
    again = simulate_single(mid_graph)
    assert fast.to_json() == ordinary.to_json() == again.to_json()
    assert fast == ordinary
    # one stream, ops back to back in listing order: the step is the sum of the op times
    assert fast.step_time_s == pytest.approx(sum(op.compute_s for op in mid_graph.ops))


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_reading_reports_bytes_read(tmp_path, mid_graph):
    path = tmp_path / "g.json"
    mid_graph.save(path)
    calls = []
    Graph.load(path, progress=lambda done, total, item: calls.append((done, total)))
    size = path.stat().st_size
    assert calls and calls[-1] == (size, size)


def test_simulation_reports_its_phases(mid_graph):
    calls = []
    simulate_single(mid_graph, progress=lambda done, total, item: calls.append((done, total,
                                                                                item)))
    assert calls == [(0, 3, PHASES[0]), (1, 3, PHASES[1]), (2, 3, PHASES[2]), (3, 3, "")]


def test_progress_bar_draws_on_a_terminal_only(tmp_path, mid_graph):
    path = tmp_path / "g.json"
    mid_graph.save(path)
    terminal, log = FakeTerminal(), io.StringIO()
    for stream in (terminal, log):
        with ProgressBar("reading g.json", stream=stream) as bar:
            Graph.load(path, progress=bar.update)
    size = path.stat().st_size
    assert f"\rreading g.json [{'#' * 30}] {size}/{size}" in terminal.getvalue()
    assert log.getvalue() == ""


def test_cli_is_silent_on_stderr_when_it_is_not_a_terminal(tmp_path, mid_graph, capsys):
    from trainsched.cli import main

    path = tmp_path / "g.json"
    mid_graph.save(path)
    assert main(["simulate", str(path), "--cluster", "cpu"]) == 0
    assert main(["show", str(path)]) == 0
    assert capsys.readouterr().err == ""


def test_critical_path_steps_read_lazily_equal_the_tuple_of_them():
    g = Graph([Op(name="a", compute_s=1.0), Op(name="b", compute_s=2.0)],
              [Edge(src="a", dst="b", size_bytes=1)])
    path = simulate_single(g, allow_forward_only=True).critical_path
    # a from 0 to 1, then b from 1 to 3, back to back
    assert [(s.name, s.start_s, s.end_s, s.wait_s) for s in path] == [
        ("a", 0.0, 1.0, 0.0), ("b", 1.0, 3.0, 0.0)]
    assert path[0].via == "start" and len(path) == 2
    assert path == tuple(path) and path[-1] == path[1] and path[:1] == (path[0],)
