"""ZB-H1's shape: on each rank, how many micro-batches hold memory at once.

The Zero Bubble ZB-H1 keeps 1F1B's warm-up, so rank ``r`` of ``p`` holds the activations of at
most ``p - r`` micro-batches (forward run, input gradient not yet), as 1F1B does; its deferred
weight gradients add ``r`` micro-batches waiting for their ``W`` (``r + 1`` between an ``I``
and the next ``W``), so every rank has ``p`` micro-batches in flight at most.
"""

from __future__ import annotations

import pytest

from trainsched.backprop.interleaved import zb_h1
from trainsched.backprop.schedules import one_f_one_b


def _most(schedule, rank: int) -> tuple[int, int]:
    """The largest number of micro-batches holding activations (F run, I or B not yet) and the
    largest number in flight (F run, W or B not yet) on ``rank``, over its action list."""
    activations = in_flight = most_act = most_flight = 0
    for a in schedule.compute_actions(rank):
        if a.kind == "F":
            activations += 1
            in_flight += 1
        elif a.kind == "I":
            activations -= 1
        elif a.kind == "W":
            in_flight -= 1
        else:   # B
            activations -= 1
            in_flight -= 1
        most_act, most_flight = max(most_act, activations), max(most_flight, in_flight)
    return most_act, most_flight


@pytest.mark.parametrize(("p", "m"), [(2, 4), (4, 8), (4, 16), (6, 12)])
def test_zb_h1_holds_1f1bs_activations_and_p_in_flight_on_every_rank(p, m):
    schedule = zb_h1(p, m)
    for r in range(p):
        assert _most(schedule, r) == (p - r, p)


@pytest.mark.parametrize(("p", "m"), [(2, 4), (4, 8)])
def test_1f1b_holds_p_minus_r_in_flight(p, m):
    schedule = one_f_one_b(p, m)
    for r in range(p):
        assert _most(schedule, r) == (p - r, p - r)
