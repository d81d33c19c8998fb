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
    assert result.mean_s == pytest.approx(0.0026)
    assert result.samples_per_s == pytest.approx(16 * 5 / 0.013)  # 6153.8/s, not 16000/s


def test_a_segments_throughput_counts_every_step_it_timed():
    segment = SegmentResult(label="ddp", kind="ddp", step_times_s=BIMODAL)
    result = TrainResult(model="m", nproc=2, batch_size=8, optimizer="sgd",
                         segments=(segment,))
    assert result.throughput() == pytest.approx(2 * 8 * 5 / 0.013)
    assert result.to_dict()["segments"][0]["throughput_samples_per_s"] == pytest.approx(
        2 * 8 * 5 / 0.013)


def test_compares_measured_table_shows_the_mean_and_the_median_beside_it():
    from types import SimpleNamespace

    from trainsched.report.tables import measured_report

    row = SimpleNamespace(strategy="data-ddp", step_time_s=0.002)
    measured = {"data-ddp": {"mean_s": 0.0026, "median_s": 0.001, "p10_s": 0.001,
                             "p90_s": 0.005, "measured_over_predicted": 1.3}}
    lines = measured_report([row], measured, "out").splitlines()
    assert "mean of the timed steps" in lines[1]
    assert lines[2].split() == ["strategy", "predicted", "measured", "median", "p10", "p90",
                                "meas/pred"]
    assert lines[3].split() == ["data-ddp", "2.00", "ms", "2.60", "ms", "1.00", "ms", "1.00",
                                "ms", "5.00", "ms", "1.30x"]


def test_a_plans_report_says_mean_and_median():
    from types import SimpleNamespace

    from trainsched.report.tables import plan_run_report

    result = RunResult(kind="data", model="m", ranks=2, samples_per_step=16,
                       step_times_s=BIMODAL)
    plan = SimpleNamespace(kind="data")
    prediction = SimpleNamespace(step_time_s=0.002, cluster="cpu")
    text = plan_run_report("p.plan.json", plan, result, prediction, warmup=1)
    assert "  measured   mean 2.60 ms  median 1.00 ms  p10 " in text
    assert "(measured / predicted 1.30x)" in text  # 2.6 ms over 2 ms, by hand


def test_a_step_is_timed_start_to_start_and_the_final_drain_is_not_a_step():
    """Steps that take 1, 2 and 3 ticks of a fake clock, then a drain of 10 ticks: the times
    are 1, 2 and 3 (the last one ends where its step returns); the drain runs after the last
    time is taken, once."""
    from trainsched.runtime.train import timed_steps

    now = [0.0]
    log: list[str] = []

    def step(i: int) -> None:
        log.append(f"step {i}")
        now[0] += i + 1

    def drain() -> None:
        log.append("drain")
        now[0] += 10

    times = timed_steps(3, step, drain, clock=lambda: now[0])
    assert times == [1.0, 2.0, 3.0]
    assert log == ["step 0", "step 1", "step 2", "drain"]
    assert timed_steps(2, step, clock=lambda: now[0]) == [1.0, 2.0]
