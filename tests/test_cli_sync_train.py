"""``train TASK --sync POLICY``: the sync runtime from the command line, launched by trainsched
or by ``torchrun``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainsched.cli import main


@pytest.mark.parametrize(("argv", "words"), [
    (["nosuch", "--sync", "asp"], "unknown model 'nosuch'"),
    (["mlp", "--sync", "asp", "--image-size", "32"], "--image-size does not apply to model 'mlp'"),
    (["teacher-student", "--sync", "asp", "--seq-len", "8"],
     "--seq-len applies to zoo models; the built-in task teacher-student makes its own inputs"),
    (["teacher-student", "--straggler", "1:3x"], "--straggler applies only with --sync"),
    (["teacher-student", "--sync", "asp", "--partition", "1MiB"],
     "--partition does not apply with --sync"),
    (["teacher-student", "--sync", "bsp", "--comm-policy", "auto"],
     "--comm-policy auto times strategies"),
    (["teacher-student", "--sync", "bsp:0.5,asp:0.4"], "sum to 0.9"),
    (["teacher-student", "--sync", "bsp:0.5,hogwild:0.5"], "column"),
    (["teacher-student", "--sync", "bsp;straggler(exclude)", "--deterministic"],
     "cannot be deterministic"),
    (["teacher-student", "--sync", "asp", "--optimizer", "momentum"],
     "--optimizer momentum: the sync runtime trains with sgd (add --momentum for momentum) "
     "or adam"),
    (["teacher-student", "--sync", "asp", "--optimizer", "adam", "--momentum", "0.9"],
     "momentum and nesterov are SGD's"),
    (["teacher-student", "--servers", "2"], "--servers applies only with --sync"),
    (["teacher-student", "--sync", "asp", "--servers", "0"], "--servers"),
    (["teacher-student", "--sync", "local:4", "--servers", "2"],
     "--servers applies to a --sync policy with a parameter-server phase"),
])
def test_bad_sync_runs_are_one_line(argv, words, capsys):
    assert main(["train", *argv]) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err


def test_the_sync_flags_reach_run_sync(monkeypatch, capsys):
    import trainsched.runtime.sync as sync_runtime
    from trainsched.runtime.sync import SyncRunResult

    seen = {}

    def fake(task, phases, **kw):
        seen.update(kw, phases=[(str(p), s) for p, s in phases])
        return SyncRunResult(task="t", ranks=kw["ranks"], batch_per_rank=kw["batch_per_rank"],
                             phases=(), switches=(), checkpoints=(), curve=(), final_loss=1.0,
                             final_accuracy=0.5, total_samples=0, wall_s=0.0,
                             resumed_from=None)

    monkeypatch.setattr(sync_runtime, "run_sync", fake)
    assert main(["train", "teacher-student", "--sync", "asp", "--servers", "2",
                 "--deterministic", "--optimizer", "adam", "--ranks", "3", "--batch-size", "8",
                 "--samples", "100", "--json"]) == 0
    assert (seen["servers"], seen["deterministic"], seen["optimizer"]) == (2, True, "adam")
    assert (seen["ranks"], seen["batch_per_rank"]) == (3, 8)
    assert json.loads(capsys.readouterr().out)["final_loss"] == 1.0
    # 100 samples rounded down to ASP's update of 8: 96
    assert [s for _, s in seen["phases"]] == [96]
    assert seen["comm"] is None  # without --comm-policy: the flat all-reduce
    assert main(["train", "teacher-student", "--sync", "bsp", "--comm-policy", "priority",
                 "--json"]) == 0
    assert seen["comm"] == "priority"


def test_a_short_policy_and_a_delayed_link_reach_run_sync_and_the_report(monkeypatch, capsys):
    import trainsched.runtime.sync as sync_runtime
    from trainsched.runtime.sync import LinkRecord, SyncRunResult
    from trainsched.sync import Ssp, Straggler

    seen = {}

    def fake(task, phases, **kw):
        seen.update(kw, phases=list(phases))
        links = (LinkRecord(rank=0, phase=0, messages=4, delayed=0, delay_s=0.0, comm_s=0.01),
                 LinkRecord(rank=1, phase=0, messages=4, delayed=4, delay_s=0.08, comm_s=0.09))
        return SyncRunResult(task="t", ranks=2, batch_per_rank=8, phases=(), switches=(),
                             checkpoints=(), curve=(), final_loss=1.0, final_accuracy=0.5,
                             total_samples=0, wall_s=0.0, resumed_from=None, links=links)

    monkeypatch.setattr(sync_runtime, "run_sync", fake)
    assert main(["train", "teacher-student", "--sync", "ssp:2", "--straggler", "1:20ms@link",
                 "--batch-size", "8", "--samples", "64"]) == 0
    assert [p for p, _ in seen["phases"]] == [Ssp(2)]
    assert seen["stragglers"] == (Straggler(rank=1, delay_s=0.02, link=True),)
    out = capsys.readouterr().out
    assert "policy ssp:2" in out
    assert "delayed link: worker 1 held 4 of 4 messages, 80.0 ms in all (sending 90.0 ms)" in out


pytest.importorskip("torch")


TWO_INPUTS = """
import torch
from torch import nn


class Two(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 3)

    def forward(self, x, y):
        return self.a(x) + self.a(y)


def two():
    return Two(), (torch.randn(2, 4), torch.randn(2, 4))
"""


def test_a_model_the_sync_runtime_cannot_feed_is_refused_before_any_rank_starts(tmp_path,
                                                                               capsys):
    path = tmp_path / "two.py"
    path.write_text(TWO_INPUTS)
    assert main(["train", f"{path}:two", "--sync", "asp"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"the sync runtime feeds a model one input tensor; {path}:two takes 2 inputs" in err


@pytest.mark.parametrize(("argv", "fields"), [
    (["small-cnn"], {"model": "small-cnn", "image_size": None, "seq_len": None}),
    (["tiny-gpt2", "--seq-len", "16"], {"model": "tiny-gpt2", "image_size": None,
                                        "seq_len": 16}),
])
def test_a_zoo_model_reaches_run_sync_as_its_task(monkeypatch, argv, fields):
    import trainsched.runtime.sync as sync_runtime

    seen = {}

    def fake(task, phases, **kw):
        seen["task"] = task
        raise RuntimeError("recorded")

    monkeypatch.setattr(sync_runtime, "run_sync", fake)
    with pytest.raises(RuntimeError, match="recorded"):
        main(["train", *argv, "--sync", "asp", "--samples", "64"])
    assert seen["task"].to_json() == {"task": "zoo", "classes": 10, "noise": 2.0,
                                      "train_samples": 2048, "test_samples": 512, "seed": 0,
                                      **fields}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_train_a_zoo_model_under_a_hybrid_policy(capsys):
    assert main(["train", "mlp", "--sync", "bsp:0.5,asp:0.5", "--samples", "512", "--ranks",
                 "2", "--batch-size", "8", "--lr", "0.1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("mlp on synthetic data (10 classes or tokens, noise 2, seed 0): 2 "
                          "workers x batch 8, policy bsp:0.5,asp:0.5, 512 samples")
    assert "switch bsp -> asp at 256 samples" in out


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


SRC = Path(__file__).resolve().parents[1] / "src"
TORCHRUN_ARGS = ["teacher-student", "--sync", "bsp:0.5,asp:0.5", "--samples", "1024",
                 "--batch-size", "16", "--deterministic", "--json"]


@pytest.mark.timeout(400)
@pytest.mark.slow
def test_under_torchrun_the_run_equals_the_built_in_launchers(capsys):
    # 3 ranks: 2 workers, then the server; the deterministic mode makes both runs bit-equal
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (str(SRC), os.environ.get("PYTHONPATH"))
                                         if p)}
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "3",
         "-m", "trainsched", "train", *TORCHRUN_ARGS],
        env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    launched = json.loads(done.stdout)  # worker 0 alone printed
    assert main(["train", *TORCHRUN_ARGS, "--ranks", "2"]) == 0
    built_in = json.loads(capsys.readouterr().out)
    assert launched["ranks"] == 2
    assert [(p["protocol"], p["samples"], p["updates"]) for p in launched["phases"]] == [
        ("bsp", 512, 16), ("asp", 512, 32)]
    assert (launched["final_loss"], launched["final_accuracy"]) == (
        built_in["final_loss"], built_in["final_accuracy"])
    assert [c["loss"] for c in launched["curve"]] == [c["loss"] for c in built_in["curve"]]
