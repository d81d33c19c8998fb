"""``train TASK --sync POLICY``: the sync runtime from the command line."""

from __future__ import annotations

import json

import pytest

from trainsched.cli import main


@pytest.mark.parametrize(("argv", "words"), [
    (["mlp", "--sync", "asp"], "--sync trains a built-in task (teacher-student)"),
    (["teacher-student", "--straggler", "1:3x"], "--straggler applies only with --sync"),
    (["teacher-student", "--sync", "asp", "--comm-policy", "ddp"],
     "--comm-policy does not apply with --sync"),
    (["teacher-student", "--sync", "bsp:0.5,asp:0.4"], "sum to 0.9"),
    (["teacher-student", "--sync", "bsp:0.5,hogwild:0.5"], "column"),
    (["teacher-student", "--sync", "bsp;straggler(exclude)"],
     "does not run straggler(exclude) yet"),
])
def test_bad_sync_runs_are_one_line(argv, words, capsys):
    assert main(["train", *argv]) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err


pytest.importorskip("torch")


@pytest.mark.timeout(300)
def test_train_switches_from_bsp_to_asp_at_half_the_samples(capsys):
    assert main(["train", "teacher-student", "--sync", "bsp:0.5,asp:0.5", "--samples", "4096",
                 "--ranks", "2", "--batch-size", "32", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["policy"] == "bsp:0.5,asp:0.5"
    assert [(p["protocol"], p["samples"]) for p in doc["phases"]] == [("bsp", 2048),
                                                                      ("asp", 2048)]
    # BSP: 2048 / (2 x 32) = 32 updates; ASP: one update per 32-sample gradient = 64
    assert [p["updates"] for p in doc["phases"]] == [32, 64]
    assert [(s["from_protocol"], s["to_protocol"], s["samples"]) for s in doc["switches"]] == [
        ("bsp", "asp", 2048)]
    # the learning rate follows the effective batch: ASP's is BSP's over the 2 ranks
    assert doc["phases"][1]["lr"] == pytest.approx(doc["phases"][0]["lr"] / 2)
