"""DualPipeV: DeepSeek's DualPipe folded onto a V placement, in PyTorch pipelining's order.

Rank ``r`` of ``p`` holds two stages in a V (stage ``r`` going down and ``2p − 1 − r`` coming
back up, as :func:`~trainsched.backprop.interleaved.zbv`). Most of the step pairs a forward of
one stage with a full backward (``B``) of the other, which DualPipe runs overlapped (one slot
that hides each one's communication under the other's compute); the first and last phases
split backwards into ``I`` and ``W`` to fill the bubble, zero-bubble style.

PyTorch's ``ScheduleDualPipeV`` writes an overlapped pair as one fused ``OVERLAP_F_B`` action
whose parts are the forward and then the backward; trainsched's schedule format has no fused
slot, so :func:`dualpipev` writes the two parts in that order. Expanded this way the order is
PyTorch's action for action (the tests compare them). The simulator replays it without the
overlap (a pair costs F + B) and with one difference from a fused slot: the pair's forward may
start before its backward's gradient has arrived, where PyTorch's runtime starts the fused slot
once both inputs are there. At p = 4, m = 8 and unit costs (B = 2) the expanded order takes 51
units, the shortest possible (bubble 1/17 ≈ 0.059); fused slots without overlap take 54 (0.111).

Per rank, with ``s0 = r``, ``s1 = 2p − 1 − r`` and micro-batches taken in order per stage:

1. ``2(p − r − 1)`` forwards of ``s0``; then ``r + 1`` pairs of forwards ``s0``, ``s1``;
2. ``p − r − 1`` times: ``I`` of ``s1``, the oldest pending ``W``, a forward of ``s1``;
3. ``m − 2p + r + 1`` times: forward ``s0`` with backward ``s1``, forward ``s1`` with backward
   ``s0`` (each pair a forward, then a ``B``);
4. ``p − r − 1`` times: ``B`` of ``s1``, then forward ``s1`` with backward ``s0``;
5. ``r + 1`` times, a backward of ``s1`` then one of ``s0``, full ``B`` s for the first half and
   split (``I``) from the middle on: an odd rank splits from the middle round's ``s1``, an even
   rank from its ``s0``;
6. ``p − r − 1`` times: the oldest pending ``W``, a backward of ``s0`` (split as in 5);
7. the ``r + 1`` pending ``W`` s left, oldest first.

It needs at least ``2p`` micro-batches (PyTorch's condition).
"""

from __future__ import annotations

from collections import defaultdict

from trainsched.backprop.actions import check_count, validated
from trainsched.backprop.interleaved import v_stage_to_rank
from trainsched.errors import TrainschedError
from trainsched.plan import Action, Schedule

__all__ = ["dualpipev"]


def _row(rank: int, p: int, m: int) -> list[Action]:
    s0, s1 = rank, 2 * p - 1 - rank
    row: list[Action] = []
    forwards: dict[int, int] = defaultdict(int)    # stage -> next forward's micro-batch
    backwards: dict[int, int] = defaultdict(int)   # stage -> next I or B's micro-batch
    pending: list[tuple[int, int]] = []            # (stage, micro-batch) of I's awaiting W

    def forward(stage: int) -> None:
        row.append(Action(stage=stage, kind="F", microbatch=forwards[stage]))
        forwards[stage] += 1

    def backward(stage: int, split: bool) -> None:
        mb = backwards[stage]
        backwards[stage] += 1
        row.append(Action(stage=stage, kind="I" if split else "B", microbatch=mb))
        if split:
            pending.append((stage, mb))

    def weight() -> None:
        if pending:
            stage, mb = pending.pop(0)
            row.append(Action(stage=stage, kind="W", microbatch=mb))

    for _ in range(2 * (p - rank - 1)):
        forward(s0)
    for _ in range(rank + 1):
        forward(s0)
        forward(s1)
    for _ in range(p - rank - 1):
        backward(s1, split=True)
        weight()
        forward(s1)
    for _ in range(m - 2 * p + rank + 1):
        forward(s0)
        backward(s1, split=False)
        forward(s1)
        backward(s0, split=False)
    for _ in range(p - rank - 1):
        backward(s1, split=False)
        forward(s1)
        backward(s0, split=False)
    split = False
    middle = (rank + 1) // 2
    for i in range(rank + 1):
        split = split or (i == middle and rank % 2 == 1)
        backward(s1, split)
        split = split or (i == middle and rank % 2 == 0)
        backward(s0, split)
    for _ in range(p - rank - 1):
        weight()
        backward(s0, split)
    while pending:
        weight()
    return row


def dualpipev(num_ranks: int, num_microbatches: int) -> Schedule:
    """DualPipeV on ``num_ranks`` ranks (two stages each, V placement), overlapped pairs
    written as a forward then a ``B`` (module docstring); ``num_microbatches >= 2 ·
    num_ranks``."""
    p = check_count("num_ranks", num_ranks)
    m = check_count("num_microbatches", num_microbatches)
    if m < 2 * p:
        raise TrainschedError(f"DualPipeV runs at least as many micro-batches as stages: "
                              f"{2 * p} for {p} ranks, got {m}; use {2 * p} or more")
    return validated([_row(r, p, m) for r in range(p)], 2 * p, m, v_stage_to_rank(p))
