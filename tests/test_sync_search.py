"""The offline BSP-fraction search with scripted trials: monotone, noisy, none passing."""

import pytest

from trainsched.errors import TrainschedError
from trainsched.sync.search import TimeModel, lower_bound, search_bsp_fraction


def test_a_monotone_curve_stops_at_the_last_fraction_within_epsilon():
    # 90 points down to f = 1/8, 88 below: 1/2, 1/4, 1/8 pass (no spread: bound = difference 0),
    # 1/16 fails (-2 < -0.5).
    result = search_bsp_fraction(lambda f, s: 90.0 if f >= 0.125 else 88.0, seed=1)
    assert result.fraction == 0.125
    assert [(c.fraction, c.passed) for c in result.candidates] == [
        (0.5, True), (0.25, True), (0.125, True), (0.0625, False)]
    assert len(result.trials) == 3 + 4 * 3


def test_every_candidate_passing_stops_at_the_minimum_fraction():
    result = search_bsp_fraction(lambda f, s: 90.0, seed=1, min_fraction=1 / 64)
    assert result.fraction == 1 / 64
    assert len(result.candidates) == 6


def test_none_passing_keeps_pure_bsp():
    result = search_bsp_fraction(lambda f, s: 90.0 if f == 1.0 else 80.0, seed=1)
    assert result.fraction == 1.0
    assert [c.fraction for c in result.candidates] == [0.5]
    assert len(result.trials) == 6


def test_a_noisy_reference_makes_an_equal_mean_candidate_fail():
    # Reference 90, 91, 89 (variance 1); f = 1/2: 90.2, 89.8, 90.0 (variance 0.04): equal
    # means, but with 3 runs each the 90 % lower bound is about -1.1 < -0.5.
    script = {1.0: iter([90.0, 91.0, 89.0]), 0.5: iter([90.2, 89.8, 90.0])}
    result = search_bsp_fraction(lambda f, s: next(script[f]), seed=3)
    assert result.fraction == 1.0
    (candidate,) = result.candidates
    assert candidate.mean_difference == pytest.approx(0.0)
    assert -1.2 < candidate.lower_bound < -1.0


def test_the_lower_bound_is_welchs_with_the_t_quantile():
    # Both variances 1, n = 3: standard error sqrt(2/3), Welch dof 4; t(0.9, 4) = 1.533206
    # (Student's table): 1 - 1.533206 * 0.816497 = -0.251858.
    assert lower_bound([1.0, 2.0, 3.0], [0.0, 1.0, 2.0], 0.9) == pytest.approx(-0.251858,
                                                                                abs=1e-5)


def test_trial_seeds_derive_from_the_seed_alone():
    seen = []
    search_bsp_fraction(lambda f, s: seen.append(s) or 90.0, seed=5, min_fraction=0.25)
    again = []
    search_bsp_fraction(lambda f, s: again.append(s) or 90.0, seed=5, min_fraction=0.25)
    other = []
    search_bsp_fraction(lambda f, s: other.append(s) or 90.0, seed=6, min_fraction=0.25)
    assert seen == again
    assert len(set(seen)) == len(seen) == 9
    assert set(seen).isdisjoint(other)


def test_total_time_sums_the_time_model_over_every_trial():
    # T(1) = 100; T(1/2) = 50 + 10 + 5 = 65; T(1/4) = 25 + 15 + 5 = 45; 3 runs each.
    model = TimeModel(bsp_s=100.0, relaxed_s=20.0, switch_s=5.0)
    result = search_bsp_fraction(lambda f, s: 90.0, seed=1, min_fraction=0.25,
                                 time_model=model)
    assert result.total_time_s == pytest.approx(3 * (100 + 65 + 45))


def test_time_model_is_the_weighted_sum_plus_switches():
    model = TimeModel(bsp_s=100.0, relaxed_s=20.0, switch_s=5.0)
    assert model.time_s(0.125) == 0.125 * 100 + 0.875 * 20 + 5
    assert model.time_s(0.0) == 20.0
    assert model.time_s(0.5, switches=3) == 50 + 10 + 15


def test_one_repeat_is_refused():
    with pytest.raises(TrainschedError, match="repeats must be a whole number >= 2"):
        search_bsp_fraction(lambda f, s: 90.0, seed=1, repeats=1)


def test_a_non_number_accuracy_is_refused():
    with pytest.raises(TrainschedError, match="must return the run's accuracy"):
        search_bsp_fraction(lambda f, s: None, seed=1)
