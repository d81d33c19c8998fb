"""Sharded parameter servers in the sync runtime: the flat parameter vector cut into S
contiguous shards, one server rank each. With k = N (BSP on the server) or in the deterministic
mode every shard takes the same decisions as one server, so S = 2 reproduces S = 1; a dead
shard server fails the run clearly. The torch-free checks (shard bounds, what is refused, the
torchrun world size) run without processes.
"""

from __future__ import annotations

import time

import pytest

from trainsched.errors import TrainschedError
from trainsched.runtime.sync import run_sync
from trainsched.runtime.sync.config import shard_bounds
from trainsched.runtime.tasks import TeacherStudent
from trainsched.sync import parse_policy
from trainsched.sync.protocols import Asp, Bsp, KOfN

TASK = TeacherStudent(input_dim=8, teacher_hidden=16, student_hidden=16, train_samples=512,
                      test_samples=128, seed=3)
N, B, LR = 2, 8, 0.05

# --- without processes ------------------------------------------------------------------------


def test_shards_are_contiguous_and_as_even_as_the_count_allows():
    assert shard_bounds(10, 1) == ((0, 10),)
    assert shard_bounds(10, 3) == ((0, 3), (3, 6), (6, 10))
    assert shard_bounds(4, 4) == ((0, 1), (1, 2), (2, 3), (3, 4))


def test_more_servers_than_parameters_is_refused():
    with pytest.raises(TrainschedError, match="at most 3"):
        shard_bounds(3, 4)


@pytest.mark.parametrize(("kw", "words"), [
    ({"servers": 0}, "servers must be a whole number >= 1"),
    ({"servers": 2, "straggler_policy": parse_policy("bsp;straggler(relax)").straggler},
     "one parameter server for now"),
])
def test_bad_server_counts_are_one_clear_error(kw, words):
    with pytest.raises(TrainschedError, match=words.replace("(", r"\(")):
        run_sync(TASK, [(Asp(), 96)], ranks=N, batch_per_rank=B, lr=LR, **kw)


def test_under_torchrun_a_world_of_the_wrong_size_is_refused(monkeypatch):
    # 2 workers + 2 shard servers need 4 ranks; a job of 3 is told so before any group forms
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "test")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(TrainschedError) as info:
        run_sync(TASK, [(Bsp(), 96), (Asp(), 96)], ranks=N, batch_per_rank=B, lr=LR,
                 servers=2)
    assert "needs 4 ranks (2 workers + 2 servers) but torchrun started 3" in str(info.value)
    assert "--nproc-per-node 4" in str(info.value)


def test_a_restricted_replica_steps_its_shard_exactly_like_the_whole_one():
    torch = pytest.importorskip("torch")
    from trainsched.runtime.sync.state import Replica

    whole = Replica(TASK.student(), lr=0.1, momentum=0.9, weight_decay=1e-3, nesterov=False)
    part = Replica(TASK.student(), lr=0.1, momentum=0.9, weight_decay=1e-3, nesterov=False)
    numel = whole.numel
    lo, hi = numel // 3, 2 * numel // 3  # cuts through parameter tensors
    part.restrict(lo, hi)
    grad = torch.linspace(-1.0, 1.0, numel)
    for samples in range(3):
        whole.step(grad, samples=samples)
        part.step(grad, samples=samples)
    a, b = whole.state_into().clone(), part.state_into().clone()
    assert torch.equal(a[lo:hi], b[lo:hi])  # bit for bit, parameters
    assert torch.equal(a[numel + lo:numel + hi], b[numel + lo:numel + hi])  # and momentum
    # a parameter tensor wholly outside the shard was not stepped at all
    first = part.params[0].numel()
    if first <= lo:
        fresh = Replica(TASK.student(), lr=0.1, momentum=0.9, weight_decay=1e-3,
                        nesterov=False).state_into()
        assert torch.equal(b[:first], fresh[:first])


# --- on real gloo processes (2 workers + 2 shard servers) -------------------------------------

STEPS = 12
SAMPLES = STEPS * N * B


def run(phases, **kw):
    options = {"ranks": N, "batch_per_rank": B, "lr": LR, "timeout_s": 30, "deadline_s": 240,
               "return_params": True, **kw}
    return run_sync(TASK, phases, **options)


@pytest.mark.timeout(300)
def test_two_shards_reproduce_one_server_bit_for_bit_in_the_deterministic_mode():
    phases = [(Bsp(), SAMPLES // 2), (Asp(), SAMPLES // 2)]
    one = run(phases, momentum=0.9, deterministic=True)
    two = run(phases, momentum=0.9, deterministic=True, servers=2)
    assert two.params == one.params
    asp = two.phases[1]
    # every shard applied one update per gradient: the phase's samples in batches of B
    assert (asp.samples, asp.updates) == (SAMPLES // 2, SAMPLES // 2 // B)
    assert [p.samples for p in two.phases] == [SAMPLES // 2, SAMPLES // 2]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_shards_of_k_of_n_with_k_equal_n_equal_one_server():
    one = run([(KOfN(N), SAMPLES)], momentum=0.9, weight_decay=1e-3)
    two = run([(KOfN(N), SAMPLES)], momentum=0.9, weight_decay=1e-3, servers=2)
    gap = max(abs(a - b) for a, b in zip(one.params, two.params, strict=True))
    assert gap <= 1e-6
    (phase,) = two.phases
    assert (phase.updates, phase.dropped, phase.staleness) == (STEPS, 0, ((STEPS,),) * N)


@pytest.mark.timeout(120)
def test_a_dead_shard_server_fails_the_run_clearly(monkeypatch):
    monkeypatch.setenv("TRAINSCHED_SYNC_FAULT", f"{N + 1}:5")  # shard 1's server, rank 3
    start = time.monotonic()
    with pytest.raises(TrainschedError) as info:
        run_sync(TASK, [(Asp(), 4000)], ranks=N, batch_per_rank=B, lr=LR, timeout_s=15,
                 deadline_s=90, servers=2)
    text = str(info.value)
    assert "rank 3 (server) exited with status 3" in text, text
    assert "parameter server of shard 1 (rank 3)" in text, text
    assert time.monotonic() - start < 60
