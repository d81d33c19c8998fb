"""Pipeline schedule generators: GPipe and 1F1B, and the registry of every generator.

:func:`gpipe` and :func:`one_f_one_b` return a validated :class:`~trainsched.plan.Schedule` for
``num_stages`` stages on as many ranks (stage ``s`` on rank ``s``) and ``num_microbatches``
micro-batches. The orders are PyTorch pipelining's (``ScheduleGPipe``, ``Schedule1F1B``) with its
idle slots and ``REDUCE_GRAD`` actions left out, so a generated schedule and PyTorch's agree
action for action. ``split_backward=True`` writes each full backward ``B`` as ``I`` then ``W``
right after it: the in-order baseline that out-of-order policies reorder.

:data:`SCHEDULES` names every generator, those that fill the bubble included
(:mod:`~trainsched.backprop.fast_forward`, :mod:`~trainsched.backprop.interleaved`,
:mod:`~trainsched.backprop.zero_bubble`). A registered generator is called
``(num_ranks, num_microbatches, ...)``; its tags say how: ``chunks`` (stages per rank, default
1: the model is cut into ``chunks × num_ranks`` stages), ``split`` (it always writes ``I`` and
``W``, so it takes no ``split_backward``), ``costs`` (it plans with the stages' costs, passed as
``stages=``) and ``compare`` (a row of ``trainsched compare``). :func:`build_schedule` applies
one by name.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from trainsched.backprop.fast_forward import fast_forward, modulo
from trainsched.backprop.interleaved import interleaved_1f1b, interleaved_zero_bubble, zb_h1, zbv
from trainsched.backprop.stages import StageCosts, uniform_stages
from trainsched.backprop.zero_bubble import zb_h2, zero_bubble
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


def fast_forward_push(num_ranks: int, num_microbatches: int, *, group: int | None = None
                      ) -> Schedule:
    """Fast-forwarding's push variant in groups of ``group`` micro-batches (default: one per
    rank, so that each group fills the pipeline once)."""
    return fast_forward(num_ranks, num_microbatches,
                        group=num_ranks if group is None else group)


#: Schedule generators by name (module docstring for the tags).
SCHEDULES: Registry[Callable[..., Schedule]] = Registry("pipeline schedule", "schedules")
SCHEDULES.register("gpipe", gpipe, compare=True)
SCHEDULES.register("1f1b", one_f_one_b, compare=True)
SCHEDULES.register("interleaved-1f1b", interleaved_1f1b, chunks=2, compare=True)
SCHEDULES.register("fast-forward", fast_forward, split=True, compare=True)
SCHEDULES.register("fast-forward-push", fast_forward_push, split=True, compare=True)
SCHEDULES.register("modulo", modulo, split=True, chunks=2, compare=True)
SCHEDULES.register("zb-h1", zb_h1, split=True, compare=True)
SCHEDULES.register("zb-h2", zb_h2, split=True, compare=True)
SCHEDULES.register("interleaved-zb", interleaved_zero_bubble, split=True, chunks=2, compare=True)
SCHEDULES.register("zbv", zbv, split=True, chunks=2, compare=True)
SCHEDULES.register("zb-greedy", zero_bubble, split=True, costs=True, compare=True)


def _options(generator: Callable[..., Schedule]) -> list[str]:
    return [p.name for p in inspect.signature(generator).parameters.values()
            if p.kind == p.KEYWORD_ONLY]


def schedule_stage_count(name: str, num_ranks: int, **options: Any) -> int:
    """How many stages schedule ``name`` runs on ``num_ranks`` ranks (``chunks`` per rank,
    from ``options`` or the registry's tag), so that the model can be cut before it is built."""
    generator = SCHEDULES.lookup(name)
    tags = SCHEDULES.tags(name.strip().lower())
    if "chunks" in options and "chunks" not in _options(generator):
        raise TrainschedError(f"pipeline schedule {name!r} runs {tags.get('chunks', 1)} "
                              "stage(s) per rank; it takes no chunks option")
    return num_ranks * options.get("chunks", tags.get("chunks", 1))


def stage_ranks(name: str, num_ranks: int, num_microbatches: int,
                **options: Any) -> tuple[int, ...]:
    """The rank of each stage of schedule ``name`` on ``num_ranks`` ranks (its
    ``stage_to_rank``), known before the model is cut, so that a cut can balance what each rank
    computes (``stage_costs_from_graph(..., stage_to_rank=)``). One stage per rank: stage r on
    rank r; several: the placement of the schedule built with equal stage costs (loop for
    interleaved and modulo, V-shaped for ZBV)."""
    count = schedule_stage_count(name, num_ranks, **options)
    if count == num_ranks:
        return tuple(range(num_ranks))
    stages = uniform_stages(count, 1.0, 1.0, 1.0)
    schedule = build_schedule(name, num_ranks, num_microbatches, stages=stages, **options)
    assert schedule.stage_to_rank is not None
    return tuple(schedule.stage_to_rank)


def build_schedule(name: str, num_ranks: int, num_microbatches: int,
                   split_backward: bool = False, *, stages: StageCosts | None = None,
                   **options: Any) -> Schedule:
    """The schedule generator registered as ``name`` (see :data:`SCHEDULES`), applied.

    ``split_backward`` applies to generators that write fused ``B`` s (the others always split);
    ``stages`` (the costs of ``schedule_stage_count(name, num_ranks)`` stages) goes to those
    that plan with costs and is ignored by the others; ``options`` (``chunks``, ``ring``,
    ``group``, a greedy's ``memory_limit_bytes`` ...) go to the generator.
    """
    generator = SCHEDULES.lookup(name)
    tags = SCHEDULES.tags(name.strip().lower())
    if tags.get("costs"):
        options = {**options, "stages": stages}
    known = _options(generator)
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise TrainschedError(f"pipeline schedule {name!r} takes no option {unknown[0]!r}; its "
                              f"options: {', '.join(known) or 'none'}")
    if tags.get("split"):
        return generator(num_ranks, num_microbatches, **options)
    return generator(num_ranks, num_microbatches, split_backward, **options)


def bubble_fraction_ideal(num_stages: int, num_microbatches: int) -> float:
    """(p - 1) / (m + p - 1): the idle share of GPipe and 1F1B with equal stage costs, no comm.

    The makespan is (m + p - 1) slots of F + B per rank, of which m are busy; the simulator must
    reproduce this for equal stage costs.
    """
    _check_sizes(num_stages, num_microbatches)
    return (num_stages - 1) / (num_microbatches + num_stages - 1)
