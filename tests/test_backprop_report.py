"""``simulate``'s out-of-order backprop lines (``report.tables.backprop_lines``) on hand-made
sweeps: what the k sweep line says when a k wins, when none does, and the slowest k."""

from __future__ import annotations

from trainsched.report.tables import backprop_lines


def _doc(times: list[float], k: int) -> dict:
    return {"name": "ooo", "k": k, "layers": len(times) - 1, "deferred_bytes": 0,
            "sweep": {"step_time_s": times, "k": k, "layers": len(times) - 1,
                      "speedup": times[0] / times[k],
                      "memory_cap_bytes": None}}


def _sweep_line(times: list[float], k: int) -> str:
    lines = [x for x in backprop_lines(_doc(times, k)) if x.lstrip().startswith("k sweep")]
    assert len(lines) == 1
    return lines[0].split("k sweep", 1)[1].strip()


def test_a_winning_k_is_shown_beside_in_order_and_the_slowest():
    assert _sweep_line([0.010, 0.009, 0.008, 0.011], 2) == (
        "in order (k=0) 10.0 ms; chosen k=2 8.00 ms (1.250x); slowest k=3 11.0 ms")


def test_no_faster_k_says_so_once():
    assert _sweep_line([0.005, 0.005, 0.005], 0) == "in order (k=0) 5.00 ms; no k faster, so k=0"


def test_the_slowest_is_left_out_when_it_is_the_chosen_or_in_order():
    assert _sweep_line([0.012, 0.010], 1) == "in order (k=0) 12.0 ms; chosen k=1 10.0 ms (1.200x)"
