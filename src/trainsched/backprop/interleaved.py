"""Interleaved pipelines: several virtual stages per rank, in the orders PyTorch generates.

With ``chunks`` = V virtual stages per rank and ``p`` ranks the model is cut into V·p stages.
:func:`interleaved_1f1b` and :func:`interleaved_zero_bubble` use the loop placement (stage
``s`` on rank ``s mod p``), :func:`zbv` the V shape (stage ``s`` on rank ``s`` for ``s < p``,
else ``2p − 1 − s``: a micro-batch goes down the ranks and back up). Their orders are those of
PyTorch pipelining's ``ScheduleInterleaved1F1B``, ``ScheduleInterleavedZeroBubble`` and
``ScheduleZBVZeroBubble``, written without idle slots, communication or ``REDUCE_GRAD``; the
tests build PyTorch's classes and compare action for action.

**Interleaved rule.** Micro-batches go in rounds of ``k = m // max(1, m // p)``; the ``j``-th
forward of a rank runs on its chunk ``(j // k) mod V`` and the ``j``-th backward on chunk
``V − 1 − ((j // k) mod V)``, each stage taking its micro-batches in order. A rank runs
``w = min(V·m, (V − 1)·k + f·(p − 1 − r))`` warm-up forwards (``f`` = 2 for 1F1B, 1 for zero
bubble), then one forward and one backward in turn, then the remaining backwards.
Zero bubble splits each backward into ``I`` and ``W``: rank ``r`` runs its first ``r``
steady backwards as ``I`` only and from then on follows every ``I`` with the oldest ``W`` not
yet run; the ``W`` s left over close the list. The delayed ``W`` s fill the idle slots that
1F1B has before the last backwards arrive. With V = 1 this is **ZB-H1** (:func:`zb_h1`): the
same activations in flight as 1F1B and, at equal F, I and W costs, a third of its bubble.

**ZBV** (two chunks): warm-up forwards on the first chunk, then forwards alternating between
chunks; in the steady state each chunk runs ``F I W`` for one micro-batch in turn; the cool-down
runs the ``I`` s first and the ``W`` s last (see :func:`zbv`).
"""

from __future__ import annotations

from collections import defaultdict

from trainsched.backprop.actions import backward, check_count, forward, validated
from trainsched.errors import TrainschedError
from trainsched.plan import Action, Schedule

__all__ = ["interleaved_1f1b", "interleaved_zero_bubble", "zb_h1", "zbv"]


def _round_size(num_ranks: int, num_microbatches: int, chunks: int) -> int:
    """Micro-batches per round; with several chunks the rounds must divide m evenly."""
    rounds = max(1, num_microbatches // num_ranks)
    if chunks > 1 and num_microbatches % rounds:
        lower = rounds * (num_microbatches // rounds)
        raise TrainschedError(
            f"an interleaved schedule of {num_ranks} ranks runs {num_microbatches} micro-batches "
            f"in {rounds} rounds, which must divide them evenly; use {lower} or "
            f"{lower + rounds} micro-batches (a multiple of {rounds}), or at most {num_ranks}")
    return num_microbatches // rounds


def _interleaved_row(rank: int, p: int, m: int, chunks: int, zero_bubble: bool,
                     split: bool) -> list[Action]:
    size = _round_size(p, m, chunks)
    total = chunks * m
    warmup = min(total, (chunks - 1) * size + (1 if zero_bubble else 2) * (p - 1 - rank))

    def forward_stage(j: int) -> int:
        return (j // size) % chunks * p + rank

    def backward_stage(j: int) -> int:
        return (chunks - 1 - (j // size) % chunks) * p + rank

    taken: dict[tuple[str, int], int] = defaultdict(int)  # (kind, stage) -> next micro-batch

    def take(kind: str, stage: int) -> int:
        taken[kind, stage] += 1
        return taken[kind, stage] - 1

    row = [forward(s, take("F", s)) for s in map(forward_stage, range(warmup))]
    pending: list[int] = []  # stages of backwards whose W is still to come, oldest first
    for j in range(total):  # the j-th backward, after the (warmup + j)-th forward if any
        if warmup + j < total:
            s = forward_stage(warmup + j)
            row.append(forward(s, take("F", s)))
        s = backward_stage(j)
        mb = take("B", s)
        if not zero_bubble:
            row += backward(s, mb, split)
            continue
        row.append(Action(stage=s, kind="I", microbatch=mb))
        pending.append(s)
        if j >= rank:
            w = pending.pop(0)
            row.append(Action(stage=w, kind="W", microbatch=take("W", w)))
    row += [Action(stage=w, kind="W", microbatch=take("W", w)) for w in pending]
    return row


def interleaved_1f1b(num_ranks: int, num_microbatches: int, split_backward: bool = False, *,
                     chunks: int = 2) -> Schedule:
    """Interleaved 1F1B (Megatron's interleaved stages): ``chunks`` loop-placed stages per rank.

    The order is ``ScheduleInterleaved1F1B``'s (module docstring); ``split_backward`` writes
    each ``B`` as ``I`` then ``W``. ``num_microbatches`` must be at most ``num_ranks`` or a
    multiple of ``num_microbatches // num_ranks`` (PyTorch's condition).
    """
    p = check_count("num_ranks", num_ranks)
    m = check_count("num_microbatches", num_microbatches)
    v = check_count("chunks", chunks)
    rows = [_interleaved_row(r, p, m, v, False, split_backward) for r in range(p)]
    return validated(rows, v * p, m)


def interleaved_zero_bubble(num_ranks: int, num_microbatches: int, *,
                            chunks: int = 2) -> Schedule:
    """Interleaved zero bubble (PyTorch's ``ScheduleInterleavedZeroBubble``, "ZB1P"):
    ``chunks`` loop-placed stages per rank, backwards split, ``W`` s delayed (module docstring).
    """
    p = check_count("num_ranks", num_ranks)
    m = check_count("num_microbatches", num_microbatches)
    v = check_count("chunks", chunks)
    rows = [_interleaved_row(r, p, m, v, True, True) for r in range(p)]
    return validated(rows, v * p, m)


def zb_h1(num_ranks: int, num_microbatches: int) -> Schedule:
    """ZB-H1: one stage per rank, 1F1B's warm-up and memory, ``W`` s delayed into the bubble.

    Rank ``r`` runs ``min(m, p − 1 − r)`` warm-up forwards, then ``F``, ``I`` pairs, each
    followed by the oldest pending ``W`` once ``r`` of them are pending; the rest close the list.
    At equal F, I and W costs and no communication the step is ``3m + p − 1`` units against
    1F1B's ``3(m + p − 1)``: a bubble of ``(p − 1)/(3m)`` of the work instead of ``(p − 1)/m``.
    """
    return interleaved_zero_bubble(num_ranks, num_microbatches, chunks=1)


def v_stage_to_rank(num_ranks: int) -> tuple[int, ...]:
    """The V placement of ``2 · num_ranks`` stages: down the ranks, then back up."""
    return tuple(range(num_ranks)) + tuple(range(num_ranks - 1, -1, -1))


def _zbv_row(rank: int, p: int, m: int) -> list[Action]:
    n = max(2 * p - 1, m)  # the steady pattern needs 2p - 1 micro-batches; extra ones dropped
    first, second = rank, 2 * p - 1 - rank
    count: dict[tuple[str, int], int] = defaultdict(int)

    def do(kind: str, stage: int) -> Action:
        count[kind, stage] += 1
        return Action(stage=stage, kind=kind, microbatch=count[kind, stage] - 1)

    row = [do("F", first) for _ in range(2 * (p - rank) - 1)]
    for _ in range(rank):
        row += [do("F", second), do("F", first)]
    for _ in range(p - rank):
        row += [do("F", second), do("I", second), do("W", second)]
    while count["F", second] < count["F", first] or count["F", first] < n:
        if count["F", first] < n:
            row.append(do("F", first))
        row += [do("I", first), do("W", first), do("F", second), do("I", second),
                do("W", second)]
    for _ in range(rank):
        row += [do("I", first), do("I", second)]
    for _ in range(p - rank):
        row += [do("I", first), do("W", first)]
    while count["W", second] < count["I", second]:
        row.append(do("W", second))
    while count["W", first] < count["I", first]:
        row.append(do("W", first))
    return [a for a in row if a.microbatch < m]


def zbv(num_ranks: int, num_microbatches: int) -> Schedule:
    """ZBV: two stages per rank in a V (rank ``r`` holds stages ``r`` and ``2p − 1 − r``).

    Per rank: ``2(p − r) − 1`` forwards of its first stage; ``r`` pairs of forwards (second
    stage, first stage); ``p − r`` triples ``F I W`` of its second stage; then, while forwards
    remain, ``F I W`` of the first stage and ``F I W`` of the second in turn; the cool-down
    runs ``r`` pairs of ``I`` s (first, second), then ``p − r`` pairs ``I W`` of the first stage,
    and the pending ``W`` s, second stage's first. Built for ``max(m, 2p − 1)`` micro-batches,
    keeping those below ``m`` (PyTorch's ``ScheduleZBVZeroBubble`` order).
    """
    p = check_count("num_ranks", num_ranks)
    m = check_count("num_microbatches", num_microbatches)
    rows = [_zbv_row(r, p, m) for r in range(p)]
    return validated(rows, 2 * p, m, v_stage_to_rank(p))
