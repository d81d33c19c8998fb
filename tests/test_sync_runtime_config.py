"""The sync runtime's plain-Python parts (no processes): phases as whole updates, segments
cut at checkpoints, fractions to samples, the learning-rate rule, stragglers, the built-in
task's data, results in JSON, and the checks ``run_sync`` makes before starting any rank."""

from __future__ import annotations

import json

import pytest

from trainsched.errors import TrainschedError
from trainsched.runtime.sync import (
    PhaseRecord,
    SyncRunResult,
    phase_quantum,
    policy_phases,
    run_sync,
    update_samples,
)
from trainsched.runtime.sync.config import LR_SCHEDULES, check_phases, plan_segments
from trainsched.runtime.tasks import TeacherStudent, task_from_json
from trainsched.sync import Straggler, parse_policy, parse_protocol
from trainsched.sync.protocols import Asp, Bsp, KOfN, LocalSgd, Ssp


def test_update_sizes_follow_the_effective_batch():
    # 4 ranks x batch 8: BSP and local SGD rounds apply 32 samples, k-of-3 24, ASP/SSP 8.
    assert [update_samples(p, 4, 8) for p in (Bsp(), LocalSgd(3), KOfN(3), Asp(), Ssp(2))] == [
        32, 32, 24, 8, 8]
    # 3 ranks x 8: k-of-2 updates are 16 samples, BSP's 24: boundaries on multiples of 48.
    assert phase_quantum([Bsp(), KOfN(2), Asp()], 3, 8) == 48


def test_a_phase_must_be_whole_updates_and_the_error_offers_the_neighbours():
    with pytest.raises(TrainschedError, match=r"phase 1 \(bsp\): 40 samples .* use 32 or 48"):
        check_phases([(Asp(), 40), ("bsp", 40)], 2, 8)
    assert check_phases([("ssp(s=1)", 40)], 2, 8) == ((Ssp(1), 40),)


@pytest.mark.parametrize("phases, words", [
    ([], "at least one phase"),
    ([(Bsp(), 0)], "add up to 0 samples"),
    ([(KOfN(3), 48)], "k=3 is more than the 2 ranks"),
    ([(parse_protocol("k-of-n(k=2)"), 24)], "is not a whole number of its updates of 16"),
    ([("bsp", -16)], "whole number >= 0"),
    ([("nope", 16)], "unknown sync protocol"),
    ([(Bsp(),)], "a pair (protocol, samples)"),
])
def test_bad_phases_are_refused(phases, words):
    with pytest.raises(TrainschedError) as info:
        check_phases(phases, 2, 8)
    assert words in str(info.value)


def test_segments_cut_phases_at_checkpoints():
    # BSP 0..96 (units of 16), ASP 96..256 (units of 8), checkpoint every 48 samples.
    segments = plan_segments([(Bsp(), 96), (Asp(), 160)], ranks=2, batch_per_rank=8,
                             checkpoint_every=48)
    assert [(s.phase, s.start, s.samples, s.last_of_phase, s.checkpoint) for s in segments] == [
        (0, 0, 48, False, True), (0, 48, 48, True, True), (1, 96, 48, False, True),
        (1, 144, 48, False, True), (1, 192, 48, False, True), (1, 240, 16, True, True)]


def test_a_zero_sample_phase_is_one_empty_segment_and_no_checkpoint():
    segments = plan_segments([(Bsp(), 32), (Asp(), 0), (Bsp(), 32)], ranks=2,
                             batch_per_rank=8, checkpoint_every=32)
    assert [(s.phase, s.start, s.samples, s.checkpoint) for s in segments] == [
        (0, 0, 32, True), (1, 32, 0, False), (2, 32, 32, True)]


def test_a_checkpoint_inside_an_update_is_refused():
    with pytest.raises(TrainschedError, match="inside one of its updates of 16 samples"):
        plan_segments([(Bsp(), 64)], ranks=2, batch_per_rank=8, checkpoint_every=24)


def test_a_policy_becomes_phases_with_boundaries_on_the_common_update():
    # 3 ranks x 8: BSP units of 24, ASP of 8, common unit 24; 960 samples.
    # bsp:0.125 -> 120 = 5 x 24; the rest to ASP.
    assert policy_phases(parse_policy("bsp:0.125,asp:0.875"), 960, ranks=3,
                         batch_per_rank=8) == [(Bsp(), 120), (Asp(), 840)]
    # 0.3 x 960 = 288 = 12 x 24 exactly; 0.6 x 960 -> 576; the last phase takes the rest.
    assert policy_phases(parse_policy("bsp:0.3,local(h=4):0.3,asp:0.4"), 960, ranks=3,
                         batch_per_rank=8) == [(Bsp(), 288), (LocalSgd(4), 288), (Asp(), 384)]
    with pytest.raises(TrainschedError, match="positive multiple of 24"):
        policy_phases(parse_policy("bsp"), 100, ranks=3, batch_per_rank=8)


def test_lr_schedules_key_on_the_fraction_of_samples():
    cosine = LR_SCHEDULES["cosine"]
    assert cosine(0.0) == 1.0 and cosine(1.0) == pytest.approx(0.0, abs=1e-15)
    assert cosine(0.5) == pytest.approx(0.5)
    assert LR_SCHEDULES["constant"](0.7) == 1.0


def test_the_teacher_student_task_is_seeded_and_its_stream_permutes_each_epoch():
    task = TeacherStudent(train_samples=64, test_samples=32, seed=5)
    a, b = task.data(), task.data()
    assert a.x_train.shape == (64, 16) and a.x_test.shape == (32, 16)
    assert bool((a.x_train == b.x_train).all()) and bool((a.y_test == b.y_test).all())
    other = TeacherStudent(train_samples=64, test_samples=32, seed=6).data()
    assert not bool((a.x_train == other.x_train).all())
    # Two epochs: each a permutation of the training set, different from one another.
    first, second = task.stream_indices(0, 64), task.stream_indices(64, 64)
    assert sorted(first.tolist()) == list(range(64)) == sorted(second.tolist())
    assert first.tolist() != second.tolist()
    # Any stretch reads the same indices as the whole stream does.
    assert task.stream_indices(60, 8).tolist() == first.tolist()[60:] + second.tolist()[:4]
    assert task_from_json(json.loads(json.dumps(task.to_json()))) == task


def test_the_teacher_labels_only_inputs_clear_of_its_decision_margin():
    import torch

    task = TeacherStudent(train_samples=256, test_samples=64, margin_quantile=0.5, seed=1)
    data = task.data()
    assert set(data.y_train.tolist()) <= set(range(task.classes))
    # every class appears, and the student starts near chance (4 classes)
    assert len(set(data.y_train.tolist())) == task.classes
    with torch.no_grad():
        start = task.loss(task.student()(data.x_test), data.y_test).item()
    assert 1.0 < start < 2.0


def test_results_round_trip_through_json():
    phase = PhaseRecord(index=0, protocol="asp", samples=64, updates=8, gradients=9,
                        dropped=0, drained=1, lr=0.025, staleness=((3, 1), (2, 2)),
                        max_clock_lead=3, wall_s=0.5, batches=4)
    assert phase.step_s == 0.125 and phase.max_staleness(0) == 1 and phase.max_staleness(1) == 1
    result = SyncRunResult(task="t", ranks=2, batch_per_rank=8, phases=(phase,), switches=(),
                           checkpoints=(64,), curve=(), final_loss=0.1, final_accuracy=0.9,
                           total_samples=64, wall_s=1.0, resumed_from=None, params=(1.0, 2.0))
    assert SyncRunResult.from_json(json.loads(json.dumps(result.to_json()))) == result


@pytest.mark.parametrize("kwargs, words", [
    ({"push_order": [0, 1]}, "pass deterministic=True"),
    ({"deterministic": True, "push_order": [0, 0]}, "name every worker 0..1"),
    ({"stragglers": [Straggler(rank=2, delay_s=0.1)]}, "straggler rank 2 is not a worker"),
    ({"checkpoint_every_samples": 16}, "go together"),
    ({"momentum": 1.0}, "momentum must be below 1"),
    ({"nesterov": True}, "nesterov needs momentum"),
    ({"lr": 0.0}, "lr must be a finite number > 0"),
    ({"lr_schedule": "linear"}, "unknown learning-rate schedule 'linear'"),
    ({"eval_every_samples": 0}, "eval_every_samples must be"),
])
def test_run_sync_refuses_bad_settings_before_starting_ranks(kwargs, words):
    options = {"ranks": 2, "batch_per_rank": 8, "lr": 0.1, **kwargs}
    with pytest.raises(TrainschedError) as info:
        run_sync(TeacherStudent(), [(Bsp(), 32)], **options)
    assert words in str(info.value)


def test_resuming_needs_an_existing_checkpoint(tmp_path):
    with pytest.raises(TrainschedError, match=r"latest\.json is missing"):
        run_sync(TeacherStudent(), [(Bsp(), 32)], ranks=2, batch_per_rank=8, lr=0.1,
                 resume_from=tmp_path)
    (tmp_path / "x.json").write_text("{}")
    with pytest.raises(TrainschedError, match="does not exist"):
        run_sync(TeacherStudent(), [(Bsp(), 32)], ranks=2, batch_per_rank=8, lr=0.1,
                 resume_from=tmp_path / "x.json")
    (tmp_path / "x.pt").write_text("")
    with pytest.raises(TrainschedError, match="not a sync-run checkpoint"):
        run_sync(TeacherStudent(), [(Bsp(), 32)], ranks=2, batch_per_rank=8, lr=0.1,
                 resume_from=tmp_path / "x.json")
