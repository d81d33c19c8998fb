"""Bad input to the schedule generators and hand-written schedules: one clear error each."""

from __future__ import annotations

import pytest

from trainsched.backprop.fast_forward import fast_forward, modulo
from trainsched.backprop.interleaved import interleaved_1f1b, interleaved_zero_bubble
from trainsched.backprop.schedules import build_schedule, gpipe, schedule_stage_count
from trainsched.backprop.stages import uniform_stages
from trainsched.backprop.zero_bubble import zero_bubble_greedy
from trainsched.errors import TrainschedError
from trainsched.plan import Schedule
from trainsched.sim import simulate_pipeline


def test_text_for_fewer_microbatches_names_the_count_it_was_written_for():
    text = gpipe(2, 2).to_text()
    with pytest.raises(TrainschedError, match=r"the actions are for 2 micro-batches \(0\.\.1\) "
                       r"but the schedule is declared for 4 \(num_microbatches=4\): regenerate "
                       r"it for 4 micro-batches or declare num_microbatches=2"):
        Schedule.from_text(text, num_microbatches=4).validate()


def test_text_for_more_stages_than_declared_names_both_counts():
    with pytest.raises(TrainschedError, match=r"the actions are for 3 stages \(0\.\.2\) but the "
                       r"schedule is declared for 2 \(num_stages=2\)"):
        Schedule.from_text(gpipe(3, 2).to_text(), num_stages=2).validate()


def test_stage_costs_for_another_stage_count_are_refused():
    with pytest.raises(TrainschedError, match="the stage costs have 2 stages but the schedule "
                                              "has 4"):
        simulate_pipeline(uniform_stages(2, 1, 1, 1), build_schedule("zbv", 2, 4))


def test_deadlock_names_the_blocked_action_of_each_rank():
    # Rank 1 runs micro-batch 1's forward first; rank 0 reaches 0F1 only after 0I0, which needs
    # rank 1's 1I0, which comes after 1F1.
    text = "0F0 0I0 0W0 0F1 0I1 0W1\n1F1 1F0 1I0 1W0 1I1 1W1\n"
    with pytest.raises(TrainschedError) as info:
        Schedule.from_text(text).validate()
    message = str(info.value)
    assert "schedule deadlocks" in message
    assert "rank 0: 0I0 (position 1) waits for 1I0 on rank 1 (position 2, not reached)" in message
    assert "rank 1: 1F1 (position 0) waits for 0F1 on rank 0 (position 3, not reached)" in message


def test_memory_cap_below_one_microbatch_says_the_smallest_cap_that_works():
    stages = uniform_stages(3, 1, 1, 1, saved_bytes=100)
    with pytest.raises(TrainschedError, match="memory limit 60 bytes on rank 0 is below the 100 "
                       "bytes one micro-batch of stage 0 saves: no schedule fits; the smallest "
                       "limit any schedule meets is 100 bytes"):
        zero_bubble_greedy(stages, 4, memory_limit_bytes=60)


def test_the_smallest_cap_named_works():
    stages = uniform_stages(3, 1, 1, 1, saved_bytes=100)
    result = zero_bubble_greedy(stages, 4, memory_limit_bytes=100)
    # One micro-batch at a time on each rank: F, I, W in turn.
    assert result.schedule.to_text().splitlines()[0] == " ".join(
        f"0{k}{m}" for m in range(4) for k in "FIW")


def test_interleaved_microbatches_must_fill_whole_rounds():
    with pytest.raises(TrainschedError, match="runs 9 micro-batches in 2 rounds, which must "
                                              "divide them evenly; use 8 or 10"):
        interleaved_1f1b(4, 9)
    with pytest.raises(TrainschedError, match="use 8 or 10"):
        interleaved_zero_bubble(4, 9)


@pytest.mark.parametrize("ring", [(0, 0, 1), (0, 1), (0, 1, 3), "012"])
def test_ring_must_order_every_rank_once(ring):
    with pytest.raises(TrainschedError, match="ring"):
        modulo(3, 4, ring=ring)


@pytest.mark.parametrize(("call", "message"), [
    (lambda: fast_forward(2, 4, group=0), "group must be an integer >= 1, got 0"),
    (lambda: modulo(2, 4, chunks=0), "chunks must be an integer >= 1, got 0"),
    (lambda: build_schedule("zbv", 2, 4, chunks=3), "pipeline schedule 'zbv' takes no option "
                                                    "'chunks'; its options: none"),
    (lambda: schedule_stage_count("zb-h1", 2, chunks=2),
     r"'zb-h1' runs 1 stage\(s\) per rank; it takes no chunks"),
    (lambda: build_schedule("zb-greedy", 2, 4, stages=uniform_stages(3, 1, 1, 1)),
     "puts one stage on each rank: give StageCosts of 2 stages"),
    (lambda: zero_bubble_greedy(uniform_stages(3, 1, 1, 1), 4, p2p_s=[0.1]),
     r"p2p_s must be seconds >= 0, one number or one per stage boundary \(2\)"),
])
def test_bad_options(call, message):
    with pytest.raises(TrainschedError, match=message):
        call()
