"""Every plan compare writes can be run: runtime.run, train --plan, compare --run, torchrun.

Real gloo processes on this host (OMP_NUM_THREADS=1, a deadline each); the model is the zoo's
3-layer MLP so that every run takes seconds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainsched.cli import main
from trainsched.cluster import cluster_preset
from trainsched.plan import DataParallelPlan, load_plan, read_plan_file
from trainsched.strategies import strategies

ROWS = tuple(strategies())   # every strategy compare knows builds for the MLP on 2 ranks


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    """``compare mlp --cluster cpu --run`` once for the module, predicted with the cpu preset
    saved as a calibration file (no calibration run)."""
    out = tmp_path_factory.mktemp("compare")
    calibration = out.parent / "cpu.json"
    calibration.write_text(cluster_preset("cpu").to_json())
    code = main(["compare", "mlp", "--batch-size", "8", "--cluster", "cpu", "--costs", "roofline",
                 "--run", "--steps", "2", "--warmup", "1", "--calibration", str(calibration),
                 "--out-dir", str(out), "--json"])
    assert code == 0
    return out


def test_compare_run_measures_every_row_this_host_runs(compared):
    doc = json.loads((compared / "compare.json").read_text())
    assert sorted(r["strategy"] for r in doc["rows"]) == sorted(ROWS)
    cores = os.cpu_count() or 1
    for row in doc["rows"]:
        measured = doc["measured"][row["strategy"]]
        if row["devices"] > cores:
            assert measured["skipped"].startswith(f"needs {row['devices']} ranks; this host "
                                                  f"has {cores} core")
            continue
        assert measured["ranks"] == row["devices"]
        assert measured["p10_s"] <= measured["median_s"] <= measured["p90_s"]
        # a run pays the mean step, and the prediction is of the expected step
        assert measured["measured_over_predicted"] == pytest.approx(
            measured["mean_s"] / row["step_time_s"])
    assert (compared / "measured.png").read_bytes()[:4] == b"\x89PNG"


def test_compare_writes_a_plan_with_its_prediction_per_row(compared):
    doc = json.loads((compared / "compare.json").read_text())
    for row in doc["rows"]:
        plan, prediction = read_plan_file(compared / f"{row['strategy']}.plan.json")
        assert plan.devices == row["devices"]
        assert prediction.step_time_s == row["step_time_s"]
        assert prediction.samples_per_step == row["samples_per_step"]
        assert plan.model.name == "mlp" and plan.model.batch_size == 8


def test_train_plan_prints_measured_beside_predicted(compared, capsys):
    path = compared / "pipeline-1f1b.plan.json"
    assert main(["train", "mlp", "--plan", str(path), "--steps", "2", "--warmup", "1",
                 "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    predicted = read_plan_file(path)[1].step_time_s
    assert doc["kind"] == "pipeline" and doc["ranks"] == 2 and len(doc["step_times_s"]) == 2
    assert doc["predicted"]["step_time_s"] == predicted
    mean = sum(doc["step_times_s"]) / len(doc["step_times_s"])
    assert doc["mean_s"] == pytest.approx(mean)
    assert doc["predicted"]["measured_over_predicted"] == pytest.approx(mean / predicted)


def test_train_plan_timeline_holds_the_measured_steps(compared, tmp_path, capsys):
    path = compared / "data-bytescheduler.plan.json"
    assert main(["train", "mlp", "--plan", str(path), "--steps", "3", "--warmup", "1",
                 "--timeline", str(tmp_path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    trace = json.loads((tmp_path / "steps.trace.json").read_text())
    steps = [e for e in trace["traceEvents"] if e.get("cat") == "step"]
    assert [e["name"] for e in steps] == ["step 0", "step 1", "step 2"]
    assert [e["dur"] for e in steps] == pytest.approx([1e6 * t for t in doc["step_times_s"]],
                                                      abs=1e-3)
    threads = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    assert threads == {"rank0/step"}
    for rank in (0, 1):  # the scheduler's own timeline of each rank, same layout
        ranked = json.loads((tmp_path / f"rank{rank}.trace.json").read_text())
        names = {e["args"]["name"] for e in ranked["traceEvents"]
                 if e["name"] == "thread_name"}
        assert f"rank{rank}/compute" in names


def test_train_plan_refuses_another_model_and_flags_the_plan_sets(compared, capsys):
    path = str(compared / "data-ddp.plan.json")
    assert main(["train", "small-cnn", "--plan", path]) == 2
    assert "made for model 'mlp', not 'small-cnn'" in capsys.readouterr().err
    assert main(["train", "mlp", "--plan", path, "--nproc", "3", "--comm", "fifo"]) == 2
    assert "--ranks, --comm-policy do not apply with --plan FILE" in capsys.readouterr().err


def test_simulate_plan_reproduces_the_compare_row(compared, capsys):
    doc = json.loads((compared / "compare.json").read_text())
    row = next(r for r in doc["rows"] if r["strategy"] == "data-bytescheduler")
    assert main(["simulate", str(compared / "graph.json"), "--cluster",
                 str(compared.parent / "cpu.json"), "--plan",
                 str(compared / "data-bytescheduler.plan.json"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["step_time_s"] == row["step_time_s"]


def _torchrun(args: list[str], timeout: int = 240) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (str(Path(__file__).parents[1] / "src"),
                                                      os.environ.get("PYTHONPATH")) if p)}
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           *args], capture_output=True, text=True, timeout=timeout, env=env,
                          cwd=Path(__file__).parent)


def test_a_data_parallel_plan_runs_under_torchrun(compared):
    path = compared / "data-bytescheduler.plan.json"
    assert isinstance(load_plan(path), DataParallelPlan)
    done = _torchrun(["--nproc-per-node", "2", "-m", "trainsched", "train", "mlp", "--plan",
                      str(path), "--steps", "2", "--warmup", "1", "--json"])
    assert done.returncode == 0, done.stderr[-2000:]
    doc = json.loads(done.stdout)  # rank 0 alone prints
    assert doc["kind"] == "data" and doc["ranks"] == 2 and len(doc["step_times_s"]) == 2


def test_torchrun_with_another_world_size_is_refused(compared):
    done = _torchrun(["--nproc-per-node", "1", "-m", "trainsched", "train", "mlp", "--plan",
                      str(compared / "data-ddp.plan.json")])
    assert done.returncode != 0
    assert "the plan runs on 2 ranks but torchrun started 1" in done.stderr


def test_runnable_names_what_this_host_lacks(compared, monkeypatch):
    from trainsched.runtime import runnable

    plan = load_plan(compared / "data-ddp.plan.json")  # 2 ranks
    monkeypatch.setattr(os, "cpu_count", lambda: 1)
    assert runnable(plan) == "needs 2 ranks; this host has 1 core"
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert runnable(plan) is None
    assert runnable(plan, "not-a-model") == ("model 'not-a-model' is not in the zoo (trainsched "
                                             "models lists it)")


def test_an_out_of_order_plan_runs_reverse_first_k_with_its_k(monkeypatch):
    """The plan's k reaches the scheduled runtime's segment (no processes: the launcher is
    replaced by a recorder)."""
    import trainsched.runtime.train as train_module
    from trainsched.comm.policy import comm_policy
    from trainsched.plan import ModelRef

    seen = []

    def record(name, segments, **kw):
        seen.extend(segments)
        raise RuntimeError("recorded")

    monkeypatch.setattr(train_module, "run_segments", record)
    plan = DataParallelPlan(model=ModelRef(name="mlp", fingerprint="f", forward_ops=3,
                                           batch_size=8), ranks=2,
                            comm="bytescheduler", policy=comm_policy("bytescheduler"),
                            backprop="ooo", k=2)
    from trainsched.runtime import run

    with pytest.raises(RuntimeError, match="recorded"):
        run(plan, steps=1, warmup=0)
    assert [s.backprop_k for s in seen] == [2]


def _sync_plan(sync: str, backprop: str = "inorder", k: int = 0) -> DataParallelPlan:
    from trainsched.comm.policy import comm_policy
    from trainsched.plan import ModelRef

    return DataParallelPlan(model=ModelRef(name="mlp", fingerprint="f", forward_ops=3,
                                           batch_size=8), ranks=2, comm="bytescheduler",
                            policy=comm_policy("bytescheduler"), sync=sync, backprop=backprop,
                            k=k)


@pytest.mark.timeout(300)
def test_a_plan_with_a_hybrid_sync_policy_runs_its_phases_on_the_sync_runtime():
    from trainsched.runtime import run, runnable

    plan = _sync_plan("bsp:0.5,asp:0.5")
    assert runnable(plan) is None
    result = run(plan, steps=30, warmup=2, lr=0.1)
    # (2 + 30) steps x 2 ranks x batch 8 = 512 samples, half under each protocol: BSP steps of
    # 16 samples, ASP updates of 8
    sync = result.sync
    assert [(p.protocol, p.samples, p.updates) for p in sync.phases] == [
        ("bsp", 256, 16), ("asp", 256, 32)]
    assert [(s.from_protocol, s.to_protocol, s.samples) for s in sync.switches] == [
        ("bsp", "asp", 256)]
    assert (result.ranks, result.samples_per_step, len(result.step_times_s)) == (2, 16, 2)
    assert sync.final_loss < 0.9 * sync.curve[0].loss  # ln 10 = 2.30 untrained
    # the BSP phase reduced its gradients with the plan's comm policy, on the scheduled runtime:
    # under ByteScheduler's 16 MiB credit, where the flat all-reduce sends the mlp's whole
    # gradient (199,946 fp32 values) at once
    assert sync.comm == "bytescheduler"
    bsp = [sync.link(r, 0) for r in range(2)]
    assert all(link.in_flight_bytes > 0 for link in bsp)


def test_a_sync_plan_with_out_of_order_backprop_is_refused_not_run_in_order():
    from trainsched.errors import TrainschedError
    from trainsched.runtime import run, runnable

    plan = _sync_plan("bsp:0.5,asp:0.5", backprop="ooo", k=1)
    assert "the sync runtime runs backprop in order" in runnable(plan)
    with pytest.raises(TrainschedError, match=r"backprop 'ooo' with sync policy"):
        run(plan, steps=1, warmup=0)


def test_a_single_device_plan_runs_its_dw_slots_and_says_there_is_no_second_stream(capsys):
    from trainsched.errors import TrainschedError
    from trainsched.plan import ModelRef, SinglePlan
    from trainsched.runtime import run

    ref = ModelRef(name="mlp", fingerprint="f", forward_ops=3, batch_size=8)
    slotted = SinglePlan(model=ref, slots=("inline", "overlap_backward", "overlap_forward(0)",
                                           "overlap_forward(1)"))
    result = run(slotted, steps=2, warmup=1)
    assert len(result.step_times_s) == 2
    assert "one stream, so they run in their slots' order" in capsys.readouterr().err
    # the worker really builds the slots: a count the model's 4 split layers do not have fails
    wrong = SinglePlan(model=ref, slots=("inline", "overlap_backward", "overlap_forward(0)"))
    with pytest.raises(TrainschedError, match="3 dW slots for a model with 4 split layers"):
        run(wrong, steps=1, warmup=0)


def test_a_sync_plan_runs_with_its_parameter_server_count(monkeypatch):
    import trainsched.runtime.sync as sync_runtime
    from trainsched.comm.policy import comm_policy
    from trainsched.plan import ModelRef
    from trainsched.runtime import run

    seen = {}

    def fake_run_sync(task, phases, **kwargs):
        seen.update(kwargs, phases=phases)
        raise RuntimeError("recorded")

    monkeypatch.setattr(sync_runtime, "run_sync", fake_run_sync)
    plan = DataParallelPlan(model=ModelRef(name="mlp", fingerprint="f", forward_ops=3,
                                           batch_size=8), ranks=2, comm="ddp",
                            policy=comm_policy("ddp"), sync="bsp:0.5,asp:0.5", servers=2,
                            server_placement="colocated")
    with pytest.raises(RuntimeError, match="recorded"):
        run(plan, steps=3, warmup=1)
    assert seen["servers"] == 2
    assert (seen["comm"], seen["comm_order"]) == ("ddp", "leader")


def test_a_trial_interleaves_the_plans_and_returns_each_rounds_median(monkeypatch):
    from types import SimpleNamespace

    import trainsched.runtime.train as train_module
    from trainsched.comm.policy import comm_policy
    from trainsched.plan import ModelRef
    from trainsched.runtime.run import interleaved_trial

    seen = []

    def fake_run_segments(model, segments, *, nproc, **common):
        seen.append((model, nproc, [(s.label, s.kind, s.steps) for s in segments]))
        times = {"ddp 0": (3.0, 1.0, 2.0), "fifo 0": (4.0,) * 3,
                 "fifo 1": (5.0, 7.0, 6.0), "ddp 1": (1.0,) * 3}
        return SimpleNamespace(segments=[SimpleNamespace(label=s.label, median_s=sorted(
            times[s.label])[1]) for s in segments])

    monkeypatch.setattr(train_module, "run_segments", fake_run_segments)
    ref = ModelRef(name="mlp", fingerprint="f", forward_ops=3, batch_size=8)
    plans = {"ddp": DataParallelPlan(model=ref, ranks=2, comm="ddp", policy=comm_policy("ddp")),
             "fifo": DataParallelPlan(model=ref, ranks=2, comm="fifo",
                                      policy=comm_policy("fifo"))}
    assert interleaved_trial("mlp", plans, rounds=2, steps=3) == {"ddp": (2.0, 1.0),
                                                                   "fifo": (4.0, 6.0)}
    # the order rotates by one each round
    assert seen == [("mlp", 2, [("ddp 0", "ddp", 3), ("fifo 0", "sdp", 3),
                                ("fifo 1", "sdp", 3), ("ddp 1", "ddp", 3)])]
