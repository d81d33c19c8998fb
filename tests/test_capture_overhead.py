"""Capture's measured tier times whole eager steps and charges what the per-op times miss
(the rule itself is tested by hand in test_step_overhead.py). These check the wiring, not a
timing."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from trainsched.capture import capture  # noqa: E402
from trainsched.capture.step import EagerStep  # noqa: E402
from trainsched.graph import to_training  # noqa: E402


def _model():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16),
                                torch.nn.ReLU(), torch.nn.Linear(16, 4))
    return model, torch.randn(4, 8)


def _sums(graph):
    """(forward, backward) compute of the training graph's ops that a step runs."""
    ops = to_training(graph).ops
    return (sum(op.compute_s for op in ops if op.kind == "forward"),
            sum(op.compute_s for op in ops if op.kind in ("backward_input", "backward_weight")))


@pytest.fixture
def scripted_step(monkeypatch):
    """The eager timer answers a step of 1 s whose forward took 0.25 s (far above what the
    ops of this model take one by one): a positive gap on both sides."""
    import importlib

    module = importlib.import_module("trainsched.capture.capture")
    calls = []

    def fake(model, args, kwargs, **options):
        calls.append(options)
        return EagerStep(step_s=1.0, forward_s=0.25, steps=7)

    monkeypatch.setattr(module, "time_eager_step", fake)
    return calls


def test_a_measured_capture_adds_up_to_the_eager_step(scripted_step):
    model, x = _model()
    graph = capture(model, x, costs="measured", device="cpu", repeats=1)
    forward, backward = _sums(graph)
    assert forward == pytest.approx(0.25, rel=1e-9)
    assert backward == pytest.approx(0.75, rel=1e-9)
    record = graph.meta["step_overhead"]
    assert (record["eager_step_s"], record["eager_forward_s"], record["eager_steps"],
            record["rule"]) == (1.0, 0.25, 7, "split")


def test_the_eager_step_runs_with_the_capture_settings(scripted_step):
    model, x = _model()
    capture(model, x, costs="measured", device="cpu", repeats=4, warmup=2)
    assert scripted_step == [{"device": torch.device("cpu"), "warmup": 2, "repeats": 4,
                              "inputs_require_grad": False}]


def test_a_pipeline_stage_counts_the_dx_of_its_first_op(scripted_step):
    model, x = _model()
    graph = capture(model, x, costs="measured", device="cpu", repeats=1,
                    inputs_require_grad=True)
    assert scripted_step[0]["inputs_require_grad"] is True
    # Linear, batch norm, relu, linear: each has a dX now (the first linear's input needs a
    # gradient), and the three with parameters (batch norm's affine ones too) a dW.
    assert graph.meta["step_overhead"]["backward_ops"] == 4 + 3
    assert sum(_sums(graph)) == pytest.approx(1.0, rel=1e-9)


def test_module_granularity_is_charged_per_op_before_grouping(scripted_step):
    model, x = _model()
    graph = capture(model, x, costs="measured", device="cpu", repeats=1,
                    granularity="module")
    assert graph.meta["step_overhead"]["forward_ops"] == 4   # linear, batch norm, relu, linear
    assert _sums(graph)[0] == pytest.approx(0.25, rel=1e-9)


def test_step_overhead_off_charges_nothing(scripted_step):
    model, x = _model()
    graph = capture(model, x, costs="measured", device="cpu", repeats=1, step_overhead=False)
    assert "step_overhead" not in graph.meta
    assert scripted_step == []


def test_the_roofline_tier_is_not_charged(scripted_step):
    model, x = _model()
    graph = capture(model, x, costs="roofline", device_kind="H100")
    assert "step_overhead" not in graph.meta
    assert scripted_step == []


def test_a_real_eager_step_is_timed_and_the_model_left_as_it_was():
    model, x = _model()
    running_mean = model[1].running_mean.clone()
    graph = capture(model, x, costs="measured", device="cpu", repeats=1)
    record = graph.meta["step_overhead"]
    assert 0 < record["eager_forward_s"] <= record["eager_step_s"]
    assert record["eager_steps"] >= 5
    # Charged (or not, when the ops already cover it): the step the training graph adds up to.
    assert sum(_sums(graph)) == pytest.approx(max(record["eager_step_s"], record["ops_s"]),
                                              rel=1e-9)
    assert torch.equal(model[1].running_mean, running_mean)
    assert all(p.grad is None for p in model.parameters())


MODEL_FILE = ("import torch\n"
              "def build(batch_size=4):\n"
              "    torch.manual_seed(0)\n"
              "    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),\n"
              "                                torch.nn.Linear(16, 2))\n"
              "    return model, (torch.randn(batch_size, 8),)\n")


def _profile(tmp_path, *flags):
    from trainsched.cli import main
    from trainsched.graph import Graph

    source = tmp_path / "tiny.py"
    source.write_text(MODEL_FILE)
    out = tmp_path / "g.json"
    code = main(["profile", f"{source}:build", "-q", "-o", str(out), *flags])
    return code, Graph.load(out) if code == 0 else None


def test_profile_charges_the_step_overhead_by_default(tmp_path, capsys):
    code, graph = _profile(tmp_path)
    assert code == 0
    assert "step overhead    eager step" in capsys.readouterr().out
    assert graph.meta["step_overhead"]["eager_steps"] >= 5


def test_profile_no_step_overhead_keeps_the_ops_as_timed(tmp_path, capsys):
    code, graph = _profile(tmp_path, "--no-step-overhead")
    assert code == 0
    assert "step_overhead" not in graph.meta
    assert "step overhead" not in capsys.readouterr().out


def test_no_step_overhead_applies_to_measured_costs_only(tmp_path, capsys):
    code, _ = _profile(tmp_path, "--costs", "static", "--no-step-overhead")
    assert code == 2
    assert ("--no-step-overhead does not apply with --costs static: it applies only with "
            "--costs measured") in capsys.readouterr().err


# --- the optimizer step -----------------------------------------------------------------------

@pytest.fixture
def scripted_update(monkeypatch):
    """The optimizer timer answers 2 s over 4 parameter tensors, median of 6."""
    import importlib

    from trainsched.capture.step import OptimizerStep

    module = importlib.import_module("trainsched.capture.capture")
    calls = []

    def fake(model, **options):
        calls.append(options)
        return OptimizerStep(step_s=2.0, steps=6, params=4)

    monkeypatch.setattr(module, "time_optimizer_step", fake)
    return calls


def test_a_measured_capture_records_the_optimizer_step(scripted_step, scripted_update):
    model, x = _model()
    graph = capture(model, x, costs="measured", device="cpu", repeats=3, warmup=1)
    assert graph.meta["optimizer_step"] == {"optimizer": "sgd", "step_s": 2.0, "steps": 6,
                                            "params": 4}
    assert scripted_update[0]["repeats"] == 3 and scripted_update[0]["warmup"] == 1


def test_its_sgd_optimizer_ops_add_up_to_the_timed_step(scripted_step, scripted_update):
    """Two Linear layers and a batch norm hold parameters: three sgd ops, summing to 2 s."""
    model, x = _model()
    ops = to_training(capture(model, x, costs="measured", device="cpu", repeats=1)).ops
    updates = [op for op in ops if op.kind == "optimizer"]
    assert len(updates) == 3
    assert sum(op.compute_s for op in updates) == pytest.approx(2.0, rel=1e-12)


def test_step_overhead_off_times_no_optimizer_step(scripted_step, scripted_update):
    model, x = _model()
    graph = capture(model, x, costs="measured", device="cpu", repeats=1, step_overhead=False)
    assert "optimizer_step" not in graph.meta
    assert scripted_update == []


def test_a_real_optimizer_step_leaves_the_parameters_and_gradients_as_they_were():
    from trainsched.capture.step import time_optimizer_step

    model, _ = _model()
    before = [p.detach().clone() for p in model.parameters()]
    model[0].weight.grad = torch.ones_like(model[0].weight)
    update = time_optimizer_step(model, device=torch.device("cpu"), repeats=1)
    assert update is not None and update.step_s > 0 and update.steps >= 5
    assert update.params == 6  # two weights, two biases, batch norm's weight and bias
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before, strict=True))
    assert torch.equal(model[0].weight.grad, torch.ones_like(model[0].weight))
    assert model[3].weight.grad is None


def test_profile_shows_the_optimizer_step_it_recorded(tmp_path, capsys):
    code, graph = _profile(tmp_path)
    assert code == 0
    record = graph.meta["optimizer_step"]
    assert record["optimizer"] == "sgd" and record["params"] == 4 and record["steps"] >= 5
    assert "optimizer step   sgd step() + zero_grad()" in capsys.readouterr().out
