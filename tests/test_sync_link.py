"""A delayed link on real gloo ranks: every message the delayed worker sends while training is
held, counted and timed, and nothing else is (the run's message accounting,
``SyncRunResult.links``). Expected counts worked out by hand from the phases."""

from __future__ import annotations

import pytest

from trainsched.runtime.sync import run_sync
from trainsched.runtime.tasks import TeacherStudent
from trainsched.sync import Straggler
from trainsched.sync.protocols import Asp, Bsp, LocalSgd

TASK = TeacherStudent(input_dim=8, teacher_hidden=16, student_hidden=16, train_samples=512,
                      test_samples=128, seed=3)
N, B, DELAY_S = 2, 8, 0.02


@pytest.fixture(scope="module")
def delayed():
    # BSP: 64 samples = 4 steps (4 all-reduce rounds); local SGD(h=2): 64 samples = 4 rounds,
    # 2 averages; ASP: 48 samples = 6 updates (one pull each, then one push per batch).
    phases = [(Bsp(), 64), (LocalSgd(2), 64), (Asp(), 48)]
    return run_sync(TASK, phases, ranks=N, batch_per_rank=B, lr=0.05, timeout_s=30,
                    deadline_s=240, stragglers=[Straggler(rank=1, delay_s=DELAY_S, link=True)])


@pytest.mark.timeout(300)
def test_every_all_reduce_round_and_average_is_one_message_per_worker(delayed):
    assert [[delayed.link(r, phase).messages for r in range(N)] for phase in (0, 1)] == \
        [[4, 4], [2, 2]]


@pytest.mark.timeout(300)
def test_server_messages_are_one_pull_per_worker_and_one_per_push(delayed):
    asp = delayed.phases[2]
    sent = [delayed.link(r, 2).messages for r in range(N)]
    assert sum(sent) == N + asp.gradients  # gradients: every push the server received
    assert asp.updates == 6


@pytest.mark.timeout(300)
def test_the_delayed_worker_has_every_message_held_and_the_other_none(delayed):
    for phase in range(3):
        slow, fast = delayed.link(1, phase), delayed.link(0, phase)
        assert slow.delayed == slow.messages > 0
        assert fast.delayed == 0 and fast.delay_s == 0.0


@pytest.mark.timeout(300)
def test_the_held_time_is_the_delay_per_message_and_part_of_the_communication_time(delayed):
    for phase in range(3):
        slow = delayed.link(1, phase)
        # a sleep lasts at least what it was asked for; the send's time includes the hold
        assert slow.delay_s >= slow.delayed * DELAY_S
        assert slow.comm_s >= slow.delay_s
