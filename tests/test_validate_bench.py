"""The validation benchmark's harness runs end to end (real gloo DDP and pipelining runs, captures,
predictions, the report); slow, so on demand: ``make test-slow``."""

from __future__ import annotations

import math

import pytest

from bench_run import run_benchmark

pytest.importorskip("torch")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_quick_validation_run_measures_and_predicts_every_configuration(tmp_path):
    proc, data = run_benchmark("validate_sim.py", "--quick", "--steps", "2", "--rounds", "1",
                               "--warmup", "1", out=tmp_path / "v.json")
    assert set(data["sweeps"]) == {"ddp", "pipeline"}
    for rows in data["sweeps"].values():
        assert rows
        for row in rows:
            assert row["steps"] == 2 and row["measured_s"] > 0 and row["predicted_s"] > 0
            assert row["error"] == pytest.approx(
                (row["predicted_s"] - row["measured_s"]) / row["measured_s"])
    tau = data["summary"]["ddp"]["kendall_tau"]
    assert math.isnan(tau) or -1.0 <= tau <= 1.0
    assert "Kendall tau" in proc.stdout
    # Further models swept over the batch, and the error per model as well as pooled.
    names = [row["config"] for row in data["sweeps"]["ddp"]]
    assert "encoder 2x64 b2 default buckets" in names and "mlp b256 default buckets" in names
    models = data["summary"]["per_model"]
    assert list(models) == ["small-cnn", "small-cnn (take turns)", "mlp", "mlp (take turns)",
                            "encoder 2x64", "encoder 2x64 (take turns)", "small-cnn pipeline"]
    assert models["mlp"]["configs"] == 6  # 3 bucket caps and the flat baseline at batch 64, 16, 256
    assert models["encoder 2x64"]["configs"] == 2
    errors = sorted(abs(r["error"]) for r in data["sweeps"]["ddp"] if r["model"] == "mlp")
    assert models["mlp"]["median_abs_error"] == pytest.approx((errors[2] + errors[3]) / 2)
    assert "per model" in proc.stdout
