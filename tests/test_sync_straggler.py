"""The straggler controller on scripted local times (spec sync §5): the detector's thresholds,
persistence and hysteresis; the decider's break-even; the fault-injection text."""

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trainsched.errors import TrainschedError
from trainsched.sync.faults import (
    Straggler,
    format_straggler,
    link_delay_s,
    parse_straggler,
    parse_stragglers,
    slowed_s,
)
from trainsched.sync.straggler import StragglerPolicy, detect, initial_state
from trainsched.sync.switching import StragglerController, decide


def _run_detector(times, ranks, policy=None):
    state, events = initial_state(ranks, policy), []
    for row in times:
        state, new = detect(state, row, policy)
        events += new
    return state, events


def test_one_slowdown_window_raises_exactly_one_slow_and_one_recovered_event():
    # Rank 1 takes 3 s instead of 1 s in observations 100..199. EWMA (weight 1/2) of rank 1:
    # 2, 2.5, 2.75 from observation 100 on, all >= 1.3 -> slow at the third, 102. After the
    # window: 2, 1.5, 1.25, 1.125 (> 1.1), 1.0625 at 204 (<= 1.1), then 205, 206 -> cleared
    # at 206.
    times = [[1.0, 3.0 if 100 <= k < 200 else 1.0, 1.0, 1.0] for k in range(400)]
    state, events = _run_detector(times, 4)
    assert [(e.kind, e.rank, e.observation) for e in events] == [
        ("slow", 1, 102), ("recovered", 1, 206)]
    assert state.slow_ranks == ()


def test_ten_percent_noise_over_ten_thousand_observations_raises_nothing():
    rng = random.Random(7)
    times = [[rng.uniform(0.9, 1.1) for _ in range(4)] for _ in range(10_000)]
    _, events = _run_detector(times, 4)
    assert events == []


def test_two_ranks_suffice_the_slow_one_is_found():
    times = [[1.0, 2.0]] * 5
    _, events = _run_detector(times, 2)
    assert [(e.kind, e.rank, e.observation) for e in events] == [("slow", 1, 2)]


def test_an_isolated_spike_shorter_than_the_persistence_is_not_an_episode():
    # One observation at 5 s: EWMA 3, then 2, 1.5, 1.25 -> ratios 3, 2, 1.5 are three in a row
    # >= 1.3, so the policy with the raw time (ewma = 1) is what keeps a single spike out.
    times = [[1.0, 1.0]] * 5 + [[1.0, 5.0]] + [[1.0, 1.0]] * 5
    _, events = _run_detector(times, 2, StragglerPolicy(ewma=1.0))
    assert events == []


def test_the_minimum_dwell_holds_a_state():
    # Slow at observation 2 (ewma = 1, three observations at 2x); fast again from 3 on: the
    # off-streak completes at observation 5, but dwell=5 keeps it slow until observation 8.
    times = [[1.0, 2.0]] * 3 + [[1.0, 1.0]] * 10
    _, events = _run_detector(times, 2, StragglerPolicy(ewma=1.0, min_dwell=5))
    assert [(e.kind, e.observation) for e in events] == [("slow", 2), ("recovered", 8)]


def test_decider_acts_only_past_twice_the_switch_cost():
    # BSP with one rank 3x slow runs at 1/3 of the fast rate: saving = D·(1 − 1/3).
    policy = StragglerPolicy(action="exclude")
    yes = decide(policy, slow_for_s=31.0, rate_now=1.0, rate_alt=3.0, switch_s=10.0)
    no = decide(policy, slow_for_s=29.0, rate_now=1.0, rate_alt=3.0, switch_s=10.0)
    assert (yes.act, no.act) == (True, False)
    assert yes.saving_s == pytest.approx(31.0 * 2 / 3)
    assert yes.cost_s == 20.0


def test_the_prior_sets_the_expected_episode_before_any_evidence():
    policy = StragglerPolicy(prior_episode_s=100.0)
    decision = decide(policy, slow_for_s=1.0, rate_now=1.0, rate_alt=2.0, switch_s=10.0)
    assert decision.episode_s == 100.0 and decision.act


def _controller_run(window, *, switch_s=10.0):
    """4 ranks, 1 s local steps (1 s per observation), rank 3 at 3 s for ``window``."""
    controller = StragglerController(4, StragglerPolicy(action="exclude"), switch_s=switch_s)
    events = []
    for k in range(300):
        row = [1.0, 1.0, 1.0, 3.0 if k in window else 1.0]
        events += controller.observe(row, elapsed_s=max(row))
    return controller, events


def test_a_long_episode_switches_out_once_and_back_once():
    # Slow from observation 102; slow_for grows 3 s per observation (the BSP step is 3 s):
    # 3 at 102, ..., 36 at 113. BSP runs 4 ranks per 3 s, excluding rank 3 runs 3 per 1 s:
    # saving = slow_for·(1 − (4/3)/3) = slow_for·5/9: 20 at 113 (not > 20), 21.7 at 114.
    controller, events = _controller_run(range(100, 200))
    assert [(e.kind, e.ranks, e.observation) for e in events] == [
        ("out", (3,), 114), ("back", (3,), 206)]
    assert controller.declined == 12


def test_a_blip_shorter_than_break_even_is_declined():
    controller, events = _controller_run(range(100, 106))
    assert events == []
    assert controller.declined > 0


# --- fault injection text ----------------------------------------------------------------------


def test_a_delay_applies_every_step():
    straggler = parse_straggler("1:50ms")
    assert straggler == Straggler(rank=1, delay_s=0.05)
    assert straggler.local_s(123, 1.0) == 1.05


def test_a_factor_with_a_window_excludes_its_end():
    straggler = parse_straggler("2:3x:100-400")
    assert straggler == Straggler(rank=2, factor=3.0, from_step=100, to_step=400)
    assert [straggler.local_s(s, 1.0) for s in (99, 100, 399, 400)] == [1.0, 3.0, 3.0, 1.0]


def test_several_stragglers_separated_by_commas():
    assert parse_stragglers("1:50ms,2:3x:100-") == (
        Straggler(rank=1, delay_s=0.05), Straggler(rank=2, factor=3.0, from_step=100))


def test_a_delayed_link_holds_messages_and_leaves_the_local_time_alone():
    straggler = parse_straggler("1:20ms@link")
    assert straggler == Straggler(rank=1, delay_s=0.02, link=True)
    assert straggler.local_s(5, 1.0) == 1.0
    assert straggler.message_s(5) == 0.02


def test_a_delayed_link_window_excludes_its_end():
    straggler = parse_straggler("0:5ms@link:3-5")
    assert [straggler.message_s(s) for s in (2, 3, 4, 5)] == [0.0, 0.005, 0.005, 0.0]


def test_link_delays_of_a_rank_add_and_compute_delays_do_not_count():
    stragglers = parse_stragglers("1:20ms@link,1:5ms@link:0-2,1:50ms,0:7ms@link")
    assert link_delay_s(stragglers, 1, 0) == pytest.approx(0.025)
    assert link_delay_s(stragglers, 1, 2) == pytest.approx(0.02)
    assert slowed_s(stragglers, 1, 0, 1.0) == pytest.approx(1.05)  # only the compute delay


@pytest.mark.parametrize("text", ["1:0.02s@link", "3:1.5s@link:10-20", "0:0.001s@link:4-"])
def test_delayed_link_text_round_trips(text):
    assert format_straggler(parse_straggler(text)) == text


def test_a_link_delay_written_in_milliseconds_formats_in_seconds():
    assert format_straggler(parse_straggler("1:20ms@LINK")) == "1:0.02s@link"


@pytest.mark.parametrize(("text", "column", "words"), [
    ("1:3x@link", 3, "not a factor"),
    ("1:20ms@net", 7, "on the rank's link only (@link), got '@net'"),
    ("1:@link", 3, "the delay must be a duration"),
    ("0:5ms,1:20ms@wire", 13, "got '@wire'"),
    ("x:50ms", 1, "rank must be a whole number"),
    ("1:fast", 3, "the delay must be a duration"),
    ("1:3x:400-100", 1, "window 400-100 is empty"),
    ("1:3x:a-b", 6, "FROM-TO"),
    ("1:0.5x", 1, "factor must be >= 1"),
    ("1", 2, "expected 2 or 3 parts"),
])
def test_bad_straggler_text_says_where(text, column, words):
    with pytest.raises(TrainschedError) as info:
        parse_stragglers(text)
    assert f"column {column}" in str(info.value)
    assert words in str(info.value)


def test_the_column_counts_across_a_comma_list():
    with pytest.raises(TrainschedError, match="column 10"):
        parse_stragglers("1:50ms,2:zz")


@given(st.builds(Straggler, rank=st.integers(0, 63), factor=st.floats(1.0, 100.0),
                 from_step=st.integers(0, 1000), to_step=st.none() | st.integers(1001, 5000))
       | st.builds(Straggler, rank=st.integers(0, 63), delay_s=st.floats(0.0, 10.0),
                   link=st.booleans()))
def test_straggler_text_round_trips(straggler):
    assert parse_straggler(format_straggler(straggler)) == straggler


def test_a_factor_on_a_link_is_refused_as_a_value_too():
    with pytest.raises(TrainschedError, match="not a factor"):
        Straggler(rank=0, factor=2.0, link=True)
