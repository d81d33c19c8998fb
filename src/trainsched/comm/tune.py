"""Auto-tuning ByteScheduler's partition size and credit (``specs/comm.md`` §7).

:func:`tune` searches (partition, credit) by Bayesian optimisation in log space over a
user-given range, with optuna's TPE sampler (seeded, so a run is reproducible): first
``startup_trials`` random points (ByteScheduler: 10), then ``guided_trials`` points the sampler
picks from what it has seen (ByteScheduler: 5). It returns the best point seen and every trial.

Offline, the objective is any callable ``(partition_bytes, credit_bytes) -> seconds per step``:

- :func:`trainsched.sim.tune.simulated_objective` simulates ``steps`` steps of a training graph
  on a cluster with :class:`~trainsched.comm.policy.ByteSchedulerPolicy` at that point
  (offline, in milliseconds; it lives with the simulator, which this module never imports);
- :func:`trainsched.runtime.train.run_trial` trains on real ranks at that point (``trainsched
  train --autotune``).

:func:`grid_search` evaluates a grid, the reference a tuner's result is compared with.

Online, :class:`OnlineTuner` runs the same search inside one training job, fed one step time at
a time: it tells the runtime at which step to switch to which point, on a fixed schedule of
steps that every rank can compute (``specs/comm.md`` §7: rank 0 decides, every rank switches
at the same step). :func:`tuned_policy` turns a point into the policy to run, the same way for
the simulator and the runtime.
Needs optuna (``pip install 'trainsched[tune]'``); plain Python otherwise, no torch.
"""

from __future__ import annotations

import contextlib
import math
import numbers
import statistics
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

from trainsched.comm.policy import MiB
from trainsched.errors import TrainschedError

__all__ = [
    "DEFAULT_CREDIT_RANGE",
    "DEFAULT_PARTITION_RANGE",
    "Objective",
    "OnlineTuner",
    "Trial",
    "TuneResult",
    "grid_search",
    "tune",
    "tuned_policy",
]

#: (partition_bytes, credit_bytes) -> step time in seconds.
Objective = Callable[[int, int], float]

#: Search ranges in bytes: ByteScheduler's all-reduce ranges (2-32M and 4-64M fp32 elements)
#: widened down to 1 MiB, where small models and slow networks want to be.
DEFAULT_PARTITION_RANGE = (1 * MiB, 128 * MiB)
DEFAULT_CREDIT_RANGE = (1 * MiB, 256 * MiB)


@dataclass(frozen=True, kw_only=True)
class Trial:
    """One evaluated point: ``phase`` is ``"startup"`` (random), ``"guided"``, ``"grid"`` or,
    online, ``"start"`` (the configuration the job started with)."""

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


class _Search:
    """The search itself, ask and tell: optuna's seeded TPE over (partition, credit) in log
    space, points snapped to multiples of the granularity inside the ranges."""

    def __init__(self, partition_range: Any, credit_range: Any, startup_trials: Any,
                 guided_trials: Any, seed: Any, granularity_bytes: Any) -> None:
        self.step = _check_count("granularity_bytes", granularity_bytes, 1)
        self.p_range = _snapped_range("partition_range", partition_range, self.step)
        self.c_range = _snapped_range("credit_range", credit_range, self.step)
        self.startup = _check_count("startup_trials", startup_trials, 1)
        self.guided = _check_count("guided_trials", guided_trials, 0)
        if not (isinstance(seed, int) and not isinstance(seed, bool)):
            raise TrainschedError(f"seed must be an integer, got {seed!r}")
        try:
            import optuna
        except ImportError:
            raise TrainschedError("auto-tuning needs optuna: pip install 'trainsched[tune]' "
                                  "(or pip install optuna)") from None
        self.optuna = optuna
        with self._quiet():
            sampler = optuna.samplers.TPESampler(n_startup_trials=self.startup, seed=seed)
            self.study = optuna.create_study(direction="minimize", sampler=sampler)
        self.trials: list[Trial] = []
        self.asked: Any = None  # the optuna trial asked and not told yet
        self.point: tuple[int, int] | None = None

    @property
    def total(self) -> int:
        return self.startup + self.guided

    @property
    def finished(self) -> bool:
        return len(self.trials) >= self.total

    @contextlib.contextmanager
    def _quiet(self) -> Iterator[None]:
        """No log line per trial (a failing trial raises instead)."""
        logging = self.optuna.logging
        level = logging.get_verbosity()
        logging.set_verbosity(logging.ERROR)
        try:
            yield
        finally:
            logging.set_verbosity(level)

    def _snap(self, value: float, lo: int, hi: int) -> int:
        return min(hi, max(lo, round(value / self.step) * self.step))

    def ask(self) -> tuple[int, int]:
        """The next point to evaluate."""
        assert self.asked is None and not self.finished
        with self._quiet():
            trial = self.study.ask()
            p = trial.suggest_float("partition_bytes", *self.p_range, log=True)
            c = trial.suggest_float("credit_bytes", *self.c_range, log=True)
        self.asked = trial
        self.point = (self._snap(p, *self.p_range), self._snap(c, *self.c_range))
        return self.point

    def tell(self, seconds: float) -> Trial:
        """The step time measured at the point last asked."""
        assert self.asked is not None and self.point is not None
        with self._quiet():
            self.study.tell(self.asked, seconds)
        done = Trial(number=len(self.trials), partition_bytes=self.point[0],
                     credit_bytes=self.point[1], step_time_s=seconds,
                     phase="startup" if len(self.trials) < self.startup else "guided")
        self.trials.append(done)
        self.asked = None
        return done


def _best(trials: Sequence[Trial]) -> TuneResult:
    best = min(trials, key=lambda t: (t.step_time_s, t.number))
    return TuneResult(partition_bytes=best.partition_bytes, credit_bytes=best.credit_bytes,
                      step_time_s=best.step_time_s, trials=tuple(trials))


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
    search = _Search(partition_range, credit_range, startup_trials, guided_trials, seed,
                     granularity_bytes)
    while not search.finished:
        partition, credit = search.ask()
        done = search.tell(_measure(objective, partition, credit))
        if on_trial is not None:
            on_trial(done)
    return _best(search.trials)


class OnlineTuner:
    """The search of :func:`tune` run inside one training job, one step time at a time.

    The runtime (:class:`trainsched.runtime.data_parallel.ScheduledDataParallel`, on rank 0)
    calls :meth:`observe` with every step's time; when a switch is due the tuner answers
    ``(apply_at_step, (partition_bytes, credit_bytes))`` and the runtime switches every rank at
    that step. The schedule is fixed by the options alone, so every rank knows
    :attr:`total_steps` without being told:

    - steps ``[0, warmup_steps)``: ignored (start-up, caches, the first plan: the first
      measurements of a job are discarded);
    - trial 0, ``"start"``: the configuration the job started with, ``trial_steps`` steps;
    - trials 1..K (``startup_trials`` random, then ``guided_trials`` guided): each applies at
      its first step, whose ``settle_steps`` first steps are discarded (the switch drains and
      rebuilds), then ``trial_steps`` steps are measured; one more step runs on the old point
      while the next one is published (the switch takes effect two steps after the step that
      decided it: rank 0 publishes the point during one step, every rank reads it the next);
    - confirmation, ``"confirm"`` trials: the ``confirm_points`` fastest points so far (the
      start point among them) run again, ``confirm_rounds`` times, in rounds that alternate
      their order (A B C, C B A, ...), on the same trial schedule. Step times drift over
      minutes on a shared machine, which favours whichever trials ran in a quiet spell; the
      alternating rounds put every candidate at the same mean position in time, so a linear
      drift cancels. Each candidate's time is the median of its confirmation trials;
    - at :attr:`total_steps`: the best point (by its confirmation time, or without
      confirmation the fastest trial, the start point included, so tuning never ends on a
      point measured slower than where it began) applies for the rest of the run.

    A trial's time is the median of its measured steps (step times drift and jump on shared
    machines). :attr:`result` holds every trial and the chosen point.
    """

    def __init__(self, *, partition_range: tuple[int, int] = DEFAULT_PARTITION_RANGE,
                 credit_range: tuple[int, int] = DEFAULT_CREDIT_RANGE,
                 startup_trials: int = 10, guided_trials: int = 5, seed: int = 0,
                 granularity_bytes: int = 4096, warmup_steps: int = 3, settle_steps: int = 1,
                 trial_steps: int = 5, confirm_points: int = 3, confirm_rounds: int = 2,
                 on_trial: Callable[[Trial], None] | None = None) -> None:
        self.search = _Search(partition_range, credit_range, startup_trials, guided_trials,
                              seed, granularity_bytes)
        self.warmup_steps = _check_count("warmup_steps", warmup_steps, 0)
        self.settle_steps = _check_count("settle_steps", settle_steps, 0)
        self.trial_steps = _check_count("trial_steps", trial_steps, 1)
        self.confirm_points = _check_count("confirm_points", confirm_points, 1)
        self.confirm_rounds = _check_count("confirm_rounds", confirm_rounds, 0)
        # The candidates are only known once the search is over: the schedule counts as many
        # confirmation trials as there could be (the start point plus every search trial).
        self.n_confirm = min(self.confirm_points, 1 + self.search.total) * self.confirm_rounds
        self.candidates: list[tuple[int, int]] = []
        self.confirm_order: list[tuple[int, int]] = []
        self.on_trial = on_trial
        self.trials: list[Trial] = []
        self.start: tuple[int, int] | None = None
        self.times: list[float] = []  # the current trial's measured steps
        self.last_step = -1
        self.switches: list[tuple[int, tuple[int, int]]] = []

    @property
    def period(self) -> int:
        """Steps from one trial's switch to the next: settle, measure, publish."""
        return self.settle_steps + self.trial_steps + 1

    def trial_start(self, k: int) -> int:
        """The step at which trial ``k`` (0: the start configuration) begins."""
        if k == 0:
            return self.warmup_steps
        return self.warmup_steps + self.trial_steps + 1 + (k - 1) * self.period

    @property
    def n_trials(self) -> int:
        """Trials after the start point: the search's, then the confirmation's."""
        return self.search.total + self.n_confirm

    @property
    def total_steps(self) -> int:
        """The step from which the chosen point runs (tuning is over)."""
        return self.trial_start(self.n_trials + 1)

    @property
    def finished(self) -> bool:
        return len(self.trials) > self.n_trials

    def begin(self, partition_bytes: int, credit_bytes: int) -> None:
        """The configuration the job starts with (trial 0)."""
        self.start = (partition_bytes, credit_bytes)

    def _window(self, k: int) -> tuple[int, int]:
        """Trial ``k``'s measured steps, [first, last]."""
        first = self.trial_start(k) + (self.settle_steps if k else 0)
        return first, first + self.trial_steps - 1

    def observe(self, step: int, step_time_s: float) -> tuple[int, tuple[int, int]] | None:
        """Step ``step`` took ``step_time_s``; returns the switch this calls for, if any:
        ``(apply_at_step, (partition_bytes, credit_bytes))`` with ``apply_at_step = step +
        2``. Steps must come in order, each once."""
        if self.start is None:
            raise TrainschedError("OnlineTuner.begin(partition, credit) must come first")
        if step <= self.last_step:
            raise TrainschedError(f"step {step} observed after step {self.last_step}")
        self.last_step = step
        if self.finished:
            return None
        k = len(self.trials)
        first, last = self._window(k)
        if step < first:
            return None
        if step > last:
            raise TrainschedError(f"step {step} comes after trial {k}'s last step {last} "
                                  f"without it: observe every step")
        self.times.append(_checked_time(step_time_s, step))
        if step < last:
            return None
        seconds = statistics.median(self.times)
        self.times = []
        if k == 0:
            done = Trial(number=0, partition_bytes=self.start[0], credit_bytes=self.start[1],
                         step_time_s=seconds, phase="start")
        elif k <= self.search.total:
            told = self.search.tell(seconds)
            done = replace(told, number=k)
        else:
            p, c = self.confirm_order[k - self.search.total - 1]
            done = Trial(number=k, partition_bytes=p, credit_bytes=c, step_time_s=seconds,
                         phase="confirm")
        self.trials.append(done)
        if self.on_trial is not None:
            self.on_trial(done)
        if k == self.search.total and self.n_confirm:
            self._plan_confirmation()
        if not self.search.finished:
            point = self.search.ask()
        elif k < self.n_trials:
            point = self.confirm_order[k - self.search.total]
        else:
            best = self.result
            assert best is not None
            point = (best.partition_bytes, best.credit_bytes)
        self.switches.append((step + 2, point))
        return step + 2, point

    def _plan_confirmation(self) -> None:
        """The fastest distinct points of the search, and the alternating rounds."""
        for t in sorted(self.trials, key=lambda t: (t.step_time_s, t.number)):
            point = (t.partition_bytes, t.credit_bytes)
            if point not in self.candidates and len(self.candidates) < self.confirm_points:
                self.candidates.append(point)
        # Rounds alternate their direction; with fewer distinct points than the schedule
        # counted on (a repeated point), more rounds fill its trials.
        order: list[tuple[int, int]] = []
        while len(order) < self.n_confirm:
            forward = len(order) // len(self.candidates) % 2 == 0
            order += self.candidates if forward else self.candidates[::-1]
        self.confirm_order = order[:self.n_confirm]

    @property
    def result(self) -> TuneResult | None:
        """The chosen point so far and every trial (``None`` before the first one ends): once
        confirmation trials exist, the candidate with the lowest median over them (ties: the
        earlier candidate), whose ``step_time_s`` is that median; before, the fastest trial."""
        if not self.trials:
            return None
        confirms = [t for t in self.trials if t.phase == "confirm"]
        if not confirms:
            return _best(self.trials)
        times = {point: [t.step_time_s for t in confirms
                         if (t.partition_bytes, t.credit_bytes) == point]
                 for point in self.candidates}  # fmt: skip
        rank = sorted((statistics.median(v), i, point)
                      for i, (point, v) in enumerate(times.items()) if v)
        seconds, _, point = rank[0]
        return TuneResult(partition_bytes=point[0], credit_bytes=point[1],
                          step_time_s=seconds, trials=tuple(self.trials))


def _checked_time(value: Any, step: int) -> float:
    number = isinstance(value, numbers.Real) and not isinstance(value, bool)
    if not (number and math.isfinite(value) and value > 0):
        raise TrainschedError(f"step {step}'s time must be seconds > 0, got {value!r}")
    return float(value)


def tuned_policy(policy: Any, partition_bytes: int, credit_bytes: int) -> Any:
    """``policy`` at a tuner's point: its partition and credit replaced; a policy that fuses
    small tensors fuses them up to one partition (so the partition sets every task's size, as
    the tuner assumes); in ``strict`` credit mode a credit below one partition is raised to
    one partition (a smaller one could never admit a partition)."""
    names = {f.name for f in fields(policy)} if hasattr(policy, "__dataclass_fields__") else ()
    if not {"partition_bytes", "credit_bytes"} <= set(names):
        raise TrainschedError(f"{type(policy).__name__} has no partition and credit to tune; "
                              f"use the priority or bytescheduler policy")
    changes: dict[str, Any] = {"partition_bytes": partition_bytes,
                               "credit_bytes": credit_bytes}
    if "fusion_bytes" in names:
        changes["fusion_bytes"] = partition_bytes
    if getattr(policy, "credit_mode", None) == "strict":
        changes["credit_bytes"] = max(credit_bytes, partition_bytes)
    return replace(policy, **changes)


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
    return _best(trials)
