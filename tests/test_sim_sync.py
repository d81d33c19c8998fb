"""The protocol simulator on hand-worked numbers: BSP waits for the slowest, ASP adds the
ranks' rates, SSP(0) is BSP's timing, k-of-N takes the k-th fastest, local SGD waits once per
period, T(f) is exact without noise; and the noisy quadratic's replay of stale updates."""

import pytest

from trainsched.errors import TrainschedError
from trainsched.sim.quadratic import NoisyQuadratic, replay_loss
from trainsched.sim.sync import SyncWorkload, simulate_sync
from trainsched.sync import Asp, Bsp, KOfN, LocalSgd, Ssp, Straggler, parse_policy


def _equal(**extra):
    return SyncWorkload(ranks=4, batch_per_rank=8, compute_s=1.0, **extra)


def test_time_of_a_bsp_then_asp_policy_is_the_weighted_sum_plus_the_switch():
    # 100 BSP steps of 4 x 8 samples: BSP 1 + 0.5 s a step -> T_bsp = 150 s; ASP with free
    # communication: each rank applies one batch a second -> 400 batches in T_asp = 100 s.
    # f = 1/4: 25 BSP steps (37.5 s) + 75 s of ASP + one 7 s switch = 119.5 s.
    workload = _equal(allreduce_s=0.5)
    assert simulate_sync(Bsp(), workload, total_samples=3200).time_s == 150.0
    assert simulate_sync(Asp(), workload, total_samples=3200).time_s == 100.0
    result = simulate_sync(parse_policy("bsp:0.25,asp:0.75"), workload, total_samples=3200,
                           switch_s=7.0)
    assert result.time_s == 0.25 * 150 + 0.75 * 100 + 7
    assert [(p.protocol, p.samples) for p in result.phases] == [("bsp", 800), ("asp", 2400)]


def test_bsp_with_one_three_times_straggler_takes_three_times_as_long():
    fair = simulate_sync(Bsp(), _equal(), total_samples=3200)
    slow = simulate_sync(Bsp(), _equal(stragglers=(Straggler(rank=2, factor=3.0),)),
                         total_samples=3200)
    assert (fair.step_time_s, slow.step_time_s) == (1.0, 3.0)


def test_asp_rate_is_the_sum_of_the_ranks_rates():
    # Ranks at 1, 2 and 4 s a step, one sample each: 1 + 1/2 + 1/4 = 1.75 samples/s, so 700
    # samples end at 400 s (rank 0 does 400, rank 1 200, rank 2 100).
    workload = SyncWorkload(ranks=3, batch_per_rank=1, compute_s=(1.0, 2.0, 4.0))
    result = simulate_sync(Asp(), workload, total_samples=700)
    assert result.time_s == 400.0


def test_a_busy_server_caps_the_asp_rate():
    # 0.5 s of server work per push: from the first arrival at 1 s the server never idles,
    # update k is applied at 1 + 0.5 k, the 400th at 201 s (4 ranks alone would take 100 s).
    result = simulate_sync(Asp(), _equal(server_s=0.5), total_samples=3200)
    assert result.time_s == 201.0


def test_ssp_with_bound_zero_has_bsps_timing_under_noise_and_stragglers():
    workload = _equal(noise_cv=0.3, stragglers=(Straggler(rank=1, factor=2.0, from_step=10,
                                                          to_step=40),))
    bsp = simulate_sync(Bsp(), workload, total_samples=3200, seed=4)
    ssp = simulate_sync(Ssp(0), workload, total_samples=3200, seed=4)
    assert ssp.time_s == pytest.approx(bsp.time_s, rel=1e-12)
    assert bsp.time_s > 100.0  # the noise and the straggler did slow it down


def test_a_larger_staleness_bound_never_takes_longer():
    workload = _equal(noise_cv=0.3)
    times = [simulate_sync(Ssp(s), workload, total_samples=3200, seed=2).time_s
             for s in (0, 1, 4)]
    assert times[0] > times[1] >= times[2]


def test_asp_staleness_counts_the_updates_since_the_read():
    # Equal ranks: the first round applies gradients read at version 0 as updates 0..3
    # (staleness 0, 1, 2, 3); from then on every gradient is 3 updates old.
    result = simulate_sync(Asp(), _equal(), total_samples=3200)
    assert result.staleness == ((0, 1), (1, 1), (2, 1), (3, 397))
    assert simulate_sync(Bsp(), _equal(), total_samples=3200).staleness == ((0, 100),)


def test_k_of_n_waits_for_the_kth_fastest_and_applies_k_batches():
    workload = SyncWorkload(ranks=4, batch_per_rank=8, compute_s=(1.0, 2.0, 3.0, 4.0))
    result = simulate_sync(KOfN(2), workload, total_samples=160)
    assert result.time_s == 10 * 2.0  # 160 samples / (2 x 8) = 10 updates of 2 s
    assert set(result.update_samples) == {16}


def test_local_sgd_waits_once_per_period():
    # Rank 0 is slow (3 s) in its step 0, rank 1 in its step 1. BSP waits twice: 3.5 + 3.5;
    # local SGD with h = 2 waits once for the larger two-step sum, 4 s, plus 0.5 s averaging.
    workload = SyncWorkload(ranks=2, batch_per_rank=1, compute_s=1.0, allreduce_s=0.5,
                            stragglers=(Straggler(rank=0, factor=3.0, to_step=1),
                                        Straggler(rank=1, factor=3.0, from_step=1, to_step=2)))
    assert simulate_sync(Bsp(), workload, total_samples=4).time_s == 7.0
    assert simulate_sync(LocalSgd(2), workload, total_samples=4).time_s == 4.5


def test_the_same_seed_gives_the_same_run():
    workload = _equal(noise_cv=0.2)
    one = simulate_sync(Asp(), workload, total_samples=3200, seed=9)
    two = simulate_sync(Asp(), workload, total_samples=3200, seed=9)
    assert one == two


def test_a_straggler_on_a_missing_rank_is_refused():
    with pytest.raises(TrainschedError, match="not a Straggler on one of the 4 ranks"):
        _equal(stragglers=(Straggler(rank=4, factor=2.0),))


def test_quadratic_replay_without_noise_halves_the_weights_under_bsp():
    # h = 1, lr 0.5: w <- w/2 each update; 3 updates: w = 1/8, loss 1/128.
    model = NoisyQuadratic(dims=1, condition=1.0, noise=0.0, lr=0.5)
    result = simulate_sync(Bsp(), SyncWorkload(ranks=2, batch_per_rank=1, compute_s=1.0),
                           total_samples=6)
    curve = replay_loss(result, model)
    assert curve.loss[-1] == 0.5 * (1 / 8) ** 2
    assert curve.time_to(0.5 * (1 / 4) ** 2) == 2.0


def test_quadratic_replay_uses_the_stale_weights():
    # ASP on 2 equal ranks: LR scale 1/2, staleness 0, 1, 1: w1 = 1 - 0.25 = 0.75,
    # w2 = 0.75 - 0.25 * w0 = 0.5, w3 = 0.5 - 0.25 * w1 = 0.3125.
    model = NoisyQuadratic(dims=1, condition=1.0, noise=0.0, lr=0.5)
    result = simulate_sync(Asp(), SyncWorkload(ranks=2, batch_per_rank=1, compute_s=1.0),
                           total_samples=3)
    assert result.update_staleness == (0, 1, 1)
    assert replay_loss(result, model).loss[-1] == 0.5 * 0.3125 ** 2
