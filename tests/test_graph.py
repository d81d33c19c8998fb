"""Op, Edge, Graph: validation, queries, orders, critical path, JSON file round trip."""

from __future__ import annotations

import json
import math
import os
import re

import pytest

from trainsched.errors import TrainschedError
from trainsched.graph import (
    FORMAT,
    FORMAT_V1,
    OP_KINDS,
    Edge,
    Graph,
    GraphTotals,
    Op,
    atomic_write_text,
)


def chain(*costs: float) -> Graph:
    ops = [Op(name=f"op{i}", compute_s=c) for i, c in enumerate(costs)]
    edges = [Edge(src=f"op{i}", dst=f"op{i + 1}", size_bytes=8) for i in range(len(costs) - 1)]
    return Graph(ops, edges)


def diamond() -> Graph:
    """a -> (b, c) -> d, the branch through c is longer."""
    ops = [
        Op(name="a", compute_s=1.0, param_bytes=100, flops=10.0),
        Op(name="b", compute_s=2.0, param_bytes=50, saved_bytes=7),
        Op(name="c", compute_s=5.0, kind="backward_input", output_bytes=3),
        Op(name="d", compute_s=1.0, buffer_bytes=4, optimizer_state_bytes=9),
    ]
    edges = [
        Edge(src="a", dst="b", size_bytes=10),
        Edge(src="a", dst="c", size_bytes=10),
        Edge(src="b", dst="d", size_bytes=20),
        Edge(src="c", dst="d", size_bytes=30),
    ]
    return Graph(ops, edges, {"tier": "static", "batch_size": 8})


# --- Op and Edge values --------------------------------------------------------------------------


def test_op_defaults_and_normalised_numbers():
    op = Op(name="x", compute_s=1, members=["a", "b"])  # type: ignore[arg-type]
    assert op.kind == "forward"
    assert op.compute_s == 1.0 and isinstance(op.compute_s, float)
    assert op.members == ("a", "b")
    assert OP_KINDS == ("forward", "backward_input", "backward_weight", "optimizer")


def test_edge_empty_tensor_means_producer_output():
    assert Edge(src="a", dst="b", size_bytes=4).tensor == "a"
    assert Edge(src="a", dst="b", size_bytes=4) == Edge(src="a", dst="b", size_bytes=4, tensor="a")
    assert Edge(src="a", dst="b", size_bytes=4, tensor="t").tensor == "t"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"name": ""}, "op name must be a non-empty string, got ''"),
        ({"name": None}, "op name must be a non-empty string, got None"),
        ({"name": "x", "kind": "fwd"}, "op 'x': unknown kind 'fwd'; expected one of forward"),
        ({"name": "x", "compute_s": -1.0}, "op 'x': compute_s must be >= 0, got -1.0"),
        ({"name": "x", "flops": math.nan}, "op 'x': flops must be finite, got nan"),
        ({"name": "x", "compute_s": math.inf}, "op 'x': compute_s must be finite"),
        ({"name": "x", "param_bytes": -4}, "op 'x': param_bytes must be >= 0, got -4"),
        ({"name": "x", "saved_bytes": 1.5}, "op 'x': saved_bytes must be an integer, got 1.5"),
        ({"name": "x", "compute_s": "fast"}, "op 'x': compute_s must be a number, got 'fast'"),
        ({"name": "x", "backward_input_s": -2.0}, "op 'x': backward_input_s must be >= 0"),
        ({"name": "x", "layer_index": -1}, "op 'x': layer_index must be >= 0"),
        ({"name": "x", "samples": True}, "op 'x': samples must be an integer"),
        ({"name": "x", "group": 3}, "op 'x': group must be a string"),
        ({"name": "x", "members": "ab"}, "op 'x': members must be a tuple of names"),
        ({"name": "x", "members": 3}, "op 'x': members must be a tuple of names"),
    ],
)
def test_op_validation(fields, message):
    with pytest.raises(TrainschedError, match="^" + re.escape(message)):
        Op(**fields)


def test_edge_negative_size():
    with pytest.raises(TrainschedError, match="edge 'a' -> 'b': size_bytes must be >= 0, got -1"):
        Edge(src="a", dst="b", size_bytes=-1)


# --- Graph validation ----------------------------------------------------------------------------


def test_duplicate_op_names_are_named():
    ops = [Op(name=n) for n in ("a", "b", "a", "c", "b")]
    with pytest.raises(TrainschedError, match="duplicate op names: 'a', 'b'"):
        Graph(ops, [])


def test_edge_to_unknown_op_names_edge_and_end():
    ops = [Op(name="a"), Op(name="b")]
    with pytest.raises(TrainschedError, match=r"edges\[1\] 'b' -> 'zz': destination 'zz' is not"):
        Graph(ops, [Edge(src="a", dst="b", size_bytes=1), Edge(src="b", dst="zz", size_bytes=1)])
    with pytest.raises(TrainschedError, match=r"edges\[0\] 'q' -> 'b': source 'q' is not"):
        Graph(ops, [Edge(src="q", dst="b", size_bytes=1)])


def test_self_loop():
    with pytest.raises(TrainschedError, match="self-loop; graph has a cycle: a -> a"):
        Graph([Op(name="a")], [Edge(src="a", dst="a", size_bytes=1)])


def test_cycle_is_printed_in_order():
    ops = [Op(name=n) for n in ("s", "c", "a", "b", "t")]
    edges = [
        Edge(src="s", dst="a", size_bytes=1),
        Edge(src="a", dst="b", size_bytes=1),
        Edge(src="b", dst="c", size_bytes=1),
        Edge(src="c", dst="a", size_bytes=1),
        Edge(src="c", dst="t", size_bytes=1),
    ]
    with pytest.raises(TrainschedError, match=r"^graph has a cycle: c -> a -> b -> c$"):
        Graph(ops, edges)


def test_cycle_search_is_iterative_on_a_long_cycle():
    n = 30_000
    ops = [Op(name=f"n{i}") for i in range(n)]
    edges = [Edge(src=f"n{i}", dst=f"n{(i + 1) % n}", size_bytes=1) for i in range(n)]
    with pytest.raises(TrainschedError) as info:
        Graph(ops, edges)
    message = str(info.value)
    assert message.startswith("graph has a cycle: n0 -> n1 -> n2 -> ")
    assert message.endswith(f"n{n - 1} -> n0")


def test_duplicate_edges():
    ops = [Op(name="a"), Op(name="b")]
    e = Edge(src="a", dst="b", size_bytes=1)
    duplicate = r"edges\[0\] and edges\[1\] are duplicates: 'a' -> 'b' carrying tensor 'a'"
    with pytest.raises(TrainschedError, match=duplicate):
        Graph(ops, [e, Edge(src="a", dst="b", size_bytes=2, tensor="a")])
    # Two tensors between the same pair are two edges.
    g = Graph(ops, [e, Edge(src="a", dst="b", size_bytes=2, tensor="a.1")])
    assert g.predecessors("b") == ("a",)
    assert len(g.in_edges("b")) == 2


def test_non_op_in_ops():
    with pytest.raises(TrainschedError, match=r"ops\[0\] is a str, not an Op"):
        Graph(["a"], [])  # type: ignore[list-item]


# --- queries -------------------------------------------------------------------------------------


def test_queries():
    g = diamond()
    assert len(g) == 4 and "a" in g and "z" not in g and 3 not in g
    assert g.op("c").compute_s == 5.0
    assert g.index("c") == 2
    assert g.predecessors("d") == ("b", "c")
    assert g.successors("a") == ("b", "c")
    assert [e.dst for e in g.out_edges("a")] == ["b", "c"]
    assert [e.src for e in g.in_edges("d")] == ["b", "c"]
    assert g.sources() == ("a",) and g.sinks() == ("d",)
    with pytest.raises(TrainschedError, match="no op named 'zz'"):
        g.op("zz")
    with pytest.raises(TrainschedError, match="no op named 'zz'"):
        g.successors("zz")


def test_meta_is_a_private_copy():
    meta = {"device": {"name": "cpu"}}
    g = Graph([Op(name="a")], [], meta)
    meta["device"]["name"] = "changed"
    g.meta["device"]["name"] = "changed too"
    assert g.meta == {"device": {"name": "cpu"}}


def test_topological_order_keeps_program_order_and_breaks_ties_by_position():
    ops = [Op(name=n) for n in ("x", "b", "a", "y", "z")]
    edges = [
        Edge(src="x", dst="y", size_bytes=1),
        Edge(src="a", dst="b", size_bytes=1),
        Edge(src="y", dst="z", size_bytes=1),
    ]
    # b waits for a; among ready ops the earliest in the list goes first.
    assert Graph(ops, edges).topological_order() == ("x", "a", "b", "y", "z")
    program = chain(1, 2, 3)
    assert program.topological_order() == tuple(op.name for op in program.ops)


def test_critical_path_of_chain_is_the_sum():
    g = chain(1.5, 2.0, 0.25, 4.0)
    assert g.critical_path() == (7.75, ("op0", "op1", "op2", "op3"))


def test_critical_path_of_diamond_takes_the_longer_branch():
    assert diamond().critical_path() == (7.0, ("a", "c", "d"))


def test_critical_path_ties_and_empty():
    ops = [Op(name=n, compute_s=1.0) for n in ("a", "b", "c", "d")]
    edges = [Edge(src="a", dst=x, size_bytes=1) for x in ("c", "b")]
    edges += [Edge(src=x, dst="d", size_bytes=1) for x in ("c", "b")]
    # b and c tie: the one earlier in ops wins.
    assert Graph(ops, edges).critical_path() == (3.0, ("a", "b", "d"))
    assert Graph([], []).critical_path() == (0.0, ())


def test_totals():
    assert diamond().totals() == GraphTotals(
        num_ops=4,
        ops_by_kind={"forward": 3, "backward_input": 1, "backward_weight": 0, "optimizer": 0},
        num_edges=4,
        compute_s=9.0,
        flops=10.0,
        param_bytes=150,
        buffer_bytes=4,
        optimizer_state_bytes=9,
        output_bytes=3,
        saved_bytes=7,
        edge_bytes=70,
    )


def test_totals_counts_every_kind_in_order():
    kinds = chain(1.0).totals().ops_by_kind
    assert list(kinds.items()) == [(k, 1 if k == "forward" else 0) for k in OP_KINDS]
    with pytest.raises(TypeError):
        kinds["forward"] = 5  # type: ignore[index]


def test_atomic_write_text(tmp_path):
    target = tmp_path / "out.txt"
    atomic_write_text(target, "one\n")
    atomic_write_text(target, "two\n")
    assert target.read_text() == "two\n" and os.listdir(tmp_path) == ["out.txt"]


def test_heaviest():
    ops = [Op(name=n, compute_s=c) for n, c in (("b", 2.0), ("a", 2.0), ("c", 5.0), ("d", 1.0))]
    g = Graph(ops, [])
    assert [op.name for op in g.heaviest(3)] == ["c", "a", "b"]
    assert [op.name for op in g.heaviest(10)] == ["c", "a", "b", "d"]
    assert g.heaviest(0) == ()


def test_replace_ops_and_with_meta():
    g = diamond()
    h = g.replace_ops([Op(name="b", compute_s=9.0)])
    assert h.op("b").compute_s == 9.0 and h.edges == g.edges and h.meta == g.meta
    assert h.critical_path()[1] == ("a", "b", "d")
    with pytest.raises(TrainschedError, match="no op named 'q'"):
        g.replace_ops([Op(name="q")])
    assert g.with_meta({"tier": "measured"}).meta == {"tier": "measured"}


def test_equality():
    assert diamond() == diamond()
    assert diamond() != diamond().with_meta({})
    assert diamond() != chain(1.0)


# --- JSON ----------------------------------------------------------------------------------------


def rich_graph() -> Graph:
    ops = [
        Op(
            name="conv1",
            compute_s=0.1 + 0.2,
            flops=1.1e9,
            bytes_accessed=123,
            param_bytes=4096,
            output_bytes=800,
            saved_bytes=800,
            layer_index=0,
            module_path="conv1",
            target="aten.convolution.default",
            backward_input_s=1e-3 / 3,
            backward_weight_flops=2.2e9,
            compute_p10_s=0.29,
            compute_p90_s=0.31,
            samples=10,
            members=("conv1.a", "conv1.b"),
            group="blk0",
        ),
        Op(name="relü", compute_s=5e-324, temp_bytes=2**40),
        Op(name="loss", kind="optimizer", forward_op="conv1"),
    ]
    edges = [
        Edge(src="conv1", dst="relü", size_bytes=800),
        Edge(src="conv1", dst="loss", size_bytes=800, tensor="conv1"),
        Edge(src="relü", dst="loss", size_bytes=8, tensor="relü:out"),
    ]
    meta = {"tier": "measured", "model": "tiny", "batch_size": 4, "repeats": [1, 2.5, None]}
    return Graph(ops, edges, meta)


def test_json_round_trip_is_exact(tmp_path):
    g = rich_graph()
    text = g.to_json()
    assert Graph.from_json(text) == g
    assert Graph.from_json(text).to_json() == text
    path = tmp_path / "g.json"
    g.save(path)
    loaded = Graph.load(path)
    assert loaded == g and loaded.to_json() == text
    assert path.read_text(encoding="utf-8") == text
    doc = json.loads(text)
    assert doc["format"] == FORMAT == "trainsched.graph/2"
    assert list(doc) == ["format", "meta", "strings", "ops", "edges"]
    assert doc["ops"]["members"] == [["conv1.a", "conv1.b"], [], []]


def test_compact_file_leaves_out_columns_of_defaults_and_writes_strings_once():
    doc = json.loads(rich_graph().to_json())
    # tied_to, buffer_bytes, ... are at their defaults on every op: no column
    assert "tied_to" not in doc["ops"] and "buffer_bytes" not in doc["ops"]
    assert doc["strings"][doc["ops"]["kind"][2]] == "optimizer"
    assert doc["ops"]["forward_op"] == [None, None, 0]  # op 0, conv1
    assert doc["ops"]["group"] == ["blk0", None, None]  # a group that is no op: its name
    assert doc["edges"]["src"] == [0, 0, 1] and doc["edges"]["dst"] == [1, 2, 2]
    assert doc["edges"]["tensor"][:2] == [None, None]  # the producer's output
    assert doc["strings"][doc["edges"]["tensor"][2]] == "relü:out"


def test_old_format_is_written_on_request_with_every_field():
    g = rich_graph()
    text = g.to_json(format=FORMAT_V1)
    doc = json.loads(text)
    assert doc["format"] == "trainsched.graph/1"
    assert len(doc["ops"][0]) == len(Op.__dataclass_fields__)  # every field written
    assert doc["ops"][0]["members"] == ["conv1.a", "conv1.b"]
    assert Graph.from_json(text) == g


def test_unknown_format_to_write_is_refused():
    with pytest.raises(TrainschedError, match=r"unknown graph format 'trainsched\.graph/9'"):
        rich_graph().to_json(format="trainsched.graph/9")


def test_json_of_equal_graphs_is_byte_identical():
    assert rich_graph().to_json() == rich_graph().to_json()
    empty = ('{"format": "trainsched.graph/2",\n"meta": {},\n"strings": [],\n'
             '"ops": {\n"name": []\n},\n"edges": {\n"dst": [],\n"size_bytes": [],\n'
             '"src": []\n}}\n')
    assert Graph([], []).to_json() == empty
    old = '{"format": "trainsched.graph/1",\n"meta": {},\n"ops": [],\n"edges": []}\n'
    assert Graph([], []).to_json(format=FORMAT_V1) == old


def test_json_hand_written_file_uses_defaults():
    text = json.dumps(
        {
            "format": FORMAT_V1,
            "ops": [{"name": "a", "param_bytes": 4e6}, {"name": "b", "compute_s": 1}],
            "edges": [{"src": "a", "dst": "b", "size_bytes": 16}],
        }
    )
    g = Graph.from_json(text)
    assert g.op("a").param_bytes == 4_000_000 and g.op("b").compute_s == 1.0
    assert g.edges[0].tensor == "a" and g.meta == {}


def write(tmp_path, content) -> str:
    path = tmp_path / "graph.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content), encoding="utf-8")
    return str(path)


def doc(**overrides):
    base = {
        "format": FORMAT_V1,
        "meta": {},
        "ops": [{"name": "a"}, {"name": "b"}],
        "edges": [{"src": "a", "dst": "b", "size_bytes": 1}],
    }
    base.update(overrides)
    return base


def op_a(**fields):
    """A document whose first op ``a`` has ``fields``."""
    return doc(ops=[{"name": "a", **fields}, {"name": "b"}])


def edge_ab(**fields):
    """A document whose one edge has ``fields``."""
    return doc(edges=[{"src": "a", "dst": "b", **fields}])


TRUNCATED = '{"format": "trainsched.graph/1", "ops": ['
WITH_NAN = '{"format": "trainsched.graph/1", "ops": [{"name": "a", "flops": NaN}], "edges": []}'
CYCLE = [{"src": "a", "dst": "b", "size_bytes": 1}, {"src": "b", "dst": "a", "size_bytes": 1}]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (TRUNCATED, "malformed JSON at line 1, column 42: Expecting value (the text ends early"),
        ('{"format": 1,\n "ops": [}', "malformed JSON at line 2, column 10"),
        ("[1, 2]", "expected a JSON object, got a list"),
        ({"ops": [], "edges": []}, "no 'format' field; this reader supports 'trainsched.graph/1'"),
        (doc(format="g/9"), "unsupported format 'g/9'; this reader supports 'trainsched.graph/1'"),
        ({"format": FORMAT_V1, "ops": []}, "missing required field 'edges'"),
        (doc(extra=1), "unknown field 'extra'"),
        (doc(meta=[1]), "meta: expected an object, got [1]"),
        (doc(ops={"a": 1}), "ops: expected a list, got an object"),
        (doc(ops=[{"name": "a"}, 3]), "ops[1]: expected an object, got a number"),
        (doc(ops=[{"kind": "forward"}]), "ops[0]: missing required field 'name'"),
        (op_a(flop=1, zzz=2), "ops[0]: unknown field 'flop', 'zzz' (did you mean 'flops'?)"),
        (doc(ops=[{"name": n} for n in "abc"] + [{"name": "d", "compute_s": "fast"}]),
         'ops[3].compute_s: expected a number, got "fast"'),
        (op_a(param_bytes=1.5), "ops[0].param_bytes: expected an integer, got 1.5"),
        (op_a(group=1), "ops[0].group: expected a string or null, got 1"),
        (op_a(members=[1]), "ops[0].members: expected a list of names, got [1]"),
        (op_a(compute_s=None), "ops[0].compute_s: expected a number, got null"),
        (op_a(compute_s=-1), "ops[0]: op 'a': compute_s must be >= 0"),
        (op_a(kind="fwd"), "ops[0]: op 'a': unknown kind 'fwd'"),
        (WITH_NAN, "ops[0]: op 'a': flops must be finite, got nan"),
        (edge_ab(), "edges[0]: missing required field 'size_bytes'"),
        (edge_ab(size_bytes="1"), 'edges[0].size_bytes: expected an integer, got "1"'),
        (edge_ab(size_bytes=-1), "edges[0]: edge 'a' -> 'b': size_bytes must be >= 0, got -1"),
        (doc(edges=[{"src": "a", "dst": "q", "size_bytes": 1}]),
         "edges[0] 'a' -> 'q': destination 'q' is not an op"),
        (doc(ops=[{"name": "a"}, {"name": "a"}]), "duplicate op names: 'a'"),
        (doc(edges=CYCLE), "graph has a cycle: a -> b -> a"),
    ],
)  # fmt: skip
def test_json_reading_errors_name_the_file(tmp_path, content, message):
    path = write(tmp_path, content)
    with pytest.raises(TrainschedError) as info:
        Graph.load(path)
    assert str(info.value).startswith(f"{path}: ")
    assert message in str(info.value)


def test_missing_file(tmp_path):
    path = tmp_path / "nope.json"
    with pytest.raises(TrainschedError, match=re.escape(str(path)) + ": no such graph file"):
        Graph.load(path)


def test_from_json_default_source():
    with pytest.raises(TrainschedError, match=r"^<string>: malformed JSON"):
        Graph.from_json("{")


def test_save_is_atomic_when_serialisation_fails(tmp_path):
    bad = Graph([Op(name="a")], [], {"when": object()})
    with pytest.raises(TrainschedError, match="meta is not JSON-serialisable"):
        bad.save(tmp_path / "g.json")
    assert os.listdir(tmp_path) == []
    # An existing file is left untouched, and no temp file is left beside it.
    good = diamond()
    good.save(tmp_path / "g.json")
    with pytest.raises(TrainschedError):
        Graph([Op(name="a")], [], {"x": math.nan}).save(tmp_path / "g.json")
    assert os.listdir(tmp_path) == ["g.json"]
    assert Graph.load(tmp_path / "g.json") == good


def test_save_into_missing_directory(tmp_path):
    with pytest.raises(TrainschedError, match="cannot write"):
        diamond().save(tmp_path / "no" / "g.json")


def test_large_graph_is_fast_enough():
    n = 20_000
    g = chain(*([1e-3] * n))
    assert len(g.topological_order()) == n
    assert g.critical_path()[0] == pytest.approx(n * 1e-3)
    assert Graph.from_json(g.to_json()) == g


@pytest.mark.parametrize(("field", "huge"), [
    ("compute_s", 1e308), ("backward_weight_s", 1e308), ("flops", 1e308),
    ("param_bytes", 10**308),
])
def test_costs_whose_sum_overflows_are_refused(field, huge):
    ops = [Op(name="a", **{field: huge}), Op(name="b", **{field: huge})]
    assert Graph(ops[:1], [])  # one such op is a finite number
    with pytest.raises(TrainschedError, match=f"the ops' {field} add up to more than the "
                                              f"largest number .*op 'a'"):
        Graph(ops, [])


def test_edge_sizes_whose_sum_overflows_are_refused():
    ops = [Op(name=n) for n in "abc"]
    edges = [Edge(src="a", dst="b", size_bytes=10**308), Edge(src="b", dst="c",
                                                              size_bytes=10**308)]
    with pytest.raises(TrainschedError, match="the edges' size_bytes add up"):
        Graph(ops, edges)
