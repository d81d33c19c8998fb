"""Where to cut a model into pipeline stages, on the per-op weights alone (no graph).

:func:`balanced_cuts` cuts a sequence of weights into contiguous runs with the smallest largest
sum (one stage per run); :func:`rank_balanced_cuts` moves such cuts so that ranks holding
several stages (interleaved, V-shaped placements) carry even loads.
:mod:`trainsched.backprop.stages` applies them to a training graph's forward ops.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence

__all__ = ["balanced_cuts", "rank_balanced_cuts"]


def balanced_cuts(weights: Sequence[float], num_parts: int) -> tuple[int, ...]:
    """Cut ``weights`` into ``num_parts`` non-empty contiguous runs with the smallest largest
    sum; return the start index of every run but the first (``num_parts - 1`` cut points).

    The bottleneck is found by bisection on floats (to adjacent floats) with a greedy check;
    the runs are then packed greedily from the front, so earlier runs are the fuller ones.
    """
    n = len(weights)
    assert 1 <= num_parts <= n
    total = math.fsum(weights)
    lo = max(max(weights), total / num_parts)
    hi = max(total, lo)
    if _parts(weights, lo) <= num_parts:
        hi = lo
    for _ in range(200):  # at most ~64 halvings before lo and hi are adjacent floats
        mid = (lo + hi) / 2
        if mid <= lo or mid >= hi:
            break
        if _parts(weights, mid) <= num_parts:
            hi = mid
        else:
            lo = mid
    return _pack(weights, hi, num_parts)


def _parts(weights: Sequence[float], limit: float) -> int:
    """How many runs a greedy packing under ``limit`` makes."""
    parts, current = 1, 0.0
    for w in weights:
        if current + w > limit and current > 0:
            parts += 1
            current = w
        else:
            current += w
    return parts


def _pack(weights: Sequence[float], limit: float, num_parts: int) -> tuple[int, ...]:
    """Greedy packing under ``limit``, cutting early where the ops left just fill the runs left."""
    n = len(weights)
    cuts: list[int] = []
    current = 0.0
    for k, w in enumerate(weights):
        if k > 0 and len(cuts) < num_parts - 1 and (
                (current + w > limit and current > 0) or n - k == num_parts - 1 - len(cuts)):
            cuts.append(k)
            current = 0.0
        current += w
    assert len(cuts) == num_parts - 1
    return tuple(cuts)


def rank_balanced_cuts(weights: Sequence[float], points: Sequence[int],
                       stage_to_rank: Sequence[int]) -> tuple[tuple[int, ...], ...]:
    """Cuts of ``weights`` (one stage per run) that even out the ranks' loads, built from
    ``points``: a rank's load is the sum of its stages' (``stage_to_rank[s]`` owns run ``s``).

    A cut balanced by stage leaves a rank that holds several stages (interleaved, V-shaped
    placements) with whatever its stages add up to: on BERT-24 over 16 ranks with two stages
    each, 6 to 16 ms. Two cuts are built going forwards and going backwards through the
    stages: a stage that is not its rank's last (first) keeps the length ``points`` gave it,
    the rank's last (first) one ends where the rank's load reaches the even share,
    ``sum(weights) / ranks`` (at the nearest op boundary; every stage keeps an op). The one
    with the lowest loads among ``points`` and those two (sorted largest first, compared in
    turn) is then improved one cut and one op at a time (past ops that cost nothing, which
    change no load) while a move lowers them. Returned: that improved cut, then the forward
    and the backward one, without repeats and without ``points`` (empty when nothing beats
    it); each takes time about linear in the stages.

    Which is fastest is the simulator's call: on the published BERT setups each of the three
    and the stage-balanced cut was the fastest for some schedule (the loads do not see how a
    schedule's micro-batches wait on one long stage).
    """
    n, num_stages = len(weights), len(points) + 1
    assert len(stage_to_rank) == num_stages and all(0 < p < n for p in points)
    ranks = max(stage_to_rank) + 1
    forward = _fitted_cuts(weights, points, stage_to_rank, ranks)
    mirrored = _fitted_cuts(weights[::-1], [n - p for p in reversed(points)],
                            stage_to_rank[::-1], ranks)
    backward = [n - p for p in reversed(mirrored)]
    prefix = _prefix(weights)

    def loads(cuts: Sequence[int]) -> list[float]:
        bounds = [0, *cuts, n]
        total = [0.0] * ranks
        for s in range(num_stages):
            total[stage_to_rank[s]] += prefix[bounds[s + 1]] - prefix[bounds[s]]
        return sorted(total, reverse=True)

    best = min([list(points), forward, backward], key=loads)  # ties: points first
    best_loads = loads(best)
    while True:  # one cut, one costed op at a time, the move that lowers the loads most
        found = None
        for k in range(len(best)):
            lo = best[k - 1] if k else 0
            hi = best[k + 1] if k + 1 < len(best) else n
            for step in (-1, 1):
                p = best[k] + step
                while lo < p < hi and prefix[p] == prefix[best[k]]:
                    p += step
                if not lo < p < hi:
                    continue
                trial = best.copy()
                trial[k] = p
                trial_loads = loads(trial)
                if trial_loads < (found[1] if found else best_loads):
                    found = (trial, trial_loads)
        if found is None:
            break
        best, best_loads = found
    out: list[tuple[int, ...]] = []
    for cut in (tuple(best), tuple(forward), tuple(backward)):
        if cut != tuple(points) and cut not in out:
            out.append(cut)
    return tuple(out)


def _prefix(weights: Sequence[float]) -> list[float]:
    prefix = [0.0]
    for w in weights:
        prefix.append(prefix[-1] + w)
    return prefix


def _fitted_cuts(weights: Sequence[float], points: Sequence[int],
                 stage_to_rank: Sequence[int], ranks: int) -> list[int]:
    """:func:`rank_balanced_cuts`'s forward cut: each stage in order keeps its length in
    ``points`` unless it is its rank's last, which ends where the rank reaches its share."""
    n, num_stages = len(weights), len(points) + 1
    prefix = _prefix(weights)
    share = prefix[-1] / ranks
    last = {r: s for s, r in enumerate(stage_to_rank)}
    bounds = [0, *points, n]
    load = [0.0] * ranks
    cuts: list[int] = []
    start = 0
    for s in range(num_stages - 1):
        r = stage_to_rank[s]
        length = share - load[r] if last[r] == s else prefix[bounds[s + 1]] - prefix[bounds[s]]
        want = prefix[start] + length
        lo, hi = start + 1, n - (num_stages - 1 - s)  # every stage keeps an op
        end = min(max(bisect.bisect_left(prefix, want, lo, hi + 1), lo), hi)
        if end > lo and want - prefix[end - 1] <= prefix[end] - want:
            end -= 1  # the nearer boundary; ties to the earlier
        load[r] += prefix[end] - prefix[start]
        cuts.append(end)
        start = end
    return cuts
