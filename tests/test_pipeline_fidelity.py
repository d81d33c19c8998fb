"""Pipeline fidelity: a stage captured on its own gets the input gradient its first op really
computes in a pipeline, and the simulator charges the host time of actions and messages."""

from __future__ import annotations

import re

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from trainsched.backprop.stages import stage_costs_from_graph  # noqa: E402
from trainsched.capture import capture  # noqa: E402
from trainsched.graph import to_training  # noqa: E402


def _second_half() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8)), torch.randn(4, 64)


def test_a_stage_captured_alone_gives_its_first_op_an_input_gradient():
    model, x = _second_half()
    graph = to_training(capture(model, (x,), costs="roofline", inputs_require_grad=True))
    first = next(op for op in graph.ops if op.kind == "forward" and op.target != "input")
    dx = graph.op(f"{first.name}:dX")   # raises if the op is missing
    assert dx.compute_s > 0             # roofline: a 4x64 by 64x64 matmul
    stages = stage_costs_from_graph(graph, 1, 1)
    others = sum(op.compute_s for op in graph.ops
                 if op.kind == "backward_input" and op.name != dx.name)
    assert stages.backward_input_s[0] == pytest.approx(others + dx.compute_s)


def test_a_model_captured_whole_keeps_no_input_gradient_for_its_first_op():
    model, x = _second_half()
    graph = to_training(capture(model, (x,), costs="roofline"))
    first = next(op for op in graph.ops if op.kind == "forward" and op.target != "input")
    assert f"{first.name}:dX" not in {op.name for op in graph.ops}


def test_the_first_op_of_a_later_stage_of_a_whole_graph_has_its_input_gradient():
    model, x = _second_half()
    graph = to_training(capture(model, (x,), costs="roofline"))
    order = [n for n in graph.topological_order() if graph.op(n).kind == "forward"]
    second_linear = [n for n in order if graph.op(n).param_bytes][1]
    stages = stage_costs_from_graph(graph, 2, 1, cut=[second_linear])
    assert stages.ops[1][0] == second_linear
    assert stages.backward_input_s[1] >= graph.op(f"{second_linear}:dX").compute_s > 0


# --- host time of actions and messages --------------------------------------------------------

def _cluster(action_s: float = 0.0, message_s: float = 0.0, stretch: float = 1.0):
    from dataclasses import replace

    from trainsched.cluster import cluster_from_flags

    base = cluster_from_flags(devices=2, memory="1GiB", bandwidth="1GB/s", latency="0s")
    device = replace(base.device, microbatch_overhead_s=action_s, message_host_s=message_s,
                     microbatch_stretch=stretch)
    return replace(base, device=device)


def test_gpipe_pays_the_action_and_message_host_time_on_every_slot():
    from trainsched.backprop.schedules import gpipe
    from trainsched.backprop.stages import uniform_stages
    from trainsched.sim import simulate_pipeline

    stages = uniform_stages(2, 1.0, 1.0, 1.0)   # F = 1, B = I + W = 2, nothing sent
    plain = simulate_pipeline(stages, gpipe(2, 4), _cluster()).step_time_s
    assert plain == pytest.approx((4 + 2 - 1) * 3.0)
    # each of F and B: + 0.1 action + 0.05 for its one message across the boundary
    slow = simulate_pipeline(stages, gpipe(2, 4), _cluster(0.1, 0.05)).step_time_s
    assert slow == pytest.approx((4 + 2 - 1) * (3.0 + 2 * 0.15))


def test_a_split_backward_pays_one_more_action_but_no_more_messages():
    from trainsched.backprop.schedules import gpipe
    from trainsched.backprop.stages import uniform_stages
    from trainsched.sim import simulate_pipeline

    stages = uniform_stages(2, 1.0, 1.0, 1.0)
    split = simulate_pipeline(stages, gpipe(2, 4, split_backward=True), _cluster(0.1, 0.05))
    # F 1.15, I 1.15, W 1.1. Rank 1's forwards end at 5 x 1.15 = 5.75, its I_k at
    # 5.75 + 2.25 k + 1.15, so I_3 at 13.65; rank 0 then runs I_3 and W_3: 13.65 + 2.25.
    assert split.step_time_s == pytest.approx(15.9)


def test_the_stretch_scales_each_actions_ops_and_not_its_host_time():
    from trainsched.backprop.schedules import gpipe
    from trainsched.backprop.stages import uniform_stages
    from trainsched.sim import simulate_pipeline

    stages = uniform_stages(2, 1.0, 1.0, 1.0)   # F = 1, B = 2
    # 5 slots of F + B: ops 1.5 x (1 + 2) = 4.5, and host time 2 x (0.1 + 0.05) on top
    step = simulate_pipeline(stages, gpipe(2, 4), _cluster(0.1, 0.05, 1.5)).step_time_s
    assert step == pytest.approx((4 + 2 - 1) * (4.5 + 2 * 0.15))
    doubled = uniform_stages(2, 2.0, 2.0, 2.0)  # twice the work: twice the stretch's share
    assert simulate_pipeline(doubled, gpipe(2, 4), _cluster(stretch=1.5)).step_time_s \
        == pytest.approx((4 + 2 - 1) * 9.0)


@pytest.mark.parametrize("value, message", [
    ("0.5", "microbatch_stretch must be a number in [1, 4]"),
    ('"10%"', "expected a number (how many times longer an action runs"),
])
def test_a_bad_stretch_in_a_cluster_file_is_refused(tmp_path, value, message):
    from trainsched.cluster import load_cluster_file
    from trainsched.errors import TrainschedError

    path = tmp_path / "c.toml"
    path.write_text('[device]\nkind = "cpu"\ncount = 2\nmicrobatch_stretch = ' + value
                    + '\n[intra_node]\nbandwidth = "1GB/s"\nlatency = "1us"\n')
    with pytest.raises(TrainschedError, match=re.escape(message)):
        load_cluster_file(path)


def test_host_times_survive_a_cluster_file_round_trip(tmp_path):
    from trainsched.cluster import load_cluster_file

    cluster = _cluster(2.5e-4, 1e-4, 1.125)
    import json

    path = tmp_path / "c.json"
    path.write_text(json.dumps(cluster.to_dict()))
    back = load_cluster_file(path)
    assert back.device.microbatch_overhead_s == 2.5e-4
    assert back.device.message_host_s == 1e-4
    assert back.device.microbatch_stretch == 1.125
    assert "microbatch_stretch" not in _cluster().to_dict()["device"]  # 1: nothing written
