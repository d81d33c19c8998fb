"""The Zero Bubble greedy scheduler for arbitrary stage costs, and ZB-H2 made with it.

:func:`zero_bubble_greedy` plans one stage per rank from :class:`~trainsched.backprop.stages.
StageCosts` (per stage ``F``, ``I``, ``W`` times, saved activation bytes), the time of a
point-to-point transfer across each stage boundary and a per-rank limit on activation memory.
It replays the step in time and, whenever a rank is free, picks its next action:

1. an ``I`` whose output gradient has arrived (the critical path) or an ``F`` whose input has
   arrived and whose saved activations fit under the limit; which of the two goes first when
   both can is a flag (``i_first``);
2. otherwise a pending ``W`` (the oldest): always when an ``F`` is held back by the memory limit
   (a ``W`` frees what its micro-batch still holds, so the cap forces it), and in an idle gap
   either always or, with ``w_fits_only``, only when the ``W`` ends before the next ``I`` or
   ``F`` that is known to arrive;
3. otherwise it waits for the next arrival. The ``W`` s left at the end close the list.

``eager_warmup`` lets a rank warm up with as many forwards as memory allows; without it, rank
``r`` runs at most ``p − r`` forwards before its first ``I``, as 1F1B does (afterwards only the
memory limit holds it back). The scheduler runs each of
the 8 flag sets (:data:`FLAG_SETS`) and keeps the shortest replayed step (ties: the first set).

Memory follows the simulator's model (:mod:`trainsched.sim.pipeline`): ``F(s, m)`` takes
``saved_bytes[s]``; ``I`` frees the share ``input_grad_only_fraction`` (rounded down to whole
bytes) and ``W`` the rest. Stages that say what a waiting ``W`` keeps
(``weight_input_bytes[s]``: each weight op's input and output gradient) are counted as the
simulator counts them: ``I`` frees all of ``saved_bytes[s]`` and takes ``weight_input_bytes[s]``
until that ``W``. Where that is more than ``I`` frees, an ``I`` can raise the memory in use, so
two rules keep every rank under its limit: an ``F`` starts only if the larger of the two still
fits after it (its own ``I`` will need it), and an ``I`` that would go over runs the oldest
pending ``W`` first. A rank must hold one micro-batch through ``F``, ``I`` and ``W``, so a limit
below the larger of ``saved_bytes[r]`` and ``weight_input_bytes[r]`` is refused, naming the
smallest limit any schedule meets: one micro-batch in flight per rank always completes.

**ZB-H2** (:func:`zb_h2`) is this scheduler at equal unit costs with every rank allowed
``2p − 1`` micro-batches in flight (from their ``F`` to their ``W``; ZB-H2's first stage holds
that many, and memory is provisioned for the largest rank): the extra warm-up forwards and the
deferred ``W`` s leave no gap on any rank from its first action to its last, a parallelogram of
``3m`` units starting at ``r`` on rank ``r``. One step still takes ``3m + p − 1`` units (rank ``r``
starts at ``r``), which is also ZB-H1's at these costs; the gain shows when consecutive steps
overlap (ZB's optimizer post-validation) or when ``W`` is cheap.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from trainsched.backprop.actions import check_count, validated
from trainsched.backprop.stages import StageCosts, uniform_stages
from trainsched.errors import TrainschedError
from trainsched.plan import Action, Schedule
from trainsched.units import is_int

__all__ = ["FLAG_SETS", "GreedyFlags", "GreedyResult", "greedy_order", "zb_h2",
           "zero_bubble_greedy"]


@dataclass(frozen=True, kw_only=True)
class GreedyFlags:
    """One way the greedy breaks its choices (module docstring)."""

    i_first: bool = True
    w_fits_only: bool = True
    eager_warmup: bool = True


#: The flag sets :func:`zero_bubble_greedy` tries, in order.
FLAG_SETS = tuple(GreedyFlags(i_first=a, w_fits_only=b, eager_warmup=c)
                  for c, a, b in itertools.product((True, False), repeat=3))


@dataclass(frozen=True, kw_only=True)
class GreedyResult:
    """A greedy schedule, the flags that made it and its replayed step time in seconds."""

    schedule: Schedule
    flags: GreedyFlags
    step_time_s: float


def _per_rank(name: str, value: int | Sequence[int] | None, p: int) -> list[float]:
    if value is None:
        return [math.inf] * p
    values = [value] * p if is_int(value) else list(value) \
        if isinstance(value, Sequence) and not isinstance(value, str) else None
    if values is None or len(values) != p or not all(is_int(v) and v >= 0 for v in values):
        raise TrainschedError(f"{name} must be a number of bytes >= 0 or one per rank ({p}), "
                              f"got {value!r}")
    return [float(v) for v in values]


def _boundaries(p2p_s: float | Sequence[float], p: int) -> list[float]:
    values = [p2p_s] * (p - 1) if isinstance(p2p_s, int | float) else list(p2p_s)
    if len(values) != p - 1 or not all(isinstance(v, int | float) and not isinstance(v, bool)
                                       and math.isfinite(v) and v >= 0 for v in values):
        raise TrainschedError(f"p2p_s must be seconds >= 0, one number or one per stage "
                              f"boundary ({p - 1}), got {p2p_s!r}")
    return [float(v) for v in values]


def greedy_order(stages: StageCosts, num_microbatches: int, flags: GreedyFlags, *,
                 p2p_s: float | Sequence[float] = 0.0,
                 memory_limit_bytes: int | Sequence[int] | None = None,
                 input_grad_only_fraction: float = 0.5) -> GreedyResult:
    """One run of the greedy (module docstring) with ``flags``; see :func:`zero_bubble_greedy`."""
    p, m = stages.num_stages, check_count("num_microbatches", num_microbatches)
    comm = _boundaries(p2p_s, p)
    limit = _per_rank("memory_limit_bytes", memory_limit_bytes, p)
    saved = stages.saved_bytes
    if stages.weight_input_bytes:   # I frees the graph, W keeps its inputs (module docstring)
        kept = list(stages.weight_input_bytes)
        at_input = [b - k for b, k in zip(saved, kept, strict=True)]   # what I frees, net
    else:
        at_input = [int(b * input_grad_only_fraction) for b in saved]
        kept = [b - a for b, a in zip(saved, at_input, strict=True)]
    need = [max(b, k) for b, k in zip(saved, kept, strict=True)]   # one micro-batch's peak
    for r in range(p):
        if limit[r] < need[r]:
            what = f"the {saved[r]} bytes one micro-batch of stage {r} saves" \
                if need[r] == saved[r] else \
                f"the {kept[r]} bytes a waiting W of stage {r} keeps per micro-batch"
            raise TrainschedError(
                f"memory limit {int(limit[r])} bytes on rank {r} is below {what}: no schedule "
                f"fits; the smallest limit any schedule meets is {max(need)} bytes (one "
                f"micro-batch in flight per rank)")
    cost = {"F": stages.forward_s, "I": stages.backward_input_s, "W": stages.backward_weight_s}
    end: dict[tuple[str, int, int], float] = {}  # (kind, stage, mb) -> end time, once placed
    next_f, next_i = [0] * p, [0] * p
    pending_w: list[list[int]] = [[] for _ in range(p)]
    used, free = [0.0] * p, [0.0] * p
    rows: list[list[Action]] = [[] for _ in range(p)]
    warmup = [m if flags.eager_warmup else p - r for r in range(p)]  # F's before 1st I

    def f_ready(r: int) -> float | None:  # when F(r, next) may start; None: not known yet
        if next_f[r] >= m:
            return None
        return 0.0 if r == 0 else (None if ("F", r - 1, next_f[r]) not in end
                                   else end["F", r - 1, next_f[r]] + comm[r - 1])

    def i_ready(r: int) -> float | None:
        k = next_i[r]
        if k >= next_f[r]:
            return None
        own = end["F", r, k]
        if r == p - 1:
            return own
        down = end.get(("I", r + 1, k))
        return None if down is None else max(own, down + comm[r])

    def earliest_f(r: int, t: float) -> float:  # a lower bound on F(r, next)'s start
        if next_f[r] >= m:
            return math.inf
        known = f_ready(r)
        return known if known is not None else t + cost["F"][r - 1] + comm[r - 1]

    def earliest_i(r: int, t: float) -> float:  # the same for I(r, next)
        if next_i[r] >= m:
            return math.inf
        known = i_ready(r)
        if known is not None:
            return known
        if next_i[r] >= next_f[r]:  # its own F has not run: after the next F at least
            return max(t, earliest_f(r, t)) + cost["F"][r]
        return t + cost["I"][r + 1] + comm[r]

    def place(r: int, kind: str, k: int, t: float) -> None:
        rows[r].append(Action(stage=r, kind=kind, microbatch=k))
        end[kind, r, k] = free[r] = t + cost[kind][r]
        if kind == "F":
            used[r] += saved[r]
            next_f[r] += 1
        elif kind == "I":
            used[r] -= at_input[r]
            next_i[r] += 1
            pending_w[r].append(k)
        else:
            used[r] -= kept[r]

    def choose(r: int, t: float) -> bool:
        fr, ir = f_ready(r), i_ready(r)
        room = used[r] + need[r] <= limit[r] and (next_i[r] > 0 or next_f[r] < warmup[r])
        f_ok = fr is not None and fr <= t and room
        i_ok = ir is not None and ir <= t
        if i_ok and pending_w[r] and used[r] - at_input[r] > limit[r]:
            place(r, "W", pending_w[r].pop(0), t)   # the I would go over: make room first
        elif i_ok and (not f_ok or flags.i_first):
            place(r, "I", next_i[r], t)
        elif f_ok:
            place(r, "F", next_f[r], t)
        elif pending_w[r]:
            held_back = fr is not None and fr <= t and not room
            fits = t + cost["W"][r] <= min(earliest_f(r, t) if room else math.inf,
                                           earliest_i(r, t))
            if not (held_back or not flags.w_fits_only or fits):
                return False
            place(r, "W", pending_w[r].pop(0), t)
        else:
            return False
        return True

    t, left = 0.0, 3 * p * m
    while left:
        progressed = True
        while progressed:
            progressed = False
            for r in range(p):
                if free[r] <= t and choose(r, t):
                    left -= 1
                    progressed = True
        if not left:
            break
        later = [x for r in range(p) for x in (free[r], f_ready(r), i_ready(r))
                 if x is not None and x > t]
        if not later:  # every rank waits on a W that does not fit: run the oldest
            r = next(r for r in range(p) if pending_w[r] and free[r] <= t)
            place(r, "W", pending_w[r].pop(0), t)
            left -= 1
            continue
        t = min(later)
    schedule = validated(rows, p, m)
    return GreedyResult(schedule=schedule, flags=flags, step_time_s=max(free))


def zero_bubble_greedy(stages: StageCosts, num_microbatches: int, *,
                       p2p_s: float | Sequence[float] = 0.0,
                       memory_limit_bytes: int | Sequence[int] | None = None,
                       input_grad_only_fraction: float = 0.5,
                       flag_sets: Sequence[GreedyFlags] = FLAG_SETS) -> GreedyResult:
    """The Zero Bubble greedy over ``flag_sets``: the shortest replayed step (module docstring).

    ``stages`` gives one stage per rank; ``p2p_s`` is the transfer time across each boundary
    (one number, or one per boundary); ``memory_limit_bytes`` caps each rank's activation
    bytes (one number, or one per rank; ``None``: no cap).
    """
    if not isinstance(stages, StageCosts):
        raise TrainschedError(f"stages must be StageCosts, got {type(stages).__name__}")
    if not flag_sets:
        raise TrainschedError("flag_sets is empty; give at least one GreedyFlags")
    best: GreedyResult | None = None
    for flags in flag_sets:
        run = greedy_order(stages, num_microbatches, flags, p2p_s=p2p_s,
                           memory_limit_bytes=memory_limit_bytes,
                           input_grad_only_fraction=input_grad_only_fraction)
        if best is None or run.step_time_s < best.step_time_s:
            best = run
    assert best is not None
    return best


def zb_h2(num_ranks: int, num_microbatches: int) -> Schedule:
    """ZB-H2: the greedy at unit costs, each rank holding at most ``2p − 1`` micro-batches
    (module docstring)."""
    p = check_count("num_ranks", num_ranks)
    m = check_count("num_microbatches", num_microbatches)
    stages = uniform_stages(p, 1.0, 1.0, 1.0, saved_bytes=1)
    return zero_bubble_greedy(stages, m, memory_limit_bytes=2 * p - 1,
                              input_grad_only_fraction=0.0).schedule


def zero_bubble(num_ranks: int, num_microbatches: int, *, stages: StageCosts | None = None,
                p2p_s: float | Sequence[float] = 0.0,
                memory_limit_bytes: int | Sequence[int] | None = None,
                input_grad_only_fraction: float = 0.5) -> Schedule:
    """The registered form: :func:`zero_bubble_greedy` on ``stages`` (unit costs if ``None``)."""
    p = check_count("num_ranks", num_ranks)
    if stages is None:
        stages = uniform_stages(p, 1.0, 1.0, 1.0)
    elif not isinstance(stages, StageCosts) or stages.num_stages != p:
        raise TrainschedError(f"the zero-bubble greedy puts one stage on each rank: give "
                              f"StageCosts of {p} stages, got {stages!r:.80}")
    return zero_bubble_greedy(stages, num_microbatches, p2p_s=p2p_s,
                              memory_limit_bytes=memory_limit_bytes,
                              input_grad_only_fraction=input_grad_only_fraction).schedule
