"""``--comm-policy auto``: simulate every data-parallel strategy, run the fastest unless it
beats stock DDP by no more than the margin the scheduler's own host work may cost."""

from __future__ import annotations

import json

import pytest

from trainsched.cli import main
from trainsched.cluster import cluster_preset
from trainsched.compare import AUTO_MARGIN, pick_comm
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


def test_calibration_applies_only_with_auto(tmp_path, capsys):
    assert main(["train", "mlp", "--comm-policy", "ddp", "--calibration", "x.json"]) == 2
    assert "--calibration" in capsys.readouterr().err


pytest.importorskip("torch")


@pytest.mark.timeout(300)
def test_train_auto_runs_the_strategy_it_chose_and_reports_every_prediction(tmp_path, capsys):
    calibration = tmp_path / "cpu.json"
    calibration.write_text(cluster_preset("cpu").to_json())
    assert main(["train", "mlp", "--comm-policy", "auto", "--calibration", str(calibration),
                 "--steps", "2", "--warmup", "1", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    predicted = doc["auto"]["predicted_s"]
    assert "data-ddp" in predicted and len(predicted) >= 3
    chosen = doc["auto"]["strategy"]
    assert chosen == pick_comm(predicted)[0]
    assert doc["predicted"]["step_time_s"] == predicted[chosen]
    assert len(doc["step_times_s"]) == 2 and doc["ranks"] == 2
