"""Training precision: capture converts or autocasts the model, the roofline uses the dtype's
rate, the optimizer keeps fp32 master weights for 16-bit parameters, and reports name it."""

from __future__ import annotations

import pytest

from trainsched import costs as cost_models
from trainsched.cli import main
from trainsched.cluster import device_kind
from trainsched.errors import TrainschedError
from trainsched.graph import Graph, Op, to_training

torch = pytest.importorskip("torch")

from trainsched.capture import capture  # noqa: E402

A100 = "A100-80GB"


def _linear(precision, **kw):
    torch.manual_seed(0)
    model = torch.nn.Linear(1024, 1024)
    x = torch.randn(512, 1024)
    return capture(model, x, costs=kw.pop("costs", "roofline"), precision=precision,
                   device_kind=kw.pop("device_kind", A100), **kw)


def _layer(graph):
    return next(op for op in graph.ops if op.param_bytes)


def test_bf16_parameters_and_activations_take_two_bytes():
    fp32, bf16 = _layer(_linear("fp32")), _layer(_linear("bf16"))
    assert fp32.param_bytes == 4 * (1024 * 1024 + 1024)
    assert bf16.param_bytes == 2 * (1024 * 1024 + 1024)
    assert bf16.output_bytes == 2 * 512 * 1024


def test_autocast_keeps_fp32_parameters_and_computes_in_bf16():
    amp = _layer(_linear("amp-bf16"))
    assert amp.param_bytes == 4 * (1024 * 1024 + 1024)
    assert amp.output_bytes == 2 * 512 * 1024          # the matmul's output is bf16
    spec = device_kind(A100)
    # 2 * 512 * 1024 * 1024 FLOPs at the bf16 rate (312 TFLOP/s) beat the fp32 rate's time
    flops = 2 * 512 * 1024 * 1024
    assert amp.flops == pytest.approx(flops, rel=1e-3)
    bf16_s = cost_models.roofline_s(flops=amp.flops, bytes_accessed=amp.bytes_accessed,
                                    device=spec, dtype="bf16")
    assert amp.compute_s == pytest.approx(bf16_s, rel=1e-12)


def test_tf32_costs_fp32_matmuls_at_the_tf32_rate():
    tf32, fp32 = _layer(_linear("tf32")), _layer(_linear("fp32"))
    spec = device_kind(A100)
    assert tf32.param_bytes == fp32.param_bytes
    assert tf32.compute_s == pytest.approx(cost_models.roofline_s(
        flops=tf32.flops, bytes_accessed=tf32.bytes_accessed, device=spec, dtype="tf32"))
    # 1.07 GFLOP: 73 us at 75 % of 19.5 TFLOP/s; compute-bound at fp32, far less at 156 TF/s
    assert fp32.compute_s > 5 * tf32.compute_s


def test_the_graph_records_its_precision():
    assert _linear("amp-fp16").meta["precision"] == "amp-fp16"


def _one_layer(precision: str) -> Graph:
    return Graph([Op(name="w", compute_s=1e-3, param_bytes=1000)], [],
                 {"precision": precision})


def test_adam_on_16_bit_parameters_keeps_an_fp32_master_copy():
    # 500 bf16 parameters (1000 bytes): fp32 master 2000 B + two fp32 moments 4000 B.
    opt = next(op for op in to_training(_one_layer("bf16"), optimizer="adam").ops
               if op.kind == "optimizer")
    assert opt.optimizer_state_bytes == 6000
    fp32 = next(op for op in to_training(_one_layer("fp32"), optimizer="adam").ops
                if op.kind == "optimizer")
    assert fp32.optimizer_state_bytes == 2000     # 250 fp32 parameters: two moments


def test_an_unknown_precision_is_a_clear_error():
    with pytest.raises(TrainschedError, match="unknown precision 'int8'; choose one of fp32"):
        _linear("int8")


def test_tf32_cannot_be_measured_on_the_cpu():
    with pytest.raises(TrainschedError, match="tf32 is a GPU math mode"):
        _linear("tf32", costs="measured", device="cpu", device_kind=None, repeats=1)


def test_compare_refuses_to_run_a_precision_it_trains_in_fp32(capsys):
    assert main(["compare", "mlp", "--cluster", "cpu:2", "--precision", "bf16", "--run"]) == 2
    assert "--run trains in fp32" in capsys.readouterr().err


def test_simulate_names_the_precision_of_the_costs(tmp_path, capsys):
    path = tmp_path / "g.json"
    Graph([Op(name="w", compute_s=1e-3, flops=1e9, param_bytes=1 << 20)], [],
          {"model": "one", "tier": "roofline", "device": "A100-80GB",
           "precision": "bf16"}).save(path)
    assert main(["simulate", str(path), "--cluster", "dgx-a100"]) == 0
    assert "costs            roofline on A100-80GB, bf16" in capsys.readouterr().out
