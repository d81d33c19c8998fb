"""``simulate --sync``: the protocol simulation's rows, its agreement with the step simulator,
plan files carrying a sync policy, and the errors."""

from __future__ import annotations

import json

import pytest

from trainsched.cli import main
from trainsched.comm.policy import DdpBucketPolicy
from trainsched.graph import Edge, Graph, Op, to_training
from trainsched.plan import DataParallelPlan, ModelRef, save_plan


def _graph(tmp_path):
    g = Graph([Op(name="a", compute_s=1e-3, param_bytes=400, flops=10.0),
               Op(name="b", compute_s=2e-3, flops=20.0),
               Op(name="c", compute_s=3e-3, param_bytes=800, flops=30.0)],
              [Edge(src="a", dst="b", size_bytes=100), Edge(src="b", dst="c", size_bytes=100)],
              {"model": "hand", "batch_size": 2})
    path = tmp_path / "g.json"
    g.save(path)
    return path


def _simulate(tmp_path, capsys, *flags):
    base = ["simulate", str(_graph(tmp_path)), "--cluster", "p3.16xlarge", "--parallelism",
            "data", "--ranks", "4", "--json"]
    assert main([*base, *flags]) == 0
    return json.loads(capsys.readouterr().out)


def test_sync_policy_rows_put_bsp_first_and_cut_the_samples_into_phases(tmp_path, capsys):
    # 200 BSP steps x 4 ranks x 2 samples = 1600 samples; 1/8 of them = 200 = 25 BSP steps.
    doc = _simulate(tmp_path, capsys, "--sync", "bsp:0.125,asp:0.875")
    sync = doc["sync"]
    assert [row["policy"] for row in sync["rows"]] == ["bsp", "bsp:0.125,asp:0.875"]
    phases = sync["rows"][1]["phases"]
    assert [(p["protocol"], p["samples"], p["updates"]) for p in phases] == [
        ("bsp", 200, 25), ("asp", 1400, 700)]


def test_bsp_without_noise_matches_the_step_simulator(tmp_path, capsys):
    doc = _simulate(tmp_path, capsys, "--sync", "asp", "--step-noise", "0")
    bsp = doc["sync"]["rows"][0]
    assert bsp["step_time_s"] == pytest.approx(doc["step_time_s"], rel=1e-12)


def test_a_three_times_straggler_triples_the_compute_of_every_bsp_step(tmp_path, capsys):
    doc = _simulate(tmp_path, capsys, "--straggler", "2:3x", "--step-noise", "0")
    sync = doc["sync"]
    (bsp,) = sync["rows"]
    assert bsp["step_time_s"] == pytest.approx(3 * sync["compute_s"] + sync["allreduce_s"],
                                               rel=1e-12)
    assert sync["stragglers"] == ["2:3.0x"]


def test_plain_bsp_without_protocol_flags_adds_no_protocol_simulation(tmp_path, capsys):
    assert _simulate(tmp_path, capsys)["sync"] is None


def test_a_plan_files_sync_policy_is_simulated(tmp_path, capsys):
    graph = to_training(Graph.load(_graph(tmp_path)))
    plan = DataParallelPlan(model=ModelRef.of(graph), ranks=4, comm="ddp",
                            policy=DdpBucketPolicy(), sync="bsp:0.5,local(h=4):0.5")
    path = tmp_path / "p.plan.json"
    save_plan(plan, path)
    assert main(["simulate", str(tmp_path / "g.json"), "--cluster", "p3.16xlarge", "--plan",
                 str(path), "--sync-steps", "40", "--json"]) == 0
    sync = json.loads(capsys.readouterr().out)["sync"]
    assert sync["samples"] == 40 * 4 * 2
    assert sync["rows"][1]["policy"] == "bsp:0.5,local(h=4):0.5"


def test_the_text_report_shows_the_policy_and_its_phases(tmp_path, capsys):
    assert main(["simulate", str(_graph(tmp_path)), "--cluster", "p3.16xlarge",
                 "--parallelism", "data", "--sync", "bsp:0.25,ssp(s=2):0.75"]) == 0
    out = capsys.readouterr().out
    assert "sync policy      bsp:0.25,ssp(s=2):0.75" in out
    assert "phase ssp(s=2)" in out


@pytest.mark.parametrize(("flags", "words"), [
    (["--sync", "bsp:0.5,asp:0.4"], "sum to 0.9, not 1"),
    (["--sync", "bsp:0.5;asp"], "column 9"),
    (["--straggler", "7:3x"], "rank 7 is not one of the 4 ranks"),
    (["--straggler", "1:3y"], "column 3"),
    (["--sync", "asp", "--step-noise", "-1"], "--step-noise"),
])
def test_bad_sync_flags_are_one_line_errors(tmp_path, capsys, flags, words):
    base = ["simulate", str(_graph(tmp_path)), "--cluster", "p3.16xlarge", "--parallelism",
            "data", "--ranks", "4"]
    assert main([*base, *flags]) == 2
    err = capsys.readouterr().err
    assert words in err
    assert err.count("\n") == 1


def test_protocol_flags_need_data_parallelism(tmp_path, capsys):
    assert main(["simulate", str(_graph(tmp_path)), "--cluster", "p3.16xlarge",
                 "--sync-steps", "10"]) == 2
    assert "--sync-steps does not apply with --parallelism single" in capsys.readouterr().err
