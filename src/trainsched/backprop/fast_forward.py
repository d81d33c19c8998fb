"""Gradient fast-forwarding and modulo allocation: Out-Of-Order BackProp's pipeline schedules.

**Fast-forwarding** (:func:`fast_forward`): forwards run GPipe-like (all of them first), and in
the backward each stage runs a micro-batch's ``I`` first, so its input gradient leaves upstream
at once, then that micro-batch's ``W`` while the upstream stage works: ``I0 W0 I1 W1 ...``, so
``W(s, m)`` ends before ``I(s, m + 1)`` starts (one micro-batch of ``W`` outstanding per stage).
The last stage, where every backward chain starts, runs all its ``I`` s, then all its ``W`` s.
At equal costs a step takes about ``m(F + I + W) + (p − 1)(F + I)``, against GPipe's
``(m + p − 1)(F + I + W)``; every rank holds the activations of all m micro-batches.

**Push** (``group=N``): micro-batches go in groups of N; a rank runs a group's forwards, then
its backwards as above (the last stage's pending ``W`` s included) before the next group's
forwards, so at most N micro-batches are in flight on a rank, at the price of a pipeline fill
and drain per group.

**Modulo allocation** (:func:`modulo`): the model is cut into V·p stages and stage ``s`` runs on
rank ``ring[s mod p]`` (``ring``: an order of the ranks around which micro-batches circle, by
default ``0, 1, ..., p − 1``; the original used ``0, 3, 2, 1, 5, 6, 7, 4`` on eight GPUs to follow
NVLink), so a micro-batch goes round the ring V times. Micro-batches go in rounds of p: a rank
runs a round's forwards chunk by chunk (``F(j, 0..p−1)``, ``F(p + j, 0..p−1)``, ...), which
keeps every rank busy once the ring is full, and the backwards of a round chunk by chunk in
reverse, fast-forwarded. Modulo with one chunk is fast-forwarding. At equal costs a step takes
about ``m(F + I + W) + (p − 1)(F + I)/V``, at V times the point-to-point messages.
"""

from __future__ import annotations

from collections.abc import Sequence

from trainsched.backprop.actions import check_count, validated
from trainsched.errors import TrainschedError
from trainsched.plan import Action, Schedule
from trainsched.units import is_int

__all__ = ["fast_forward", "modulo"]


def _runs(items: range, size: int) -> list[range]:
    return [items[k:k + size] for k in range(0, len(items), size)]


def _check_ring(ring: Sequence[int] | None, p: int) -> tuple[int, ...]:
    if ring is None:
        return tuple(range(p))
    if isinstance(ring, str) or not isinstance(ring, Sequence):
        raise TrainschedError(f"ring must be a sequence of rank numbers, got {ring!r}")
    order = tuple(ring)
    if not all(is_int(r) for r in order) or sorted(order) != list(range(p)):
        raise TrainschedError(f"ring {list(order)} must list each rank 0..{p - 1} once (an order "
                              f"of the {p} ranks)")
    return order


def _rows(p: int, m: int, chunks: int, ring: tuple[int, ...], group: int) -> list[list[Action]]:
    last = chunks * p - 1
    rows: list[list[Action]] = [[] for _ in range(p)]
    for j in range(p):  # position on the ring; its rank is ring[j]
        row = rows[ring[j]]
        for members in _runs(range(m), group):
            rounds = _runs(members, p) if chunks > 1 else [members]
            for batch in rounds:
                row += [Action(stage=v * p + j, kind="F", microbatch=mb)
                        for v in range(chunks) for mb in batch]
            for batch in rounds:
                for v in range(chunks - 1, -1, -1):
                    s = v * p + j
                    if s == last:  # the chain starts here: all I's first
                        row += [Action(stage=s, kind=k, microbatch=mb)
                                for k in ("I", "W") for mb in batch]
                    else:
                        row += [Action(stage=s, kind=k, microbatch=mb)
                                for mb in batch for k in ("I", "W")]
    return rows


def fast_forward(num_ranks: int, num_microbatches: int, *, group: int | None = None) -> Schedule:
    """Gradient fast-forwarding, one stage per rank; ``group=N`` is the push variant
    (micro-batches in groups of N, at most N in flight per rank). Module docstring."""
    p = check_count("num_ranks", num_ranks)
    m = check_count("num_microbatches", num_microbatches)
    size = m if group is None else check_count("group", group)
    return validated(_rows(p, m, 1, tuple(range(p)), size), p, m)


def modulo(num_ranks: int, num_microbatches: int, *, chunks: int = 2,
           ring: Sequence[int] | None = None, group: int | None = None) -> Schedule:
    """Modulo allocation: ``chunks`` virtual stages per rank, stage ``s`` on rank
    ``ring[s mod num_ranks]``, fast-forwarded backwards (module docstring). ``group`` pushes
    as in :func:`fast_forward`."""
    p = check_count("num_ranks", num_ranks)
    m = check_count("num_microbatches", num_microbatches)
    v = check_count("chunks", chunks)
    order = _check_ring(ring, p)
    size = m if group is None else check_count("group", group)
    mapping = tuple(order[s % p] for s in range(v * p))
    return validated(_rows(p, m, v, order, size), v * p, m, mapping)
