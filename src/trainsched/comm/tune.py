"""Auto-tuning ByteScheduler's partition size and credit (``specs/comm.md`` §7).

:func:`tune` searches (partition, credit) by Bayesian optimisation in log space over a
user-given range, with optuna's TPE sampler (seeded, so a run is reproducible): first
``startup_trials`` random points (ByteScheduler: 10), then ``guided_trials`` points the sampler
picks from what it has seen (ByteScheduler: 5). It returns the best point seen and every trial.

The objective is any callable ``(partition_bytes, credit_bytes) -> seconds per step``:

- :func:`simulated_objective` simulates ``steps`` steps of a training graph on a cluster with
  :class:`~trainsched.comm.policy.ByteSchedulerPolicy` at that point (offline, in
  milliseconds);
- :func:`trainsched.runtime.train.run_trial` trains on real ranks at that point (``trainsched
  train --autotune``).

:func:`grid_search` evaluates a grid, the reference a tuner's result is compared with.
Needs optuna (``pip install 'trainsched[tune]'``); plain Python otherwise, no torch.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from trainsched.comm.policy import ByteSchedulerPolicy, MiB
from trainsched.errors import TrainschedError
from trainsched.sim.data_parallel import simulate_data_parallel

__all__ = [
    "DEFAULT_CREDIT_RANGE",
    "DEFAULT_PARTITION_RANGE",
    "Objective",
    "Trial",
    "TuneResult",
    "grid_search",
    "simulated_objective",
    "tune",
]

#: (partition_bytes, credit_bytes) -> step time in seconds.
Objective = Callable[[int, int], float]

#: Search ranges in bytes: ByteScheduler's all-reduce ranges (2-32M and 4-64M fp32 elements)
#: widened down to 1 MiB, where small models and slow networks want to be.
DEFAULT_PARTITION_RANGE = (1 * MiB, 128 * MiB)
DEFAULT_CREDIT_RANGE = (1 * MiB, 256 * MiB)


@dataclass(frozen=True, kw_only=True)
class Trial:
    """One evaluated point: ``phase`` is ``"startup"`` (random) or ``"guided"``."""

    number: int
    partition_bytes: int
    credit_bytes: int
    step_time_s: float
    phase: str

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True, kw_only=True)
class TuneResult:
    """The best point seen (ties: the earliest trial) and every trial in order."""

    partition_bytes: int
    credit_bytes: int
    step_time_s: float
    trials: tuple[Trial, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"partition_bytes": self.partition_bytes, "credit_bytes": self.credit_bytes,
                "step_time_s": self.step_time_s,
                "trials": [t.to_dict() for t in self.trials]}


def _check_range(name: str, value: Any) -> tuple[int, int]:
    ok = (isinstance(value, Sequence) and len(value) == 2
          and all(isinstance(v, int) and not isinstance(v, bool) for v in value))
    if not ok or not 0 < value[0] <= value[1]:
        raise TrainschedError(f"{name} must be two integers 0 < low <= high (bytes), got "
                              f"{value!r}")
    return int(value[0]), int(value[1])


def _snapped_range(name: str, value: Any, step: int) -> tuple[int, int]:
    """The range's multiples of ``step``: its lowest and highest."""
    lo, hi = _check_range(name, value)
    first, last = -(-lo // step) * step, hi // step * step
    if first > last:
        raise TrainschedError(f"{name} {lo}-{hi} B holds no multiple of the granularity "
                              f"({step} B); widen it or lower granularity_bytes")
    return first, last


def _check_count(name: str, value: Any, minimum: int) -> int:
    if not (isinstance(value, int) and not isinstance(value, bool) and value >= minimum):
        raise TrainschedError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def _measure(objective: Objective, partition: int, credit: int) -> float:
    value = objective(partition, credit)
    number = isinstance(value, numbers.Real) and not isinstance(value, bool)
    if not (number and math.isfinite(value) and value > 0):
        raise TrainschedError(f"the tuning objective must return a step time in seconds > 0, "
                              f"got {value!r} at partition {partition} B, credit {credit} B")
    return float(value)


def tune(objective: Objective, *,
         partition_range: tuple[int, int] = DEFAULT_PARTITION_RANGE,
         credit_range: tuple[int, int] = DEFAULT_CREDIT_RANGE,
         startup_trials: int = 10, guided_trials: int = 5, seed: int = 0,
         granularity_bytes: int = 4096,
         on_trial: Callable[[Trial], None] | None = None) -> TuneResult:
    """Minimise ``objective(partition_bytes, credit_bytes)`` over the two ranges (bytes, both
    ends included, searched in log space) in ``startup_trials`` random and then
    ``guided_trials`` TPE-guided trials. Points are rounded to multiples of
    ``granularity_bytes`` inside the range (4 KiB: a whole number of elements of any dtype,
    as a real partition must be; 1 for any byte count). The same ``seed`` and objective give
    the same trials. ``on_trial`` is called after each trial (progress output)."""
    step = _check_count("granularity_bytes", granularity_bytes, 1)
    p_lo, p_hi = _snapped_range("partition_range", partition_range, step)
    c_lo, c_hi = _snapped_range("credit_range", credit_range, step)
    startup = _check_count("startup_trials", startup_trials, 1)
    guided = _check_count("guided_trials", guided_trials, 0)
    if not (isinstance(seed, int) and not isinstance(seed, bool)):
        raise TrainschedError(f"seed must be an integer, got {seed!r}")
    try:
        import optuna
    except ImportError:
        raise TrainschedError("auto-tuning needs optuna: pip install 'trainsched[tune]' "
                              "(or pip install optuna)") from None

    def snap(value: float, lo: int, hi: int) -> int:
        return min(hi, max(lo, round(value / step) * step))

    trials: list[Trial] = []

    def run(trial: Any) -> float:
        partition = snap(trial.suggest_float("partition_bytes", p_lo, p_hi, log=True),
                         p_lo, p_hi)
        credit = snap(trial.suggest_float("credit_bytes", c_lo, c_hi, log=True), c_lo, c_hi)
        seconds = _measure(objective, partition, credit)
        done = Trial(number=len(trials), partition_bytes=partition, credit_bytes=credit,
                     step_time_s=seconds,
                     phase="startup" if len(trials) < startup else "guided")
        trials.append(done)
        if on_trial is not None:
            on_trial(done)
        return seconds

    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.ERROR)  # a failing trial raises, no log
    try:
        sampler = optuna.samplers.TPESampler(n_startup_trials=startup, seed=seed)
        study = optuna.create_study(direction="minimize", sampler=sampler)
        study.optimize(run, n_trials=startup + guided, catch=())
    finally:
        optuna.logging.set_verbosity(verbosity)
    best = min(trials, key=lambda t: (t.step_time_s, t.number))
    return TuneResult(partition_bytes=best.partition_bytes, credit_bytes=best.credit_bytes,
                      step_time_s=best.step_time_s, trials=tuple(trials))


def grid_search(objective: Objective, partitions: Iterable[int],
                credits: Iterable[int]) -> TuneResult:
    """Every (partition, credit) of the grid, partitions outer; the best as :func:`tune`
    reports it (all trials are ``"grid"`` ones)."""
    points = [(p, c) for p in partitions for c in credits]
    if not points:
        raise TrainschedError("grid_search needs at least one partition and one credit")
    trials = tuple(Trial(number=k, partition_bytes=p, credit_bytes=c,
                         step_time_s=_measure(objective, p, c), phase="grid")
                   for k, (p, c) in enumerate(points))  # fmt: skip
    best = min(trials, key=lambda t: (t.step_time_s, t.number))
    return TuneResult(partition_bytes=best.partition_bytes, credit_bytes=best.credit_bytes,
                      step_time_s=best.step_time_s, trials=trials)


def simulated_objective(graph: Any, cluster: Any, ranks: int, algorithm: str = "ring", *,
                        steps: int = 3, **policy_options: Any) -> Objective:
    """The simulator's step time (steady period of ``steps`` steps, see
    :func:`trainsched.sim.simulate_data_parallel`) of ``graph`` on ``ranks`` ranks of
    ``cluster`` with ``algorithm``, under :class:`ByteSchedulerPolicy` at the given partition
    and credit. ``policy_options`` go to the policy (``credit_mode``, ``cross_barrier``,
    ``fusion_bytes``); without ``fusion_bytes`` small neighbours are fused up to one partition
    (``fusion_bytes = partition_bytes``), so the partition size sets every task's size and
    the number of collectives, which is what pays each collective's start-up latency. With
    ``credit_mode="strict"`` a credit below the partition is raised to one partition."""

    def objective(partition_bytes: int, credit_bytes: int) -> float:
        options = {"fusion_bytes": partition_bytes, **policy_options}
        if options.get("credit_mode") == "strict":
            credit_bytes = max(credit_bytes, partition_bytes)
        policy = ByteSchedulerPolicy(partition_bytes=partition_bytes, credit_bytes=credit_bytes,
                                     **options)
        return simulate_data_parallel(graph, cluster, ranks=ranks, policy=policy,
                                      algorithm=algorithm, steps=steps).step_time_s

    ByteSchedulerPolicy(**{"fusion_bytes": MiB, **policy_options})  # bad options fail now
    return objective
