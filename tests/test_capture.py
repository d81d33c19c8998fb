"""Capture: real PyTorch models into graphs, with exact shapes, FLOPs, bytes and costs."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from trainsched import costs as cost_models  # noqa: E402
from trainsched.capture import build, capture  # noqa: E402
from trainsched.cluster import device_kind  # noqa: E402
from trainsched.errors import TrainschedError  # noqa: E402
from trainsched.graph import Graph, to_training  # noqa: E402

B = 64
W = 256


def _mlp_graph(**kw):
    z = build("mlp", batch_size=B)
    return capture(z.model, z.args, name="mlp", **kw)


def test_mlp_static_shapes_flops_params_exact():
    g = _mlp_graph(costs="static")
    linears = [op for op in g.ops if "linear" in op.target or "addmm" in op.target]
    assert len(linears) == 4
    assert [op.flops for op in linears] == [2 * B * W * W] * 3 + [2 * B * W * 10]
    assert [op.param_bytes for op in linears] == [(W * W + W) * 4] * 3 + [(W * 10 + 10) * 4]
    assert [op.layer_index for op in linears] == [0, 1, 2, 3]
    assert g.op("x").output_bytes == B * W * 4
    assert all(op.compute_s == 0.0 for op in g.ops)
    # A chain: every op but the input has exactly one producer.
    assert all(len(g.predecessors(op.name)) == 1 for op in g.ops if op.name != "x")
    # The first Linear reads the input, which needs no gradient: no dX, but a dW.
    first = linears[0]
    assert first.backward_input_flops is None
    assert first.backward_weight_flops == 2 * B * W * W
    assert linears[1].backward_input_flops == 2 * B * W * W


def test_resnet50_forward_flops_match_published_8_18_gflop():
    z = build("resnet50", batch_size=1)
    g = capture(z.model, z.args, costs="static", name="resnet50")
    assert abs(g.totals().flops - 8.18e9) / 8.18e9 < 0.02
    assert g.totals().param_bytes == 4 * sum(p.numel() for p in z.model.parameters())


def test_measured_costs_are_positive_with_spread():
    g = _mlp_graph(costs="measured", repeats=4)
    assert g.meta["tier"] == "measured" and g.meta["device"] == "cpu"
    assert g.meta["memory_bandwidth_bytes_per_s"] > 0
    linears = [op for op in g.ops if op.param_bytes]
    for op in linears:
        assert op.compute_s > 0
        assert op.compute_p10_s <= op.compute_s <= op.compute_p90_s
        assert op.backward_weight_s > 0
        assert 3 <= op.samples <= 4
    assert linears[0].backward_input_s is None
    assert all(op.backward_input_s > 0 for op in linears[1:])
    # body.2 and body.4 are the same op on the same shapes: timed once, the times shared.
    assert (linears[1].compute_s, linears[1].backward_weight_s) == (
        linears[2].compute_s, linears[2].backward_weight_s)
    assert g.meta["timed_signatures"] < len([op for op in g.ops if op.target != "input"])


def test_roofline_costs_follow_the_formula():
    g = _mlp_graph(costs="roofline", device_kind="V100")
    spec = device_kind("V100")
    assert g.meta["device"] == spec.kind
    op = next(op for op in g.ops if op.param_bytes)
    expected = cost_models.roofline_s(flops=op.flops, bytes_accessed=op.bytes_accessed,
                                      device=spec)
    assert op.compute_s == pytest.approx(expected, rel=1e-12)
    assert op.compute_s > 0


def test_small_cnn_residual_and_module_granularity():
    z = build("small-cnn", batch_size=2)
    g = capture(z.model, z.args, costs="static")
    adds = [op for op in g.ops if op.target.startswith("aten.add")]
    assert len(adds) == 1 and len(g.predecessors(adds[0].name)) == 2
    m = capture(z.model, z.args, costs="static", granularity="module")
    names = [op.name for op in m.ops]
    # self.relu is called twice: two ops, never one op that would close a cycle.
    assert "relu" in names and "relu#1" in names
    assert m.totals().flops == g.totals().flops
    assert m.totals().param_bytes == g.totals().param_bytes
    assert sorted(x for op in m.ops for x in (op.members or (op.name,))) == sorted(
        op.name for op in g.ops)
    assert m.meta["granularity"] == "module"


def test_module_depth_groups_resnet_blocks():
    z = build("resnet50", batch_size=1)
    g = capture(z.model, z.args, costs="static", granularity="module", module_depth=2)
    names = [op.name for op in g.ops]
    assert "layer1.0" in names and "layer4.2" in names and "fc" in names
    assert len(g.ops) == 23
    assert abs(g.totals().flops - 8.18e9) / 8.18e9 < 0.02


def test_tied_weights_share_a_group_and_count_once():
    z = build("tiny-gpt2", batch_size=2, seq_len=16)
    g = capture(z.model, (), example_kwargs=z.kwargs, costs="static")
    tied = [op for op in g.ops if op.group and op.group.startswith("tied:")]
    assert len(tied) >= 2
    assert len({op.group for op in tied}) == 1
    n_params = sum(p.numel() for p in z.model.parameters())  # tied weights counted once
    assert g.totals().param_bytes == 4 * n_params


def test_captured_graph_becomes_an_acyclic_training_graph():
    g = _mlp_graph(costs="measured", repeats=3)
    t = to_training(g, optimizer="adam")
    kinds = t.totals().ops_by_kind
    assert kinds["backward_weight"] == 4 and kinds["optimizer"] == 4
    assert kinds["backward_input"] == 3 + 3  # 3 Linear + 3 ReLU after the first Linear
    order = {n: i for i, n in enumerate(t.topological_order())}
    linears = [op.name for op in g.ops if op.param_bytes]
    assert f"{linears[0]}:dX" not in t
    assert order[f"{linears[0]}:dW"] > order[f"{linears[1]}:dX"] > order[linears[-1]]


def test_fx_fallback_gives_the_same_costs_as_export():
    z = build("mlp", batch_size=8)
    a = capture(z.model, z.args, costs="static", method="export")
    b = capture(z.model, z.args, costs="static", method="fx")
    assert b.meta["trace"] == "fx" and a.meta["trace"] == "export"
    assert b.totals().flops == a.totals().flops
    assert b.totals().param_bytes == a.totals().param_bytes


class _Broken(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.fc(x)


def test_forward_that_fails_on_the_example_input_is_a_clear_error():
    with pytest.raises(TrainschedError, match=r"could not trace|forward failed"):
        capture(_Broken(), (torch.randn(2, 5),), costs="static")


def test_bad_options_are_clear_errors():
    z = build("mlp", batch_size=2)
    with pytest.raises(TrainschedError, match="granularity"):
        capture(z.model, z.args, granularity="layer")
    with pytest.raises(TrainschedError, match="cost tier"):
        capture(z.model, z.args, costs="guess")
    with pytest.raises(TrainschedError, match="unknown model"):
        build("resnet5000")

    with pytest.raises(TrainschedError, match=r"module_depth .* applies to granularity "
                                              r"'module', not 'op'"):
        capture(z.model, z.args, costs="static", module_depth=2)


def test_static_capture_is_deterministic():
    a = _mlp_graph(costs="static")
    b = _mlp_graph(costs="static")
    assert a.to_json() == b.to_json()
    assert Graph.from_json(a.to_json()) == a
