"""Auto-tuning partition and credit: within 5% of the best grid point in 15 trials on a VGG-like
graph in the simulator, reproducible for a seed, bad input rejected."""

from __future__ import annotations

import json
import math

import pytest

from trainsched.cluster import resolve_cluster
from trainsched.comm.policy import ByteSchedulerPolicy
from trainsched.comm.tune import (
    OnlineTuner,
    grid_search,
    tune,
    tuned_policy,
)
from trainsched.errors import TrainschedError
from trainsched.graph import Edge, Graph, Op, to_training
from trainsched.sim import simulate_data_parallel
from trainsched.sim.tune import simulated_objective

MiB = 1 << 20
# VGG-16's layers: parameters (weights and bias, millions) and forward GFLOPs per image.
VGG16 = [(0.0018, 0.17), (0.037, 3.7), (0.074, 1.85), (0.148, 3.7), (0.295, 1.85),
         (0.59, 3.7), (0.59, 3.7), (1.18, 1.85), (2.36, 3.7), (2.36, 3.7), (2.36, 0.92),
         (2.36, 0.92), (2.36, 0.92), (102.8, 0.2), (16.8, 0.03), (4.1, 0.008)]
GRID_PARTITIONS = [p * MiB for p in (1, 2, 4, 8, 16, 32, 64, 128)]
GRID_CREDITS = [c * MiB for c in (1, 4, 16, 64, 256)]


def vgg_like(batch_ms: float = 90.0) -> Graph:
    """VGG-16's parameter sizes (fp32) and its compute split by FLOPs: ``batch_ms`` of forward,
    as much again for each of dX and dW."""
    total = sum(f for _, f in VGG16)
    ops = [Op(name=f"layer{i}", compute_s=batch_ms * 1e-3 * f / total,
              param_bytes=round(p * 1e6) * 4, output_bytes=1 << 20, saved_bytes=1 << 20,
              layer_index=i) for i, (p, f) in enumerate(VGG16)]  # fmt: skip
    edges = [Edge(src=f"layer{i}", dst=f"layer{i + 1}", size_bytes=1 << 20)
             for i in range(len(ops) - 1)]
    return to_training(Graph(ops, edges), memory_bandwidth_bytes_per_s=900e9)


@pytest.fixture(scope="module")
def vgg_objective():
    # 16 V100s on two nodes, 25 Gbit/s TCP: VGG's 553 MB take longer than its compute.
    return simulated_objective(vgg_like(), resolve_cluster("v100-tcp-25g:2"), 16, "ring")


def test_tuner_finds_the_grid_best_within_5_percent_in_15_trials(vgg_objective):
    grid = grid_search(vgg_objective, GRID_PARTITIONS, GRID_CREDITS)
    worst = max(t.step_time_s for t in grid.trials)
    assert worst > 1.2 * grid.step_time_s  # the setting matters on this setup
    for seed in (0, 1, 2):
        result = tune(vgg_objective, seed=seed)
        assert len(result.trials) == 15
        assert [t.phase for t in result.trials] == ["startup"] * 10 + ["guided"] * 5
        assert result.step_time_s <= 1.05 * grid.step_time_s, (seed, result, grid)
        best = min(result.trials, key=lambda t: t.step_time_s)
        assert (best.partition_bytes, best.credit_bytes) == (result.partition_bytes,
                                                             result.credit_bytes)
        # The reported time is the objective's at the reported point.
        assert vgg_objective(result.partition_bytes, result.credit_bytes) == result.step_time_s
        for t in result.trials:
            assert MiB <= t.partition_bytes <= 128 * MiB and MiB <= t.credit_bytes <= 256 * MiB


def test_tuner_is_deterministic_for_a_seed(vgg_objective):
    a = tune(vgg_objective, seed=7, startup_trials=4, guided_trials=3)
    b = tune(vgg_objective, seed=7, startup_trials=4, guided_trials=3)
    assert a == b and a.to_dict() == b.to_dict()
    c = tune(vgg_objective, seed=8, startup_trials=4, guided_trials=3)
    assert [(t.partition_bytes, t.credit_bytes) for t in c.trials] != [
        (t.partition_bytes, t.credit_bytes) for t in a.trials]


def test_tuner_searches_in_log_space_within_the_range():
    seen = []

    def objective(partition: int, credit: int) -> float:
        seen.append((partition, credit))
        return 1.0 + abs(math.log2(partition / 3000))  # best partition 3000 B, credit irrelevant

    result = tune(objective, partition_range=(100, 100_000), credit_range=(50, 50),
                  startup_trials=10, guided_trials=10, seed=0, granularity_bytes=1)
    assert all(100 <= p <= 100_000 and c == 50 for p, c in seen)
    assert len(seen) == 20
    # Log-uniform: startup points spread over the decades, not crowded at the top.
    assert sum(p < 10_000 for p, _ in seen[:10]) >= 4
    assert abs(math.log2(result.partition_bytes / 3000)) < 1  # within 2x of the optimum
    calls = []
    tune(objective, partition_range=(100, 200), credit_range=(1, 2), startup_trials=2,
         guided_trials=1, on_trial=calls.append, granularity_bytes=1)
    assert [t.number for t in calls] == [0, 1, 2]
    # Default granularity: whole 4 KiB multiples inside the range.
    seen.clear()
    tune(objective, partition_range=(5000, 3 * MiB), credit_range=(MiB, 2 * MiB),
         startup_trials=6, guided_trials=2)
    assert all(p % 4096 == 0 and c % 4096 == 0 for p, c in seen)
    assert all(8192 <= p <= 3 * MiB and MiB <= c <= 2 * MiB for p, c in seen)


def test_simulated_objective_is_the_simulators_step_time():
    graph = vgg_like()
    cluster = resolve_cluster("v100-tcp-25g:2")
    objective = simulated_objective(graph, cluster, 16, "ring", steps=3)
    policy = ByteSchedulerPolicy(partition_bytes=8 * MiB, credit_bytes=16 * MiB,
                                 fusion_bytes=8 * MiB)
    expected = simulate_data_parallel(graph, cluster, ranks=16, policy=policy, steps=3)
    assert objective(8 * MiB, 16 * MiB) == expected.step_time_s
    fixed = simulated_objective(graph, cluster, 16, fusion_bytes=MiB)
    default = ByteSchedulerPolicy(partition_bytes=8 * MiB, credit_bytes=16 * MiB)
    assert fixed(8 * MiB, 16 * MiB) == simulate_data_parallel(
        graph, cluster, ranks=16, policy=default, steps=3).step_time_s
    strict = simulated_objective(graph, cluster, 16, credit_mode="strict")
    assert strict(8 * MiB, MiB) == strict(8 * MiB, 8 * MiB)  # credit raised to one partition
    with pytest.raises(TrainschedError, match="fusion_bytes must be an integer >= 0"):
        simulated_objective(graph, cluster, 16, fusion_bytes=-1)


@pytest.mark.parametrize(("kwargs", "problem"), [
    ({"partition_range": (0, MiB)}, "partition_range must be two integers 0 < low <= high"),
    ({"partition_range": (4 * MiB, MiB)}, "partition_range must be two integers"),
    ({"credit_range": (1.5, 8)}, "credit_range must be two integers"),
    ({"credit_range": (MiB,)}, "credit_range must be two integers"),
    ({"startup_trials": 0}, "startup_trials must be an integer >= 1"),
    ({"guided_trials": -1}, "guided_trials must be an integer >= 0"),
    ({"seed": "x"}, "seed must be an integer"),
    ({"partition_range": (5000, 8000)}, "5000-8000 B holds no multiple of the granularity"),
    ({"granularity_bytes": 0}, "granularity_bytes must be an integer >= 1"),
])
def test_bad_ranges_and_counts_are_rejected(kwargs, problem):
    with pytest.raises(TrainschedError, match=problem):
        tune(lambda p, c: 1.0, **kwargs)


def test_bad_objective_values_are_reported():
    for value in (float("nan"), 0.0, -1.0, "fast", None):
        with pytest.raises(TrainschedError, match="must return a step time in seconds > 0"):
            tune(lambda p, c, v=value: v, startup_trials=1, guided_trials=0)
    with pytest.raises(TrainschedError, match="at least one partition and one credit"):
        grid_search(lambda p, c: 1.0, [], [MiB])


def feed(tuner: OnlineTuner, objective, start: tuple[int, int], noise: float = 1e6) -> list:
    """Drive ``tuner`` as the runtime does: step s runs the point switched to last (at or
    before s) and takes ``objective`` of it; steps the tuner must ignore (warm-up, settling,
    the publishing step) take ``noise`` instead, which must change nothing."""
    tuner.begin(*start)
    point, switches, applies = start, [], {}
    ignored = set(range(tuner.warmup_steps))
    for k in range(1, tuner.n_trials + 1):
        first = tuner.trial_start(k)
        ignored |= set(range(first, first + tuner.settle_steps)) | {first - 1}
    for step in range(tuner.total_steps + 3):
        point = applies.pop(step, point)
        seconds = noise if step in ignored else objective(*point)
        switch = tuner.observe(step, seconds)
        if switch is not None:
            at, new = switch
            assert at == step + 2
            applies[at] = new
            switches.append(switch)
    return switches


def test_online_tuner_searches_as_the_offline_one_on_a_fixed_schedule(vgg_objective):
    offline = tune(vgg_objective, seed=4, startup_trials=4, guided_trials=3)
    tuner = OnlineTuner(seed=4, startup_trials=4, guided_trials=3, warmup_steps=3,
                        settle_steps=2, trial_steps=3, confirm_rounds=0)
    # 3 warm-up steps, the start point's 3, then 7 trials of 2 + 3 + 1 steps.
    assert tuner.total_steps == 3 + 3 + 1 + 7 * 6 == 49
    start = (64 * MiB, 64 * MiB)
    switches = feed(tuner, vgg_objective, start)
    assert tuner.finished and len(tuner.trials) == 8
    assert tuner.trials[0].phase == "start"
    assert (tuner.trials[0].partition_bytes, tuner.trials[0].credit_bytes) == start
    assert tuner.trials[0].step_time_s == vgg_objective(*start)
    # The same points in the same order with the same times as the offline search: the
    # ignored steps' huge times reached nobody.
    assert [(t.partition_bytes, t.credit_bytes, t.step_time_s, t.phase)
            for t in tuner.trials[1:]] == [(t.partition_bytes, t.credit_bytes, t.step_time_s,
                                            t.phase) for t in offline.trials]
    assert [at for at, _ in switches] == [tuner.trial_start(k) for k in range(1, 9)]
    best = tuner.result
    assert switches[-1] == (tuner.total_steps, (best.partition_bytes, best.credit_bytes))
    assert best.step_time_s == min(offline.step_time_s, vgg_objective(*start))


def test_online_tuner_ends_on_the_start_point_when_nothing_beats_it():
    tuner = OnlineTuner(startup_trials=2, guided_trials=0, warmup_steps=0, settle_steps=0,
                        trial_steps=1, partition_range=(MiB, 8 * MiB),
                        credit_range=(MiB, 8 * MiB), confirm_rounds=0)
    start = (3 * MiB, 5 * MiB)
    switches = feed(tuner, lambda p, c: 1.0 if (p, c) == start else 2.0, start)
    assert len(switches) == 3 and switches[-1] == (tuner.total_steps, start)
    assert tuner.result.trials[0].phase == "start" and tuner.result.step_time_s == 1.0
    # Trials of one step: the median of one value; a median over several.
    median = OnlineTuner(startup_trials=1, guided_trials=0, warmup_steps=0, trial_steps=3,
                         confirm_rounds=0)
    median.begin(MiB, MiB)
    for step, seconds in enumerate([5.0, 1.0, 2.0]):
        median.observe(step, seconds)
    assert median.trials[0].step_time_s == 2.0


def test_confirmation_rounds_cancel_a_linear_drift():
    """Step times fall by 2% of the best time per step (the machine grows quieter while the
    search runs), which makes later trials look faster than they are. The search alone then
    picks a late point; the alternating confirmation rounds pick the truly fastest candidate."""
    def truth(p: int, c: int) -> float:
        return 1.0 + abs(math.log2(p / (8 * MiB))) / 10 + abs(math.log2(c / (16 * MiB))) / 40

    options = {"startup_trials": 6, "guided_trials": 2, "warmup_steps": 1, "settle_steps": 1,
               "trial_steps": 2, "partition_range": (MiB, 64 * MiB),
               "credit_range": (MiB, 256 * MiB), "seed": 5}
    clock = {"step": 0}

    def drifting(p: int, c: int) -> float:
        return truth(p, c) + 0.02 * (200 - clock["step"])

    def run(tuner: OnlineTuner) -> OnlineTuner:
        tuner.begin(32 * MiB, 32 * MiB)
        point, applies = (32 * MiB, 32 * MiB), {}
        for step in range(tuner.total_steps + 1):
            clock["step"] = step
            point = applies.pop(step, point)
            switch = tuner.observe(step, drifting(*point))
            if switch is not None:
                applies[switch[0]] = switch[1]
        return tuner

    plain = run(OnlineTuner(confirm_rounds=0, **options))
    confirmed = run(OnlineTuner(confirm_points=3, confirm_rounds=2, **options))
    assert confirmed.total_steps == plain.total_steps + 6 * plain.period
    phases = [t.phase for t in confirmed.trials]
    assert phases == ["start"] + ["startup"] * 6 + ["guided"] * 2 + ["confirm"] * 6
    a, b, c = confirmed.candidates
    assert confirmed.confirm_order == [a, b, c, c, b, a]
    # The candidates are the three fastest-looking trials (the latest ones, here), and the
    # search alone takes the last of them; confirmation takes the truly fastest.
    plain_pick = (plain.result.partition_bytes, plain.result.credit_bytes)
    chosen = (confirmed.result.partition_bytes, confirmed.result.credit_bytes)
    assert chosen == min(confirmed.candidates, key=lambda pc: truth(*pc))
    assert truth(*plain_pick) > truth(*chosen)
    assert confirmed.switches[-1] == (confirmed.total_steps, chosen)


def test_online_tuner_rejects_misuse():
    tuner = OnlineTuner(startup_trials=1, guided_trials=0, warmup_steps=1, trial_steps=2,
                        confirm_rounds=0)
    with pytest.raises(TrainschedError, match="begin"):
        tuner.observe(0, 1.0)
    tuner.begin(MiB, MiB)
    tuner.observe(0, 1.0)
    with pytest.raises(TrainschedError, match="observed after step 0"):
        tuner.observe(0, 1.0)
    with pytest.raises(TrainschedError, match="without it: observe every step"):
        tuner.observe(3, 1.0)  # step 1 and 2 are trial 0's, step 3 skips them
    for value in (0.0, float("inf"), "1s"):
        with pytest.raises(TrainschedError, match="must be seconds > 0"):
            fresh = OnlineTuner(warmup_steps=0)
            fresh.begin(MiB, MiB)
            fresh.observe(0, value)
    for bad in ({"trial_steps": 0}, {"warmup_steps": -1}, {"settle_steps": 1.5},
                {"confirm_points": 0}, {"confirm_rounds": -1}):
        with pytest.raises(TrainschedError, match="must be an integer"):
            OnlineTuner(**bad)


def test_tuned_policy_fuses_to_a_partition_and_keeps_a_strict_credit_whole():
    from trainsched.comm.policy import FifoPolicy, PriorityPolicy

    bs = tuned_policy(ByteSchedulerPolicy(), 8 * MiB, 2 * MiB)
    assert (bs.partition_bytes, bs.credit_bytes, bs.fusion_bytes) == (8 * MiB, 2 * MiB, 8 * MiB)
    strict = tuned_policy(PriorityPolicy(partition_bytes=MiB, credit_bytes=4 * MiB),
                          8 * MiB, 2 * MiB)
    assert (strict.partition_bytes, strict.credit_bytes) == (8 * MiB, 8 * MiB)
    with pytest.raises(TrainschedError, match="no partition and credit to tune"):
        tuned_policy(FifoPolicy(), MiB, MiB)


@pytest.mark.timeout(300)
def test_train_autotune_tunes_online_in_one_job_and_times_the_best(capsys):
    from trainsched.cli import main

    code = main(["train", "mlp", "--nproc", "2", "--autotune", "--tune-trials", "2",
                 "--tune-steps", "2", "--tune-partition", "64KiB-1MiB", "--tune-credit",
                 "64KiB-4MiB", "--steps", "3", "--warmup", "1", "--timeout", "120", "--json"])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    tuned = out["autotune"]
    start, *trials = tuned["trials"]
    assert (start["phase"], start["partition_bytes"], start["credit_bytes"]) == (
        "start", 4 * MiB, 16 * MiB)  # the --partition and --credit defaults
    assert [t["phase"] for t in trials] == ["startup", "startup"] + ["confirm"] * 6
    for t in trials[:2]:
        assert t["step_time_s"] > 0
        assert 64 << 10 <= t["partition_bytes"] <= MiB and t["partition_bytes"] % 4096 == 0
        assert 64 << 10 <= t["credit_bytes"] <= 4 * MiB
    # The three points re-measured twice, in alternating order; the chosen one has the lowest
    # median over its two confirmation trials.
    points = [(t["partition_bytes"], t["credit_bytes"]) for t in tuned["trials"]]
    assert points[3:6] == points[6:9][::-1] and len(set(points[3:6])) == 3
    confirm = {pc: sorted(t["step_time_s"] for t, q in zip(trials[2:], points[3:], strict=True)
                          if q == pc) for pc in points[3:6]}
    chosen = (tuned["partition_bytes"], tuned["credit_bytes"])
    assert tuned["step_time_s"] == sum(confirm[chosen]) / 2 == min(
        sum(v) / 2 for v in confirm.values())
    # 1 warm-up step, the start point's 2, then 8 trials of 1 + 2 + 1 steps: switches at 4,
    # 8, ..., 32 and to the chosen point at 36; then 1 warm-up and 3 timed steps there.
    assert tuned["total_steps"] == 36
    assert [s[0] for s in tuned["switches"]] == list(range(4, 37, 4))
    assert tuned["switches"][-1][1:] == list(chosen)
    (segment,) = out["segments"]
    assert len(segment["step_times_s"]) == 3 and out["median_s"] > 0


@pytest.mark.parametrize(("flags", "problem"), [
    (["--comm", "ddp"], "--autotune does not apply with --comm-policy ddp: it applies only "
                        "with --comm-policy priority or bytescheduler (it tunes their partition "
                        "and credit)"),
    (["--tune-partition", "4MiB"], "--tune-partition takes LOW-HIGH"),
    (["--tune-credit", "8MiB-1MiB"], "--tune-credit takes LOW-HIGH with 0 < LOW <= HIGH"),
    (["--tune-trials", "0"], "--tune-trials must be >= 1"),
    (["--tune-steps", "0"], "--tune-steps must be >= 1"),
    (["--tune-confirm", "-1"], "--tune-confirm must be >= 0"),
    (["--timeline", "tl"], "--trace-dir does not apply with --autotune"),
])
def test_train_autotune_rejects_bad_flags_on_one_line(flags, problem, capsys):
    from trainsched.cli import main

    assert main(["train", "mlp", "--autotune", *flags]) == 2
    err = capsys.readouterr().err
    assert problem in err and err.count("\n") == 1


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_train_autotune_tunes_the_bytescheduler_policy_too(capsys):
    from trainsched.cli import main

    code = main(["train", "mlp", "--nproc", "2", "--comm", "bytescheduler", "--autotune",
                 "--tune-trials", "2", "--tune-steps", "1", "--tune-confirm", "0",
                 "--tune-partition", "64KiB-1MiB", "--tune-credit", "64KiB-4MiB", "--steps", "2",
                 "--warmup", "1", "--timeout", "120", "--json"])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    tuned = out["autotune"]
    assert out["comm"] == "bytescheduler"
    assert [t["phase"] for t in tuned["trials"]] == ["start", "startup", "startup"]
    best = min(tuned["trials"], key=lambda t: (t["step_time_s"], t["number"]))  # start too
    assert (tuned["partition_bytes"], tuned["credit_bytes"]) == (best["partition_bytes"],
                                                                 best["credit_bytes"])
    assert tuned["switches"][-1][1:] == [best["partition_bytes"], best["credit_bytes"]]
