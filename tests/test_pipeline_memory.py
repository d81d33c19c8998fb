"""The simulator's memory model per schedule: saved activations held from F to W.

Four equal stages on four ranks, eight micro-batches, each saving S = 1000 bytes per stage, no
resident state, nothing sent. F adds S; I frees half of it, W the rest (a fused B all of it).
A micro-batch is "in flight" on a rank from its F to its W. Rank 0's peak, worked out:

- GPipe runs all 8 forwards first: 8S;
- 1F1B holds at most p - r = 4 on rank 0: 4S;
- ZB-H1 keeps 1F1B's forwards and only moves W's later within their slot: 4S;
- ZB-H2 lets 2p - 1 = 7 micro-batches be in flight on rank 0: 7S, about twice 1F1B.
"""

from __future__ import annotations

import pytest

from trainsched.backprop.schedules import build_schedule
from trainsched.backprop.stages import uniform_stages
from trainsched.sim import simulate_pipeline

S = 1000


def _peak(name: str) -> int:
    stages = uniform_stages(4, 1.0, 1.0, 1.0, saved_bytes=S)
    result = simulate_pipeline(stages, build_schedule(name, 4, 8, stages=stages))
    return result.peak_memory_bytes["device0"]


@pytest.mark.parametrize(("name", "expected"), [("gpipe", 8 * S), ("1f1b", 4 * S),
                                                ("zb-h1", 4 * S), ("zb-h2", 7 * S)])
def test_rank_zero_peak_per_schedule(name, expected):
    assert _peak(name) == expected


def test_the_peaks_order_gpipe_above_1f1b_equal_zb_h1_below_zb_h2():
    gpipe, ofob, h1, h2 = (_peak(n) for n in ("gpipe", "1f1b", "zb-h1", "zb-h2"))
    assert gpipe >= ofob == h1
    assert 1.5 * ofob <= h2 <= 2 * ofob


def test_a_later_rank_holds_fewer_micro_batches_under_1f1b():
    stages = uniform_stages(4, 1.0, 1.0, 1.0, saved_bytes=S)
    result = simulate_pipeline(stages, build_schedule("1f1b", 4, 8))
    assert [result.peak_memory_bytes[f"device{r}"] for r in range(4)] == [4 * S, 3 * S,
                                                                          2 * S, 1 * S]


def test_stages_that_say_what_w_keeps_free_the_rest_at_i():
    from dataclasses import replace

    # 1F1B split on 2 stages, 2 micro-batches: rank 0 runs F0 F1 I0 W0 I1 W1. W keeps
    # K = 1500 of its micro-batch from the end of its I: while I0 runs, micro-batches 0 and 1
    # hold S each (2000); while W0 runs, micro-batch 1 holds S and micro-batch 0 K (2500).
    stages = replace(uniform_stages(2, 1.0, 1.0, 1.0, saved_bytes=S),
                     weight_input_bytes=(1500, 1500))
    result = simulate_pipeline(stages, build_schedule("1f1b", 2, 2, split_backward=True))
    assert result.peak_memory_bytes["device0"] == S + 1500


def test_weight_input_bytes_need_one_entry_per_stage():
    from dataclasses import replace

    from trainsched.errors import TrainschedError

    with pytest.raises(TrainschedError, match="weight_input_bytes"):
        replace(uniform_stages(2, 1.0, 1.0, 1.0), weight_input_bytes=(1,))
