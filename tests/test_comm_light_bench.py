"""The communication benchmarks run end to end on 2 gloo ranks in their quick modes: every
configuration is timed, interleaved, and reported against DDP paired by round."""

from __future__ import annotations

import pytest

from bench_run import run_benchmark

pytest.importorskip("torch")


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_quick_light_run_times_every_configuration_against_ddp(tmp_path):
    proc, data = run_benchmark("comm_light.py", "--quick", out=tmp_path / "l.json")
    summary = data["models"]["mlp"]["summary"]
    assert list(summary) == ["ddp-25MB", "pass-through (enabled=False)", "fifo",
                             "priority 4/16MiB", "bytescheduler 4/16MiB",
                             "bytescheduler 4/16MiB, static order",
                             "bytescheduler 32/64MiB, fusion 32MiB",
                             "buckets 1/25MiB, ready order"]
    assert summary["ddp-25MB"]["paired_ddp_ratio"] == 1.0
    for s in summary.values():
        assert len(s["round_medians_s"]) == 1 and s["median_s"] > 0
        assert s["paired_ddp_ratio"] == pytest.approx(
            summary["ddp-25MB"]["median_s"] / s["median_s"])
    assert "bytescheduler 4/16MiB, static order" in proc.stdout


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_quick_real_run_tunes_and_times_every_configuration(tmp_path):
    proc, data = run_benchmark("comm_real.py", "--quick", out=tmp_path / "r.json")
    summary, verdict = data["summary"], data["verdict"]
    assert "priority 16/64MiB overdraft, static order" in summary
    assert any(label.startswith("priority tuned") for label in summary)
    assert verdict["tuned"] in summary and verdict["best_priority"] in summary
    assert data["online_tuning"]["trials"] and "online tuning" in proc.stdout
    for s in summary.values():
        assert s["median_s"] > 0 and s["paired_ddp_ratio"] > 0


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_quick_auto_run_times_the_plan_auto_picks_against_ddp(tmp_path):
    from trainsched.cluster import cluster_preset
    from trainsched.compare import pick_comm

    calibration = tmp_path / "cpu.json"
    calibration.write_text(cluster_preset("cpu").to_json())
    # --trial-steps 0: the simulator's pick as is (the trial's rule has its own tests)
    proc, data = run_benchmark("comm_auto.py", "--quick", "--calibration", str(calibration),
                               "--trial-steps", "0", out=tmp_path / "a.json")
    mlp = data["models"]["mlp"]
    chosen = mlp["auto"]["strategy"]
    assert chosen == pick_comm(mlp["auto"]["predicted_s"])[0]
    assert list(mlp["summary"]) == ["ddp-25MB", f"auto: {chosen}"]
    ddp, auto = (mlp["summary"][k]["median_s"] for k in mlp["summary"])
    assert mlp["paired_auto_over_ddp"] == pytest.approx(ddp / auto)
    assert f"mlp: auto picked {chosen}" in proc.stdout
