"""Trace an nn.Module into a flat list of steps: torch.export first, torch.fx as the fallback.

A *step* is one call the capture will run and cost on its own: an ATen op of the exported
program (op granularity) or, with the fx fallback, a leaf-module call. Views, ``getitem`` and
other aliasing calls are not steps: their consumers read the tensor they alias, so moving a view
across devices moves the tensor it shows and costs nothing to compute. Work that does not depend
on the user's inputs (buffer updates such as BatchNorm's ``num_batches_tracked += 1``, masks
built from constants) is not a step either: it is state, not per-batch work.
"""

from __future__ import annotations

import contextlib
import io
import logging
import operator
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx

from trainsched.errors import TrainschedError

#: ATen packets whose output aliases an input: free to compute, folded into what they view.
_VIEW_PACKETS = {
    "alias", "as_strided", "chunk", "detach", "diagonal", "expand", "expand_as", "flatten",
    "lift_fresh", "lift_fresh_copy", "movedim", "narrow", "permute", "reshape", "select",
    "slice", "split", "split_with_sizes", "squeeze", "t", "transpose", "unbind", "unflatten",
    "unsafe_split", "unsqueeze", "view", "view_as", "_unsafe_view", "_reshape_alias",
    "unfold",
}


@dataclass(frozen=True)
class Ref:
    """An argument that is the value of another traced node (a step, a view or an input)."""

    node: str


@dataclass(frozen=True)
class StateRef:
    """An argument that is a parameter, buffer or constant of the model, by qualified name."""

    fqn: str


@dataclass
class Step:
    """One costed call. ``args``/``kwargs`` hold Ref/StateRef placeholders and literals."""

    name: str
    target: str
    fn: Callable[..., Any]
    args: tuple
    kwargs: dict
    module_path: str
    module_call: str          # module path plus the call index, e.g. "layer1.0.relu@1"
    state: tuple[str, ...] = ()   # qualified names of the parameters/buffers it reads


@dataclass
class Traced:
    """What capture needs from a model, independent of how it was traced."""

    method: str                              # "export" or "fx"
    inputs: dict[str, Any]                   # user-input node name -> example value
    state: dict[str, torch.Tensor]           # fqn -> parameter/buffer/constant tensor
    trainable: set[str]                      # fqns of trainable parameters
    steps: list[Step]
    views: dict[str, tuple[Callable[..., Any], tuple, dict]] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)   # value nodes (views, steps), program order
    outputs: list[str] = field(default_factory=list)  # nodes whose values the model returns


def _packet_name(target: Any) -> str:
    if isinstance(target, torch._ops.OpOverload):
        return target.overloadpacket.__name__
    return getattr(target, "__name__", str(target))


def _target_str(target: Any) -> str:
    if isinstance(target, torch._ops.OpOverload):
        return f"aten.{target.overloadpacket.__name__}.{target._overloadname}"
    if target is operator.getitem:
        return "getitem"
    return getattr(target, "__qualname__", None) or getattr(target, "__name__", str(target))


def _module_of(node: fx.Node) -> tuple[str, str]:
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return "", ""
    key, (path, _type) = list(stack.items())[-1]
    suffix = key.rsplit("@", 1)[1] if "@" in key else "0"
    return path, f"{path}@{suffix}"


def _map_args(value: Any, convert: Callable[[fx.Node], Any]) -> Any:
    return fx.node.map_arg(value, convert)


def _is_view(node: fx.Node) -> bool:
    return node.target is operator.getitem or _packet_name(node.target) in _VIEW_PACKETS


def trace_export(model: torch.nn.Module, args: tuple, kwargs: dict) -> Traced:
    """Trace with torch.export (functionalised, decompositions kept at the level users write)."""
    program = torch.export.export(model, args, kwargs).run_decompositions({})
    signature = program.graph_signature
    state_of: dict[str, str] = {}
    state_of.update(signature.inputs_to_parameters)
    state_of.update(signature.inputs_to_buffers)
    state_of.update(getattr(signature, "inputs_to_lifted_tensor_constants", {}) or {})
    named = dict(program.named_parameters())
    named.update(dict(program.named_buffers()))
    named.update(dict(getattr(program, "constants", {}) or {}))
    state = {fqn: named[fqn] for fqn in state_of.values() if fqn in named}
    trainable = {fqn for fqn in signature.inputs_to_parameters.values()
                 if fqn in state and state[fqn].requires_grad}

    input_values = match_inputs(program, args, kwargs)

    graph = program.graph
    output_node = next(n for n in graph.nodes if n.op == "output")
    user_out_names = set(signature.user_outputs)
    outputs = [n.name for n in _flatten(list(output_node.args)) if isinstance(n, fx.Node)
               and n.name in user_out_names]
    return normalise_graph(graph, state_of, input_values, state, trainable, outputs, "export")


def match_inputs(program: Any, args: tuple, kwargs: dict) -> dict[str, Any]:
    """Pair the exported program's user-input placeholders with the example tensors."""
    names = set(program.graph_signature.user_inputs)
    placeholders = [n for n in program.graph.nodes if n.op == "placeholder" and n.name in names]
    by_name = {k: v for k, v in kwargs.items() if isinstance(v, torch.Tensor)}
    positional = [v for v in _flatten(list(args)) if isinstance(v, torch.Tensor)]
    values: dict[str, Any] = {}
    for node in placeholders:
        value = by_name.pop(node.name) if node.name in by_name else (
            positional.pop(0) if positional else by_name.pop(next(iter(by_name)), None))
        expected = node.meta.get("val")
        if not isinstance(value, torch.Tensor) or (
                expected is not None and tuple(expected.shape) != tuple(value.shape)):
            raise TrainschedError(
                f"cannot match the exported input {node.name!r} to an example tensor; pass "
                "tensors as positional arguments or as keyword arguments named like forward's")
        values[node.name] = value
    return values


def trace_fx(model: torch.nn.Module, args: tuple, kwargs: dict) -> Traced:
    """Fallback: torch.fx symbolic tracing; leaf-module calls become steps."""
    gm = fx.symbolic_trace(model)
    state = dict(gm.named_parameters())
    state.update(dict(gm.named_buffers()))
    trainable = {k for k, v in gm.named_parameters() if v.requires_grad}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    values = list(args) + [kwargs[n.name] for n in placeholders[len(args):] if n.name in kwargs]
    input_values = {n.name: v for n, v in zip(placeholders, values, strict=False)}
    steps: list[Step] = []
    views: dict[str, tuple] = {}
    order: list[str] = []
    modules = dict(gm.named_modules())
    outputs: list[str] = []

    def convert(n: fx.Node) -> Any:
        if n.op == "get_attr":
            return StateRef(str(n.target))
        return Ref(n.name)

    for node in gm.graph.nodes:
        if node.op == "placeholder":
            continue
        if node.op == "output":
            outputs = [n.name for n in _flatten(list(node.args)) if isinstance(n, fx.Node)]
            continue
        if node.op == "get_attr":
            continue
        a = _map_args(node.args, convert)
        k = _map_args(node.kwargs, convert)
        if node.op == "call_module":
            path = str(node.target)
            module = modules[path]
            local = dict(module.named_parameters())
            local.update(dict(module.named_buffers()))
            names = tuple(f"{path}.{n}" for n in local)
            fn = _module_caller(module, tuple(local))
            steps.append(Step(node.name, type(module).__name__, fn, a, k, path, f"{path}@0", names))
        else:
            target = node.target
            fn = (lambda *x, _m=target, **kw: getattr(x[0], _m)(*x[1:], **kw)) \
                if node.op == "call_method" else target
            name = str(target) if node.op == "call_method" else _target_str(target)
            if name in _VIEW_PACKETS or target is operator.getitem:
                views[node.name] = (fn, a, k)
            else:
                steps.append(Step(node.name, name, fn, a, k, "", "@0"))
        order.append(node.name)
    return Traced("fx", input_values, state, trainable, steps, views, order, outputs)


def _module_caller(module: torch.nn.Module, local_names: tuple[str, ...]) -> Callable[..., Any]:
    def call(*args: Any, __state: tuple = (), **kwargs: Any) -> Any:
        return torch.func.functional_call(module, dict(zip(local_names, __state, strict=True)),
                                          args, kwargs)
    return call


def _flatten(value: Any) -> list:
    if isinstance(value, (list, tuple)):
        return [x for v in value for x in _flatten(v)]
    if isinstance(value, dict):
        return [x for v in value.values() for x in _flatten(v)]
    return [value]


def normalise_graph(graph: fx.Graph, state_of: dict[str, str], input_values: dict[str, Any],
                    state: dict[str, torch.Tensor], trainable: set[str], outputs: list[str],
                    method: str) -> Traced:
    """Split an exported graph into steps and views; drop input-independent work.

    ``input_values`` pairs user-input placeholders with example tensors (:func:`match_inputs`);
    :class:`trainsched.runtime.PlacedModule` splits a program the same way capture does.
    """
    # Per-batch work is whatever reads a user input or a trainable parameter (the latter gets a
    # gradient even when computed from constants, e.g. position embeddings).
    depends_on_input: set[str] = set(input_values) | {
        name for name, fqn in state_of.items() if fqn in trainable}
    nodes = [n for n in graph.nodes if n.op == "call_function"]
    for node in nodes:
        if any(a.name in depends_on_input for a in node.all_input_nodes):
            depends_on_input.add(node.name)
    needed: set[str] = set(outputs)
    for node in reversed(nodes):
        if node.name in needed:
            needed.update(a.name for a in node.all_input_nodes)

    constants: dict[str, torch.Tensor] = {}
    steps: list[Step] = []
    views: dict[str, tuple] = {}
    order: list[str] = []

    def convert(n: fx.Node) -> Any:
        if n.name in state_of:
            return StateRef(state_of[n.name])
        if n.name in constants:
            return StateRef(n.name)
        return Ref(n.name)

    for node in nodes:
        if node.name not in needed:
            continue
        a = _map_args(node.args, convert)
        k = _map_args(node.kwargs, convert)
        if node.name not in depends_on_input:
            # Input-independent work (masks, position ids): computed once, held as state.
            constants[node.name] = _evaluate(node.target, a, k, state, constants)
            continue
        if _is_view(node):
            views[node.name] = (node.target, a, k)
        else:
            path, call = _module_of(node)
            used = tuple(sorted({r.fqn for r in _flatten([a, k]) if isinstance(r, StateRef)}))
            steps.append(Step(node.name, _target_str(node.target), node.target, a, k, path, call,
                              used))
        order.append(node.name)
    if not steps:
        raise TrainschedError("the traced model has no computation that depends on its inputs")
    state = {**state, **constants}
    return Traced(method, input_values, state, trainable, steps, views, order, outputs)


def _evaluate(target: Any, args: Any, kwargs: Any, state: dict, constants: dict) -> Any:
    def value(r: Any) -> Any:
        if isinstance(r, StateRef):
            return constants.get(r.fqn, state.get(r.fqn))
        return r
    real_args = _tree_map(value, args)
    real_kwargs = _tree_map(value, kwargs)
    with torch.no_grad():
        return target(*real_args, **real_kwargs)


def _tree_map(fn: Callable[[Any], Any], value: Any) -> Any:
    if isinstance(value, tuple):
        return tuple(_tree_map(fn, v) for v in value)
    if isinstance(value, list):
        return [_tree_map(fn, v) for v in value]
    if isinstance(value, dict):
        return {k: _tree_map(fn, v) for k, v in value.items()}
    return fn(value)


def trace(model: torch.nn.Module, args: tuple, kwargs: dict, method: str = "auto") -> Traced:
    """Trace ``model`` on the example inputs; ``method`` is "auto", "export" or "fx"."""
    if method not in ("auto", "export", "fx"):
        raise TrainschedError(f"unknown trace method {method!r}; use auto, export or fx")
    if method in ("auto", "export"):
        try:
            with held_stderr():
                return trace_export(model, args, kwargs)
        except TrainschedError:
            raise
        except Exception as exc:
            if method == "export":
                raise TrainschedError(f"torch.export failed on the model: {_first_line(exc)}") \
                    from exc
            export_error = exc
    try:
        with held_stderr():
            return trace_fx(model, args, kwargs)
    except Exception as exc:
        msg = f"could not trace the model: torch.fx failed: {_first_line(exc)}"
        if method == "auto":
            msg = (f"could not trace the model: torch.export failed "
                   f"({_first_line(export_error)}) and torch.fx failed ({_first_line(exc)})")
        raise TrainschedError(msg) from exc


@contextlib.contextmanager
def quiet_torch_logs() -> Iterator[None]:
    """torch logs failures of export and fake tensors with tracebacks at ERROR level; capture
    reports them as one clear line instead, so records up to ERROR are muted meanwhile."""
    previous = logging.root.manager.disable
    logging.disable(logging.ERROR)
    try:
        yield
    finally:
        logging.disable(previous)


@contextlib.contextmanager
def held_stderr() -> Iterator[None]:
    """Hold what is printed on ``sys.stderr`` inside (torch.export prints the partial graph of a
    model it cannot trace, dozens of lines, before raising): passed on when the block succeeds
    (warnings stay visible), dropped when it raises, whose error capture reports in one line."""
    held = io.StringIO()
    with contextlib.redirect_stderr(held):
        yield
    sys.stderr.write(held.getvalue())


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".strip()
