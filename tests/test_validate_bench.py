"""The validation benchmark's harness runs end to end (real gloo DDP and pipelining runs, captures,
predictions, the report); slow, so on demand: ``make test-slow``."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_quick_validation_run_measures_and_predicts_every_configuration(tmp_path):
    out = tmp_path / "v.json"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "validate_sim.py"), "--quick",
                           "--steps", "2", "--rounds", "1", "--warmup", "1", "--out", str(out)],
                          env=env, capture_output=True, text=True, timeout=580)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(out.read_text())
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
