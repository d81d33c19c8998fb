"""Pipeline schedule generators: GPipe and 1F1B, the baselines of out-of-order pipelines.

Each generator returns a validated :class:`~trainsched.plan.Schedule` for ``num_stages`` stages
on as many ranks (stage ``s`` on rank ``s``) and ``num_microbatches`` micro-batches. The orders
are PyTorch pipelining's (``ScheduleGPipe``, ``Schedule1F1B``) with its idle slots and
``REDUCE_GRAD`` actions left out, so a generated schedule and PyTorch's agree action for action.
``split_backward=True`` writes each full backward ``B`` as ``I`` then ``W`` right after it: the
in-order baseline that out-of-order policies reorder.
"""

from __future__ import annotations

from collections.abc import Callable

from trainsched.errors import TrainschedError
from trainsched.plan import Action, Schedule
from trainsched.registry import Registry


def _check_sizes(num_stages: int, num_microbatches: int) -> None:
    for name, value in (("num_stages", num_stages), ("num_microbatches", num_microbatches)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise TrainschedError(f"{name} must be an integer >= 1, got {value!r}")


def _forward(stage: int, microbatch: int) -> list[Action]:
    return [Action(stage=stage, kind="F", microbatch=microbatch)]


def _backward(stage: int, microbatch: int, split: bool) -> list[Action]:
    kinds = ("I", "W") if split else ("B",)
    return [Action(stage=stage, kind=k, microbatch=microbatch) for k in kinds]


def _validated(rows: list[list[Action]], num_stages: int, num_microbatches: int) -> Schedule:
    schedule = Schedule(ranks=tuple(map(tuple, rows)), num_stages=num_stages,
                        num_microbatches=num_microbatches)  # fmt: skip
    schedule.validate()
    return schedule


def gpipe(num_stages: int, num_microbatches: int, split_backward: bool = False) -> Schedule:
    """GPipe (fill-drain): every rank runs F0..F(m-1), then the backwards B0..B(m-1).

    Backwards go in ascending micro-batch order, as PyTorch's ``ScheduleGPipe`` runs them (the
    makespan equals the reverse order's: (m + p - 1)(F + B) for equal stage costs). Every
    rank holds the activations of all m micro-batches at the peak.
    """
    _check_sizes(num_stages, num_microbatches)
    rows = []
    for rank in range(num_stages):
        row = [a for m in range(num_microbatches) for a in _forward(rank, m)]
        row += [a for m in range(num_microbatches) for a in _backward(rank, m, split_backward)]
        rows.append(row)
    return _validated(rows, num_stages, num_microbatches)


def one_f_one_b(num_stages: int, num_microbatches: int, split_backward: bool = False) -> Schedule:
    """1F1B (PipeDream-Flush): warm-up forwards, then one forward and one backward in turn.

    Rank r runs w = min(m, p - 1 - r) warm-up forwards, then pairs F(w + k), B(k) until the
    forwards run out, then the remaining backwards. At most min(m, p - r) micro-batches are in
    flight on rank r (GPipe: m), for the same makespan. Valid for any m >= 1, also m < p
    (PyTorch's ``Schedule1F1B`` requires m >= p).
    """
    _check_sizes(num_stages, num_microbatches)
    p, m = num_stages, num_microbatches
    rows = []
    for rank in range(p):
        warmup = min(m, p - 1 - rank)
        row = [a for k in range(warmup) for a in _forward(rank, k)]
        for k in range(m - warmup):
            row += _forward(rank, warmup + k) + _backward(rank, k, split_backward)
        row += [a for k in range(m - warmup, m) for a in _backward(rank, k, split_backward)]
        rows.append(row)
    return _validated(rows, p, m)


#: Schedule generators by name; ``compare=True``: a row of ``trainsched compare``.
SCHEDULES: Registry[Callable[..., Schedule]] = Registry("pipeline schedule", "schedules")
SCHEDULES.register("gpipe", gpipe, compare=True)
SCHEDULES.register("1f1b", one_f_one_b, compare=True)


def build_schedule(
    name: str, num_stages: int, num_microbatches: int, split_backward: bool = False
) -> Schedule:
    """The schedule generator registered as ``name`` (see :data:`SCHEDULES`), applied."""
    return SCHEDULES.lookup(name)(num_stages, num_microbatches, split_backward)


def bubble_fraction_ideal(num_stages: int, num_microbatches: int) -> float:
    """(p - 1) / (m + p - 1): the idle share of GPipe and 1F1B with equal stage costs, no comm.

    The makespan is (m + p - 1) slots of F + B per rank, of which m are busy; the simulator must
    reproduce this for equal stage costs.
    """
    _check_sizes(num_stages, num_microbatches)
    return (num_stages - 1) / (num_microbatches + num_stages - 1)
