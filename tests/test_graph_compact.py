"""The compact graph file (``trainsched.graph/2``): round trips, old files, errors.

``golden/graphs/two-ops.v1.json`` is a file as trainsched wrote graphs before the compact format
(every field of every op); ``two-ops.v2.json`` is the same graph in the compact format, checked
by hand: ``strings`` in order of first use (kinds, module paths, targets, then tensor keys),
columns of defaults left out, ``forward_op`` and ``group`` as op indices.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings

from test_graph_properties import forward_dags
from trainsched.errors import TrainschedError
from trainsched.graph import FORMAT_V1, Edge, Graph, Op, to_training

GOLDEN = Path(__file__).parent / "golden" / "graphs"


def two_ops() -> Graph:
    """The graph of the golden files, built by hand."""
    return Graph([Op(name="a", compute_s=0.5, param_bytes=8, module_path="fc",
                     target="aten.linear.default"),
                  Op(name="a:dX", kind="backward_input", compute_s=0.25, forward_op="a",
                     group="a", module_path="fc")],
                 [Edge(src="a", dst="a:dX", size_bytes=4, tensor="a:saved")],
                 {"model": "m"})


def test_an_old_format_file_is_still_read():
    assert Graph.load(GOLDEN / "two-ops.v1.json") == two_ops()


def test_the_compact_file_is_the_hand_checked_text():
    assert two_ops().to_json() == (GOLDEN / "two-ops.v2.json").read_text()
    assert Graph.load(GOLDEN / "two-ops.v2.json") == two_ops()


def test_an_old_file_saved_again_is_written_compact(tmp_path):
    graph = Graph.load(GOLDEN / "two-ops.v1.json")
    graph.save(tmp_path / "g.json")
    assert (tmp_path / "g.json").read_text() == (GOLDEN / "two-ops.v2.json").read_text()


@settings(max_examples=60, deadline=None)
@given(forward_dags())
def test_random_graphs_round_trip_exactly(forward):
    # shuffled listings, grouped ops (lists of member names), training ops (forward_op, group)
    for graph in (forward, to_training(forward)):
        fd, name = tempfile.mkstemp(suffix=".json")
        os.close(fd)
        try:
            graph.save(name)
            loaded = Graph.load(name)
            text = Path(name).read_text()
        finally:
            os.unlink(name)
        assert loaded == Graph.from_json(graph.to_json(format=FORMAT_V1)) == graph
        assert loaded.to_json() == text
        assert loaded.topological_order() == graph.topological_order()


def test_repeated_strings_are_shared_when_read():
    g = Graph.from_json((GOLDEN / "two-ops.v2.json").read_text())
    assert g.op("a").module_path is g.op("a:dX").module_path
    assert g.op("a:dX").forward_op is g.op("a").name  # the op's own name object


def test_hand_written_values_in_other_valid_types():
    doc = json.loads((GOLDEN / "two-ops.v2.json").read_text())
    doc["ops"]["compute_s"] = [1, 0.25]  # an integer for a float field
    doc["ops"]["param_bytes"] = [8.0, 0]  # an integral float for an integer field
    doc["strings"].append("")
    doc["edges"]["tensor"] = [len(doc["strings"]) - 1]  # an empty key: the producer's output
    g = Graph.from_json(json.dumps(doc))
    assert g.op("a").compute_s == 1.0 and type(g.op("a").compute_s) is float
    assert g.op("a").param_bytes == 8 and type(g.op("a").param_bytes) is int
    assert g.edges[0].tensor == "a"


def edited(**changes) -> dict:
    """The golden compact document with ``changes``: ``part__column=value`` sets a column
    (None removes it), a plain key sets a top-level value."""
    doc = json.loads((GOLDEN / "two-ops.v2.json").read_text())
    for key, value in changes.items():
        if "__" in key:
            part, column = key.split("__")
            if value is None:
                del doc[part][column]
            else:
                doc[part][column] = value
        else:
            doc[key] = value
    return doc


@pytest.mark.parametrize(("doc", "message"), [
    (edited(ops__compute_s=[0.5]),
     "ops.compute_s: 1 values, but ops.name has 2 (one value per op)"),
    (edited(edges__dst=[1, 0]), "edges.dst: 2 values, but edges.src has 1 (one value per edge)"),
    (edited(edges__src=[5]), "edges.src[0]: expected an index into ops (0..1), got 5"),
    (edited(edges__dst=[-1]), "edges.dst[0]: expected an index into ops (0..1), got -1"),
    (edited(ops__kind=[0, 9]), "ops.kind[1]: expected an index into strings (0..5), got 9"),
    (edited(ops__forward_op=[None, 2]),
     "ops.forward_op[1]: expected an index into ops (0..1) or a name or null, got 2"),
    (edited(edges__tensor=["a"]),
     'edges.tensor[0]: expected an index into strings (0..5) or null, got "a"'),
    (edited(edges__src=[0, 1], edges__dst=[1, 0], edges__size_bytes=[4, 4],
            edges__tensor=None), "graph has a cycle: a -> a:dX -> a"),
    (edited(edges__dst=[0]), "edges[0] 'a' -> 'a' is a self-loop"),
    (edited(ops__name=["a", "a"]), "duplicate op names: 'a'"),
    (edited(ops__flop=[0.0, 0.0]), "ops: unknown field 'flop' (did you mean 'flops'?)"),
    (edited(edges__bytes=[1]), "edges: unknown field 'bytes'"),
    (edited(ops__name=None), "ops: missing required field 'name'"),
    (edited(ops=[{"name": "a"}]), "ops: expected an object of columns (one list per field), "
                                  "got a list"),
    (edited(ops__compute_s=0.5), "ops.compute_s: expected a list, got a number"),
    (edited(ops__compute_s=[0.5, "fast"]), 'ops.compute_s[1]: expected a number, got "fast"'),
    (edited(ops__compute_s=[-1.0, 0.25]), "ops[0]: op 'a': compute_s must be >= 0, got -1.0"),
    (edited(ops__members=[["x"], [3]]), "ops.members[1]: expected a list of names, got [3]"),
    (edited(ops__name=["a", ""]), "ops[1]: op name must be a non-empty string"),
    (edited(strings="abc"), "strings: expected a list, got a string"),
    (edited(strings=["forward", 1]), "strings[1]: expected a string, got a number"),
    (edited(edges__size_bytes=[-1]), "edges[0]: edge 'a' -> 'a:dX': size_bytes must be >= 0, "
                                     "got -1"),
    (edited(edges__size_bytes=["1"]), 'edges.size_bytes[0]: expected an integer, got "1"'),
    (edited(extra=1), "unknown field 'extra'"),
    (edited(format="trainsched.graph/3"), "unsupported format 'trainsched.graph/3'; this "
     "reader supports 'trainsched.graph/1' and 'trainsched.graph/2'"),
])  # fmt: skip
def test_a_malformed_compact_file_is_refused_with_where(tmp_path, doc, message):
    path = tmp_path / "g.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(TrainschedError) as info:
        Graph.load(path)
    assert str(info.value).startswith(f"{path}: ")
    assert message in str(info.value)


def test_a_nan_in_a_compact_file_is_refused(tmp_path):
    text = (GOLDEN / "two-ops.v2.json").read_text().replace("[0.5, 0.25]", "[NaN, 0.25]")
    path = tmp_path / "g.json"
    path.write_text(text)
    with pytest.raises(TrainschedError, match="ops\\[0\\]: op 'a': compute_s must be finite"):
        Graph.load(path)


def test_the_compact_file_is_much_smaller():
    from test_graph_scale import resnet_like

    graph = resnet_like(40)
    # every field of every op, against the fields some op sets, names written once
    assert len(graph.to_json()) * 3 < len(graph.to_json(format=FORMAT_V1))


@pytest.mark.parametrize(("old", "new", "message"), [
    ('"src": [0]', '"src": [7]', "edges.src[0]: expected an index into ops (0..1), got 7"),
    ('"compute_s": [0.5, 0.25]', '"compute_s": [0.5]', "ops.compute_s: 1 values, but ops.name"),
    ('"compute_s": [0.5, 0.25]', '"compute_s": [-0.5, 0.25]', "compute_s must be >= 0"),
    ('"dst": [1]', '"dst": [1', "malformed JSON at line 16, column 13"),
    ('"tensor": [5]\n}}\n', '"tensor": [5]\n}', "malformed JSON"),  # truncated
])  # fmt: skip
def test_a_file_in_the_writers_layout_read_by_lines_gets_the_whole_texts_error(
        tmp_path, old, new, message):
    text = (GOLDEN / "two-ops.v2.json").read_text()
    assert old in text
    text = text.replace(old, new)
    path = tmp_path / "g.json"
    path.write_text(text)
    with pytest.raises(TrainschedError) as by_lines:
        Graph.load(path)
    with pytest.raises(TrainschedError) as whole:
        Graph.from_json(text, source=str(path))
    assert str(by_lines.value) == str(whole.value)
    assert message in str(by_lines.value)


def test_plain_columns_whose_edge_sizes_overflow_together_are_refused(tmp_path):
    # The ops' columns are all plain; two edge sizes, each a valid integer, add up to more
    # than the largest float.
    doc = edited(edges__src=[0, 0], edges__dst=[1, 1], edges__size_bytes=[10**308, 10**308],
                 edges__tensor=[None, 5])
    path = tmp_path / "g.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(TrainschedError, match="the edges' size_bytes add up to more than"):
        Graph.load(path)
