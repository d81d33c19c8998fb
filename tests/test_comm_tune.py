"""Auto-tuning partition and credit: within 5% of the best grid point in 15 trials on a VGG-like
graph in the simulator, reproducible for a seed, bad input rejected."""

from __future__ import annotations

import json
import math

import pytest

from trainsched.cluster import resolve_cluster
from trainsched.comm.policy import ByteSchedulerPolicy
from trainsched.comm.tune import grid_search, simulated_objective, tune
from trainsched.errors import TrainschedError
from trainsched.graph import Edge, Graph, Op
from trainsched.sim import simulate_data_parallel
from trainsched.training import to_training

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


def test_train_autotune_runs_real_trials_and_reports_the_best(capsys):
    from trainsched.cli import main

    code = main(["train", "mlp", "--nproc", "2", "--autotune", "--tune-trials", "1",
                 "--tune-partition", "64KiB-1MiB", "--tune-credit", "64KiB-4MiB",
                 "--steps", "2", "--warmup", "1", "--timeout", "120", "--json"])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    tuned = out["autotune"]
    (trial,) = tuned["trials"]
    assert trial["phase"] == "startup" and trial["step_time_s"] > 0
    assert 64 << 10 <= trial["partition_bytes"] <= MiB and trial["partition_bytes"] % 4096 == 0
    assert 64 << 10 <= trial["credit_bytes"] <= 4 * MiB
    assert (tuned["partition_bytes"], tuned["step_time_s"]) == (trial["partition_bytes"],
                                                               trial["step_time_s"])


@pytest.mark.parametrize(("flags", "problem"), [
    (["--comm", "ddp"], "--autotune tunes the priority scheduler's partition and credit"),
    (["--tune-partition", "4MiB"], "--tune-partition takes LOW-HIGH"),
    (["--tune-credit", "8MiB-1MiB"], "--tune-credit takes LOW-HIGH with 0 < LOW <= HIGH"),
    (["--tune-trials", "0"], "--tune-trials must be >= 1"),
    (["--timeline", "tl"], "--timeline records one run"),
])
def test_train_autotune_rejects_bad_flags_on_one_line(flags, problem, capsys):
    from trainsched.cli import main

    assert main(["train", "mlp", "--autotune", *flags]) == 2
    err = capsys.readouterr().err
    assert problem in err and err.count("\n") == 1
