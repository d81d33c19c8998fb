"""The binary graph file (``trainsched.graph/3``, ``.tsg``): layout, round trips, errors.

The layout checks read the file with ``struct`` and ``numpy`` here, independently of the
reader: magic line, one header line of JSON, zero padding to 8 bytes, then each column's
little-endian values padded to 8 bytes. Malformed files are made by taking a valid file apart
(:func:`parts`), changing one thing, and putting it back together (:func:`put_together`).
"""

from __future__ import annotations

import json
import os
import struct
import tempfile
from pathlib import Path

import numpy
import pytest
from hypothesis import given, settings

from test_graph_compact import GOLDEN, two_ops
from test_graph_properties import forward_dags
from trainsched.cli import main
from trainsched.errors import TrainschedError
from trainsched.graph import Edge, Graph, Op, to_training

MAGIC = b"trainsched.graph/3\n"


def every_field() -> Graph:
    """A captured-like training graph in which every op field and edge field is used: measured
    spreads, tied weights, grouped members, nulls beside values, a tensor key of its own, a
    group naming no op, non-ASCII names, a string holding a newline."""
    ops = [
        Op(name="emb", compute_s=1e-4, flops=2.0e6, bytes_accessed=4096, param_bytes=1024,
           buffer_bytes=16, optimizer_state_bytes=2048, output_bytes=512, temp_bytes=64,
           saved_bytes=256, group="stage-0", layer_index=0, module_path="embed",
           target="aten.embedding.default", members=("embed.a", "embed.b"),
           backward_input_s=2e-4, backward_weight_s=3e-4, backward_input_flops=4.0e6,
           backward_weight_flops=4.5e6, compute_p10_s=0.9e-4, compute_p90_s=1.2e-4,
           backward_input_p10_s=1.8e-4, backward_input_p90_s=2.4e-4,
           backward_weight_p10_s=2.7e-4, backward_weight_p90_s=3.3e-4, samples=7),
        Op(name="héad", compute_s=0.5, flops=1e9, param_bytes=8, output_bytes=8,
           module_path="head", target="aten.linear.default", tied_to=("emb",),
           layer_index=1, samples=7),
        Op(name="héad:dX", kind="backward_input", compute_s=0.25, forward_op="héad",
           group="héad", module_path="head", output_bytes=512),
        Op(name="héad:dW", kind="backward_weight", compute_s=0.25, forward_op="héad",
           group="héad", module_path="head\n(tied)", output_bytes=8),
        Op(name="héad:opt", kind="optimizer", compute_s=1e-5, forward_op="héad",
           group="héad", target="adam"),
    ]
    edges = [Edge(src="emb", dst="héad", size_bytes=512),
             Edge(src="emb", dst="héad:dW", size_bytes=512, tensor="emb:saved"),
             Edge(src="héad", dst="héad:dX", size_bytes=8),
             Edge(src="héad:dW", dst="héad:opt", size_bytes=8, tensor="héad:grad")]
    return Graph(ops, edges, {"model": "captured-like", "tier": "measured", "batch_size": 4,
                              "training": {"optimizer": "adam"}})


def saved(graph: Graph, path: Path) -> Path:
    graph.save(path)
    return path


# --- layout and round trips ---------------------------------------------------------------------


def test_the_two_op_file_is_the_hand_worked_layout(tmp_path):
    data = saved(two_ops(), tmp_path / "g.tsg").read_bytes()
    assert data.startswith(MAGIC)
    end = data.index(b"\n", len(MAGIC)) + 1
    # strings: the names first, then in order of first use (columns in sorted field order:
    # forward_op and group name op a, then kinds, module path, targets, the edge's tensor)
    names = ["a", "a:dX", "forward", "backward_input", "fc", "aten.linear.default", "",
             "a:saved"]
    assert data[len(MAGIC):end].decode() == (
        '{"columns": [["strings.length", "<u4", 8], ["strings.text", "|u1", 62], '
        '["ops.compute_s", "<f8", 2], ["ops.forward_op", "<i4", 2], ["ops.group", "<i4", 2], '
        '["ops.kind", "<i4", 2], ["ops.module_path", "<i4", 2], ["ops.param_bytes", "<i8", 2], '
        '["ops.target", "<i4", 2], ["edges.dst", "<i4", 1], ["edges.size_bytes", "<i8", 1], '
        '["edges.src", "<i4", 1], ["edges.tensor", "<i4", 1]], "edges": 1, '
        '"meta": {"model": "m"}, "ops": 2}\n')
    assert set(data[end:end + (-end % 8)]) <= {0}  # zero padding to 8 bytes
    # each column padded to 8 bytes: strings 32 + 64, compute_s 16, five <i4 op columns 8
    # each, param_bytes 16, four edge columns 8 each
    body = data[end + (-end % 8):]
    assert len(body) == 32 + 64 + 16 + 5 * 8 + 16 + 4 * 8
    expected = [struct.pack("<8I", *map(len, names)),  # lengths without the newlines
                "".join(f"{name}\n" for name in names).encode() + bytes(2),
                struct.pack("<2d", 0.5, 0.25),
                struct.pack("<2i", -1, 0),  # forward_op: null, then op a's name
                struct.pack("<2i", -1, 0),  # group
                struct.pack("<2i", 2, 3),  # kind: forward, backward_input
                struct.pack("<2i", 4, 4),  # module_path: fc
                struct.pack("<2q", 8, 0),  # param_bytes
                struct.pack("<2i", 5, 6),  # target: aten.linear.default, ""
                struct.pack("<i", 1) + bytes(4),  # edges.dst
                struct.pack("<q", 4),  # edges.size_bytes
                struct.pack("<i", 0) + bytes(4),  # edges.src
                struct.pack("<i", 7) + bytes(4)]  # edges.tensor: a:saved
    assert body == b"".join(expected)


@pytest.mark.parametrize("graph", [two_ops(), every_field(), Graph([], [], {}),
                                   to_training(Graph([Op(name="x", compute_s=1.0,
                                                         param_bytes=4)], []))],
                         ids=["two-ops", "every-field", "empty", "one-op-training"])
def test_json_to_binary_to_json_is_byte_identical(tmp_path, graph):
    text = saved(graph, tmp_path / "g.json").read_text()
    binary = saved(Graph.load(tmp_path / "g.json"), tmp_path / "g.tsg")
    back = Graph.load(binary)
    assert back == graph
    assert back.to_json() == text
    assert saved(back, tmp_path / "again.tsg").read_bytes() == binary.read_bytes()


def test_every_field_survives_the_binary_file_in_its_own_type(tmp_path):
    back = Graph.load(saved(every_field(), tmp_path / "g.tsg"))
    emb, head = back.op("emb"), back.op("héad")
    assert emb.members == ("embed.a", "embed.b") and head.tied_to == ("emb",)
    assert type(emb.compute_s) is float and type(emb.param_bytes) is int
    assert head.backward_input_s is None and emb.backward_weight_p90_s == 3.3e-4
    assert emb.layer_index == 0 and back.op("héad:dX").layer_index is None
    assert back.edges[1].tensor == "emb:saved" and back.edges[0].tensor == "emb"
    assert back.op("héad:dW").module_path == "head\n(tied)"  # a newline of its own


def test_an_old_format_file_converts_to_the_same_binary_file(tmp_path):
    saved(Graph.load(GOLDEN / "two-ops.v1.json"), tmp_path / "old.tsg")
    saved(two_ops(), tmp_path / "new.tsg")
    assert (tmp_path / "old.tsg").read_bytes() == (tmp_path / "new.tsg").read_bytes()


@settings(max_examples=40, deadline=None)
@given(forward_dags())
def test_random_graphs_round_trip_through_the_binary_file(forward):
    for graph in (forward, to_training(forward)):
        fd, name = tempfile.mkstemp(suffix=".tsg")
        os.close(fd)
        try:
            graph.save(name)
            loaded = Graph.load(name)
        finally:
            os.unlink(name)
        assert loaded == graph
        assert loaded.to_json() == graph.to_json()


def test_the_format_is_told_by_the_first_bytes_not_the_suffix(tmp_path):
    binary = saved(two_ops(), tmp_path / "g.tsg")
    renamed = tmp_path / "g.json"
    renamed.write_bytes(binary.read_bytes())
    assert Graph.load(renamed) == two_ops()


def test_save_writes_json_unless_the_path_ends_in_tsg_or_the_format_asks(tmp_path):
    assert saved(two_ops(), tmp_path / "g.json").read_text().startswith("{")
    assert saved(two_ops(), tmp_path / "G.TSG").read_bytes().startswith(MAGIC)
    two_ops().save(tmp_path / "h.bin", format="trainsched.graph/3")
    assert (tmp_path / "h.bin").read_bytes().startswith(MAGIC)


def test_json_text_of_the_binary_format_is_refused():
    with pytest.raises(TrainschedError, match="binary format, not JSON text"):
        two_ops().to_json(format="trainsched.graph/3")


def test_an_integer_beyond_64_bits_is_refused_when_writing_binary(tmp_path):
    graph = Graph([Op(name="a", param_bytes=2**64)], [])
    with pytest.raises(TrainschedError, match=r"param_bytes .* does not fit .* save the "
                                              r"graph as \.json"):
        graph.save(tmp_path / "g.tsg")
    assert not (tmp_path / "g.tsg").exists()


# --- malformed files ----------------------------------------------------------------------------


def parts(path: Path) -> tuple[dict, dict[str, numpy.ndarray]]:
    """A binary file taken apart: its header and its columns (name -> array)."""
    data = path.read_bytes()
    end = data.index(b"\n", len(MAGIC)) + 1
    header = json.loads(data[len(MAGIC):end])
    at = end + (-end % 8)
    columns = {}
    for name, dtype, length in header["columns"]:
        size = length * numpy.dtype(dtype).itemsize
        columns[name] = numpy.frombuffer(data[at:at + size], dtype=dtype).copy()
        at += size + (-size % 8)
    return header, columns


def put_together(path: Path, header: dict, columns: dict[str, numpy.ndarray],
                 lengths: dict[str, int] | None = None, dtypes: dict[str, str] | None = None
                 ) -> Path:
    """Write a binary file of ``columns``; ``lengths`` and ``dtypes`` override what the header
    says of a column."""
    lengths, dtypes = lengths or {}, dtypes or {}
    header = {**header, "columns": [[name, dtypes.get(name, values.dtype.str),
                                     lengths.get(name, len(values))]
                                    for name, values in columns.items()]}
    head = MAGIC + (json.dumps(header, sort_keys=True) + "\n").encode()
    out = [head, bytes(-len(head) % 8)]
    for values in columns.values():
        raw = values.tobytes()
        out += [raw, bytes(-len(raw) % 8)]
    path.write_bytes(b"".join(out))
    return path


def broken(tmp_path: Path, change) -> Path:
    """The two-op binary file with ``change(header, columns)`` applied (it may return the keyword
    arguments of :func:`put_together`)."""
    header, columns = parts(saved(two_ops(), tmp_path / "good.tsg"))
    extra = change(header, columns) or {}
    return put_together(tmp_path / "g.tsg", header, columns, **extra)


def refused(path: Path) -> str:
    with pytest.raises(TrainschedError) as info:
        Graph.load(path)
    message = str(info.value)
    assert message.startswith(f"{path}: ")
    return message


def test_the_helpers_put_a_valid_file_back_together_unchanged(tmp_path):
    path = broken(tmp_path, lambda header, columns: None)
    assert path.read_bytes() == (tmp_path / "good.tsg").read_bytes()


def _set(name, values, dtype=None):
    def change(header, columns):
        columns[name] = numpy.array(values, dtype=dtype or columns[name].dtype)
    return change


def _strings(strings):
    def change(header, columns):
        columns["strings.text"] = numpy.frombuffer(
            "".join(f"{s}\n" for s in strings).encode(), dtype="|u1")
        columns["strings.length"] = numpy.array(list(map(len, strings)), dtype="<u4")
    return change


def _header(**changes):
    def change(header, columns):
        header.update(changes)
    return change


def _drop(name):
    def change(header, columns):
        del columns[name]
    return change


def _lengths(name, length):
    def change(header, columns):
        return {"lengths": {name: length}}
    return change


def _dtypes(name, dtype):
    def change(header, columns):
        return {"dtypes": {name: dtype}}
    return change


@pytest.mark.parametrize(("change", "message"), [
    (_set("ops.compute_s", [float("nan"), 0.25]),
     "ops.compute_s[0]: expected a finite number >= 0, got nan"),
    (_set("ops.compute_s", [0.5, -1.0]), "ops.compute_s[1]: expected a finite number >= 0, "
                                         "got -1.0"),
    (_set("ops.compute_s", [0.5, float("inf")]), "ops.compute_s[1]: expected a finite number"),
    (_set("ops.param_bytes", [-8, 0]), "ops.param_bytes[0]: expected an integer >= 0, got -8"),
    (_set("edges.size_bytes", [-4]), "edges.size_bytes[0]: expected an integer >= 0, got -4"),
    (_set("edges.src", [2]), "edges.src[0]: expected an index into ops (0..1), got 2"),
    (_set("edges.dst", [-1]), "edges.dst[0]: expected an index into ops (0..1), got -1"),
    (_set("ops.kind", [2, 99]), "ops.kind[1]: expected an index into strings (0..7), got 99"),
    (_set("ops.kind", [2, 4]), "ops.kind[1]: unknown kind 'fc'; expected one of forward"),
    (_set("ops.group", [-2, 0]), "ops.group[0]: expected an index into strings (0..7) or -1, "
                                 "got -2"),
    (_set("edges.tensor", [8]), "edges.tensor[0]: expected an index into strings (0..7) or "
                                "-1, got 8"),
    (_set("ops.compute_s", [0.5]), "ops.compute_s: 1 values, but the header says 2 ops (one "
                                   "value per op)"),
    (_set("edges.dst", [1, 0]), "edges.dst: 2 values, but the header says 1 edges (one value "
                                "per edge)"),
    (_lengths("ops.compute_s", 3), "columns: truncated: the header's columns end at byte"),
    (_lengths("strings.text", 40), "columns: has bytes after its last column"),
    (_lengths("ops.kind", 1), "ops.kind: 1 values, but the header says 2 ops"),
    (_dtypes("ops.compute_s", "<f4"), "ops.compute_s: unknown dtype '<f4'; expected one of"),
    (_set("ops.compute_s", [0.5, 0.25], dtype="<i8"),
     "ops.compute_s: dtype '<i8' is not the column's '<f8'"),
    (_set("ops.flop", [1.0, 2.0], dtype="<f8"), "ops.flop: unknown column"),
    (_drop("edges.size_bytes"), "edges.size_bytes: missing required column"),
    (_set("strings.length", [1, 4, 7, 14, 2, 19, 0, 8]),
     "strings.length: the lengths add up to 63 characters with their newlines, but "
     "strings.text has 62"),
    (_set("strings.length", [2, 3, 7, 14, 2, 19, 0, 7]),
     "strings.text: string 0 does not end with a newline where strings.length says it ends"),
    (_set("strings.text", list(b"\xff" + b"x" * 61)), "strings.text: not UTF-8 (byte 0)"),
    (_strings(["", "a:dX", "forward", "backward_input", "fc", "aten.linear.default", "",
               "a:saved"]), "strings[0]: the name of op 0 is empty"),
    (_header(ops=3), "ops.kind: 2 values, but the header says 3 ops (one value per op)"),
    (_header(ops=-1), "header.ops: expected a count, got -1"),
    (_header(meta=[1]), "header.meta: expected an object"),
    (_header(extra=1), "header: expected an object with columns, edges, meta and ops"),
    (_set("edges.dst", [0]), "edges[0] 'a' -> 'a' is a self-loop"),
])  # fmt: skip
def test_a_malformed_binary_file_is_refused_naming_the_file_and_column(tmp_path, change,
                                                                         message):
    assert message in refused(broken(tmp_path, change))


@pytest.mark.parametrize(("cut", "message"), [
    (lambda data: len(MAGIC) + 5, "header: truncated: the header line has no end"),
    (lambda data: data.index(b"\n", len(MAGIC)) + 1, "columns: truncated"),
    (lambda data: len(data) - 8, "columns: truncated"),
    (lambda data: len(data) - 1, "columns: truncated"),
])
def test_a_truncated_binary_file_is_refused(tmp_path, cut, message):
    data = saved(two_ops(), tmp_path / "good.tsg").read_bytes()
    path = tmp_path / "g.tsg"
    path.write_bytes(data[:cut(data)])
    assert message in refused(path)


def test_two_ops_of_one_name_are_refused(tmp_path):
    header, columns = parts(saved(Graph([Op(name="a"), Op(name="b")], []), tmp_path / "ok.tsg"))
    text = columns["strings.text"]
    assert bytes(text[:4]) == b"a\nb\n"
    text[2] = ord("a")
    assert "duplicate op names: 'a'" in refused(put_together(tmp_path / "g.tsg", header,
                                                               columns))


def test_a_null_mask_must_hold_zeros_and_ones(tmp_path):
    header, columns = parts(saved(every_field(), tmp_path / "good.tsg"))
    columns["ops.layer_index.null"][2] = 7
    message = refused(put_together(tmp_path / "g.tsg", header, columns))
    assert "ops.layer_index.null[2]: expected 0 or 1, got 7" in message


def test_a_cli_command_reads_a_binary_file_and_words_a_bad_one(tmp_path, capsys):
    good = saved(every_field(), tmp_path / "g.tsg")
    json_path = saved(every_field(), tmp_path / "g.json")
    assert main(["simulate", str(good), "--cluster", "dgx-h100", "--json"]) == 0
    from_binary = capsys.readouterr().out
    assert main(["simulate", str(json_path), "--cluster", "dgx-h100", "--json"]) == 0
    assert capsys.readouterr().out == from_binary
    bad = tmp_path / "bad.tsg"
    bad.write_bytes(good.read_bytes()[:-8])
    assert main(["show", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}: columns: truncated" in err and "Traceback" not in err


def test_compare_takes_a_tsg_path_as_a_graph_file(tmp_path, capsys):
    path = saved(every_field(), tmp_path / "g.tsg")
    # a graph file has its batch: the flag is refused as for a .json graph
    assert main(["compare", str(path), "--cluster", "dgx-h100", "--batch-size", "4"]) == 2
    assert "--batch-size does not apply to a graph file" in capsys.readouterr().err


def test_edges_read_from_a_binary_file_are_the_graphs_edges_whichever_query_comes_first(
        tmp_path):
    path = saved(every_field(), tmp_path / "g.tsg")
    graph = Graph.load(path)  # its edges are made when first read
    assert graph.out_edges("emb") == every_field().out_edges("emb")
    assert Graph.load(path).in_edges("héad:opt") == (Edge(src="héad:dW", dst="héad:opt",
                                                          size_bytes=8, tensor="héad:grad"),)
    edges = Graph.load(path).edges
    assert type(edges) is tuple and edges == every_field().edges
    assert Graph.load(path).totals().edge_bytes == 512 + 512 + 8 + 8


def test_duplicate_edges_in_a_binary_file_are_refused(tmp_path):
    def twice(header, columns):
        for name in ("edges.src", "edges.dst", "edges.size_bytes", "edges.tensor"):
            columns[name] = numpy.concatenate([columns[name], columns[name]])
        header["edges"] = 2

    message = refused(broken(tmp_path, twice))
    assert "edges[0] and edges[1] are duplicates: 'a' -> 'a:dX' carrying tensor 'a:saved'" \
        in message


def test_ops_are_found_by_name_in_a_graph_read_from_a_binary_file(tmp_path):
    graph = Graph.load(saved(every_field(), tmp_path / "g.tsg"))  # its index is made when asked
    assert "héad:dX" in graph and "nope" not in graph
    assert graph.index("héad:opt") == 4 and graph.op("emb").samples == 7
    with pytest.raises(TrainschedError, match="no op named 'nope'"):
        graph.op("nope")


# --- ops made only when asked for ---------------------------------------------------------------


FIELDS = tuple(f.name for f in __import__("dataclasses").fields(Op))


@pytest.mark.parametrize("field", FIELDS)
def test_a_column_read_from_the_file_equals_the_ops_field(tmp_path, field):
    """Every field, from the columns (before any Op record is made) and from the records: the
    values of the ops written, in their types (tuples for name lists, None beside values)."""
    graph = every_field()
    back = Graph.load(saved(graph, tmp_path / "g.tsg"))
    expected = tuple(getattr(op, field) for op in graph.ops)
    from_columns = back.column(field)
    assert from_columns == expected
    assert list(map(type, from_columns)) == list(map(type, expected))
    assert back.ops == graph.ops and back.column(field) == expected  # after the records


def test_a_one_device_simulation_of_a_binary_graph_makes_no_op_records(tmp_path, monkeypatch):
    import trainsched.graph.core as core
    from trainsched.sim import simulate_single

    made = []
    build = core._OpsToMake.make
    monkeypatch.setattr(core._OpsToMake, "make", lambda self: made.append(1) or build(self))
    graph = every_field()  # a training graph
    back = Graph.load(saved(graph, tmp_path / "g.tsg"))
    assert simulate_single(back).step_time_s == simulate_single(graph).step_time_s
    assert main(["simulate", str(tmp_path / "g.tsg"), "--cluster", "cpu", "--json"]) == 0
    assert made == []
    assert back.op("emb") == graph.op("emb") and made == []  # one op: that record alone
    one, expected = back.op("emb"), graph.op("emb")
    assert [type(getattr(one, f)) for f in FIELDS] == [type(getattr(expected, f)) for f in FIELDS]
    assert back.ops == graph.ops and made == [1]  # all of them: made once
    assert back.ops == graph.ops and made == [1]


def test_an_unknown_column_is_refused():
    with pytest.raises(TrainschedError, match="no op field 'speed'; the fields are"):
        every_field().column("speed")


def test_forward_only_reads_the_kinds():
    graph = every_field()
    assert not graph.forward_only()
    forward = Graph([op for op in graph.ops if op.kind == "forward"],
                    [e for e in graph.edges if e.dst in ("héad",)])
    assert forward.forward_only() and Graph([], []).forward_only()


def test_show_reads_a_binary_graph_without_its_records(tmp_path, monkeypatch, capsys):
    """``show`` (totals, the critical path, the heaviest ops, the timing spread) gives the
    same summary from the columns as from the records, and makes no Op or Edge record."""
    import trainsched.graph.core as core
    from trainsched.report.graph_summary import graph_summary

    graph = every_field()
    back = Graph.load(saved(graph, tmp_path / "g.tsg"))
    made = []
    monkeypatch.setattr(core._OpsToMake, "make", lambda self: made.append("ops"))
    monkeypatch.setattr(type(back._edges), "make", lambda self: made.append("edges"))
    summary = graph_summary(back, top=3)
    assert made == []
    assert summary == graph_summary(graph, top=3)
    assert summary["edges"] == 4 and summary["timing_spread"]["phases"] == 3
    # 0.5 s, then the two 0.25 s ops by name
    assert [h["name"] for h in summary["heaviest"]] == ["héad", "héad:dW", "héad:dX"]
