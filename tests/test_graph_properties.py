"""Invariants of Graph and the training transform on random DAGs (hypothesis)."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainsched.errors import TrainschedError
from trainsched.graph import Edge, Graph, Op, to_training

costs = st.floats(min_value=0.0, max_value=1e3, allow_nan=False, allow_infinity=False)
sizes = st.integers(min_value=0, max_value=2**40)
# (flops, param_bytes, backward_input_s, backward_weight_flops): one draw per op keeps it fast.
profiles = st.sampled_from([
    (0.0, 0, None, None),
    (0.0, 64, None, None),
    (1e6, 4096, 2.5e-4, None),
    (3.5e9, 4096, None, 7e9),
    (1e6, 0, 1e-3, 2e6),
])  # fmt: skip


@st.composite
def forward_dags(draw: st.DrawFn) -> Graph:
    """Up to 40 forward ops; edges only from lower to higher index; ops listed in shuffled order."""
    n = draw(st.integers(min_value=0, max_value=40))
    ops = []
    for i in range(n):
        flops, param_bytes, backward_input_s, backward_weight_flops = draw(profiles)
        ops.append(Op(
            name=f"op{i}",
            compute_s=draw(costs),
            flops=flops,
            param_bytes=param_bytes,
            saved_bytes=draw(sizes),
            backward_input_s=backward_input_s,
            backward_weight_flops=backward_weight_flops,
            members=("m.a", "m.b") if i % 3 == 0 else (),
        ))  # fmt: skip
    index = st.integers(0, max(n - 1, 0))
    pairs = draw(st.lists(st.tuples(index, index, sizes), min_size=n, max_size=2 * n))
    chosen = {(min(i, j), max(i, j)): size for i, j, size in pairs if i != j}
    edges = [Edge(src=f"op{i}", dst=f"op{j}", size_bytes=size) for (i, j), size in chosen.items()]
    order = draw(st.permutations(range(n)))
    return Graph([ops[i] for i in order], edges, {"tier": "static", "batch_size": n + 1})


def assert_respects_edges(graph: Graph, order: tuple[str, ...]) -> dict[str, int]:
    position = {name: k for k, name in enumerate(order)}
    assert len(order) == len(graph) == len(position)
    assert set(order) == {op.name for op in graph.ops}
    for e in graph.edges:
        assert position[e.src] < position[e.dst]
    return position


@settings(max_examples=100, deadline=None)
@given(forward_dags())
def test_json_round_trip_is_exact(graph):
    text = graph.to_json()
    loaded = Graph.from_json(text)
    assert loaded == graph
    assert loaded.to_json() == text


@settings(max_examples=100, deadline=None)
@given(forward_dags())
def test_topological_order_respects_every_edge(graph):
    assert_respects_edges(graph, graph.topological_order())


@settings(max_examples=100, deadline=None)
@given(forward_dags())
def test_critical_path_between_largest_op_and_total(graph):
    length, path = graph.critical_path()
    total = graph.totals().compute_s
    largest = max((op.compute_s for op in graph.ops), default=0.0)
    assert largest <= length <= total * (1 + 1e-12)
    assert math.isclose(length, math.fsum(graph.op(n).compute_s for n in path), abs_tol=1e-9)
    for u, v in itertools.pairwise(path):
        assert u in graph.predecessors(v)


@settings(max_examples=100, deadline=None)
@given(forward_dags(), st.sampled_from(["sgd", "momentum", "adam"]))
def test_training_transform_follows_the_rules(graph, optimizer):
    t = to_training(graph, optimizer=optimizer)  # constructing it proves it is acyclic
    requires_grad: dict[str, bool] = {}
    for name in graph.topological_order():
        preds = graph.predecessors(name)
        requires_grad[name] = graph.op(name).param_bytes > 0 or any(requires_grad[p] for p in preds)
    with_dx = {v for v in requires_grad if any(requires_grad[p] for p in graph.predecessors(v))}
    with_params = {op.name for op in graph.ops if op.param_bytes > 0}
    totals = t.totals()
    assert totals.ops_by_kind == {
        "forward": len(graph),
        "backward_input": len(with_dx),
        "backward_weight": len(with_params),
        "optimizer": len(with_params),
    }
    assert {op.forward_op for op in t.ops if op.kind == "backward_input"} == with_dx
    assert {op.forward_op for op in t.ops if op.kind == "optimizer"} == with_params

    position = assert_respects_edges(t, t.topological_order())
    for op in t.ops:
        if op.kind != "forward":
            assert position[op.forward_op] < position[op.name]
            assert op.group == t.op(op.forward_op).group
    # The transform's own op order is a valid order too.
    assert_respects_edges(t, tuple(op.name for op in t.ops))


@settings(max_examples=100, deadline=None)
@given(forward_dags())
def test_a_back_edge_makes_a_reported_cycle_of_real_edges(graph):
    path = graph.critical_path()[1]
    if len(path) < 2:
        return
    back = Edge(src=path[-1], dst=path[0], size_bytes=1, tensor="back")
    with pytest.raises(TrainschedError, match=r"^graph has a cycle: ") as info:
        Graph(graph.ops, [*graph.edges, back])
    cycle = str(info.value).removeprefix("graph has a cycle: ").split(" -> ")
    assert cycle[0] == cycle[-1] and len(set(cycle)) == len(cycle) - 1
    pairs = {(e.src, e.dst) for e in (*graph.edges, back)}
    assert all((u, v) in pairs for u, v in itertools.pairwise(cycle))
