"""Building blocks of the pipeline schedule generators: size checks, actions, validated results.

Every generator in :mod:`trainsched.backprop` writes its rank lists with these helpers, so that
the same size errors and the same final check (:meth:`~trainsched.plan.Schedule.validate`)
apply to all of them.
"""

from __future__ import annotations

from collections.abc import Sequence

from trainsched.errors import TrainschedError
from trainsched.plan import Action, Schedule
from trainsched.units import is_int

__all__ = ["backward", "check_count", "check_sizes", "forward", "validated"]


def check_count(name: str, value: object, minimum: int = 1) -> int:
    """``value`` if it is an integer >= ``minimum``, else a TrainschedError naming ``name``."""
    if not is_int(value) or value < minimum:
        raise TrainschedError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def check_sizes(num_stages: int, num_microbatches: int) -> None:
    """Both counts are integers >= 1 (the first may be named num_ranks by the caller)."""
    check_count("num_stages", num_stages)
    check_count("num_microbatches", num_microbatches)


def forward(stage: int, microbatch: int) -> Action:
    return Action(stage=stage, kind="F", microbatch=microbatch)


def backward(stage: int, microbatch: int, split: bool) -> list[Action]:
    """``B``, or ``I`` then ``W`` when ``split``: the in-order backward of one micro-batch."""
    kinds = ("I", "W") if split else ("B",)
    return [Action(stage=stage, kind=k, microbatch=microbatch) for k in kinds]


def validated(rows: Sequence[Sequence[Action]], num_stages: int, num_microbatches: int,
              stage_to_rank: Sequence[int] | None = None) -> Schedule:
    """The :class:`Schedule` of ``rows`` (one list per rank), proven complete and deadlock-free."""
    schedule = Schedule(ranks=tuple(map(tuple, rows)), num_stages=num_stages,
                        num_microbatches=num_microbatches,
                        stage_to_rank=None if stage_to_rank is None else tuple(stage_to_rank))
    schedule.validate()
    return schedule
