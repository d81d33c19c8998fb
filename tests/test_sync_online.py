"""The online straggler policy in the sync runtime, on real gloo processes (3 workers + the
parameter-server rank): a straggler appearing mid-run is relaxed to ASP within 10 steps and BSP
comes back once it is over, or (``exclude``) BSP goes on among the fast workers and the slow one
rejoins after; a noisy but fair run never switches; what the runtime refuses.

The workers' forward sleeps 20 ms (``tests/sync_models.py``), so a batch's local time is set by
known delays, not by how loaded the machine is: a 3x straggler is then 60 ms against 20 ms, and
the fair noise is ±10 % of 20 ms, below the detector's 1.3 threshold by construction
(1.1 / 0.9 < 1.22).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from trainsched.errors import TrainschedError
from trainsched.runtime.sync import run_sync
from trainsched.runtime.tasks import TeacherStudent
from trainsched.sync import Straggler, StragglerPolicy, parse_policy

TASK = TeacherStudent(input_dim=8, teacher_hidden=16, student_hidden=16, train_samples=512,
                      test_samples=128, seed=3)
N, B = 3, 8
STEP = N * B  # samples per BSP step
RELAX = parse_policy("bsp;straggler(relax)").straggler
EXCLUDE = parse_policy("bsp;straggler(exclude)").straggler


@pytest.fixture
def sleepy_models(monkeypatch):
    """Make ``sync_models`` importable in the worker processes."""
    here = str(Path(__file__).parent)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (here,
                                                                 os.environ.get("PYTHONPATH"))
                                                     if p))


def run(steps: int, model: str, **kw):
    options = {"straggler_policy": RELAX, **kw}
    return run_sync(TASK, [("bsp", steps * STEP)], ranks=N, batch_per_rank=B, lr=0.05,
                    model=model, observe_every_steps=2, timeout_s=30, deadline_s=240,
                    **options)


@pytest.mark.timeout(300)
def test_a_straggler_from_step_20_is_relaxed_within_10_steps_and_bsp_resumes_after_it(
        sleepy_models):
    start, end = 20, 45
    result = run(80, "sync_models:steady",
                 stragglers=[Straggler(rank=1, factor=3.0, from_step=start, to_step=end)])
    assert [(e.kind, e.rank) for e in result.detector_events] == [("slow", 1), ("recovered", 1)]
    slow = result.detector_events[0]
    assert start < slow.step <= start + 10, slow
    ours = [s for s in result.switches if s.reason == "straggler"]
    assert [(s.from_protocol, s.to_protocol, s.ranks) for s in ours] == [
        ("bsp", "asp", (1,)), ("asp", "bsp", (1,))]
    out, back = ours
    # the decider may decline at the first slow observation (the saving is weighed against
    # two switches); either way the switch comes within 10 steps of the straggler
    assert slow.step <= out.step <= start + 10 and out.at_s < back.at_s
    (episode,) = result.episodes
    assert episode.end == "recovered" and episode.ranks == (1,)
    # BSP came back only after the window: in the episode worker 1 got through the rest of its
    # slow steps (its batches from step `out.step` on; one more may be drained at the end)
    assert sum(episode.staleness[1]) + episode.drained >= end - out.step
    # samples are the clock: the relaxed ones are not BSP's, and the run's total is kept
    (phase,) = result.phases
    assert phase.samples > 0 and phase.samples + episode.samples == result.total_samples
    assert result.total_samples == 80 * STEP and episode.samples % STEP == 0
    assert episode.samples == episode.updates * B


@pytest.mark.timeout(300)
def test_an_excluded_straggler_idles_for_its_window_and_rejoins_after_it(sleepy_models):
    start, end = 20, 45
    result = run(110, "sync_models:steady", straggler_policy=EXCLUDE,
                 stragglers=[Straggler(rank=1, factor=3.0, from_step=start, to_step=end)])
    assert [(e.kind, e.rank) for e in result.detector_events] == [("slow", 1), ("recovered", 1)]
    slow, recovered = result.detector_events
    assert start < slow.step <= start + 10, slow
    ours = [s for s in result.switches if s.reason == "straggler"]
    assert [(s.from_protocol, s.to_protocol, s.ranks) for s in ours] == [
        ("bsp", "bsp(fast)", (1,)), ("bsp(fast)", "bsp", (1,))]
    out, back = ours
    assert slow.step <= out.step <= start + 10
    (episode,) = result.episodes
    assert episode.end == "recovered" and episode.ranks == (1,)
    # worker 1 probes one batch per observation (every 2 steps of the others): it got through
    # the rest of its slow window before it was seen recovered
    assert episode.updates >= 2 * (end - out.step)
    assert recovered.samples <= back.samples
    # BSP among the 2 fast workers: 2 gradients of B samples per update, and the episode ends
    # on a whole number of 3-worker BSP steps
    assert episode.gradients == 2 * episode.updates and episode.samples == 2 * B * episode.updates
    assert episode.samples % STEP == 0 and episode.staleness[1] == ()
    # samples are the clock: the episode's are outside the BSP quota, the run's total is kept
    (phase,) = result.phases
    assert phase.samples + episode.samples == result.total_samples == 110 * STEP
    # the run ends after the rejoin's and the last BSP step's digest checks, which raise when
    # the replicas differ: the slow worker took the fast workers' state bit for bit


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_a_noisy_but_fair_run_never_switches(sleepy_models):
    result = run(150, "sync_models:noisy")
    assert result.observations == 74  # every 2 steps, not after the last one
    assert result.detector_events == () and result.episodes == ()
    assert result.switches == () and result.total_samples == 150 * STEP


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_an_episode_in_the_bsp_phase_shortens_the_last_phase_not_the_bsp_quota(sleepy_models):
    policy = parse_policy("bsp:0.5,asp:0.5;straggler(relax)")
    result = run_sync(TASK, [("bsp", 40 * STEP), ("asp", 40 * STEP)], ranks=N,
                      batch_per_rank=B, lr=0.05, model="sync_models:steady",
                      straggler_policy=policy.straggler, timeout_s=30, deadline_s=240,
                      stragglers=[Straggler(rank=1, factor=3.0, from_step=10, to_step=25)])
    (episode,) = result.episodes
    assert episode.end == "recovered" and 0 < episode.samples < 40 * STEP
    bsp, asp = result.phases
    assert bsp.samples == 40 * STEP  # the BSP quota is trained in full, under BSP
    assert asp.samples == 40 * STEP - episode.samples  # the relaxed samples came off the end
    assert result.total_samples == 80 * STEP
    planned = [s for s in result.switches if s.reason == "plan"]
    assert [(s.from_protocol, s.to_protocol, s.samples) for s in planned] == [
        ("bsp", "asp", 40 * STEP + episode.samples)]


@pytest.mark.parametrize(("kw", "words"), [
    ({"straggler_policy": RELAX, "deterministic": True}, "cannot be deterministic"),
    ({"straggler_policy": RELAX, "checkpoint_every_samples": 48, "checkpoint_dir": "x"},
     "checkpoints do not combine"),
    ({"straggler_policy": RELAX, "observe_every_steps": 0}, "observe_every_steps"),
    ({"straggler_policy": "relax"}, "must be a StragglerPolicy"),
])
def test_what_the_online_policy_refuses_is_one_clear_error(kw, words):
    with pytest.raises(TrainschedError) as info:
        run_sync(TASK, [("bsp", 96)], ranks=2, batch_per_rank=B, lr=0.05, **kw)
    assert words in str(info.value)


def test_exclude_on_more_than_six_workers_is_refused():
    with pytest.raises(TrainschedError, match="at most 6 workers"):
        run_sync(TASK, [("bsp", 7 * 8 * 4)], ranks=7, batch_per_rank=B, lr=0.05,
                 straggler_policy=StragglerPolicy(action="exclude"))


def test_one_worker_has_no_one_to_be_compared_with():
    with pytest.raises(TrainschedError, match="at least 2"):
        run_sync(TASK, [("bsp", 96)], ranks=1, batch_per_rank=B, lr=0.05,
                 straggler_policy=RELAX)
