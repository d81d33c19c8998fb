"""Validity of every registered generator: coverage, dependency order, fast-forward bounds,
activations in flight (counted by hand for small cases), the greedy's memory cap; golden orders."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainsched.backprop.fast_forward import fast_forward, modulo
from trainsched.backprop.interleaved import zb_h1, zbv
from trainsched.backprop.schedules import SCHEDULES, build_schedule, one_f_one_b
from trainsched.backprop.stages import StageCosts
from trainsched.backprop.zero_bubble import FLAG_SETS, zb_h2, zero_bubble_greedy
from trainsched.errors import TrainschedError
from trainsched.plan import Schedule

GOLDEN = {
    # The spec's stage-0 row; the last stage runs all its I's, then all its W's.
    "fast-forward 3x4": (lambda: fast_forward(3, 4), """\
0F0 0F1 0F2 0F3 0I0 0W0 0I1 0W1 0I2 0W2 0I3 0W3
1F0 1F1 1F2 1F3 1I0 1W0 1I1 1W1 1I2 1W2 1I3 1W3
2F0 2F1 2F2 2F3 2I0 2I1 2I2 2I3 2W0 2W1 2W2 2W3
"""),
    # Groups of 2: a group's W's all run before the next group's forwards.
    "push 3x4 group 2": (lambda: fast_forward(3, 4, group=2), """\
0F0 0F1 0I0 0W0 0I1 0W1 0F2 0F3 0I2 0W2 0I3 0W3
1F0 1F1 1I0 1W0 1I1 1W1 1F2 1F3 1I2 1W2 1I3 1W3
2F0 2F1 2I0 2I1 2W0 2W1 2F2 2F3 2I2 2I3 2W2 2W3
"""),
    # Ring (1, 0): stages 0 and 2 on rank 1, stages 1 and 3 on rank 0; rounds of 2.
    "modulo 2x4 ring 1,0": (lambda: modulo(2, 4, ring=(1, 0)), """\
1F0 1F1 3F0 3F1 1F2 1F3 3F2 3F3 3I0 3I1 3W0 3W1 1I0 1W0 1I1 1W1 3I2 3I3 3W2 3W3 1I2 1W2 1I3 1W3
0F0 0F1 2F0 2F1 0F2 0F3 2F2 2F3 2I0 2W0 2I1 2W1 0I0 0W0 0I1 0W1 2I2 2W2 2I3 2W3 0I2 0W2 0I3 0W3
"""),
    # Warm-up p - 1 - r forwards; rank r holds back its first r W's, which close the list.
    "zb-h1 3x4": (lambda: zb_h1(3, 4), """\
0F0 0F1 0F2 0I0 0W0 0F3 0I1 0W1 0I2 0W2 0I3 0W3
1F0 1F1 1I0 1F2 1I1 1W0 1F3 1I2 1W1 1I3 1W2 1W3
2F0 2I0 2F1 2I1 2F2 2I2 2W0 2F3 2I3 2W1 2W2 2W3
"""),
    "zbv 2x3": (lambda: zbv(2, 3), """\
0F0 0F1 0F2 3F0 3I0 3W0 3F1 3I1 3W1 0I0 0W0 3F2 3I2 3W2 0I1 0W1 0I2 0W2
1F0 2F0 1F1 2F1 2I0 2W0 1F2 1I0 1W0 2F2 2I1 2W1 1I1 2I2 1I2 1W1 2W2 1W2
"""),
}


@pytest.mark.parametrize("case", list(GOLDEN))
def test_golden_orders(case):
    build, text = GOLDEN[case]
    schedule = build()
    assert schedule.to_text() == text
    assert Schedule.from_text(text, stage_to_rank=schedule.stage_to_rank) == schedule


def test_modulo_places_stage_s_on_the_ring_position_s_mod_p():
    assert modulo(4, 4, chunks=3, ring=(0, 3, 2, 1)).stage_to_rank == (0, 3, 2, 1) * 3
    assert zbv(3, 5).stage_to_rank == (0, 1, 2, 2, 1, 0)


def test_modulo_with_one_chunk_is_fast_forwarding():
    assert modulo(3, 5, chunks=1) == fast_forward(3, 5)


# --- every generator, any size ------------------------------------------------------------------


def runs_in_order(schedule: Schedule) -> bool:
    """Execute the rank lists (each in order) until none can move; True if all finish. An
    action needs: F(s-1, m) for F; F(s, m) and the gradient of s+1 for I/B; I(s, m) for W."""
    last = schedule.num_stages - 1
    done: set[tuple[int, str, int]] = set()
    lists = [list(schedule.compute_actions(r)) for r in range(schedule.num_ranks)]
    moved = True
    while moved:
        moved = False
        for row in lists:
            while row:
                a = row[0]
                s, k, m = a.stage, a.kind, a.microbatch
                needs = {"F": [(s - 1, "F", m)] if s else [], "W": [(s, "G", m)]}.get(
                    k, [(s, "F", m)] + ([(s + 1, "G", m)] if s < last else []))
                if any(n not in done for n in needs):
                    break
                done.add((s, "G" if k in "IB" else k, m))
                row.pop(0)
                moved = True
    return not any(lists)


@settings(max_examples=200, deadline=None)
@given(name=st.sampled_from(sorted(SCHEDULES)), p=st.integers(1, 5), m=st.integers(1, 10))
def test_every_generator_gives_complete_dependency_ordered_schedules(name, p, m):
    try:
        schedule = build_schedule(name, p, m)
    except TrainschedError as exc:  # interleaved rounds must divide m: the one refusal
        assert "must divide them evenly" in str(exc)
        assert m > p and m % (m // p)
        return
    counts = Counter((a.stage, a.kind, a.microbatch)
                     for r in range(p) for a in schedule.compute_actions(r))
    assert set(counts.values()) == {1}
    for s in range(schedule.num_stages):
        for k in range(m):
            kinds = {kind for kind in "FIWB" if (s, kind, k) in counts}
            assert kinds in ({"F", "B"}, {"F", "I", "W"})
    assert runs_in_order(schedule)


@settings(max_examples=60, deadline=None)
@given(p=st.integers(1, 5), m=st.integers(1, 10), chunks=st.integers(1, 3),
       group=st.one_of(st.none(), st.integers(1, 4)), data=st.data())
def test_fast_forward_bound_w_before_the_next_i(p, m, chunks, group, data):
    ring = data.draw(st.permutations(range(p)))
    schedule = modulo(p, m, chunks=chunks, ring=ring, group=group)
    last = schedule.num_stages - 1
    for r in range(p):
        where = {(a.stage, a.kind, a.microbatch): i
                 for i, a in enumerate(schedule.compute_actions(r))}
        for (s, kind, k), i in where.items():
            if kind == "W" and s != last and k + 1 < m:
                assert i < where[s, "I", k + 1]


# --- activations in flight -----------------------------------------------------------------------


def in_flight_peak(schedule: Schedule, rank: int) -> int:
    """Most (stage, micro-batch) pairs on ``rank`` whose F ran and whose W (or B) has not."""
    live = peak = 0
    for a in schedule.compute_actions(rank):
        live += {"F": 1, "W": -1, "B": -1}.get(a.kind, 0)
        peak = max(peak, live)
    return peak


@pytest.mark.parametrize(("build", "peaks"), [
    # GPipe-like forwards: all m; push: the group.
    (lambda: fast_forward(3, 4), [4, 4, 4]),
    (lambda: fast_forward(3, 6, group=2), [2, 2, 2]),
    # 1F1B holds p - r; ZB-H1 also holds the r W's it delays: p on every rank.
    (lambda: one_f_one_b(4, 8, split_backward=True), [4, 3, 2, 1]),
    (lambda: zb_h1(4, 8), [4, 4, 4, 4]),
    # ZBV, counted in chunks (half a stage each): 2p, i.e. p whole stages, as 1F1B's rank 0.
    (lambda: zbv(2, 3), [4, 4]),
    (lambda: zbv(4, 8), [8, 8, 8, 8]),
])
def test_in_flight_peaks_by_hand(build, peaks):
    schedule = build()
    assert [in_flight_peak(schedule, r) for r in range(schedule.num_ranks)] == peaks


def test_zb_h2_warms_up_with_2p_minus_1_forwards_on_rank_0_and_never_holds_more():
    schedule = zb_h2(4, 8)
    first = schedule.compute_actions(0)
    assert [str(a) for a in first[:8]] == [f"0F{k}" for k in range(7)] + ["0I0"]
    assert max(in_flight_peak(schedule, r) for r in range(4)) == 2 * 4 - 1


def activation_peaks(schedule: Schedule, saved: list[int], fraction: float) -> list[int]:
    peaks = []
    for r in range(schedule.num_ranks):
        held = peak = 0
        for a in schedule.compute_actions(r):
            part = int(saved[a.stage] * fraction)
            held += {"F": saved[a.stage], "I": -part, "W": part - saved[a.stage]}[a.kind]
            peak = max(peak, held)
        peaks.append(peak)
    return peaks


@settings(max_examples=80, deadline=None)
@given(p=st.integers(1, 4), m=st.integers(1, 8), data=st.data())
def test_greedy_respects_the_memory_cap(p, m, data):
    times = st.lists(st.sampled_from([0.5, 1.0, 2.0, 3.0]), min_size=p, max_size=p)
    saved = data.draw(st.lists(st.integers(1, 5), min_size=p, max_size=p))
    fraction = data.draw(st.sampled_from([0.0, 0.5, 1.0]))
    stages = StageCosts(forward_s=tuple(data.draw(times)),
                        backward_input_s=tuple(data.draw(times)),
                        backward_weight_s=tuple(data.draw(times)),
                        activation_bytes=(0,) * p, saved_bytes=tuple(saved),
                        param_bytes=(0,) * p, grad_bytes=(0,) * p,
                        optimizer_state_bytes=(0,) * p)
    cap = data.draw(st.integers(max(saved), 3 * max(saved)))
    comm = data.draw(st.sampled_from([0.0, 0.5]))
    result = zero_bubble_greedy(stages, m, memory_limit_bytes=cap, p2p_s=comm,
                                input_grad_only_fraction=fraction)
    result.schedule.validate()
    assert max(activation_peaks(result.schedule, saved, fraction)) <= cap


def test_greedy_keeps_the_best_flag_set():
    # At unit costs with 1F1B's largest in-flight count (p) on every rank, the best flag set
    # matches ZB-H1's 3m + p - 1 = 27; warming up as far as memory allows does worse (29).
    stages = StageCosts(forward_s=(1.0,) * 4, backward_input_s=(1.0,) * 4,
                        backward_weight_s=(1.0,) * 4, activation_bytes=(0,) * 4,
                        saved_bytes=(1,) * 4, param_bytes=(0,) * 4, grad_bytes=(0,) * 4,
                        optimizer_state_bytes=(0,) * 4)
    best = zero_bubble_greedy(stages, 8, memory_limit_bytes=4, input_grad_only_fraction=0.0)
    assert best.step_time_s == 27
    assert not best.flags.eager_warmup
    eager = [f for f in FLAG_SETS if f.eager_warmup]
    assert zero_bubble_greedy(stages, 8, memory_limit_bytes=4, input_grad_only_fraction=0.0,
                              flag_sets=eager).step_time_s == 29
