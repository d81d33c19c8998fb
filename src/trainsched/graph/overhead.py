"""Framework overhead per op: the part of an eager training step that per-op timings miss.

Capture times every op on its own; an eager training step also pays what lies between the ops:
the autograd engine walking the graph, the allocator, Python dispatching each call. None of it
is in any single op's time, so a measured graph's ops add up to less than the step they describe
(a fifth of ResNet-50's step on a CPU, more for small models made of many tiny ops). The
measured tier therefore also times whole eager steps, forward alone and forward + backward, and
charges the difference to the ops, per op dispatched (:func:`spread_gap`, the rule;
:func:`charge_step_overhead`, applying it to a forward graph). Plain Python: no torch here.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, replace

from trainsched.errors import TrainschedError
from trainsched.graph.core import Graph, Op
from trainsched.graph.training import _backward_cost, to_training

#: The key of ``graph.meta`` recording what was charged; absent: nothing was.
STEP_OVERHEAD = "step_overhead"

#: The rules :func:`spread_gap` can apply, by name (the ``rule`` of its result).
RULES = {
    "split": "forward ops share the forward gap, backward ops the backward gap",
    "forward": "the whole gap on the forward ops (the backward ops' times already cover "
               "backward)",
    "backward": "the whole gap on the backward ops (the forward ops' times already cover "
                "forward)",
    "even": "the gap shared evenly by every op",
    "none": "nothing charged: the ops' times already cover the step",
}


@dataclass(frozen=True)
class Spread:
    """What :func:`spread_gap` charges: seconds added to each forward and each backward op
    (``dX`` or ``dW``), and the rule that decided it (a key of :data:`RULES`)."""

    forward_per_op_s: float
    backward_per_op_s: float
    rule: str


def spread_gap(*, step_s: float, forward_ops_s: float, forward_ops: int,
               backward_ops_s: float, backward_ops: int,
               forward_s: float | None = None) -> Spread:
    """Spread the gap between an eager step and the sum of its ops over the ops.

    ``step_s`` is the eager step (forward + backward), ``forward_s`` its forward alone (None:
    not timed); ``forward_ops_s`` and ``backward_ops_s`` are the summed times of the
    ``forward_ops`` forward ops and the ``backward_ops`` backward ops. The gap is
    ``step_s - forward_ops_s - backward_ops_s``; charged, the ops add up to ``step_s``:

    - gap <= 0: nothing (``none``); times are never taken away from an op;
    - forward timed and both parts of the gap >= 0: forward ops share the forward gap
      (``forward_s - forward_ops_s``), backward ops the rest (``split``);
    - forward timed and one part < 0: the whole gap goes to the other part's ops (``forward``
      or ``backward``): that part's ops were timed high, the other's low, and the step only
      says by how much in total;
    - forward not timed, or ops of one kind only: every op gets ``gap / ops`` (``even``).
    """
    for name, value in (("step_s", step_s), ("forward_ops_s", forward_ops_s),
                        ("backward_ops_s", backward_ops_s), ("forward_s", forward_s)):
        if value is None and name == "forward_s":
            continue
        real = isinstance(value, numbers.Real) and not isinstance(value, bool)
        if not (real and math.isfinite(value) and value >= 0):
            raise TrainschedError(f"{name} must be a finite number of seconds >= 0, got "
                                  f"{value!r}")
    for name, count in (("forward_ops", forward_ops), ("backward_ops", backward_ops)):
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise TrainschedError(f"{name} must be a count of ops >= 0, got {count!r}")
    if forward_s is not None and forward_s > step_s:
        raise TrainschedError(f"the eager forward ({forward_s!r} s) cannot take longer than "
                              f"the whole step ({step_s!r} s): time them in the same steps")
    gap = step_s - forward_ops_s - backward_ops_s
    ops = forward_ops + backward_ops
    if gap <= 0 or ops == 0:
        return Spread(0.0, 0.0, "none")
    if forward_s is None or forward_ops == 0 or backward_ops == 0:
        return Spread(gap / ops, gap / ops, "even")
    forward_gap = forward_s - forward_ops_s
    backward_gap = gap - forward_gap
    if forward_gap < 0:
        return Spread(0.0, gap / backward_ops, "backward")
    if backward_gap < 0:
        return Spread(gap / forward_ops, 0.0, "forward")
    return Spread(forward_gap / forward_ops, backward_gap / backward_ops, "split")


def charge_step_overhead(graph: Graph, *, step_s: float, forward_s: float | None = None,
                         steps: int | None = None) -> Graph:
    """``graph`` (a forward graph at op granularity) with the gap to an eager step charged.

    The ops counted are those of ``to_training(graph)`` that a step runs: every forward op but
    the inputs, every ``dX`` and ``dW``; optimizer ops are not part of the timed step. Their
    times are summed, :func:`spread_gap` decides the charge, and each forward op's forward time
    and each of its backward phases that the training graph has grows by it (a backward time
    derived from the forward one becomes explicit first, so the charge is not scaled). The
    result's training graph adds up to ``step_s`` (or to the ops' sum, when that is larger).
    ``meta["step_overhead"]`` records the eager times (``steps``: how many were timed), the
    ops' sums before, the charge per op and the rule.
    """
    if STEP_OVERHEAD in graph.meta:
        raise TrainschedError("this graph's step overhead is charged already (meta "
                              f"{STEP_OVERHEAD!r}); charge a graph once")
    if any(op.kind != "forward" for op in graph.ops):
        raise TrainschedError("charge the step overhead to a forward graph, before the "
                              "training transform")
    if any(op.members for op in graph.ops):
        raise TrainschedError("charge the step overhead at op granularity, before coarsening "
                              "to modules: the overhead is per op dispatched")
    training = to_training(graph)
    forward = [op for op in graph.ops if op.target != "input"]
    backward = [op for op in training.ops if op.kind in ("backward_input", "backward_weight")]
    forward_ops_s = sum(op.compute_s for op in forward)
    backward_ops_s = sum(op.compute_s for op in backward)
    spread = spread_gap(step_s=step_s, forward_s=forward_s, forward_ops_s=forward_ops_s,
                        forward_ops=len(forward), backward_ops_s=backward_ops_s,
                        backward_ops=len(backward))
    record = {
        "eager_step_s": float(step_s),
        "eager_forward_s": None if forward_s is None else float(forward_s),
        "eager_steps": steps,
        "ops_s": forward_ops_s + backward_ops_s,
        "forward_ops_s": forward_ops_s,
        "backward_ops_s": backward_ops_s,
        "forward_ops": len(forward),
        "backward_ops": len(backward),
        "forward_per_op_s": spread.forward_per_op_s,
        "backward_per_op_s": spread.backward_per_op_s,
        "rule": spread.rule,
    }
    meta = {**graph.meta, STEP_OVERHEAD: {k: v for k, v in record.items() if v is not None}}
    if spread.rule == "none":
        return Graph(graph.ops, graph.edges, meta)
    names = {op.name for op in training.ops}
    ops = [op if op.target == "input" else _charged(op, spread, names) for op in graph.ops]
    return Graph(ops, graph.edges, meta)


def _plus(value: float | None, add: float) -> float | None:
    return None if value is None else value + add


def _charged(op: Op, spread: Spread, training_ops: set[str]) -> Op:
    """``op`` with ``spread``'s charge on its forward phase and on each backward phase the
    training graph gives it (``training_ops``: the names of that graph's ops)."""
    f, b = spread.forward_per_op_s, spread.backward_per_op_s
    fields: dict[str, float | None] = {
        "compute_s": op.compute_s + f,
        "compute_p10_s": _plus(op.compute_p10_s, f),
        "compute_p90_s": _plus(op.compute_p90_s, f),
    }
    for kind, suffix in (("backward_input", "dX"), ("backward_weight", "dW")):
        if f"{op.name}:{suffix}" not in training_ops:
            continue
        own = _backward_cost(op, getattr(op, f"{kind}_s"), getattr(op, f"{kind}_flops"))
        fields[f"{kind}_s"] = own + b
        fields[f"{kind}_p10_s"] = _plus(getattr(op, f"{kind}_p10_s"), b)
        fields[f"{kind}_p90_s"] = _plus(getattr(op, f"{kind}_p90_s"), b)
    return replace(op, **fields)
