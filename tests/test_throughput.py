"""Throughput of measured steps: samples over the steps' total time, not over the median step
(a host whose steps are bimodal, fast or one scheduler tick slower, runs at the mean)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from trainsched.runtime.run import RunResult
from trainsched.runtime.train import SegmentResult, TrainResult

# three fast steps of 1 ms and two slow ones of 5 ms: median 1 ms, total 13 ms
BIMODAL = (0.001, 0.005, 0.001, 0.005, 0.001)


def test_a_plans_run_counts_every_step_it_timed():
    result = RunResult(kind="data", model="m", ranks=2, samples_per_step=16,
                       step_times_s=BIMODAL)
    assert result.median_s == 0.001
    assert result.samples_per_s == pytest.approx(16 * 5 / 0.013)  # 6153.8/s, not 16000/s


def test_a_segments_throughput_counts_every_step_it_timed():
    segment = SegmentResult(label="ddp", kind="ddp", step_times_s=BIMODAL)
    result = TrainResult(model="m", nproc=2, batch_size=8, optimizer="sgd",
                         segments=(segment,))
    assert result.throughput() == pytest.approx(2 * 8 * 5 / 0.013)
    assert result.to_dict()["segments"][0]["throughput_samples_per_s"] == pytest.approx(
        2 * 8 * 5 / 0.013)
