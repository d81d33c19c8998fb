"""Weight gradients without the autograd graph: ``W`` of ``linear`` and ``layer_norm`` nodes.

A pipeline stage's ``W`` needs, for each weight node, only the node's input ``x`` and the
gradient ``gy`` at its output: ``linear`` gives ``dW = gyᵀx`` and ``db = Σ gy`` over the leading
dimensions; ``layer_norm`` gives ``dγ = Σ gy · x̂`` and ``dβ = Σ gy``, with ``x̂`` the input
normalised again (cheap, elementwise). When every weight node of a stage has such a formula,
:class:`~trainsched.runtime.stage_modules.PipelineStage` lets ``I`` run autograd without keeping
the graph, so everything the forward saved for the input gradient alone is freed at ``I``, and
``W`` keeps only ``x`` and ``gy``: the memory model of the pipeline simulator. A norm's weight
gradient is not deferred (:func:`deferred`): it is tiny to compute, and keeping its ``x`` and
``gy`` until ``W`` would cost as much memory as a linear's, so ``I`` runs its formula at once.
:func:`weight_formula` returns the function for a node, or ``None`` (a convolution, batch norm,
a weight reached through other nodes), and the stage then keeps the graph until ``W``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import fx, nn

from trainsched.runtime.exported import ExportedProgram

__all__ = ["accumulate_grads", "deferred", "weight_formula"]


def weight_formula(program: ExportedProgram, model: nn.Module, node: fx.Node,
                   fqns: Sequence[str]) -> Any:
    """``W`` of a weight node from its input and output gradient alone: a function
    ``(x, gy)`` adding the parameter gradients, or ``None`` when there is none for the node
    (see the module docstring)."""
    aten = torch.ops.aten

    def param(arg: Any) -> str | None:
        kind, fqn = program.state_of.get(arg.name, ("", "")) if isinstance(arg, fx.Node) \
            else ("", "")
        return fqn if kind == "param" else None

    args = list(node.args)
    if node.kwargs or not args or not isinstance(args[0], fx.Node):
        return None
    if node.target is aten.linear.default and len(args) in (2, 3):
        names = [param(a) for a in args[1:]]
        if None in names or sorted(names) != sorted(fqns):   # type: ignore[type-var]
            return None
        params = [model.get_parameter(f) for f in names]   # type: ignore[arg-type]

        def linear(x: torch.Tensor, gy: torch.Tensor) -> None:
            g2 = gy.reshape(-1, gy.shape[-1])
            grads = [g2.t().mm(x.reshape(-1, x.shape[-1]))]
            if len(params) == 2:
                grads.append(g2.sum(0))
            accumulate_grads(params, grads)
        return linear
    if node.target is aten.layer_norm.default and len(args) >= 4:
        names = [param(a) for a in args[2:4]]
        if None in names or sorted(names) != sorted(fqns):   # type: ignore[type-var]
            return None
        params = [model.get_parameter(f) for f in names]   # type: ignore[arg-type]
        shape, eps = list(args[1]), float(args[4]) if len(args) > 4 else 1e-5

        def layer_norm(x: torch.Tensor, gy: torch.Tensor) -> None:
            lead = tuple(range(x.dim() - len(shape)))
            xhat = torch.nn.functional.layer_norm(x, shape, eps=eps)
            accumulate_grads(params, [(gy * xhat).sum(lead), gy.sum(lead)])
        return layer_norm
    return None


def deferred(node: fx.Node) -> bool:
    """Whether ``W`` of weight node ``node`` waits for the ``W`` action: not for a norm, whose
    weight gradient (elementwise products and sums) runs in ``I``, so that ``I`` frees its input
    and output gradient at once (a norm stays one backward, as the training graph has it)."""
    return node.target is not torch.ops.aten.layer_norm.default


def accumulate_grads(params: Sequence[torch.Tensor], grads: Sequence[Any]) -> None:
    """Add ``grads`` into the ``.grad`` of ``params`` (``None`` s skipped)."""
    with torch.no_grad():
        for p, g in zip(params, grads, strict=True):
            if g is None:
                continue
            if p.grad is None:
                p.grad = g.detach().clone()
            else:
                p.grad.add_(g)
