"""Several measured captures of one model made into one graph: each op's times the median of
its times over the captures (:func:`median_costs`).

A capture times each op for a fraction of a second, one op after another, while a shared host's
speed moves over seconds: on this project's 2-core VM nine captures of ResNet-50 (batch 8,
32 px) made one after another summed 157-186 ms of compute, 16% apart, while the model's
training step measured the same within 1% over four runs in half an hour. The per-op median of
three captures summed 162-178 ms. A capture repeated (``capture_beside(..., passes=3)``) gives
the simulator costs that depend less on the second they were taken.

Plain Python: no torch here.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence

from trainsched.errors import TrainschedError
from trainsched.graph.core import Graph, Op

__all__ = ["CAPTURE_PASSES", "TIME_FIELDS", "median_costs"]

#: ``meta`` key: how many captures an op's times are the median of.
CAPTURE_PASSES = "capture_passes"

#: The measured times of an op, each merged as the median over the captures.
TIME_FIELDS = ("compute_s", "compute_p10_s", "compute_p90_s",
               "backward_input_s", "backward_input_p10_s", "backward_input_p90_s",
               "backward_weight_s", "backward_weight_p10_s", "backward_weight_p90_s")


def median_costs(graphs: Sequence[Graph]) -> Graph:
    """One graph of ``graphs``, captures of the same model: the ops and edges of the first,
    each time of :data:`TIME_FIELDS` the median of that op's over the captures (a p10 stays at
    most its median and a p90 at least: the medians of ordered values keep their order), the
    samples summed, and the ``meta`` of the median capture (the one whose ops' compute adds up
    to the median total; its eager-step and optimizer records belong together) with
    ``meta["capture_passes"]``. One graph is returned as it is.
    """
    if not graphs:
        raise TrainschedError("median_costs needs at least one captured graph")
    if len(graphs) == 1:
        return graphs[0]
    first = graphs[0]
    for k, other in enumerate(graphs[1:], start=2):
        _check_same(first, other, k)
    totals = [sum(op.compute_s for op in g.ops) for g in graphs]
    middle = sorted(range(len(graphs)), key=lambda i: (totals[i], i))[(len(graphs) - 1) // 2]
    columns = [g.ops for g in graphs]
    ops = [_median_op(tuple(ops_i)) for ops_i in zip(*columns, strict=True)]
    meta = {**graphs[middle].meta, CAPTURE_PASSES: len(graphs)}
    return Graph(ops, first.edges, meta)


def _median_op(ops: tuple[Op, ...]) -> Op:
    changes: dict[str, float | int | None] = {"samples": sum(op.samples for op in ops)}
    for field in TIME_FIELDS:
        values = [getattr(op, field) for op in ops]
        if all(v is None for v in values):
            continue
        if any(v is None for v in values):
            raise TrainschedError(f"the captures differ at op {ops[0].name!r}: {field} was "
                                  f"measured in some and not in others; capture them alike")
        changes[field] = statistics.median(values)
    return dataclasses.replace(ops[0], **changes)


def _check_same(first: Graph, other: Graph, k: int) -> None:
    """The captures must be of one model: the same ops (names and kinds) and edges."""
    ours = [(op.name, op.kind) for op in first.ops]
    theirs = [(op.name, op.kind) for op in other.ops]
    if ours != theirs:
        where = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b),
                     min(len(ours), len(theirs)))
        raise TrainschedError(
            f"capture {k} is not of the same model as the first: {len(theirs)} ops against "
            f"{len(ours)}, first difference at op {where}; capture one model with the same "
            f"inputs each time")
    if first.edges != other.edges:
        raise TrainschedError(f"capture {k} has other edges than the first; capture one model "
                              f"with the same inputs each time")
