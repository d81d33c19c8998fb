"""The sync runtime on real gloo processes (workers + one parameter-server rank): exact
equivalences with BSP, staleness and the SSP bound under a slowed rank, switch invariants,
bit-identical resume from a mid-phase checkpoint, and dead ranks failing clearly.

The reference for every equivalence is computed here, independently of the runtime: one
process taking full-batch SGD steps over the same stream samples (BSP step ``t`` of ``N``
workers with batch ``b`` reads stream samples ``t·N·b .. (t+1)·N·b``).
"""

from __future__ import annotations

import json
import time

import pytest
import torch

from sync_reference import full_batch_params
from trainsched.errors import TrainschedError
from trainsched.runtime.sync import run_sync
from trainsched.runtime.tasks import TeacherStudent
from trainsched.sync import Straggler
from trainsched.sync.protocols import Asp, Bsp, KOfN, LocalSgd, Ssp

TASK = TeacherStudent(input_dim=8, teacher_hidden=16, student_hidden=16, train_samples=512,
                      test_samples=128, seed=3)
N, B, STEPS, LR = 3, 8, 20, 0.05
SAMPLES = STEPS * N * B  # 480: 20 BSP steps


def reference(*, steps: int = STEPS, lr: float = LR, momentum: float = 0.0,
              weight_decay: float = 0.0, nesterov: bool = False) -> torch.Tensor:
    """Full-batch SGD on N·B stream samples per step, in this process."""
    model = TASK.student()
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum,
                          weight_decay=weight_decay, nesterov=nesterov)
    return full_batch_params(TASK, model, opt, steps=steps, batch=N * B)


def run(phases, **kw):
    options = {"ranks": N, "batch_per_rank": B, "lr": LR, "timeout_s": 30, "deadline_s": 240,
               "return_params": True, **kw}
    return run_sync(TASK, phases, **options)


def params(result) -> torch.Tensor:
    return torch.tensor(result.params, dtype=torch.float32)


def gap(result, expected: torch.Tensor) -> float:
    return float((params(result) - expected).abs().max())


@pytest.fixture(scope="module")
def momentum_reference() -> torch.Tensor:
    return reference(momentum=0.9, weight_decay=1e-3)


@pytest.fixture(scope="module")
def bsp_run():
    return run([(Bsp(), SAMPLES)], momentum=0.9, weight_decay=1e-3)


# --- equivalences (20 steps, tolerance 1e-6) -------------------------------------------------


@pytest.mark.timeout(300)
def test_bsp_equals_full_batch_sgd_with_momentum_and_weight_decay(bsp_run, momentum_reference):
    assert params(bsp_run).shape == momentum_reference.shape
    assert gap(bsp_run, momentum_reference) <= 1e-6
    (phase,) = bsp_run.phases
    assert (phase.updates, phase.gradients, phase.samples) == (STEPS, STEPS * N, SAMPLES)


@pytest.mark.timeout(300)
def test_k_of_n_with_k_equal_n_on_the_server_equals_bsp(momentum_reference):
    result = run([(KOfN(N), SAMPLES)], momentum=0.9, weight_decay=1e-3)
    assert gap(result, momentum_reference) <= 1e-6
    (phase,) = result.phases
    assert (phase.updates, phase.gradients, phase.dropped, phase.drained) == (STEPS, 60, 0, 0)
    # every gradient was computed on the version it was applied to
    assert phase.staleness == ((STEPS,),) * N


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_ssp_zero_with_the_lr_rule_equals_bsp_without_momentum():
    # One SSP update per gradient at lr/N (effective batch b of N·b): N updates from one
    # version add up to BSP's one averaged step.
    result = run([(Ssp(0), SAMPLES)])
    assert gap(result, reference()) <= 1e-6
    (phase,) = result.phases
    assert phase.lr == pytest.approx(LR / N)
    assert (phase.updates, phase.max_clock_lead) == (STEPS * N, 0)


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_local_sgd_with_period_one_equals_bsp_with_nesterov_and_weight_decay():
    result = run([(LocalSgd(1), SAMPLES)], momentum=0.9, weight_decay=1e-3, nesterov=True)
    assert gap(result, reference(momentum=0.9, weight_decay=1e-3, nesterov=True)) <= 1e-6


@pytest.mark.timeout(300)
def test_bsp_then_zero_asp_samples_then_bsp_equals_bsp(bsp_run, momentum_reference):
    half = SAMPLES // 2
    result = run([(Bsp(), half), (Asp(), 0), (Bsp(), half)], momentum=0.9, weight_decay=1e-3)
    # The state went to the server and back untouched: the very same bits as plain BSP.
    assert result.params == bsp_run.params
    assert gap(result, momentum_reference) <= 1e-6
    assert [(s.from_protocol, s.to_protocol, s.samples) for s in result.switches] == [
        ("bsp", "asp", half), ("asp", "bsp", half)]
    # the learning rate is derived from each phase's protocol, never compounded
    assert [p.lr for p in result.phases] == [LR, pytest.approx(LR / N), LR]
    assert [p.samples for p in result.phases] == [half, 0, half]


# --- staleness and the SSP bound under a slowed rank -----------------------------------------


@pytest.mark.timeout(300)
def test_a_slowed_rank_is_stale_under_asp_not_under_bsp_and_ssp_bounds_the_lead():
    slow = Straggler(rank=1, delay_s=0.05)
    # 320 ASP updates take the fast rank well over one 50 ms sleep, so the slow rank's
    # gradients land inside the phase.
    result = run_sync(TASK, [(Asp(), 2560), (KOfN(2), 160), (Ssp(1), 160)], ranks=2,
                      batch_per_rank=B, lr=LR, stragglers=[slow], timeout_s=30,
                      deadline_s=240)
    asp, bsp, ssp = result.phases
    assert sum(asp.staleness[1]) > 0 and asp.max_staleness(1) > 0
    assert asp.max_clock_lead > 1  # unbounded: the fast rank runs far ahead
    assert bsp.staleness == ((10,), (10,))  # k = N: every gradient on the current version
    assert ssp.max_clock_lead <= 1
    assert ssp.updates == 20 and asp.updates == 320


# --- switching -------------------------------------------------------------------------------


@pytest.mark.timeout(300)
def test_switches_conserve_samples_and_set_the_lr_of_each_protocol_once():
    phases = [(Bsp(), 160), (Asp(), 96), (LocalSgd(2), 64), (KOfN(1), 48), (Bsp(), 32)]
    # BatchNorm: its statistics are reconciled at every switch (float averaged, count from
    # worker 0), and the digest check after each BSP phase covers parameters and momentum.
    task = TeacherStudent(input_dim=8, teacher_hidden=16, student_hidden=16, train_samples=512,
                          test_samples=128, seed=3, batch_norm=True)
    result = run_sync(task, phases, ranks=2, batch_per_rank=B, lr=0.1, momentum=0.9,
                      timeout_s=30, deadline_s=240)
    bsp, asp, local, one_of_two, last = result.phases
    # Samples are the clock: N·b per BSP or local round, b per ASP update, k·b per k-of-N.
    assert bsp.updates * 2 * B + asp.updates * B + local.updates * 2 * B \
        + one_of_two.updates * B + last.updates * 2 * B == 400 == result.total_samples
    assert (bsp.updates, asp.updates, local.updates, one_of_two.updates, last.updates) == (
        10, 12, 4, 6, 2)
    assert [p.lr for p in result.phases] == [0.1, 0.05, 0.1, 0.05, 0.1]
    assert [s.samples for s in result.switches] == [160, 256, 320, 368]
    assert all(s.cost_s > 0 for s in result.switches)
    # k-of-N with k = 1 of 2: the second gradient on a version is dropped or drained.
    assert one_of_two.gradients == one_of_two.updates + one_of_two.dropped + one_of_two.drained


@pytest.mark.timeout(120)
def test_a_push_order_the_staleness_bound_cannot_follow_fails_instead_of_hanging():
    with pytest.raises(TrainschedError) as info:
        run_sync(TASK, [(Ssp(0), 96)], ranks=2, batch_per_rank=B, lr=LR, deterministic=True,
                 push_order=[0, 0, 1], timeout_s=20, deadline_s=90)
    assert "rank 2 (server): the scripted push order [0, 0, 1] needs worker 0 next" in str(
        info.value)


# --- checkpoints and faults ------------------------------------------------------------------

RESUME_PHASES = [(Bsp(), 96), (Asp(), 160), (LocalSgd(2), 96)]


def resume_run(tmp, **kw):
    return run_sync(TASK, RESUME_PHASES, ranks=2, batch_per_rank=B, lr=LR, momentum=0.9,
                    deterministic=True, checkpoint_every_samples=48, checkpoint_dir=tmp,
                    return_params=True, timeout_s=20, deadline_s=240, **kw)


@pytest.mark.timeout(400)
def test_a_run_killed_mid_phase_resumes_bit_identically(tmp_path, monkeypatch):
    whole = resume_run(tmp_path / "whole")
    assert whole.checkpoints == (48, 96, 144, 192, 240, 288, 336, 352)
    monkeypatch.setenv("TRAINSCHED_SYNC_FAULT", "1:16")  # worker 1 dies in the ASP phase
    with pytest.raises(TrainschedError) as info:
        resume_run(tmp_path / "cut")
    assert "rank 1 exited with status 3" in str(info.value)
    latest = json.loads((tmp_path / "cut" / "latest.json").read_text())["checkpoint"]
    samples = json.loads((tmp_path / "cut" / latest).read_text())["samples"]
    assert 96 < samples < 256  # inside the ASP phase
    monkeypatch.delenv("TRAINSCHED_SYNC_FAULT")
    resumed = resume_run(tmp_path / "cut", resume_from=tmp_path / "cut")
    assert resumed.resumed_from == samples
    assert resumed.params == whole.params
    assert [p.updates for p in resumed.phases] == [p.updates for p in whole.phases]
    assert [p.lr for p in resumed.phases] == [LR, LR / 2, LR]  # not LR / 4 after the restart
    with pytest.raises(TrainschedError, match="another model"):
        run_sync(TeacherStudent(input_dim=8, teacher_hidden=16, student_hidden=32,
                                train_samples=512, test_samples=128, seed=3), RESUME_PHASES,
                 ranks=2, batch_per_rank=B, lr=LR, momentum=0.9, deterministic=True,
                 checkpoint_every_samples=48, checkpoint_dir=tmp_path / "cut",
                 resume_from=tmp_path / "cut")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("victim, words", [
    (1, "worker 1 died mid-run"),
    pytest.param(2, "parameter server (rank 2)", marks=pytest.mark.slow)])
def test_a_dead_worker_or_server_fails_the_run_clearly(monkeypatch, victim, words):
    monkeypatch.setenv("TRAINSCHED_SYNC_FAULT", f"{victim}:5")
    start = time.monotonic()
    with pytest.raises(TrainschedError) as info:
        run_sync(TASK, [(Asp(), 4000)], ranks=2, batch_per_rank=B, lr=LR, timeout_s=15,
                 deadline_s=90)
    text = str(info.value)
    assert f"rank {victim}" in text and "exited with status 3" in text, text
    assert words in text, text
    assert time.monotonic() - start < 60


# --- convergence on the built-in teacher-student task ----------------------------------------

CONVERGE = {"ranks": 2, "batch_per_rank": 16, "lr": 0.05, "momentum": 0.9,
            "lr_schedule": "cosine", "timeout_s": 30, "deadline_s": 300}


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.parametrize("protocol", [Bsp(), Asp(), Ssp(2), KOfN(1), LocalSgd(4)],
                         ids=lambda p: p.name)
def test_every_protocol_cuts_the_held_out_loss_tenfold(protocol):
    result = run_sync(TeacherStudent(), [(protocol, 16384)], **CONVERGE)
    first = result.curve[0]
    assert first.samples == 0 and result.curve[-1].samples == 16384
    assert result.final_loss <= first.loss / 10, (first.loss, result.final_loss)
    assert result.final_accuracy > 0.9


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_bsp_then_asp_with_the_lr_rule_ends_within_ten_percent_of_bsp():
    bsp = run_sync(TeacherStudent(), [(Bsp(), 20480)], **CONVERGE)
    hybrid = run_sync(TeacherStudent(), [(Bsp(), 5120), (Asp(), 15360)], **CONVERGE)
    assert hybrid.final_loss <= 1.1 * bsp.final_loss, (hybrid.final_loss, bsp.final_loss)
