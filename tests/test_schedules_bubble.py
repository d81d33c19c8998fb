"""Bubble formulas at unit costs: p = 4 ranks, m = 64 micro-batches, no communication.

T_F = T_I = T_W = 1 (a fused B costs 2) per stage; with two chunks per rank each chunk costs
half, so every rank works 3m = 192 units in every schedule. The **bubble rate** is Σ idle ÷
Σ busy over the ranks (the spec's table). The **steady bubble** is the idle inside each rank's
span, from its first action to its last: what remains when consecutive steps overlap (Zero
Bubble's optimizer post-validation), where "ZB-H2 and ZBV → 0" is exact. Expected values are
worked out below from the rank timelines, not read from the code.
"""

from __future__ import annotations

import math

import pytest

from trainsched.backprop.fast_forward import fast_forward, modulo
from trainsched.backprop.interleaved import zb_h1, zbv
from trainsched.backprop.schedules import gpipe, one_f_one_b
from trainsched.backprop.stages import uniform_stages
from trainsched.backprop.zero_bubble import zb_h2
from trainsched.sim import simulate_pipeline

P, M = 4, 64
WORK = 3 * M  # per rank


def run(schedule, chunks: int = 1):
    unit = 1.0 / chunks
    return simulate_pipeline(uniform_stages(P * chunks, unit, unit, unit), schedule)


def rate(result) -> float:
    return math.fsum(result.rank_idle_s) / math.fsum(result.rank_busy_s)


def steady_idle(result) -> float:
    spans: dict[int, list[float]] = {}
    for t in result.tasks:
        if t.category != "comm":
            first_last = spans.setdefault(t.args["rank"], [math.inf, 0.0])
            first_last[0] = min(first_last[0], t.start_s)
            first_last[1] = max(first_last[1], t.end_s)
    return math.fsum(last - first - busy for (first, last), busy
                     in zip((spans[r] for r in sorted(spans)), result.rank_busy_s, strict=True))


def test_1f1b_bubble_is_p_minus_1_over_m():
    # (m + p - 1) slots of F + B = 201; rank r starts at r and ends at 201 - 2r (its last B
    # waits for the chain from below), so its span holds 201 - 3r - 192 idle units: 18 in all.
    result = run(one_f_one_b(P, M))
    assert result.step_time_s == 3 * (M + P - 1) == 201
    assert rate(result) == (P - 1) / M == 3 / 64
    assert steady_idle(result) == 9 + 6 + 3 + 0


def test_zb_h1_bubble_is_a_third_of_1f1bs():
    # Every rank ends at 3m + p - 1 = 195, rank r starting at r: p - 1 = 3 idle units per rank,
    # of which 3 - r lie inside its span.
    result = run(zb_h1(P, M))
    assert result.step_time_s == WORK + P - 1 == 195
    assert rate(result) == (P - 1) / (3 * M) == 1 / 64
    assert steady_idle(result) == 3 + 2 + 1 + 0


def test_zb_h2_has_no_bubble_inside_the_ranks_spans():
    # A parallelogram: rank r works without a gap from r to r + 192. One isolated step still
    # lasts 195 (rank 3 cannot start before 3), the shortest any schedule reaches.
    result = run(zb_h2(P, M))
    assert result.step_time_s == 195
    assert rate(result) == 1 / 64
    assert steady_idle(result) == 0


def test_zbv_bubble_is_half_of_zb_h1s_and_none_inside_the_spans():
    # Chunks of half cost: rank r starts at r / 2 (the V's forwards go down the ranks) and works
    # without a gap, so the step is 192 + 1.5 and the rate (p - 1) / (6m).
    result = run(zbv(P, M), chunks=2)
    assert result.step_time_s == WORK + (P - 1) / 2 == 193.5
    assert rate(result) == (P - 1) / (6 * M) == 1 / 128
    assert steady_idle(result) == 0


def test_fast_forward_and_modulo_against_gpipe():
    # GPipe (fused B): (m + p - 1)(F + I + W) = 201. Fast-forwarding: m(F + I + W) +
    # (p - 1)(F + I) = 198. Modulo, two chunks of half cost: the fill is (p - 1)(F + I) / 2,
    # so 195.
    assert run(gpipe(P, M)).step_time_s == 201
    assert run(fast_forward(P, M)).step_time_s == WORK + (P - 1) * 2 == 198
    assert run(modulo(P, M, chunks=2), chunks=2).step_time_s == WORK + (P - 1) == 195


@pytest.mark.parametrize("m", [8, 16, 32])
def test_zb_h2_and_zbv_rates_shrink_as_one_over_m(m):
    # The only idle of either is the fill before each rank's first action: p(p-1)/2 units for
    # ZB-H2 and half of it for ZBV, twice over (it recurs at the end), against 4 x 3m of work.
    h2 = simulate_pipeline(uniform_stages(P, 1, 1, 1), zb_h2(P, m))
    v = simulate_pipeline(uniform_stages(2 * P, 0.5, 0.5, 0.5), zbv(P, m))
    assert rate(h2) == pytest.approx(2 * 6 / (4 * 3 * m), rel=1e-12)
    assert rate(v) == pytest.approx(2 * 3 / (4 * 3 * m), rel=1e-12)
