"""The training transform: a forward graph becomes forward + split backward + optimizer.

Backward is split the way out-of-order backprop and zero-bubble pipelines need it: ``v:dX``
(``backward_input``, the gradient of v's inputs, on the critical path) and ``v:dW``
(``backward_weight``, the gradient of v's parameters, free to move), then ``v:opt`` updates
the parameters. Only ops that really need gradient work get it: an op fed only by inputs and
parameter-free ops has no backward, and the first layer of a network has no ``dX`` (unless its
input is listed in ``meta["grad_inputs"]``: a pipeline stage captured alone). Nothing else
builds backward ops by hand. The rules are listed in ``docs/graph-format.md``.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import replace
from typing import Any

from trainsched.errors import TrainschedError
from trainsched.graph.core import Edge, Graph, Op
from trainsched.precision import master_weights

# State tensors per parameter: SGD none, SGD with momentum one, Adam two (first and second moment).
OPTIMIZER_STATE_TENSORS = {"sgd": 0, "momentum": 1, "adam": 2}
#: The optimizers a training graph (and a real run) can use: the one list of their names.
OPTIMIZERS = tuple(OPTIMIZER_STATE_TENSORS)
# Used for optimizer steps when neither the caller nor the graph's meta gives a bandwidth.
DEFAULT_MEMORY_BANDWIDTH_BYTES_PER_S = 10e9


def to_training(
    graph: Graph, *, optimizer: str = "sgd", memory_bandwidth_bytes_per_s: float | None = None
) -> Graph:
    """The training graph of a forward graph (every op of kind ``forward``).

    Ops come in forward (topological) order, then backward ops in reverse forward order (``dX``
    before ``dW`` of each op), then optimizer ops in forward order. ``optimizer`` is one of
    ``sgd``, ``momentum``, ``adam``; optimizer steps are memory-bound and cost their bytes over
    ``memory_bandwidth_bytes_per_s`` (default: ``meta["memory_bandwidth_bytes_per_s"]``, else
    10 GB/s). A graph captured in 16-bit parameters (``meta["precision"]`` ``bf16``/``fp16``)
    gets an fp32 master copy and fp32 optimizer state in its optimizer ops.
    """
    if optimizer not in OPTIMIZER_STATE_TENSORS:
        raise TrainschedError(
            f"unknown optimizer {optimizer!r}; choose one of {', '.join(OPTIMIZER_STATE_TENSORS)}"
        )
    bandwidth = _bandwidth(graph, memory_bandwidth_bytes_per_s)
    wrong = [op for op in graph.ops if op.kind != "forward"]
    if wrong:
        raise TrainschedError(
            f"to_training needs a forward graph, but op {wrong[0].name!r} has kind "
            f"{wrong[0].kind!r} ({len(wrong)} non-forward ops); was it transformed already?"
        )
    order = graph.topological_order()
    # Inputs that need a gradient: a pipeline stage captured alone (capture's
    # inputs_require_grad) reads the previous stage's activations, so its first ops get a dX.
    grad_inputs = set(graph.meta.get("grad_inputs", ()))
    requires_grad: dict[str, bool] = {}
    has_dx: dict[str, bool] = {}
    for v in order:
        has_dx[v] = any(requires_grad[u] for u in graph.predecessors(v))
        requires_grad[v] = has_dx[v] or graph.op(v).param_bytes > 0 or v in grad_inputs
    # Gradient bytes flowing back from consumer c to producer u: the forward edges' sizes.
    grad_bytes: dict[str, dict[str, int]] = {v: {} for v in order}
    for e in graph.edges:
        if has_dx[e.dst] and requires_grad[e.src]:
            grad_bytes[e.dst][e.src] = grad_bytes[e.dst].get(e.src, 0) + e.size_bytes

    forward = [graph.op(v) for v in order]
    backward: list[Op] = []
    grads: dict[str, list[str]] = {}  # the backward ops of each forward op, by name
    for op in reversed(forward):
        # dX outputs one gradient per producer that needs one; dW outputs the parameter gradient.
        mine = []
        if has_dx[op.name]:
            mine.append(_backward(op, "backward_input", sum(grad_bytes[op.name].values())))
        if op.param_bytes > 0:
            mine.append(_backward(op, "backward_weight", op.param_bytes))
        elif op.tied_to:
            mine.append(_tied_backward(op, graph, bandwidth))
        backward += mine
        grads[op.name] = [b.name for b in mine]
    master = master_weights(graph.meta.get("precision", "fp32"))
    optim = [_optimizer(op, optimizer, bandwidth, master) for op in forward if op.param_bytes > 0]
    optim, per_op = charge_optimizer_step(optim, graph.meta.get(OPTIMIZER_STEP), optimizer)

    edges = list(graph.edges)
    edges += [
        Edge(src=op.name, dst=b, size_bytes=op.saved_bytes, tensor=f"{op.name}:saved")
        for op in forward
        for b in grads[op.name]
    ]
    edges += [
        Edge(src=f"{c}:dX", dst=b, size_bytes=size, tensor=f"{c}:dX>{u}")
        for c in reversed(order)
        for u, size in grad_bytes[c].items()
        for b in grads[u]
    ]
    edges += [
        Edge(src=f"{op.name}:dW", dst=op.name + ":opt", size_bytes=op.param_bytes,
             tensor=f"{op.name}:grad")
        for op in forward
        if op.param_bytes > 0
    ]  # fmt: skip
    # A tied weight's gradient is whole once every reader's dW has added its share into it.
    edges += [
        Edge(src=f"{op.name}:dW", dst=f"{owner}:dW", size_bytes=graph.op(owner).param_bytes,
             tensor=f"{op.name}:grad>{owner}")
        for op in forward if op.param_bytes == 0
        for owner in op.tied_to
    ]  # fmt: skip
    meta = graph.meta
    meta["training"] = {"optimizer": optimizer, "memory_bandwidth_bytes_per_s": bandwidth}
    if per_op is not None:
        meta["training"]["optimizer_step_per_op_s"] = per_op
    forward = [replace(op, group=_group(op)) for op in forward]
    return Graph([*forward, *backward, *optim], edges, meta)


#: The key of ``graph.meta`` recording a measured optimizer step (capture's measured tier):
#: ``optimizer`` (its name), ``step_s`` (median seconds of ``step()`` + ``zero_grad()``),
#: ``steps`` (how many were timed), ``params`` (parameter tensors it updated).
OPTIMIZER_STEP = "optimizer_step"


def charge_optimizer_step(optim: list[Op], record: Any,
                          optimizer: str) -> tuple[list[Op], float | None]:
    """The optimizer ops ``optim`` with a measured step charged, and the charge per op.

    ``record`` is ``meta["optimizer_step"]`` (None: nothing measured). When it measured the
    same ``optimizer`` and its ``step_s`` exceeds the ops' summed times (their bytes over the
    memory bandwidth), every op gets an even share of the difference, so the ops add up to the
    measured step: what a per-parameter loop pays beyond the bytes (Python, dispatch, one
    kernel per tensor). Never taken away (0 charged); another optimizer, or no ops: untouched
    (None)."""
    if not isinstance(record, dict) or record.get("optimizer") != optimizer or not optim:
        return optim, None
    step_s = record.get("step_s")
    if not (isinstance(step_s, int | float) and math.isfinite(step_s) and step_s >= 0):
        raise TrainschedError(f"meta[{OPTIMIZER_STEP!r}] step_s must be a finite number of "
                              f"seconds >= 0, got {step_s!r}; capture the graph again")
    gap = step_s - sum(op.compute_s for op in optim)
    if gap <= 0:
        return optim, 0.0
    per_op = gap / len(optim)
    return [replace(op, compute_s=op.compute_s + per_op) for op in optim], per_op


def _group(op: Op) -> str:
    """The co-location group of a forward op and everything derived from it."""
    return op.group if op.group is not None else op.name


def _bandwidth(graph: Graph, given: float | None) -> float:
    """Memory bandwidth for optimizer steps: the argument, else the graph's meta, else 10 GB/s."""
    key = "memory_bandwidth_bytes_per_s"
    value, where = (given, key) if given is not None else (graph.meta.get(key), f"meta[{key!r}]")
    if value is None:
        return DEFAULT_MEMORY_BANDWIDTH_BYTES_PER_S
    number = isinstance(value, numbers.Real) and not isinstance(value, bool)
    if not (number and math.isfinite(value) and value > 0):
        raise TrainschedError(
            f"{where} must be a positive number of bytes per second, got {value!r}"
        )
    return float(value)


def _backward_cost(op: Op, measured_s: float | None, backward_flops: float | None) -> float:
    """Measured time, else forward time scaled by the FLOP ratio, else the forward time."""
    if measured_s is not None:
        return measured_s
    if op.flops > 0 and backward_flops is not None:
        return op.compute_s * backward_flops / op.flops
    return op.compute_s


def _derived(op: Op, suffix: str, kind: str, **fields: object) -> Op:
    """An op derived from forward op ``op``: same group, layer and module, no saved bytes."""
    return Op(name=f"{op.name}:{suffix}", kind=kind, group=_group(op), forward_op=op.name,
              layer_index=op.layer_index, module_path=op.module_path, **fields)  # fmt: skip


def _backward(op: Op, kind: str, output_bytes: int) -> Op:
    """``v:dX`` or ``v:dW`` (by ``kind``), costed from the forward op's record of that phase."""
    measured_s = getattr(op, f"{kind}_s")
    backward_flops = getattr(op, f"{kind}_flops")
    measured = measured_s is not None
    return _derived(
        op, "dX" if kind == "backward_input" else "dW", kind,
        compute_s=_backward_cost(op, measured_s, backward_flops),
        flops=backward_flops if backward_flops is not None else op.flops,
        bytes_accessed=op.bytes_accessed,
        output_bytes=output_bytes,
        temp_bytes=op.temp_bytes,
        target=op.target,
        compute_p10_s=getattr(op, f"{kind}_p10_s") if measured else None,
        compute_p90_s=getattr(op, f"{kind}_p90_s") if measured else None,
        samples=op.samples if measured else 0,
    )  # fmt: skip


def _tied_backward(op: Op, graph: Graph, bandwidth_bytes_per_s: float) -> Op:
    """``v:dW`` of an op that reads tied weights it does not own: its weight-gradient work plus
    adding the result into each owner's gradient (read both, write one: memory-bound). It
    produces no gradient of its own (``output_bytes`` 0): the owners' gradients hold the sum."""
    missing = [t for t in op.tied_to if t not in graph or graph.op(t).param_bytes == 0]
    if missing:
        raise TrainschedError(f"op {op.name!r} is tied to {missing[0]!r}, which is not an op "
                              f"owning parameters in this graph; tied_to must name the ops "
                              f"that own the shared parameters")
    shared = sum(graph.op(t).param_bytes for t in op.tied_to)
    dw = _backward(op, "backward_weight", 0)
    return replace(dw, compute_s=dw.compute_s + 3 * shared / bandwidth_bytes_per_s,
                   bytes_accessed=dw.bytes_accessed + 3 * shared)


def _optimizer(op: Op, optimizer: str, bandwidth_bytes_per_s: float, master: bool) -> Op:
    """``v:opt``: reads param, grad and k state tensors, writes param and state; memory-bound.
    With ``master`` (16-bit parameters) the state and an fp32 master copy of the weights are
    twice the parameters' bytes each, and the step also reads and writes the master copy."""
    k = OPTIMIZER_STATE_TENSORS[optimizer]
    if master:
        state = 2 * (k + 1) * op.param_bytes
        accessed = op.param_bytes * 2 + 2 * state    # param and grad read, state read + written
    else:
        state = k * op.param_bytes
        accessed = op.param_bytes * (3 + 2 * k)
    return _derived(
        op, "opt", "optimizer",
        compute_s=accessed / bandwidth_bytes_per_s,
        bytes_accessed=accessed,
        optimizer_state_bytes=state,
        target=optimizer,
    )  # fmt: skip
