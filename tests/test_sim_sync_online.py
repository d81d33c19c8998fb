"""The straggler controller in the simulated loop: exclusion pays when switches are cheap and
loses when they cost minutes; relaxing runs ASP while the straggler lasts."""

import pytest

from trainsched.sim.sync import SyncWorkload
from trainsched.sim.sync_online import simulate_online
from trainsched.sync import Straggler, StragglerPolicy

# 8 ranks of 32 samples, 1 s local steps + 0.1 s all-reduce; rank 3 three times slower in its
# steps 200..399; 1000 BSP steps' worth of samples.
WORKLOAD = SyncWorkload(ranks=8, batch_per_rank=32, compute_s=1.0, allreduce_s=0.1,
                        stragglers=(Straggler(rank=3, factor=3.0, from_step=200, to_step=400),))
TOTAL = 1000 * 8 * 32


def _run(action, switch_s):
    return simulate_online(WORKLOAD, total_samples=TOTAL, policy=StragglerPolicy(action=action),
                           switch_s=switch_s)


def test_ignoring_the_straggler_is_plain_bsp():
    # 800 steps of 1.1 s and 200 of 3.1 s.
    result = _run("ignore", 0.1)
    assert result.time_s == pytest.approx(800 * 1.1 + 200 * 3.1)
    assert result.events == ()


def test_cheap_exclusion_goes_out_at_detection_and_back_at_recovery():
    # Slow at observation 202 (EWMA), act at once: saving 3.1·(1 − (8/3.1)/(7/1.1)) = 1.84 s
    # > 0.2 s. Steps 0..199 at 1.1 s, 200..202 at 3.1 s, switch; 204 steps of 7 ranks at 1.1 s
    # until rank 3 is cleared at observation 406, switch; the remaining 256000 − 203·256 −
    # 204·224 = 158336 samples take 619 full-width steps.
    result = _run("exclude", 0.1)
    assert [(e.kind, e.ranks, e.observation) for _, e in result.events] == [
        ("out", (3,), 202), ("back", (3,), 406)]
    assert result.time_s == pytest.approx(200 * 1.1 + 3 * 3.1 + 0.1 + 204 * 1.1 + 0.1
                                          + 619 * 1.1)
    assert result.bsp_samples == TOTAL


def test_exclusion_at_150_s_a_switch_acts_late_and_loses_to_ignoring():
    # The rule needs 3.1 s·(k − 201)·0.5945 > 300 s: k = 364, 162 observations declined, with
    # only 36 slow steps left to save on.
    ignore, costly = _run("ignore", 150.0), _run("exclude", 150.0)
    assert [(e.kind, e.observation) for _, e in costly.events] == [("out", 364), ("back", 406)]
    assert costly.declined == 162
    assert costly.time_s > ignore.time_s


def test_relaxing_runs_asp_until_the_straggler_recovers():
    result = _run("relax", 0.1)
    assert [e.kind for _, e in result.events] == ["out", "back"]
    assert result.relaxed_samples > 0
    # the relaxed samples are part of the run, as in the runtime: the total is kept
    assert result.bsp_samples + result.relaxed_samples == TOTAL
    assert max(result.run.update_staleness) > 0


@pytest.mark.timeout(60)
def test_a_straggler_that_never_recovers_ends_the_run_relaxed():
    forever = SyncWorkload(ranks=4, batch_per_rank=32, compute_s=1.0, allreduce_s=0.1,
                           stragglers=(Straggler(rank=1, factor=3.0, from_step=10),))
    total = 200 * 4 * 32
    result = simulate_online(forever, total_samples=total,
                             policy=StragglerPolicy(action="relax"), switch_s=0.1)
    assert [e.kind for _, e in result.events] == ["out"]
    assert result.bsp_samples + result.relaxed_samples == total
