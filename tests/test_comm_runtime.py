"""The communication-scheduling runtime on real gloo processes (``tests/comm_jobs.py``):
equality with DDP and with plain all-reduce, order safety, crossing the barrier from the
timeline, bad input, and dead or hung ranks."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from trainsched.runtime.launch import free_port, run_workers

JOBS = str(Path(__file__).with_name("comm_jobs.py"))


def run_job(tmp_path: Path, job: str, world_size: int = 2, limit_s: float = 120,
            wait_all: bool = False, **extra) -> list[dict]:
    port = free_port()
    configs = [{"job": job, "rank": r, "world_size": world_size, "port": port,
                "out": str(tmp_path), **extra} for r in range(world_size)]
    exits = run_workers(JOBS, configs, workdir=tmp_path, timeout_s=limit_s,
                        wait_all=wait_all)
    results = []
    for e in exits:
        path = tmp_path / f"rank{e.rank}.json"
        results.append(json.loads(path.read_text()) if path.exists() else
                       {"missing": True, "status": e.status, "log": e.log.read_text()[-2000:]})
    for r in results:
        assert "crash" not in r, r["crash"]
    return results


@pytest.fixture(scope="module")
def main_job(tmp_path_factory) -> tuple[Path, list[dict]]:
    """One 2-rank job for the equality and the fuzz tests (spawning is the slow part)."""
    tmp = tmp_path_factory.mktemp("comm_main")
    return tmp, run_job(tmp, "main", steps=30, limit_s=300)


@pytest.mark.timeout(400)
def test_every_policy_and_optimizer_equals_ddp_and_plain_all_reduce(main_job):
    _, results = main_job
    for rank, r in enumerate(r["equality"] for r in results):
        assert len(r["vs_ddp"]) == 9 * 3
        worst = max(r["vs_ddp"].items(), key=lambda item: item[1])
        assert worst[1] <= 1e-6, (rank, worst)
        # Partitioned, credited, FIFO or whole-tensor: the same sums, bit for bit.
        assert all(r["bitwise"].values()), (rank, r["bitwise"])
        assert len(r["bitwise"]) == 3 * 8 + 2
        # backfill reaches the runtime's dispatcher and keeps strict credit's bound
        assert r["backfill_in_core"] is True and 0 < r["backfill_peak_bytes"] <= 3 * 1024
        assert "only exact for elementwise optimizers" in r["partition_update_refused"]
        assert r["set_lr_vs_ddp"] <= 1e-6
        assert r["ranks_identical"]


def in_flight_peak(trace: dict) -> int:
    """The most bytes of COMM slices (issued -> done) open at one instant."""
    edges = []
    for e in trace["traceEvents"]:
        if e["ph"] == "X" and e["args"]["phase"] == "COMM":
            size = e["args"]["bytes"]
            edges += [(e["ts"], 1, size), (e["ts"] + e["dur"], 0, -size)]
    peak = current = 0
    for _, _, delta in sorted(edges):  # at equal times, ends (0) before starts (1)
        current += delta
        peak = max(peak, current)
    return peak


def crossing_violations(trace: dict) -> tuple[int, list[str]]:
    """Pairs (UPDATE of layer l in step t, FWD of layer l in step t+1) checked, and those
    where the forward started before the update ended."""
    ends: dict[tuple[str, int], float] = {}
    fwd: dict[tuple[str, int], float] = {}
    for e in trace["traceEvents"]:
        if e["ph"] != "X":
            continue
        a = e["args"]
        if a["phase"] == "UPDATE":
            key = (a["layer"], a["step"])
            ends[key] = max(ends.get(key, 0.0), e["ts"] + e["dur"])
        elif a["phase"] == "FWD":
            fwd[a["layer"], a["step"]] = min(fwd.get((a["layer"], a["step"]), 1e30), e["ts"])
    checked, bad = 0, []
    for (layer, step), start in fwd.items():
        if (layer, step - 1) in ends:
            checked += 1
            if start < ends[layer, step - 1]:
                bad.append(f"{layer} step {step}: FWD {start} < UPDATE end "
                           f"{ends[layer, step - 1]}")
    return checked, bad


def check_fuzz(tmp_path: Path, results: list[dict], steps: int) -> None:
    for rank, r in enumerate(results):
        # 30 steps with random delays per rank, the order checked before every issue.
        assert r["fuzz_vs_ddp"] <= 1e-5, (rank, r["fuzz_vs_ddp"])
        assert "models differ between rank" in r["mismatch"], r["mismatch"]
        assert "not a multiple of the element size" in r["bad_partition"]
        assert "smaller than the partition size" in r["strict_credit"]
        assert "got no gradient" in r["unused"] and "fc3.weight" in r["unused"]
        assert "collective order differs between ranks" in r["local_order"], r["local_order"]
        trace = json.loads((tmp_path / "timeline" / f"rank{rank}.trace.json").read_text())
        phases = {e["args"]["phase"] for e in trace["traceEvents"] if e["ph"] == "X"}
        assert phases >= {"FWD", "BWD", "UPDATE", "QUEUE", "COMM"}
        # SGD is elementwise: the split parameters were stepped partition by partition.
        parts = {e["args"].get("task") for e in trace["traceEvents"]
                 if e["ph"] == "X" and e["args"]["phase"] == "UPDATE"}
        assert {"fc1.weight/0", "fc1.weight/31", "conv2.weight/2"} <= parts
        # Strict credit on every rank: the dispatcher's count, and the trace's COMM slices.
        assert 0 < r["max_in_flight_bytes"] <= r["credit_bytes"]
        assert in_flight_peak(trace) <= r["credit_bytes"]
        checked, bad = crossing_violations(trace)
        # 4 layers; FWD of steps 2..steps-1 after UPDATE of 1..steps-2.
        assert checked == 4 * (steps - 2) and not bad, bad
        seen = {e["args"]["step"] for e in trace["traceEvents"] if e["ph"] == "X"}
        assert seen == set(range(1, steps))


@pytest.mark.timeout(400)
def test_order_fuzz_crossing_bad_input_and_the_local_order_hazard(main_job):
    tmp, results = main_job
    check_fuzz(tmp, [r["fuzz"] for r in results], steps=30)


def check_retune(tmp_path: Path, results: list[dict]) -> None:
    KiB = 1024
    r0 = results[0]
    assert r0["at/momentum"] == r0["at/adam"] == [2, 5]
    for rank, r in enumerate(results):
        for opt in ("momentum", "adam"):
            # Every rank switched at rank 0's steps, to rank 0's sizes.
            assert r[f"switches/{opt}"] == [[2, 4 * KiB, 8 * KiB], [5, None, None]], rank
            # Partition sizes and credit change no sum: bit for bit the unswitched run, DDP's
            # parameters (the optimizer state moved between partitionings intact).
            assert r["bitwise"][opt], (rank, opt)
            assert r["vs_ddp"][opt] <= 1e-6, (rank, opt, r["vs_ddp"][opt])
        same_shape, diff, scale = r["folded_buffer"]
        assert same_shape and scale > 0 and diff <= 1e-7 * max(1.0, scale), r["folded_buffer"]
        tuner = r["tuner"]
        # 1 warm-up step, the start point and 4 + 2 trials of (1 settle + 2 measured + 1
        # publish) steps: the chosen point applies at step 28, on every rank.
        assert tuner["total_steps"] == 28 and tuner["steps"] == 30
        assert [s[0] for s in tuner["switches"]] == list(range(4, 29, 4)), tuner["switches"]
        assert tuner["switches"] == results[0]["tuner"]["switches"]
        assert r["tuner_vs_ddp"] <= 1e-6
        assert "no partition and credit to tune" in r["tuner_fifo"]
    errors = r0["errors/momentum"]
    assert "at_step must be an integer >= 2" in errors["past"]
    assert "not a multiple of the element size" in errors["unaligned"]
    assert "no such field" in errors["field"] and "bucket_bytes" in errors["field"]
    assert "keeps the policy's kind" in errors["kind"]
    assert "rank 0's call" in results[1]["errors/momentum"]["follower"]
    # Rank 0's tuner: the start point, 3 random and 1 guided trial, 2 confirmations; the
    # switch it decided after each is the one every rank made (a strict credit is raised to
    # one partition).
    tuner = r0["tuner"]
    assert [t["phase"] for t in tuner["trials"]] == (["start"] + ["startup"] * 3 + ["guided"]
                                                     + ["confirm"] * 2)
    assert [d[:2] for d in tuner["decided"]] == [s[:2] for s in tuner["switches"]]
    for (_, p, c), (_, _, sc) in zip(tuner["decided"], tuner["switches"], strict=True):
        assert sc == max(c, p) and KiB <= p <= 16 * KiB
    confirms = [t for t in tuner["trials"] if t["phase"] == "confirm"]
    best = min(confirms, key=lambda t: (t["step_time_s"], t["number"]))
    assert tuner["decided"][-1][1:] == [best["partition_bytes"], best["credit_bytes"]]
    for rank in range(len(results)):  # the trace: a SWITCH at step 2, larger partitions after
        trace = json.loads((tmp_path / "retune-timeline" / f"rank{rank}.trace.json")
                           .read_text())
        slices = [e["args"] for e in trace["traceEvents"] if e["ph"] == "X"]
        assert [(a["step"], a["partition_bytes"]) for a in slices
                if a["phase"] == "SWITCH"] == [(2, 4 * KiB)]
        sizes = {step: max(a["bytes"] for a in slices
                           if a["phase"] == "COMM" and a["step"] == step) for step in (1, 2, 3)}
        assert sizes == {1: KiB, 2: 4 * KiB, 3: 4 * KiB}, sizes


@pytest.mark.timeout(400)
def test_rank_zero_switches_sizes_mid_run_and_every_rank_follows_at_that_step(main_job):
    tmp, results = main_job
    check_retune(tmp, [r["retune"] for r in results])


# --- order="static" and enabled=False ----------------------------------------------------------


@pytest.fixture(scope="module")
def static_job(tmp_path_factory) -> list[dict]:
    """One 2-rank job for the static order's tests."""
    return run_job(tmp_path_factory.mktemp("comm_static"), "static", limit_s=300)


def issued_as_compiled(issues: list[dict], steps: int) -> None:
    """Every step issued exactly the static order compiled for it, nothing else."""
    assert [e["step"] for e in issues] == list(range(steps))
    for e in issues:
        assert e["order"] and e["issued"] == e["order"], e["step"]


@pytest.mark.timeout(400)
def test_static_order_equals_the_leader_order_and_ddp_and_every_rank_issues_it(static_job):
    r0, r1 = static_job
    assert len(r0["runs"]) == 4 * 2  # 4 policies x (momentum SGD, Adam)
    for key in r0["runs"]:
        # One compiled order, the same on both ranks, every collective once.
        orders = [r["runs"][key]["static_order"] for r in static_job]
        assert orders[0] == orders[1] and len(set(orders[0])) == len(orders[0]) > 1, key
        for rank, r in enumerate(static_job):
            run = r["runs"][key]
            # The same sums in another order: the leader-ordered run's parameters bit for
            # bit, DDP's within the existing tolerance.
            assert run["bitwise_vs_leader"], (rank, key)
            assert run["vs_ddp"] <= 1e-6, (rank, key, run["vs_ddp"])
            issued_as_compiled(run["issues"], steps=5)
            assert all(e["order"] == run["static_order"] for e in run["issues"])
            # No decision went through the store, and no rank reads decisions; the leader
            # run of the same job shows both would be seen.
            assert run["decision_keys"] == [], (rank, key, run["decision_keys"][:3])
            # DDP's ordered buckets are dispatched in plan order on every rank, so even the
            # leader publishes no decision for them; for the other policies it does.
            assert (run["leader_decision_keys"] == 0) == key.startswith("ddp-buckets"), key
            assert "trainsched-decisions" not in run["threads"]
            assert "trainsched-dispatcher" in run["threads"]
        assert "trainsched-decisions" in r1["runs"][key]["leader_threads"]
    assert "static_wire must be (alpha_s, bytes_per_s)" in r0["bad_wire"]
    assert "static_order is the order compiled with order='static'" in r0["not_static"]


@pytest.mark.timeout(400)
def test_static_order_holds_under_random_per_rank_delays_with_the_order_checked(static_job):
    # verify_order_every=1: a mismatch would have raised in the job (and failed run_job).
    for rank, r in enumerate(static_job):
        fuzz = r["fuzz"]
        assert fuzz["vs_ddp"] <= 1e-5, (rank, fuzz["vs_ddp"])
        issued_as_compiled(fuzz["issues"], fuzz["steps"])
        assert fuzz["static_order"] == static_job[0]["fuzz"]["static_order"]
        assert fuzz["decision_keys"] == []
        assert 0 < fuzz["max_in_flight_bytes"] <= fuzz["credit_bytes"]  # strict credit kept


@pytest.mark.timeout(400)
def test_static_order_is_recompiled_at_a_switch_on_every_rank(static_job):
    KiB = 1024
    assert static_job[0]["retune_at"] == 2
    assert "rank 0's call" in static_job[1]["retune"]["errors"]["follower"]
    for r in static_job:
        retune = r["retune"]
        assert retune["switches"] == [[2, 4 * KiB, 8 * KiB]]
        issued_as_compiled(retune["issues"], steps=6)
        before, after = retune["issues"][0]["order"], retune["issues"][2]["order"]
        assert [e["order"] for e in retune["issues"]] == [before] * 2 + [after] * 4
        assert after == retune["static_order"]
        # fc1.weight (32 KiB): 32 partitions of 1 KiB before, 8 of 4 KiB after.
        assert "fc1.weight/31" in before and "fc1.weight/7" in after
        assert "fc1.weight/8" not in after
        assert retune["issues"] == static_job[0]["retune"]["issues"]  # both ranks alike
        assert retune["bitwise_vs_unswitched"] and retune["vs_ddp"] <= 1e-6
        # An online tuner under the static order: rank 0's decisions, applied on every
        # rank at the same steps, each step issuing the order compiled for its policy.
        tuner = r["tuner"]
        decided = static_job[0]["tuner"]["decided"]
        assert len(decided) >= 5
        assert [s[0] for s in tuner["switches"]] == [d[0] for d in decided]
        assert tuner["switches"] == static_job[0]["tuner"]["switches"]
        issued_as_compiled(tuner["issues"], tuner["steps"])
        assert tuner["issues"] == static_job[0]["tuner"]["issues"]
        assert len({tuple(e["order"]) for e in tuner["issues"]}) >= 2
        assert tuner["vs_ddp"] <= 1e-6


@pytest.mark.timeout(200)
def test_the_loops_own_collectives_between_steps_never_meet_the_gradients(tmp_path):
    # The loss all-reduced and a barrier on the default group while the step's gradients are
    # still being reduced: on a shared group they would pair with the wrong collectives (a
    # size mismatch, a hang, or a loss summed with a gradient slice).
    results = run_job(tmp_path, "user_collectives", timeout_s=30, limit_s=150)
    assert results[0].keys() == {"priority-overdraft", "bytescheduler", "fifo-crossing"}
    for name, mine in results[0].items():
        theirs = results[1][name]
        assert len(mine["summed"]) == 5
        for a, b, total in zip(mine["losses"], theirs["losses"], mine["summed"], strict=True):
            assert total == pytest.approx(a + b, rel=1e-6), name
        assert theirs["summed"] == mine["summed"], name
        assert max(mine["vs_ddp"], theirs["vs_ddp"]) <= 1e-6, name


@pytest.mark.timeout(300)
def test_disabled_is_a_pass_through_to_ddp_without_hooks_threads_or_store_traffic(tmp_path):
    results = run_job(tmp_path, "disabled", limit_s=240)
    none = {"grad": 0, "forward": 0}
    for rank, r in enumerate(results):
        runs = r["runs"]
        for label in ("momentum", "adam", "factory"):
            run = runs[label]
            # DDP's parameters bit for bit (the lazy step is the same computation).
            assert run["bitwise_vs_ddp"], (rank, label, run["vs_ddp"])
            assert len(set(run["threads"])) == 1, (rank, label, run["threads"])
            assert run["hooks_before"] == none and run["hooks_after_close"] == none
            assert all(h == none for h in run["hooks"]), (rank, label, run["hooks"])
            assert run["store_keys_added"] == 0, (rank, label)
            assert run["steps_before_drain"] == 5
        assert runs["momentum"]["steps_after_drain"] == 5
        assert runs["momentum"]["momentum_buffer_bitwise"]  # `optimizers` after drain
        assert "was closed" in runs["momentum"]["forward_after_close"]
        assert r["set_lr_bitwise"]
        # The same measurements of an enabled wrapper: its threads, hooks and store keys.
        on = runs["enabled"]
        assert on["threads"][2] > on["threads"][0]
        assert all(h["grad"] == 8 and h["forward"] > 0 for h in on["hooks"])  # 8 parameters
        assert on["store_keys_added"] > 0
        assert on["hooks_after_close"] == none and on["vs_ddp"] <= 1e-6
        refused = r["refused"]
        for key, words in (("tuner", "a tuner"), ("timeline", "a timeline"),
                           ("verify", "verify_order_every"), ("order", "order='static'"),
                           ("update", "update='partition'")):
            assert "enabled=False is a pass-through to DistributedDataParallel" in refused[key]
            assert f"refuses {words} (" in refused[key], refused[key]
            assert "drop it or use enabled=True" in refused[key]
        assert "a tuner" in refused["several"] and "verify_order_every" in refused["several"]
        assert "drop them" in refused["several"]
        assert "built with enabled=False" in refused["retune"]
        assert "enabled=False" in refused["static_order"]
        assert "enabled must be True or False" in refused["enabled_type"]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_order_fuzz_on_four_ranks_for_a_hundred_steps(tmp_path):
    results = run_job(tmp_path, "fuzz", world_size=4, steps=100, limit_s=800)
    check_fuzz(tmp_path, results, steps=100)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("victim", [1, pytest.param(0, marks=pytest.mark.slow)])
def test_a_dead_rank_makes_the_survivor_fail_clearly(tmp_path, victim):
    start = time.monotonic()
    results = run_job(tmp_path, "fault", victim=victim, mode="die", timeout_s=20,
                      wait_all=True, limit_s=60)
    survivor = results[1 - victim]
    assert results[victim].get("missing"), "the victim should have died"
    assert survivor["error"], survivor
    assert "died" in survivor["error"] or "failed" in survivor["error"], survivor["error"]
    assert survivor["seconds"] < 20
    assert time.monotonic() - start < 60


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_hung_rank_makes_the_survivor_fail_within_the_timeout(tmp_path):
    results = run_job(tmp_path, "fault", victim=1, mode="hang", timeout_s=8, wait_all=True,
                      limit_s=30)
    survivor = results[0]
    assert survivor["error"] and survivor["seconds"] < 30, survivor


# --- timed training (runtime.train and the CLI) ----------------------------------------------


@pytest.mark.timeout(180)
def test_run_segments_times_every_kind_in_one_job():
    from trainsched.runtime.train import Segment, run_segments

    kinds = [Segment(label="fifo", kind="sdp", policy="fifo", cross_barrier=False),
             Segment(label="ddp", kind="ddp", bucket_mb=1.0),
             Segment(label="priority", kind="sdp", partition_bytes=64 * 1024,
                     credit_bytes=256 * 1024, credit_mode="strict"),
             Segment(label="static", kind="sdp", partition_bytes=64 * 1024,
                     credit_bytes=256 * 1024, order="static"),
             Segment(label="off", kind="sdp", enabled=False),
             Segment(label="flat", kind="flat"), Segment(label="compute", kind="compute"),
             Segment(label="allreduce", kind="allreduce")]
    segments = [s.__class__(**{**s.__dict__, "steps": 3, "warmup": 1}) for s in kinds]
    result = run_segments("mlp", segments, nproc=2, batch_size=8, optimizer="momentum")
    assert [s.label for s in result.segments] == [s.label for s in kinds]
    for s in result.segments:
        assert len(s.step_times_s) == 3 and all(t > 0 for t in s.step_times_s)
        assert s.quantile_s(0.1) <= s.median_s <= s.quantile_s(0.9)
    times = result.first.step_times_s
    assert result.batch_size == 8
    assert result.throughput() == pytest.approx(16 * 3 / sum(times))
    assert result.to_dict()["segments"][2]["label"] == "priority"


@pytest.mark.timeout(180)
def test_cli_train_prints_json_and_writes_a_timeline(tmp_path, capsys):
    from trainsched.cli import main

    code = main(["train", "mlp", "--nproc", "2", "--comm", "priority", "--partition", "16KiB",
                 "--credit", "64KiB", "--steps", "3", "--warmup", "1", "--batch-size", "4",
                 "--timeline", str(tmp_path), "--json"])
    assert code == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["comm"] == "priority" and doc["partition_bytes"] == 16 * 1024
    assert len(doc["segments"][0]["step_times_s"]) == 3 and doc["median_s"] > 0
    times = doc["segments"][0]["step_times_s"]
    assert doc["throughput_samples_per_s"] == pytest.approx(8 * len(times) / sum(times))
    for rank in range(2):
        trace = json.loads((tmp_path / f"rank{rank}.trace.json").read_text())
        steps = {e["args"]["step"] for e in trace["traceEvents"] if e["ph"] == "X"}
        assert steps == {1, 2, 3}


@pytest.mark.timeout(180)
def test_cli_train_runs_the_static_order(capsys):
    from trainsched.cli import main

    code = main(["train", "mlp", "--nproc", "2", "--comm", "priority", "--partition", "16KiB",
                 "--credit", "64KiB", "--order", "static", "--steps", "3", "--warmup", "1",
                 "--batch-size", "4"])
    assert code == 0
    out = capsys.readouterr().out
    assert "static order" in out and "step time  median" in out


@pytest.mark.timeout(180)
def test_cli_train_bytescheduler_fuses_small_gradients(tmp_path, capsys):
    from trainsched.cli import main

    code = main(["train", "mlp", "--nproc", "2", "--comm", "bytescheduler", "--steps", "3",
                 "--warmup", "1", "--batch-size", "4", "--timeline", str(tmp_path), "--json"])
    assert code == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["comm"] == "bytescheduler" and doc["median_s"] > 0
    trace = json.loads((tmp_path / "rank0.trace.json").read_text())
    tracks = {e["args"]["name"] for e in trace["traceEvents"]
              if e["ph"] == "M" and e["name"] == "thread_name"
              and e["args"]["name"].startswith("rank0/comm/")}  # fmt: skip
    # The MLP's gradients are all below 1 MiB: fused into flat buffers of at most 4 MiB, each
    # named after its most urgent member and the count of the others.
    groups = {t.split(" (lane")[0] for t in tracks}
    assert groups and all("+" in g for g in groups), groups
    # Every one of the MLP's 8 parameters (4 linear layers) is in exactly one fused group.
    assert sum(int(g.rsplit("+", 1)[1]) + 1 for g in groups) == 8


def test_cli_train_runs_backfill(capsys):
    from trainsched.cli import main

    code = main(["train", "mlp", "--nproc", "2", "--partition", "16KiB", "--credit", "48KiB",
                 "--credit-mode", "strict", "--backfill", "--steps", "3", "--warmup", "1",
                 "--batch-size", "4", "--json"])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert out["backfill"] is True and out["credit_mode"] == "strict" and out["median_s"] > 0


@pytest.mark.parametrize("argv, message", [
    (["--partition", "4MiB", "--credit", "1MiB", "--credit-mode", "strict"],
     "smaller than the partition size"),
    (["--comm", "ddp", "--timeline", "."], "--trace-dir does not apply with --comm-policy ddp"),
    (["--steps", "0"], "--steps 0: give at least 1"),
    (["--nproc", "0"], "--ranks 0: give at least 1"),
    (["--partition", "0"], "partition_bytes must be a positive integer"),
    (["--order", "local"], "--order local: give leader or static"),
    (["--comm", "ddp", "--order", "static"], "--order does not apply with --comm-policy ddp"),
    (["--comm", "ddp", "--no-schedule"], "--no-schedule does not apply with --comm-policy ddp"),
    (["--no-schedule", "--order", "static"], "--order does not apply with --no-schedule"),
    (["--no-schedule", "--timeline", "."], "--trace-dir does not apply with --no-schedule"),
    (["--no-schedule", "--autotune"], "--no-schedule does not apply with --autotune"),
    (["--backfill"], "it needs credit_mode 'strict'"),
    (["--comm", "fifo", "--backfill"], "--backfill does not apply with --comm-policy fifo: it "
                                       "applies only with --comm-policy priority or "
                                       "bytescheduler"),
    (["--comm", "ddp", "--backfill"], "--backfill does not apply with --comm-policy ddp"),
    (["--comm", "bytescheduler", "--backfill"], "it needs credit_mode 'strict'"),
    (["--comm", "bytescheduler", "--credit", "1MiB", "--credit-mode", "strict"],
     "must hold one partition"),
])
def test_cli_train_rejects_bad_input_before_spawning(capsys, argv, message):
    from trainsched.cli import main

    start = time.monotonic()
    assert main(["train", "mlp", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
    assert time.monotonic() - start < 5



@pytest.mark.parametrize(("options", "message"), [
    ({"lr": float("nan")}, "lr must be a finite number > 0, got nan"),
    ({"lr": 0}, "lr must be a finite number > 0, got 0"),
    ({"nproc": 0}, "nproc must be a positive integer, got 0"),
    ({"batch_size": "4"}, "batch_size must be an integer of at least 1, got '4'"),
    ({"comm": "ddp", "order": "static"}, "order sets the scheduled runtime's collective order"),
    ({"comm": "ddp", "enabled": False}, "comm 'ddp' is stock DDP already"),
    ({"comm": "fifo", "backfill": True}, "it applies to comm 'priority' or 'bytescheduler'"),
    ({"steps": 0}, "steps must be at least 1, got 0"),
])
def test_train_library_errors_name_parameters_before_spawning(options, message):
    from trainsched.errors import TrainschedError
    from trainsched.runtime.train import train

    with pytest.raises(TrainschedError, match=re.escape(message)) as raised:
        train("mlp", **options)
    assert "--" not in str(raised.value)
