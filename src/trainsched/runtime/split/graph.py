"""The graph backend: split the backward of any module with parameters, per call.

Each forward call of a graph-split module runs on an *island*: its tensor arguments that
require a gradient enter detached (fresh leaves), the module's own autograd graph is built
from them and its parameters, and a bridge function (:class:`_Bridge`) hands the outputs,
detached, to the caller's graph. When the caller's backward reaches the bridge:

- **dX.** ``autograd.grad`` from the island's outputs to its input leaves only
  (``retain_graph=True``). Autograd runs only the nodes on a path to an input and, in a node
  that also feeds a parameter, computes only the input side (its output mask), so no weight
  kernel runs. A pre-hook on every *frontier* node (a node on an input path with an edge to a
  node that reaches only parameters: where a weight's path joins the activation path) records
  the gradient arriving there.
- **dW.** The closure pushed to the queue runs ``autograd.grad`` from those frontier nodes
  (``GradientEdge``), fed the recorded gradients, and from the outputs that lie off every
  input path, to the parameters; the results are accumulated into ``.grad``. A frontier node
  below another frontier node would receive its gradient twice in that pass (once recorded,
  once recomputed from above), so a pre-hook replaces what arrives at every frontier node by
  what was recorded (tied weights inside one module are the usual case).

With no input that requires a gradient there is no dX and the whole backward is dW. The
bytes an entry holds are the island's saved tensors (seen by a ``saved_tensors_hooks`` pack
hook), the recorded gradients and the output gradients, parameters left out.

What cannot be split raises :class:`~trainsched.errors.TrainschedError` naming the module:
outputs other than tensors in (nested) tuples, lists and dicts, and tensors that require a
gradient hidden inside container arguments.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.autograd.graph import GradientEdge, Node, get_gradient_edge

from trainsched.errors import TrainschedError
from trainsched.runtime.split.functions import Slot
from trainsched.runtime.split.queue import accumulate

__all__ = ["graph_forward"]


def _flatten(value: Any, out: list[torch.Tensor], where: str) -> Any:
    """``value`` with each tensor replaced by its index in ``out`` (appended)."""
    if isinstance(value, torch.Tensor):
        out.append(value)
        return _Leaf(len(out) - 1)
    if isinstance(value, tuple | list):
        items = [_flatten(v, out, where) for v in value]
        return type(value)(items) if not hasattr(value, "_fields") else type(value)(*items)
    if isinstance(value, dict):
        return {k: _flatten(v, out, where) for k, v in value.items()}
    if value is None or isinstance(value, int | float | bool | str):
        return value
    raise TrainschedError(f"{where} returns a {type(value).__name__}; the graph split handles "
                          f"tensors in (nested) tuples, lists and dicts")


class _Leaf:
    def __init__(self, index: int) -> None:
        self.index = index


def _rebuild(shape: Any, tensors: list[torch.Tensor]) -> Any:
    if isinstance(shape, _Leaf):
        return tensors[shape.index]
    if isinstance(shape, tuple | list):
        items = [_rebuild(v, tensors) for v in shape]
        return type(shape)(items) if not hasattr(shape, "_fields") else type(shape)(*items)
    if isinstance(shape, dict):
        return {k: _rebuild(v, tensors) for k, v in shape.items()}
    return shape


def _needs_grad_inside(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return value.requires_grad
    if isinstance(value, tuple | list):
        return any(_needs_grad_inside(v) for v in value)
    if isinstance(value, dict):
        return any(_needs_grad_inside(v) for v in value.values())
    return False


class _Island:
    """One forward call of a graph-split module: its detached inputs, inner outputs and the
    storages its graph saved."""

    def __init__(self, slot: Slot, tag: tuple[int, int], leaves: list[torch.Tensor],
                 outs: list[torch.Tensor], saved: list[torch.Tensor]) -> None:
        self.slot, self.tag = slot, tag
        self.leaves = leaves
        self.outs = outs
        self.saved = saved

    def backward_input(self, gys: tuple[torch.Tensor | None, ...]) -> tuple[Any, ...]:
        pairs = [(o, g) for o, g in zip(self.outs, gys, strict=True)
                 if g is not None and o.requires_grad]
        params = [p for _, p in self.slot.params]
        inputs = [x for x in self.leaves if x.requires_grad]
        if not pairs:
            return (None,) * len(self.leaves)
        roots = [get_gradient_edge(o).node for o, _ in pairs]
        down = _on_paths(roots, [get_gradient_edge(x).node for x in inputs])
        up = _on_paths(roots, [get_gradient_edge(p).node for p in params])
        frontier = [n for n in down if any(c is not None and c in up and c not in down
                                           for c, _ in n.next_functions)]
        recorded: dict[Node, tuple] = {}
        dxs: tuple[torch.Tensor | None, ...] = (None,) * len(inputs)
        if inputs:
            handles = [n.register_prehook(lambda grads, n=n: recorded.__setitem__(n, grads))
                       for n in frontier]
            try:
                dxs = torch.autograd.grad([o for o, _ in pairs], inputs,
                                          [g for _, g in pairs], retain_graph=True,
                                          allow_unused=True)
            finally:
                for h in handles:
                    h.remove()
        starts: list[Any] = []
        grads: list[torch.Tensor] = []
        for n in frontier:
            for i, g in enumerate(recorded.get(n, ())):
                if g is not None:
                    starts.append(GradientEdge(n, i))
                    grads.append(g)
        for o, g in pairs:
            edge = get_gradient_edge(o)
            if edge.node not in down and edge.node in up:
                starts.append(edge)
                grads.append(g)
        keep = [*self.saved, *grads]
        overwrite = {n: recorded[n] for n in frontier if n in recorded}
        self.outs, self.saved = [], []
        self.slot.push(*self.tag, tuple(keep), _weight_closure(starts, grads, params, overwrite))
        by_leaf = dict(zip(map(id, inputs), dxs, strict=True))
        return tuple(by_leaf.get(id(x)) for x in self.leaves)


def _on_paths(roots: list[Node], targets: list[Node]) -> set[Node]:
    """The nodes reachable from ``roots`` from which some of ``targets`` is reachable."""
    parents: dict[Node, list[Node]] = {}
    seen: set[Node] = set()
    stack = list(roots)
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        for child, _ in node.next_functions:
            if child is not None:
                parents.setdefault(child, []).append(node)
                stack.append(child)
    found: set[Node] = set()
    stack = [t for t in targets if t in seen]
    while stack:
        node = stack.pop()
        if node in found:
            continue
        found.add(node)
        stack.extend(parents.get(node, ()))
    return found


def _weight_closure(starts: list[Any], grads: list[torch.Tensor],
                    params: list[nn.Parameter], overwrite: dict[Node, tuple],
                    ) -> Callable[[], None]:
    def run() -> None:
        if not starts:
            return
        handles = ([n.register_prehook(lambda _grads, g=g: g) for n, g in overwrite.items()]
                   if len(starts) > 1 else [])
        try:
            found = torch.autograd.grad(starts, params, grads, allow_unused=True)
        finally:
            for h in handles:
                h.remove()
        for p, g in zip(params, found, strict=True):
            if g is not None:
                accumulate(p, g)
    return run


class _Bridge(torch.autograd.Function):
    """Joins an island to the caller's graph: the inputs that require a gradient and the
    parameters in, the island's outputs (detached) out."""

    @staticmethod
    def forward(ctx: Any, island: _Island, num_inputs: int, *tensors: torch.Tensor) -> Any:
        ctx.island, ctx.num_inputs = island, num_inputs
        ctx.num_params = len(tensors) - num_inputs
        outs = tuple(o.detach() for o in island.outs)
        ctx.mark_non_differentiable(*[d for d, o in zip(outs, island.outs, strict=True)
                                      if not o.requires_grad])
        return outs

    @staticmethod
    def backward(ctx: Any, *gys: torch.Tensor | None) -> tuple[Any, ...]:
        dxs = ctx.island.backward_input(gys)
        return (None, None, *dxs, *([None] * ctx.num_params))


def graph_forward(m: nn.Module, slot: Slot, forward: Callable[..., Any]) -> Callable[..., Any]:
    """The forward that replaces ``m``'s (``forward``, its own) with a graph-split one."""
    where = f"module {slot.path or '<root>'!r} ({type(m).__name__})"

    def split(*args: Any, **kwargs: Any) -> Any:
        params = [p for _, p in slot.params]
        grad_args = [v for v in (*args, *kwargs.values())
                     if isinstance(v, torch.Tensor) and v.requires_grad]
        if not torch.is_grad_enabled() or not (params or grad_args):
            return forward(*args, **kwargs)
        if any(not isinstance(v, torch.Tensor) and _needs_grad_inside(v)
               for v in (*args, *kwargs.values())):
            raise TrainschedError(f"{where} takes a tensor that requires a gradient inside a "
                                  f"container argument; the graph split detaches top-level "
                                  f"tensor arguments only: pass it as an argument of its own")
        outer: list[torch.Tensor] = []
        leaves: list[torch.Tensor] = []

        def enter(v: Any) -> Any:
            if isinstance(v, torch.Tensor) and v.requires_grad:
                outer.append(v)
                leaves.append(v.detach().requires_grad_(True))
                return leaves[-1]
            return v

        args2 = tuple(enter(v) for v in args)
        kwargs2 = {k: enter(v) for k, v in kwargs.items()}
        saved: list[torch.Tensor] = []

        def pack(t: torch.Tensor) -> torch.Tensor:
            saved.append(t)
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            result = forward(*args2, **kwargs2)
        flat: list[torch.Tensor] = []
        shape = _flatten(result, flat, where)
        if not any(t.requires_grad for t in flat):
            return result
        tag = slot.forward_call()
        island = _Island(slot, tag, leaves, flat, saved)
        outs = _Bridge.apply(island, len(outer), *outer, *params)
        return _rebuild(shape, list(outs))
    return split
