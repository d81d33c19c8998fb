"""The training transform on hand graphs: which backward ops exist, their edges and costs."""

from __future__ import annotations

import pytest

from trainsched.errors import TrainschedError
from trainsched.graph import Edge, Graph, Op
from trainsched.graph.training import DEFAULT_MEMORY_BANDWIDTH_BYTES_PER_S, to_training


def edge_list(graph: Graph) -> list[tuple[str, str, int, str]]:
    return [(e.src, e.dst, e.size_bytes, e.tensor) for e in graph.edges]


def three_op_chain(**meta) -> Graph:
    ops = [
        Op(name="a", compute_s=1.0, param_bytes=40, saved_bytes=4, layer_index=0, module_path="l0"),
        Op(name="b", compute_s=2.0, param_bytes=80, saved_bytes=8, layer_index=1, module_path="l1"),
        Op(name="c", compute_s=3.0, param_bytes=40, saved_bytes=2, layer_index=2, module_path="l2"),
    ]
    edges = [Edge(src="a", dst="b", size_bytes=10), Edge(src="b", dst="c", size_bytes=20)]
    return Graph(ops, edges, {"model": "chain", **meta})


def test_chain_with_params_everywhere():
    t = to_training(three_op_chain())
    names = [op.name for op in t.ops]
    assert names == [
        "a", "b", "c",
        "c:dX", "c:dW", "b:dX", "b:dW", "a:dW",
        "a:opt", "b:opt", "c:opt",
    ]  # fmt: skip
    assert edge_list(t) == [
        ("a", "b", 10, "a"),
        ("b", "c", 20, "b"),
        ("a", "a:dW", 4, "a:saved"),
        ("b", "b:dX", 8, "b:saved"),
        ("b", "b:dW", 8, "b:saved"),
        ("c", "c:dX", 2, "c:saved"),
        ("c", "c:dW", 2, "c:saved"),
        ("c:dX", "b:dX", 20, "c:dX>b"),
        ("c:dX", "b:dW", 20, "c:dX>b"),
        ("b:dX", "a:dW", 10, "b:dX>a"),
        ("a:dW", "a:opt", 40, "a:grad"),
        ("b:dW", "b:opt", 80, "b:grad"),
        ("c:dW", "c:opt", 40, "c:grad"),
    ]
    kinds = {op.name: op.kind for op in t.ops}
    assert kinds["c:dX"] == "backward_input" and kinds["c:dW"] == "backward_weight"
    assert kinds["a:opt"] == "optimizer" and kinds["a"] == "forward"
    for op in t.ops:
        base = op.name.split(":")[0]
        assert op.group == base
        assert op.layer_index == t.op(base).layer_index
        assert op.module_path == t.op(base).module_path
        assert op.forward_op == (None if op.kind == "forward" else base)
    assert t.op("c:dX").output_bytes == 20 and t.op("b:dX").output_bytes == 10
    assert t.op("b:dW").output_bytes == 80
    assert all(op.saved_bytes == 0 for op in t.ops if op.kind != "forward")
    assert t.meta["model"] == "chain"
    assert t.meta["training"]["optimizer"] == "sgd"
    assert t.critical_path()[1][:3] == ("a", "b", "c")


def test_first_op_without_params_and_inputs_needs_no_backward():
    ops = [
        Op(name="norm", compute_s=1.0, saved_bytes=5),  # e.g. input normalisation
        Op(name="fc1", compute_s=2.0, param_bytes=16, saved_bytes=6),
        Op(name="relu", compute_s=0.5, saved_bytes=7),
        Op(name="fc2", compute_s=2.0, param_bytes=16, saved_bytes=8),
    ]
    edges = [
        Edge(src="norm", dst="fc1", size_bytes=100),
        Edge(src="fc1", dst="relu", size_bytes=50),
        Edge(src="relu", dst="fc2", size_bytes=50),
    ]
    t = to_training(Graph(ops, edges))
    names = [op.name for op in t.ops]
    assert names == [
        "norm", "fc1", "relu", "fc2",
        "fc2:dX", "fc2:dW", "relu:dX", "fc1:dW",
        "fc1:opt", "fc2:opt",
    ]  # fmt: skip
    assert not any(n.startswith("norm:") for n in names)
    assert edge_list(t)[3:] == [
        ("fc1", "fc1:dW", 6, "fc1:saved"),
        ("relu", "relu:dX", 7, "relu:saved"),
        ("fc2", "fc2:dX", 8, "fc2:saved"),
        ("fc2", "fc2:dW", 8, "fc2:saved"),
        ("fc2:dX", "relu:dX", 50, "fc2:dX>relu"),
        ("relu:dX", "fc1:dW", 50, "relu:dX>fc1"),
        ("fc1:dW", "fc1:opt", 16, "fc1:grad"),
        ("fc2:dW", "fc2:opt", 16, "fc2:grad"),
    ]


def test_residual_diamond_gradients_fan_in():
    # x -> conv1 -> conv2 -> add, and x -> add (the skip); x has parameters.
    ops = [
        Op(name="x", param_bytes=8),
        Op(name="conv1", param_bytes=8),
        Op(name="conv2", param_bytes=8),
        Op(name="add"),
    ]
    edges = [
        Edge(src="x", dst="conv1", size_bytes=32),
        Edge(src="x", dst="add", size_bytes=32),
        Edge(src="conv1", dst="conv2", size_bytes=32),
        Edge(src="conv2", dst="add", size_bytes=32),
    ]
    t = to_training(Graph(ops, edges))
    into_x_dw = [(e.src, e.tensor) for e in t.in_edges("x:dW")]
    assert into_x_dw == [("x", "x:saved"), ("add:dX", "add:dX>x"), ("conv1:dX", "conv1:dX>x")]
    assert t.predecessors("conv2:dX") == ("conv2", "add:dX")
    assert t.successors("add:dX") == ("x:dW", "conv2:dX", "conv2:dW")
    assert t.op("add:dX").output_bytes == 64  # one gradient per producer
    assert "add:dW" not in t and "add:opt" not in t and "x:dX" not in t
    assert [op.name for op in t.ops][4:] == [
        "add:dX", "conv2:dX", "conv2:dW", "conv1:dX", "conv1:dW", "x:dW",
        "x:opt", "conv1:opt", "conv2:opt",
    ]  # fmt: skip


def test_several_tensors_between_one_pair_make_one_gradient():
    ops = [Op(name="split", param_bytes=4), Op(name="use")]
    edges = [
        Edge(src="split", dst="use", size_bytes=10, tensor="split.0"),
        Edge(src="split", dst="use", size_bytes=30, tensor="split.1"),
    ]
    t = to_training(Graph(ops, edges))
    assert edge_list(t)[-2] == ("use:dX", "split:dW", 40, "use:dX>split")
    assert t.op("use:dX").output_bytes == 40


@pytest.mark.parametrize(("optimizer", "k"), [("sgd", 0), ("momentum", 1), ("adam", 2)])
def test_optimizer_variants(optimizer, k):
    t = to_training(three_op_chain(), optimizer=optimizer, memory_bandwidth_bytes_per_s=100.0)
    opt = t.op("b:opt")
    assert opt.optimizer_state_bytes == k * 80
    assert opt.bytes_accessed == 80 * (3 + 2 * k)
    assert opt.compute_s == pytest.approx(80 * (3 + 2 * k) / 100.0)
    assert opt.param_bytes == 0 and opt.forward_op == "b"
    assert t.meta["training"] == {"optimizer": optimizer, "memory_bandwidth_bytes_per_s": 100.0}
    assert t.totals().optimizer_state_bytes == k * 160


def test_optimizer_bandwidth_from_meta_then_default():
    from_meta = to_training(three_op_chain(memory_bandwidth_bytes_per_s=1000.0))
    assert from_meta.op("a:opt").compute_s == pytest.approx(120 / 1000.0)
    default = to_training(three_op_chain())
    expected_s = 120 / DEFAULT_MEMORY_BANDWIDTH_BYTES_PER_S
    assert default.op("a:opt").compute_s == pytest.approx(expected_s)
    assert DEFAULT_MEMORY_BANDWIDTH_BYTES_PER_S == 10e9


def test_bad_arguments():
    unknown = "unknown optimizer 'lamb'; choose one of sgd, momentum, adam"
    with pytest.raises(TrainschedError, match=unknown):
        to_training(three_op_chain(), optimizer="lamb")
    with pytest.raises(TrainschedError, match="memory_bandwidth_bytes_per_s must be a positive"):
        to_training(three_op_chain(), memory_bandwidth_bytes_per_s=0)
    with pytest.raises(TrainschedError, match=r"meta\['memory_bandwidth_bytes_per_s'\] must be"):
        to_training(three_op_chain(memory_bandwidth_bytes_per_s="fast"))
    twice = "needs a forward graph, but op 'c:dX' has kind 'backward_input'"
    with pytest.raises(TrainschedError, match=twice):
        to_training(to_training(three_op_chain()))


def costed(**fields) -> Graph:
    """x (parameters) -> y (the op under test, with parameters)."""
    ops = [Op(name="x", param_bytes=4), Op(name="y", param_bytes=4, **fields)]
    return Graph(ops, [Edge(src="x", dst="y", size_bytes=8)])


def test_measured_backward_costs_win():
    t = to_training(costed(
        compute_s=1.0, flops=100.0, samples=12,
        backward_input_s=0.7, backward_input_p10_s=0.6, backward_input_p90_s=0.9,
        backward_weight_s=1.3, backward_input_flops=300.0,
    ))  # fmt: skip
    dx, dw = t.op("y:dX"), t.op("y:dW")
    assert (dx.compute_s, dx.compute_p10_s, dx.compute_p90_s, dx.samples) == (0.7, 0.6, 0.9, 12)
    assert (dw.compute_s, dw.compute_p10_s, dw.samples) == (1.3, None, 12)
    assert dx.flops == 300.0 and dw.flops == 100.0


def test_flop_ratio_scales_the_forward_time():
    t = to_training(costed(
        compute_s=2.0, flops=100.0, backward_input_flops=100.0, backward_weight_flops=250.0,
        bytes_accessed=64, temp_bytes=3,
    ))  # fmt: skip
    dx, dw = t.op("y:dX"), t.op("y:dW")
    assert dx.compute_s == pytest.approx(2.0) and dw.compute_s == pytest.approx(5.0)
    assert (dx.flops, dw.flops) == (100.0, 250.0)
    assert dx.bytes_accessed == dw.bytes_accessed == 64 and dx.temp_bytes == dw.temp_bytes == 3
    assert dx.samples == 0 and dx.compute_p10_s is None


def test_fallback_costs_the_forward_time():
    # No measurement; backward FLOPs unknown, or forward FLOPs zero (memory-bound): forward time.
    t = to_training(costed(compute_s=0.25, backward_weight_flops=40.0))
    assert t.op("y:dX").compute_s == 0.25 and t.op("y:dW").compute_s == 0.25
    assert t.op("y:dX").flops == 0.0 and t.op("y:dW").flops == 40.0


def test_existing_group_is_kept_and_shared():
    ops = [Op(name="x", param_bytes=4, group="block0"), Op(name="y", param_bytes=4)]
    t = to_training(Graph(ops, [Edge(src="x", dst="y", size_bytes=8)]))
    assert {op.name for op in t.ops if op.group == "block0"} == {"x", "x:dW", "x:opt"}
    assert t.op("y").group == "y"


def test_forward_order_follows_topology_not_listing():
    ops = [Op(name="b", param_bytes=4), Op(name="a", param_bytes=4)]
    t = to_training(Graph(ops, [Edge(src="a", dst="b", size_bytes=8)]))
    assert [op.name for op in t.ops] == ["a", "b", "b:dX", "b:dW", "a:dW", "a:opt", "b:opt"]


def test_parameter_free_graph_has_no_backward():
    ops = [Op(name="a"), Op(name="b")]
    t = to_training(Graph(ops, [Edge(src="a", dst="b", size_bytes=8)]))
    assert [op.name for op in t.ops] == ["a", "b"]
    assert to_training(Graph([], [])).ops == ()
