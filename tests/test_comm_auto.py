"""``--comm-policy auto``: simulate every data-parallel strategy, run the fastest unless it
beats stock DDP by no more than the margin the scheduler's own host work may cost."""

from __future__ import annotations

import json

import pytest

from trainsched.cli import main
from trainsched.cluster import cluster_preset
from trainsched.compare import AUTO_MARGIN, AutoChoice, confirm_choice, pick_comm
from trainsched.errors import TrainschedError


def test_a_strategy_predicted_well_ahead_of_ddp_is_chosen():
    name, reason = pick_comm({"data-ddp": 10.0, "data-priority": 8.0, "data-fifo": 12.0})
    assert name == "data-priority"                     # 10 / 8 - 1 = 25% > 5%
    assert "25.0% faster than stock DDP" in reason


def test_a_gain_within_the_margin_keeps_stock_ddp():
    name, reason = pick_comm({"data-ddp": 10.0, "data-priority": 9.7})   # 3.1% < 5%
    assert name == "data-ddp"
    assert "only 3.1% faster" in reason


def test_ddp_predicted_fastest_runs_ddp():
    assert pick_comm({"data-ddp": 5.0, "data-fifo": 6.0})[0] == "data-ddp"


def test_equal_predictions_break_by_name():
    name, _ = pick_comm({"data-ddp": 10.0, "data-b": 5.0, "data-a": 5.0}, margin=0.0)
    assert name == "data-a"


def test_the_margin_is_five_percent():
    assert AUTO_MARGIN == 0.05


def test_auto_needs_stock_ddp_among_the_candidates():
    with pytest.raises(TrainschedError, match="auto compares every candidate with data-ddp"):
        pick_comm({"data-fifo": 1.0})


def _choice(strategy: str = "data-priority") -> AutoChoice:
    # plans stand in as plain markers: confirm_choice only moves them around
    return AutoChoice(strategy=strategy, planned="PICK", predicted_s={}, reason="predicted",
                      shortlist={"data-ddp": "DDP", "data-priority": "PICK",
                                 "data-fifo": "FIFO"})


def test_the_strategy_that_measured_fastest_runs_if_it_beat_ddp():
    # DDP / priority per round: 1.10, 0.95, 1.05 -> median 1.05; DDP / fifo: 1.2, 1.1, 1.0
    # -> median 1.1: fifo, though priority was predicted fastest
    kept = confirm_choice(_choice(), {"data-ddp": [11.0, 9.5, 10.5],
                                      "data-priority": [10.0, 10.0, 10.0],
                                      "data-fifo": [11.0 / 1.2, 9.5 / 1.1, 10.5]})
    assert (kept.strategy, kept.planned) == ("data-fifo", "FIFO")
    assert kept.trial["measured_over_ddp"] == pytest.approx({"data-priority": 1.05,
                                                             "data-fifo": 1.1})
    assert "data-fifo measured 1.100x stock DDP, the best of 2" in kept.reason


def test_when_nothing_measured_faster_stock_ddp_runs():
    # DDP / priority: 0.96, 1.02, 0.98 -> 0.98; DDP / fifo: 0.9 each round
    back = confirm_choice(_choice(), {"data-ddp": [9.6, 10.2, 9.8],
                                      "data-priority": [10.0, 10.0, 10.0],
                                      "data-fifo": [9.6 / 0.9, 10.2 / 0.9, 9.8 / 0.9]})
    assert (back.strategy, back.planned) == ("data-ddp", "DDP")
    assert "the best of 2 (data-priority) measured 0.980x stock DDP, not above 1.02x: stock DDP" \
        in back.reason


def test_a_gain_within_the_trials_noise_margin_runs_stock_ddp():
    # 1.01x: faster, but not by more than the 2% the trial asks for
    close = confirm_choice(_choice(), {"data-ddp": [10.1], "data-priority": [10.0],
                                       "data-fifo": [10.1]})
    assert close.strategy == "data-ddp"
    assert "not above 1.02x" in close.reason


def test_a_short_models_trial_runs_enough_steps_to_last_half_a_second():
    from dataclasses import replace

    from trainsched.compare import trial_steps

    short = replace(_choice(), predicted_s={"data-ddp": 0.0025, "data-priority": 0.002})
    assert trial_steps(short, 3) == 200          # 0.5 s / 2.5 ms
    long = replace(_choice(), predicted_s={"data-ddp": 0.3, "data-priority": 0.2})
    assert trial_steps(long, 3) == 3             # 3 x 0.3 s is already long enough


def test_the_trial_needs_a_pick_other_than_ddp_and_every_shortlisted_time():
    with pytest.raises(TrainschedError, match="nothing to check"):
        confirm_choice(_choice("data-ddp"), {"data-ddp": [1.0]})
    with pytest.raises(TrainschedError, match="must measure data-ddp, data-priority, data-fifo"):
        confirm_choice(_choice(), {"data-ddp": [1.0], "data-priority": [1.0]})
    with pytest.raises(TrainschedError, match="same number of rounds"):
        confirm_choice(_choice(), {"data-ddp": [1.0, 1.0], "data-priority": [1.0],
                                   "data-fifo": [1.0]})
    with pytest.raises(TrainschedError, match="must be positive"):
        confirm_choice(_choice(), {"data-ddp": [1.0], "data-priority": [0.0],
                                   "data-fifo": [1.0]})


def test_the_shortlist_is_ddp_and_the_strategies_predicted_beyond_the_margin():
    from trainsched.compare import AUTO_BASELINE, TRIAL_CANDIDATES, choose_comm
    from trainsched.graph import Edge, Graph, Op, to_training
    from trainsched.strategies import Options

    ops = [Op(name=f"l{i}", compute_s=1e-3, param_bytes=4 << 20, output_bytes=1 << 16,
              layer_index=i) for i in range(6)]
    graph = to_training(Graph(ops, [Edge(src=f"l{i}", dst=f"l{i + 1}", size_bytes=1 << 16)
                                    for i in range(5)]))
    choice = choose_comm(graph, cluster_preset("p3.16xlarge"), Options(ranks=2, microbatches=1,
                                                                       batch_size=8))
    base = choice.predicted_s[AUTO_BASELINE]
    ahead = sorted((n for n, t in choice.predicted_s.items()
                    if n != AUTO_BASELINE and base / t - 1 > AUTO_MARGIN),
                   key=lambda n: (choice.predicted_s[n], n))
    assert list(choice.shortlist) == [AUTO_BASELINE, *ahead[:TRIAL_CANDIDATES]]


def test_auto_trial_applies_only_with_auto_and_is_a_count(capsys):
    assert main(["train", "mlp", "--comm-policy", "ddp", "--auto-trial", "2"]) == 2
    assert "--auto-trial" in capsys.readouterr().err
    assert main(["train", "mlp", "--comm-policy", "auto", "--auto-trial", "-1"]) == 2
    assert "--auto-trial" in capsys.readouterr().err


def test_calibration_applies_only_with_auto(tmp_path, capsys):
    assert main(["train", "mlp", "--comm-policy", "ddp", "--calibration", "x.json"]) == 2
    assert "--calibration" in capsys.readouterr().err


pytest.importorskip("torch")


@pytest.mark.timeout(300)
def test_train_auto_runs_the_strategy_it_chose_and_reports_every_prediction(tmp_path, capsys):
    calibration = tmp_path / "cpu.json"
    calibration.write_text(cluster_preset("cpu").to_json())
    assert main(["train", "mlp", "--comm-policy", "auto", "--calibration", str(calibration),
                 "--steps", "2", "--warmup", "1", "--auto-trial", "0", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    predicted = doc["auto"]["predicted_s"]
    assert "data-ddp" in predicted and len(predicted) >= 3
    chosen = doc["auto"]["strategy"]
    assert chosen == pick_comm(predicted)[0]
    assert doc["predicted"]["step_time_s"] == predicted[chosen]
    assert len(doc["step_times_s"]) == 2 and doc["ranks"] == 2


def test_train_auto_runs_stock_ddp_when_its_pick_measured_slower(tmp_path, capsys, monkeypatch):
    import importlib

    import trainsched.compare as compare_module
    import trainsched.runtime as runtime_package

    run_module = importlib.import_module("trainsched.runtime.run")  # the package's run is
    # the function of that name

    real_choose = compare_module.choose_comm

    def choose_priority(graph, cluster, options, margin=AUTO_MARGIN):
        from dataclasses import replace

        from trainsched.strategies import plan_strategies

        choice = real_choose(graph, cluster, options, margin)
        planned, _ = plan_strategies(graph, cluster, options, ["single", "data-fifo"])
        return replace(choice, strategy="data-fifo", planned=planned["data-fifo"],
                       reason="forced by the test",
                       predicted_s={"data-ddp": 1.0, "data-fifo": 0.5},
                       shortlist={"data-ddp": choice.shortlist["data-ddp"],
                                  "data-fifo": planned["data-fifo"]})

    trials, ran = [], []

    def fake_trial(model, plans, *, rounds, steps, **common):
        trials.append((model, {n: p.comm for n, p in plans.items()}, rounds, steps))
        return {n: (1.0 if n == "data-ddp" else 1.25,) * rounds for n in plans}  # 0.8x DDP

    def fake_run(plan, model, **kwargs):
        ran.append(plan.comm)
        raise RuntimeError("stop here")

    monkeypatch.setattr(compare_module, "choose_comm", choose_priority)
    monkeypatch.setattr(run_module, "interleaved_trial", fake_trial)
    monkeypatch.setattr(runtime_package, "run", fake_run)
    calibration = tmp_path / "cpu.json"
    calibration.write_text(cluster_preset("cpu").to_json())
    with pytest.raises(RuntimeError, match="stop here"):
        main(["train", "mlp", "--comm-policy", "auto", "--calibration", str(calibration),
              "--steps", "2", "--warmup", "1", "--auto-trial", "4"])
    assert trials == [("mlp", {"data-ddp": "ddp", "data-fifo": "fifo"}, 3, 4)]
    assert ran == ["ddp"]
    assert "timing data-fifo against stock DDP first (3 rounds of 4 steps)" in \
        capsys.readouterr().out
