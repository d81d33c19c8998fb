"""The offline policy: the smallest BSP fraction within ε of pure BSP's accuracy.

For a recurring job, train the first fraction f of the samples under BSP and the rest under a
relaxed protocol; accuracy tends to rise with f and so does time. :func:`search_bsp_fraction`
finds f once, for later runs to reuse:

1. reference: ``repeats`` runs at f = 1 (pure BSP);
2. candidates 1/2, 1/4, … down to ``min_fraction``, ``repeats`` runs each, halving while the
   candidate passes and stopping at the first that fails;
3. a candidate **passes** when the one-sided lower confidence bound (level ``confidence``) of
   mean(acc_f) − mean(acc_bsp) is at least −ε. The bound is Welch's: the difference of the means
   minus Student's t quantile (Welch–Satterthwaite degrees of freedom) times the standard error
   √(s²_f/n + s²_bsp/n). Run-to-run noise makes one run per probe stop anywhere; repeats and
   the bound make a noisy candidate fail instead of passing by luck.

The answer is the last passing f (1.0 if none passes), with every trial and their total time
under the time model

    T(f) = f·T_bsp + (1 − f)·T_relaxed + n_switches·C_switch

(:class:`TimeModel`; one switch for 0 < f < 1). Trial seeds derive from ``seed`` alone, so a
search is repeatable.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from trainsched.errors import TrainschedError
from trainsched.units import is_int

__all__ = ["Candidate", "SearchResult", "TimeModel", "Trial", "search_bsp_fraction",
           "trial_seed"]


@dataclass(frozen=True, kw_only=True)
class TimeModel:
    """A whole run's time under BSP (``bsp_s``), under the relaxed protocol (``relaxed_s``)
    and one switch's cost (``switch_s``), all in seconds."""

    bsp_s: float
    relaxed_s: float
    switch_s: float = 0.0

    def __post_init__(self) -> None:
        for name in ("bsp_s", "relaxed_s", "switch_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or \
                    not (math.isfinite(value) and value >= 0):
                raise TrainschedError(f"time model: {name} must be seconds >= 0, got {value!r}")

    def time_s(self, fraction: float, switches: int | None = None) -> float:
        """T(f); ``switches`` defaults to 1 for 0 < f < 1, else 0."""
        if switches is None:
            switches = 1 if 0 < fraction < 1 else 0
        return (fraction * self.bsp_s + (1 - fraction) * self.relaxed_s
                + switches * self.switch_s)


@dataclass(frozen=True, kw_only=True)
class Trial:
    """One run: its BSP ``fraction``, ``seed``, the ``accuracy`` it reached (points) and its
    time under the time model (``None`` without one)."""

    fraction: float
    seed: int
    accuracy: float
    time_s: float | None


@dataclass(frozen=True, kw_only=True)
class Candidate:
    """A probed fraction: the mean accuracy difference to BSP, its one-sided lower bound and
    whether it passed (bound >= −ε)."""

    fraction: float
    mean_difference: float
    lower_bound: float
    passed: bool


@dataclass(frozen=True, kw_only=True)
class SearchResult:
    """The chosen ``fraction``, the reference (BSP) mean accuracy, each candidate's verdict,
    every trial in the order run and their total time (``None`` without a time model)."""

    fraction: float
    reference_accuracy: float
    candidates: tuple[Candidate, ...]
    trials: tuple[Trial, ...]
    total_time_s: float | None


def trial_seed(seed: int, index: int) -> int:
    """The seed of the ``index``-th trial of a search seeded ``seed`` (a 32-bit integer)."""
    return int(np.random.SeedSequence([seed, index]).generate_state(1)[0])


def _t_quantile(level: float, dof: float) -> float:
    from scipy.stats import t as student_t

    return float(student_t.ppf(level, dof))


def lower_bound(sample: list[float], reference: list[float], confidence: float) -> float:
    """Welch's one-sided lower confidence bound of mean(sample) − mean(reference)."""
    diff = statistics.fmean(sample) - statistics.fmean(reference)
    va, vb = statistics.variance(sample), statistics.variance(reference)
    na, nb = len(sample), len(reference)
    se2 = va / na + vb / nb
    if se2 == 0:
        return diff
    dof = se2 ** 2 / ((va / na) ** 2 / (na - 1) + (vb / nb) ** 2 / (nb - 1))
    return diff - _t_quantile(confidence, dof) * math.sqrt(se2)


def _check(epsilon_points: float, repeats: int, min_fraction: float, confidence: float) -> None:
    if isinstance(epsilon_points, bool) or not isinstance(epsilon_points, int | float) or \
            not (math.isfinite(epsilon_points) and epsilon_points >= 0):
        raise TrainschedError(f"epsilon_points must be a number >= 0 (accuracy points), got "
                              f"{epsilon_points!r}")
    if not (is_int(repeats) and repeats >= 2):
        raise TrainschedError(f"repeats must be a whole number >= 2 (a confidence bound needs "
                              f"a spread), got {repeats!r}")
    if not (isinstance(min_fraction, int | float) and 0 < min_fraction <= 0.5):
        raise TrainschedError(f"min_fraction must be in (0, 0.5] (the first candidate is "
                              f"0.5), got {min_fraction!r}")
    if not (isinstance(confidence, int | float) and 0.5 <= confidence < 1):
        raise TrainschedError(f"confidence must be in [0.5, 1), got {confidence!r}")


def search_bsp_fraction(run_trial: Callable[[float, int], float], *,
                        epsilon_points: float = 0.5, repeats: int = 3,
                        min_fraction: float = 1 / 64, confidence: float = 0.9, seed: int,
                        time_model: TimeModel | None = None) -> SearchResult:
    """Halve the BSP fraction while it stays within ``epsilon_points`` of BSP (module
    docstring). ``run_trial(fraction, seed)`` trains one run and returns its accuracy in
    points; the reference runs ``fraction = 1.0``."""
    _check(epsilon_points, repeats, min_fraction, confidence)
    trials: list[Trial] = []

    def run(fraction: float) -> list[float]:
        out = []
        for _ in range(repeats):
            s = trial_seed(seed, len(trials))
            accuracy = run_trial(fraction, s)
            if isinstance(accuracy, bool) or not isinstance(accuracy, int | float) or \
                    not math.isfinite(accuracy):
                raise TrainschedError(f"run_trial({fraction}, {s}) returned {accuracy!r}; it "
                                      f"must return the run's accuracy as a finite number")
            trials.append(Trial(fraction=fraction, seed=s, accuracy=float(accuracy),
                                time_s=None if time_model is None
                                else time_model.time_s(fraction)))
            out.append(float(accuracy))
        return out

    reference = run(1.0)
    chosen, candidates = 1.0, []
    fraction = 0.5
    while fraction >= min_fraction:
        accuracies = run(fraction)
        bound = lower_bound(accuracies, reference, confidence)
        passed = bound >= -epsilon_points
        candidates.append(Candidate(
            fraction=fraction,
            mean_difference=statistics.fmean(accuracies) - statistics.fmean(reference),
            lower_bound=bound, passed=passed))
        if not passed:
            break
        chosen = fraction
        fraction /= 2
    total = None if time_model is None else math.fsum(t.time_s for t in trials
                                                      if t.time_s is not None)
    return SearchResult(fraction=chosen, reference_accuracy=statistics.fmean(reference),
                        candidates=tuple(candidates), trials=tuple(trials), total_time_s=total)
