"""The Zero Bubble greedy under a memory cap when a waiting W keeps more than I frees.

Stages that give ``weight_input_bytes`` (each weight op's input and output gradient) free all
of an F's saved activations at I and hold the kept bytes until W, as the pipeline simulator
counts them; the greedy must stay under its cap by that count."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainsched.backprop.stages import StageCosts
from trainsched.backprop.zero_bubble import zero_bubble_greedy
from trainsched.cluster import Link, cluster_from_flags
from trainsched.errors import TrainschedError
from trainsched.plan import Schedule
from trainsched.sim import simulate_pipeline
from trainsched.sim.pipeline_choice import choose_from_costs


def stages_of(times: list[tuple[float, float, float]], saved: list[int],
              kept: list[int]) -> StageCosts:
    p = len(saved)
    return StageCosts(forward_s=tuple(t[0] for t in times),
                      backward_input_s=tuple(t[1] for t in times),
                      backward_weight_s=tuple(t[2] for t in times),
                      activation_bytes=(0,) * p, saved_bytes=tuple(saved),
                      param_bytes=(0,) * p, grad_bytes=(0,) * p,
                      optimizer_state_bytes=(0,) * p, weight_input_bytes=tuple(kept))


def peaks_by_count(schedule: Schedule, saved: list[int], kept: list[int]) -> list[int]:
    """F holds saved until I; from I, kept until W (counted from I itself: an upper bound)."""
    peaks = []
    for r in range(schedule.num_ranks):
        held = peak = 0
        for a in schedule.compute_actions(r):
            held += {"F": saved[a.stage], "I": kept[a.stage] - saved[a.stage],
                     "W": -kept[a.stage]}[a.kind]
            peak = max(peak, held)
        peaks.append(peak)
    return peaks


@settings(max_examples=80, deadline=None)
@given(p=st.integers(1, 4), m=st.integers(1, 8), data=st.data())
def test_the_cap_holds_when_w_keeps_more_than_i_frees(p, m, data):
    time = st.sampled_from([0.5, 1.0, 2.0])
    times = [data.draw(st.tuples(time, time, time)) for _ in range(p)]
    saved = data.draw(st.lists(st.integers(1, 6), min_size=p, max_size=p))
    kept = data.draw(st.lists(st.integers(0, 9), min_size=p, max_size=p))
    need = max(max(s, k) for s, k in zip(saved, kept, strict=True))
    cap = data.draw(st.integers(need, 3 * need))
    stages = stages_of(times, saved, kept)
    schedule = zero_bubble_greedy(stages, m, memory_limit_bytes=cap).schedule
    schedule.validate()
    assert max(peaks_by_count(schedule, saved, kept)) <= cap
    # The simulator's own account of the same schedule agrees.
    assert max(simulate_pipeline(stages, schedule).peak_memory_bytes.values()) <= cap


def test_a_cap_between_one_and_two_waiting_ws_by_hand():
    # 2 stages, unit times, F saves 48, a waiting W keeps 64, cap 112. Rank 0: F0, F1 (96;
    # F1 fits since 48 + 64 <= 112); I0 at 3 once rank 1's I0 is back (96 - 48 + 64 = 112);
    # F2 would need 112 + 64: W0 is forced (48), then F2 (96), and so on. Rank 1: F0, I0 (64);
    # F1 would need 64 + 64 > 112, so W0 first. One step: 14 units (13 without a cap).
    stages = stages_of([(1.0, 1.0, 1.0)] * 2, [48, 48], [64, 64])
    capped = zero_bubble_greedy(stages, 4, memory_limit_bytes=112)
    assert capped.schedule.to_text().splitlines() == [
        "0F0 0F1 0I0 0W0 0F2 0I1 0W1 0F3 0I2 0W2 0I3 0W3",
        "1F0 1I0 1W0 1F1 1I1 1W1 1F2 1I2 1W2 1F3 1I3 1W3"]
    assert capped.step_time_s == 14
    assert zero_bubble_greedy(stages, 4).step_time_s == 13


def test_a_cap_below_what_a_waiting_w_keeps_names_the_smallest_that_works():
    stages = stages_of([(1.0, 1.0, 1.0)] * 2, [48, 48], [64, 40])
    with pytest.raises(TrainschedError, match="memory limit 63 bytes on rank 0 is below the 64 "
                       "bytes a waiting W of stage 0 keeps per micro-batch: no schedule fits; "
                       "the smallest limit any schedule meets is 64 bytes"):
        zero_bubble_greedy(stages, 4, memory_limit_bytes=63)


def test_auto_under_1f1b_peak_picks_1f1b_when_w_keeps_more():
    # 2 ranks, 4 micro-batches, F = I = W = 1 per stage; F saves 48 and a waiting W keeps 64.
    # 1F1B holds 2 micro-batches on rank 0 (96) and takes (m + p - 1) * 3 = 15; under 96 the
    # greedy cannot keep an F beside a waiting W (48 + 64) and is slower.
    cluster = replace(cluster_from_flags(devices=2, memory="1TiB", bandwidth="1GB/s",
                                         latency="0s"),
                      intra_node=Link(bandwidth_bytes_per_s=1e30, latency_s=0.0))

    def costs(p: int, m: int, cut: object) -> StageCosts:
        return stages_of([(2.0 / p,) * 3] * p, [96 // p] * p, [128 // p] * p)

    choice = choose_from_costs(costs, cluster, 2, [4], memory_limit_bytes=96)
    assert (choice.schedule_name, choice.result.step_time_s) == ("1f1b", 15.0)
    greedy = next(c for c in choice.candidates if c.schedule == "zb-greedy")
    assert greedy.fits and greedy.step_time_s > 15.0
