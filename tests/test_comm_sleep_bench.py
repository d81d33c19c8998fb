"""The sleep-compute communication benchmark runs end to end (link measurement, interleaved real
runs on 2 gloo ranks, predictions, the report); slow, so on demand: ``make test-slow``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_quick_sleep_run_measures_and_predicts_every_configuration(tmp_path):
    out = tmp_path / "s.json"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "comm_sleep.py"),
                           "--steps", "2", "--warmup", "1", "--repeats", "1",
                           "--link-repeats", "2", "--out", str(out)],
                          env=env, capture_output=True, text=True, timeout=580)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(out.read_text())
    labels = [row["label"] for row in data["rows"]]
    assert labels[:2] == ["fifo", "tictac"] and labels[-1] == "ddp-25MB" and len(labels) == 7
    for row in data["rows"]:
        assert len(row["raw"]) == 1 and len(row["raw"][0]) == 2
        assert row["median_s"] > 0 and row["predicted_s"] > 0
        assert row["error"] == pytest.approx(row["predicted_s"] / row["median_s"] - 1)
    assert data["link"]["alpha_s"] >= 0 and data["link"]["bandwidth_bytes_per_s"] > 0
    assert -1.0 <= data["kendall_tau"] <= 1.0 and "Kendall tau" in proc.stdout
