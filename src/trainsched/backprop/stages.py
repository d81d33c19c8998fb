"""Pipeline stages: a model cut into contiguous stages, and what one micro-batch costs on each.

:class:`StageCosts` is what the pipeline simulator (:func:`trainsched.sim.pipeline.
simulate_pipeline`) reads: per stage, the time of its forward (``F``), input-gradient (``I``) and
weight-gradient (``W``) work for one micro-batch, the bytes it sends downstream per micro-batch
(the same bytes come back as the gradient), the activation bytes it keeps per micro-batch and
the state it holds all step.

:func:`stage_costs_from_graph` cuts a training graph's forward ops, in topological order, into
contiguous stages balanced by compute (forward + dX + dW) or by parameter bytes, or at cut points
the caller gives. **Linear scaling**: the graph is costed at the full batch, and a micro-batch of
1/m of it is taken to cost 1/m of every time and of every activation and saved byte (bytes
rounded up to whole bytes), except the part of each op's time that does not depend on its
size: a roofline graph's op pays its device's launch overhead once per micro-batch
(:func:`launch_s`). The rest still overestimates the speed of small micro-batches, whose
kernels are memory-bound or, measured on a CPU, slower per sample; cost the graph at the
micro-batch size to avoid it (``microbatch_graph``).
:func:`uniform_stages` builds equal stages by hand (tests, closed forms).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from trainsched.backprop.cuts import balanced_cuts, rank_balanced_cuts
from trainsched.errors import TrainschedError
from trainsched.graph import Graph, to_training
from trainsched.units import is_int

__all__ = ["CUT_MODES", "StageCosts", "balanced_cuts", "launch_s", "microbatch_count",
           "rank_balanced_cuts", "rank_cuts", "stage_costs_from_graph", "uniform_stages"]

CUT_MODES = ("compute", "params")

_TIME_FIELDS = ("forward_s", "backward_input_s", "backward_weight_s")
_BYTE_FIELDS = ("activation_bytes", "saved_bytes", "param_bytes", "grad_bytes",
                "optimizer_state_bytes")  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class StageCosts:
    """Per-stage costs of a pipeline; every field is a tuple with one entry per stage.

    Per micro-batch: ``forward_s``, ``backward_input_s`` (dX, ``I``), ``backward_weight_s``
    (dW, ``W``; a fused ``B`` costs I + W); ``activation_bytes[s]``, what stage ``s`` sends to
    stage ``s + 1`` (and receives back as the gradient; the last stage sends nothing, so its
    entry is 0); ``saved_bytes[s]``, the activations stage ``s`` keeps from its ``F`` until
    its backward has used them. Resident all step: ``param_bytes`` (parameters and buffers),
    ``grad_bytes`` and ``optimizer_state_bytes``. ``ops[s]`` names the forward ops of stage
    ``s`` (empty for hand-made stages); ``num_microbatches`` is the count the graph's costs
    were divided by (``None``: per-micro-batch costs given directly), which the simulator
    checks against the schedule's. ``weight_input_bytes[s]``, when given, is what a deferred
    ``W`` of stage ``s`` keeps per micro-batch from its ``I`` on (each weight op's input and
    output gradient): the simulator then frees all of ``saved_bytes`` at ``I`` and holds these
    bytes until ``W``; empty (the default), it frees a fixed share at ``I`` instead.
    """

    forward_s: tuple[float, ...]
    backward_input_s: tuple[float, ...]
    backward_weight_s: tuple[float, ...]
    activation_bytes: tuple[int, ...]
    saved_bytes: tuple[int, ...]
    param_bytes: tuple[int, ...]
    grad_bytes: tuple[int, ...]
    optimizer_state_bytes: tuple[int, ...]
    ops: tuple[tuple[str, ...], ...] = field(default=())
    num_microbatches: int | None = None
    weight_input_bytes: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        p = len(self.forward_s)
        if p < 1:
            raise TrainschedError("stage costs need at least one stage")
        for name in (*_TIME_FIELDS, *_BYTE_FIELDS):
            values = tuple(getattr(self, name))
            if len(values) != p:
                raise TrainschedError(f"stage costs: {name} has {len(values)} entries for {p} "
                                      "stages; give one per stage")
            for s, v in enumerate(values):
                if name in _TIME_FIELDS:
                    ok = isinstance(v, int | float) and not isinstance(v, bool) \
                        and math.isfinite(v) and v >= 0
                    kind = "a finite number of seconds >= 0"
                else:
                    ok = is_int(v) and v >= 0
                    kind = "an integer number of bytes >= 0"
                if not ok:
                    raise TrainschedError(f"stage costs: {name}[{s}] must be {kind}, got {v!r}")
            if name in _TIME_FIELDS:
                values = tuple(float(v) for v in values)
            object.__setattr__(self, name, values)
        if self.activation_bytes[-1] != 0:
            raise TrainschedError(f"stage costs: the last stage ({p - 1}) sends nothing "
                                  f"downstream; activation_bytes[{p - 1}] must be 0, "
                                  f"got {self.activation_bytes[-1]}")
        ops = tuple(tuple(names) for names in self.ops) if self.ops else ((),) * p
        if len(ops) != p:
            raise TrainschedError(f"stage costs: ops has {len(ops)} entries for {p} stages")
        object.__setattr__(self, "ops", ops)
        held = tuple(self.weight_input_bytes)
        if held and (len(held) != p or not all(is_int(v) and v >= 0 for v in held)):
            raise TrainschedError(f"stage costs: weight_input_bytes must be empty or one integer "
                                  f"number of bytes >= 0 per stage ({p}), got {held!r}")
        object.__setattr__(self, "weight_input_bytes", held)
        m = self.num_microbatches
        if m is not None and not (is_int(m) and m >= 1):
            raise TrainschedError(f"stage costs: num_microbatches must be an integer >= 1 or "
                                  f"None, got {m!r}")

    @property
    def num_stages(self) -> int:
        return len(self.forward_s)

    @property
    def backward_s(self) -> tuple[float, ...]:
        """Per stage, a fused ``B``: ``backward_input_s + backward_weight_s``."""
        return tuple(i + w for i, w in zip(self.backward_input_s, self.backward_weight_s,
                                           strict=True))  # fmt: skip

    @property
    def resident_bytes(self) -> tuple[int, ...]:
        """Per stage, the state held all step: parameters, gradients, optimizer state."""
        return tuple(a + b + c for a, b, c in zip(self.param_bytes, self.grad_bytes,
                                                  self.optimizer_state_bytes, strict=True))


def uniform_stages(num_stages: int, forward_s: float, backward_input_s: float,
                   backward_weight_s: float, activation_bytes: int = 0, *, saved_bytes: int = 0,
                   param_bytes: int = 0) -> StageCosts:
    """``num_stages`` equal stages (every stage but the last sends ``activation_bytes``)."""
    if not (is_int(num_stages) and num_stages >= 1):
        raise TrainschedError(f"num_stages must be an integer >= 1, got {num_stages!r}")
    p = num_stages
    return StageCosts(forward_s=(forward_s,) * p, backward_input_s=(backward_input_s,) * p,
                      backward_weight_s=(backward_weight_s,) * p,
                      activation_bytes=(activation_bytes,) * (p - 1) + (0,),
                      saved_bytes=(saved_bytes,) * p, param_bytes=(param_bytes,) * p,
                      grad_bytes=(param_bytes,) * p, optimizer_state_bytes=(0,) * p)  # fmt: skip


def rank_cuts(graph: Graph, num_stages: int,
              stage_to_rank: Sequence[int]) -> tuple[tuple[int, ...], ...]:
    """:func:`rank_balanced_cuts` of ``graph``'s forward ops, from the cut balanced by stage
    (``stage_costs_from_graph``'s ``cut="compute"``), each as cut points for its ``cut``;
    none where every rank holds one stage. ``stage_to_rank``: the rank of each stage in the
    schedule that will run them (:func:`trainsched.backprop.schedules.stage_ranks`)."""
    mapping = tuple(stage_to_rank)
    if len(mapping) != num_stages or not all(is_int(r) and r >= 0 for r in mapping):
        raise TrainschedError(f"stage_to_rank must give a rank >= 0 for each of the "
                              f"{num_stages} stages, got {stage_to_rank!r}")
    if len(set(mapping)) == num_stages:
        return ()
    if graph.forward_only():
        graph = to_training(graph)
    order = tuple(n for n in graph.topological_order() if graph.op(n).kind == "forward")
    if num_stages > len(order):
        return ()  # stage_costs_from_graph says why
    phase = _phase_times(graph, order, launch_s(graph))
    weights = [math.fsum(total for total, _ in phase[n]) for n in order]
    if not any(weights):
        return ()
    return rank_balanced_cuts(weights, balanced_cuts(weights, num_stages), mapping)


def _check_cuts(cut: Sequence[Any], order: Sequence[str], num_stages: int) -> tuple[int, ...]:
    where = {name: k for k, name in enumerate(order)}
    points = []
    for c in cut:
        if isinstance(c, str):
            if c not in where:
                raise TrainschedError(f"cut point {c!r} is not a forward op of the graph; give "
                                      "the name of a stage's first op or its index in forward "
                                      "order")
            points.append(where[c])
        elif is_int(c):
            points.append(c)
        else:
            raise TrainschedError(f"cut point {c!r} must be an op name or an index into the "
                                  "forward ops")
    if len(points) != num_stages - 1:
        raise TrainschedError(f"{len(points)} cut point(s) make {len(points) + 1} stages, not "
                              f"{num_stages}; give num_stages - 1 = {num_stages - 1} cut points")
    bounds = [0, *points, len(order)]
    for k in range(1, len(bounds) - 1):
        if not 0 < bounds[k] < len(order):
            raise TrainschedError(f"cut point {cut[k - 1]!r} (index {bounds[k]}) must lie in "
                                  f"1..{len(order) - 1}: every stage needs at least one op")
        if bounds[k] <= bounds[k - 1]:
            raise TrainschedError(f"cut points must be strictly increasing (every stage needs "
                                  f"an op); {cut[k - 1]!r} (index {bounds[k]}) does not follow "
                                  f"index {bounds[k - 1]}")
    return tuple(points)


PHASES = {"forward": 0, "backward_input": 1, "backward_weight": 2}  # F, I, W of a stage


def _owner(op: Any) -> str:
    """The forward op a training graph's op belongs to (itself for a forward op)."""
    return op.forward_op or (op.name if op.kind == "forward" else op.name.rsplit(":", 1)[0])


def launch_s(graph: Graph) -> float:
    """The time each op of ``graph`` pays once per run whatever its size: the device's launch
    overhead in a roofline graph (``meta["launch_overhead_s"]``, which capture records; for a
    graph written before it, the catalogue's figure for ``meta["device"]``), else 0 (measured
    times do not separate it)."""
    meta = graph.meta
    if meta.get("tier") != "roofline":
        return 0.0
    value = meta.get("launch_overhead_s")
    if value is None:
        from trainsched.cluster.catalogue import device_kind

        try:
            value = device_kind(str(meta.get("device"))).launch_overhead_s
        except TrainschedError:
            return 0.0
    if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
        raise TrainschedError(f"the graph's meta launch_overhead_s must be a duration >= 0 s, "
                              f"got {value!r}")
    return float(value)


def microbatch_count(graph: Graph, microbatch_graph: Graph) -> int | None:
    """How many micro-batches of ``microbatch_graph``'s size make ``graph``'s batch, from the
    two graphs' ``meta["batch_size"]``; ``None`` when either does not say. A size that does
    not divide the batch is refused."""
    batch, micro = graph.meta.get("batch_size"), microbatch_graph.meta.get("batch_size")
    if not (is_int(batch) and is_int(micro) and batch >= 1 and micro >= 1):
        return None
    if batch % micro:
        raise TrainschedError(f"the micro-batch graph's batch of {micro} does not divide the "
                              f"graph's batch of {batch}: capture it at a divisor of {batch}")
    return batch // micro


def _phase_times(graph: Graph, order: Sequence[str],
                 launch: float = 0.0) -> dict[str, list[list[float]]]:
    """Per forward op in ``order``, per phase (forward, dX, dW): ``[summed time, the part of
    it paid per run whatever the size]``, the second ``launch`` for every op that costs
    anything (at most its time)."""
    phase = {n: [[0.0, 0.0], [0.0, 0.0], [0.0, 0.0]] for n in order}
    for op in graph.ops:
        if op.kind in PHASES:
            cell = phase[_owner(op)][PHASES[op.kind]]
            cell[0] += op.compute_s
            cell[1] += min(op.compute_s, launch)
    return phase


def stage_costs_from_graph(graph: Graph, num_stages: int, num_microbatches: int, *,
                           cut: str | Sequence[int | str] = "compute",
                           microbatch_graph: Graph | None = None) -> StageCosts:
    """Cut ``graph``'s forward ops into ``num_stages`` contiguous stages and cost them.

    ``graph`` is a training graph (:func:`trainsched.graph.to_training`); a forward-only
    graph is transformed with the default SGD optimizer first. Its forward ops, in the graph's
    topological order, are cut by ``cut``: ``"compute"`` balances the sum of each op's forward,
    dX and dW time, ``"params"`` its parameter bytes (the smallest largest stage in both cases),
    or a sequence of ``num_stages - 1`` cut points, each the first op of a stage (by name, or
    by index in that order). The backward and optimizer ops of a forward op (their
    ``forward_op``) go with it. Per micro-batch (``/ num_microbatches``, the linear-scaling
    assumption of the module docstring, each op's :func:`launch_s` paid whole): F, I and W are
    the summed ``compute_s`` of the stage's forward, ``backward_input`` and ``backward_weight``
    ops; ``saved_bytes`` the summed
    ``saved_bytes`` of its forward ops; ``activation_bytes[s]`` the bytes of the forward edges
    from stages ``<= s`` to stages ``> s`` (one tensor counted once, also when it skips a
    stage, which forwards it). Resident: ``param_bytes`` (with buffers), the gradients its dW
    ops produce and optimizer state. Optimizer compute is not part of a pipeline schedule and
    is left out.

    ``microbatch_graph``: the same model's training graph captured at the micro-batch size
    (the same ops by name). Its F, I and W times and its saved and activation bytes are then a
    micro-batch's as they are, not the batch's divided by ``num_microbatches``: measured on a
    CPU, a micro-batch of 2 images costs ResNet-50 more than a quarter of a batch of 8 (2.3x
    more at 32 x 32 on this project's host). The cut is made on ``graph``. Where both graphs
    record their batch size, the micro-batch graph's must be the batch over
    ``num_microbatches`` (:func:`microbatch_count`).
    """
    for name, value in (("num_stages", num_stages), ("num_microbatches", num_microbatches)):
        if not (is_int(value) and value >= 1):
            raise TrainschedError(f"{name} must be an integer >= 1, got {value!r}")
    if graph.forward_only():
        graph = to_training(graph)
    order = tuple(n for n in graph.topological_order() if graph.op(n).kind == "forward")
    if num_stages > len(order):
        raise TrainschedError(f"cannot cut {len(order)} forward op(s) into {num_stages} stages; "
                              f"use at most {len(order)} stages, or a finer-grained graph")
    forward = set(order)
    if microbatch_graph is not None:
        if microbatch_graph.forward_only():
            microbatch_graph = to_training(microbatch_graph)
        if {op.name for op in microbatch_graph.ops} != {op.name for op in graph.ops}:
            raise TrainschedError("the micro-batch graph's ops are not the graph's: capture "
                                  "the same model the same way at the micro-batch size")
        count = microbatch_count(graph, microbatch_graph)
        if count is not None and count != num_microbatches:
            raise TrainschedError(
                f"the micro-batch graph holds 1/{count} of the graph's batch of "
                f"{graph.meta['batch_size']}, not 1/{num_microbatches}: capture it at "
                f"{graph.meta['batch_size']} / {num_microbatches} samples, or use "
                f"{count} micro-batches")
    resident = {n: [0, 0, 0] for n in order}  # params + buffers, grads, optimizer state
    for op in graph.ops:
        owner = _owner(op)
        if owner not in forward:
            raise TrainschedError(f"op {op.name!r} ({op.kind}) belongs to no forward op of the "
                                  "graph (set its forward_op); cannot assign it to a stage")
        if op.kind == "backward_weight":
            resident[owner][1] += op.output_bytes
        resident[owner][0] += op.param_bytes + op.buffer_bytes
        resident[owner][2] += op.optimizer_state_bytes
    phase = _phase_times(graph, order, launch_s(graph))

    if isinstance(cut, str):
        if cut not in CUT_MODES:
            raise TrainschedError(f"unknown cut {cut!r}; use one of {', '.join(CUT_MODES)} or a "
                                  "list of cut points")
        if cut == "compute":
            weights = [math.fsum(total for total, _ in phase[n]) for n in order]
        else:
            weights = [float(graph.op(n).param_bytes) for n in order]
        if num_stages > 1 and not any(weights):
            what = "compute time" if cut == "compute" else "parameters"
            raise TrainschedError(f"the graph's forward ops have no {what} to balance; give "
                                  "explicit cut points or another cut")
        points = balanced_cuts(weights, num_stages) if num_stages > 1 else ()
    elif isinstance(cut, Sequence):
        points = _check_cuts(list(cut), order, num_stages)
    else:
        raise TrainschedError(f"cut must be 'compute', 'params' or a list of cut points, "
                              f"got {cut!r}")

    bounds = [0, *points, len(order)]
    stage_of = {}
    for s in range(num_stages):
        for n in order[bounds[s]:bounds[s + 1]]:
            stage_of[n] = s
    m = num_microbatches
    sized = graph
    if microbatch_graph is not None:  # a micro-batch's own costs and bytes: nothing to divide
        phase = _phase_times(microbatch_graph, order, launch_s(microbatch_graph))
        m, sized = 1, microbatch_graph
    # A tensor (producer, key) read in later stages crosses every cut up to its last reader's
    # stage, once, at the largest size any edge gives it; a stage it skips forwards it.
    last_reader: dict[tuple[str, str], list[int]] = {}  # -> [last stage, size]
    for e in sized.edges:
        if e.src in forward and e.dst in forward and stage_of[e.dst] > stage_of[e.src]:
            entry = last_reader.setdefault((e.src, e.tensor), [0, 0])
            entry[0] = max(entry[0], stage_of[e.dst])
            entry[1] = max(entry[1], e.size_bytes)
    crossing = [0] * num_stages
    for (src, _), (last, size) in last_reader.items():
        for s in range(stage_of[src], last):
            crossing[s] += size

    def per_mb_s(cells: list[list[float]]) -> float:  # the size-free part is paid every time
        fixed = math.fsum(f for _, f in cells)
        return (math.fsum(t for t, _ in cells) - fixed) / m + fixed

    def per_mb_bytes(total: int) -> int:
        return -(-total // m)

    stages = [order[bounds[s]:bounds[s + 1]] for s in range(num_stages)]
    return StageCosts(
        forward_s=tuple(per_mb_s([phase[n][0] for n in names]) for names in stages),
        backward_input_s=tuple(per_mb_s([phase[n][1] for n in names]) for names in stages),
        backward_weight_s=tuple(per_mb_s([phase[n][2] for n in names]) for names in stages),
        activation_bytes=tuple(per_mb_bytes(b) for b in crossing),
        saved_bytes=tuple(per_mb_bytes(sum(sized.op(n).saved_bytes for n in names))
                          for names in stages),
        param_bytes=tuple(sum(resident[n][0] for n in names) for names in stages),
        grad_bytes=tuple(sum(resident[n][1] for n in names) for names in stages),
        optimizer_state_bytes=tuple(sum(resident[n][2] for n in names) for names in stages),
        ops=tuple(stages),
        num_microbatches=num_microbatches,
    )  # fmt: skip
