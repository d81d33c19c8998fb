"""``train --backprop ooo [--k K]``: out-of-order backprop on real gloo ranks from the CLI."""

from __future__ import annotations

import json

import pytest

from trainsched.cli import main


@pytest.mark.parametrize(("argv", "words"), [
    (["--k", "2"], "it applies only with --backprop ooo"),
    (["--comm-policy", "ddp", "--backprop", "ooo"],
     "it applies only with --comm-policy priority or bytescheduler"),
    (["--comm-policy", "priority", "--backprop", "ooo", "--k", "-1"], "--k"),
])
def test_backprop_flags_that_do_not_apply_are_refused(argv, words, capsys):
    assert main(["train", "mlp", *argv]) == 2
    assert words in capsys.readouterr().err


pytest.importorskip("torch")


@pytest.mark.timeout(300)
def test_train_runs_reverse_first_k_with_the_k_given(capsys):
    assert main(["train", "mlp", "--comm-policy", "bytescheduler", "--backprop", "ooo",
                 "--k", "2", "--steps", "2", "--warmup", "1", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["backprop"], doc["k"]) == ("ooo", 2)
    assert doc["steps"] == 2 and doc["median_s"] > 0


@pytest.mark.timeout(300)
def test_a_k_above_the_models_layers_is_one_line(capsys):
    # the zoo MLP has four Linear layers
    assert main(["train", "mlp", "--comm-policy", "priority", "--backprop", "ooo",
                 "--k", "5", "--steps", "1", "--warmup", "0"]) == 2
    err = capsys.readouterr().err
    assert "above the model's 4 split layers" in err and "Traceback" not in err


@pytest.mark.timeout(300)
def test_priority_chooses_k_with_the_policy_it_runs(capsys, tmp_path):
    # train runs priority crossing the step barrier; choosing k once simulated the registered
    # default, which does not cross it, and refused ("needs a comm policy whose updates cross")
    from trainsched.cluster import cluster_preset

    calibration = tmp_path / "cpu.json"
    calibration.write_text(cluster_preset("cpu").to_json())
    assert main(["train", "mlp", "--comm-policy", "priority", "--backprop", "ooo",
                 "--calibration", str(calibration), "--steps", "1", "--warmup", "0",
                 "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["backprop"] == "ooo" and doc["k"] in range(5)  # the zoo MLP: 4 split layers
