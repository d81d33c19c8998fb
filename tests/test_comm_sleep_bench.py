"""The sleep-compute communication benchmark runs end to end (link measurement, interleaved real
runs on 2 gloo ranks, predictions, the report); slow, so on demand: ``make test-slow``."""

from __future__ import annotations

import pytest

from bench_run import run_benchmark

pytest.importorskip("torch")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_quick_sleep_run_measures_and_predicts_every_configuration(tmp_path):
    proc, data = run_benchmark("comm_sleep.py", "--steps", "2", "--warmup", "1", "--repeats",
                               "1", "--link-repeats", "2", out=tmp_path / "s.json")
    labels = [row["label"] for row in data["rows"]]
    assert labels[:2] == ["fifo", "tictac"] and labels[-1] == "ddp-25MB" and len(labels) == 7
    for row in data["rows"]:
        assert len(row["raw"]) == 1 and len(row["raw"][0]) == 2
        assert row["median_s"] > 0 and row["predicted_s"] > 0
        assert row["error"] == pytest.approx(row["predicted_s"] / row["median_s"] - 1)
    assert data["link"]["alpha_s"] >= 0 and data["link"]["bandwidth_bytes_per_s"] > 0
    assert -1.0 <= data["kendall_tau"] <= 1.0 and "Kendall tau" in proc.stdout
