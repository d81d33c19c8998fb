"""The function backend: custom autograd functions for Linear, Conv1d/2d/3d and Embedding.

Each function's forward saves what dW needs (the input, the conv settings); its backward
computes dX at once (Linear: ``gy @ W``; Conv: ``aten.convolution_backward`` with the output
mask for the input only, so no weight kernel runs) and pushes onto the layer's
:class:`~.queue.WGradQueue` a closure that later computes dW and the bias gradient (Linear:
``gyᵀ x`` over the flattened leading dimensions and ``Σ gy``; Conv: the same aten op masked to
weight and bias; Embedding: ``aten.embedding_dense_backward``) and accumulates them into
``.grad``. The backward returns ``None`` for weight and bias, so autograd never accumulates
them itself (and never fires their post-accumulate-grad hooks). Embedding has no dX: its whole
backward moves.

:class:`Slot` binds one module to its queue; :func:`split_forward` is the forward that
replaces the module's own (conv padding, string padding and padding modes are applied as the
module does, by padding the input first where needed).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from trainsched.runtime.split.queue import WGradQueue, accumulate

__all__ = ["CONVS", "FUNCTION_KINDS", "Slot", "split_forward"]

CONVS = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
#: The module types the function backend splits (when their forward is the stock one).
FUNCTION_KINDS = (nn.Linear, *CONVS, nn.Embedding)


class Slot:
    """One split module (``path`` in the model) and the queue its dW go to."""

    def __init__(self, queue: WGradQueue, path: str, module: nn.Module) -> None:
        self.queue = queue
        self.path = path
        self.module = module
        self.params = [(f"{path}.{n}" if path else n, p)
                       for n, p in module.named_parameters() if p.requires_grad]

    def forward_call(self) -> tuple[int, int]:
        """(layer, micro-batch) of a forward that records a graph."""
        return self.queue.forward_call(self, [p for _, p in self.params])

    def push(self, layer: int, microbatch: int, tensors: tuple[torch.Tensor | None, ...],
             run: Callable[[], None]) -> None:
        self.queue.push(layer=layer, microbatch=microbatch, params=self.params,
                        tensors=tensors, run=run)


class _LinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                slot: Slot, tag: tuple[int, int]) -> torch.Tensor:
        ctx.slot, ctx.tag = slot, tag
        ctx.save_for_backward(x, weight, bias)
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx: Any, gy: torch.Tensor) -> tuple[Any, ...]:
        x, weight, bias = ctx.saved_tensors
        dx = gy.matmul(weight) if ctx.needs_input_grad[0] else None

        def dw() -> None:
            g2 = gy.reshape(-1, gy.shape[-1])
            if weight.requires_grad:
                accumulate(weight, g2.t().mm(x.reshape(-1, x.shape[-1])))
            if bias is not None and bias.requires_grad:
                accumulate(bias, g2.sum(0))

        ctx.slot.push(*ctx.tag, (x, gy), dw)
        return dx, None, None, None, None


class _ConvFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                conf: tuple, slot: Slot, tag: tuple[int, int]) -> torch.Tensor:
        ctx.slot, ctx.tag, ctx.conf = slot, tag, conf
        ctx.save_for_backward(x, weight, bias)
        stride, padding, dilation, groups = conf
        zeros = [0] * len(stride)
        return torch.ops.aten.convolution(x, weight, bias, stride, padding, dilation, False,
                                          zeros, groups)

    @staticmethod
    def backward(ctx: Any, gy: torch.Tensor) -> tuple[Any, ...]:
        x, weight, bias = ctx.saved_tensors
        stride, padding, dilation, groups = ctx.conf
        zeros = [0] * len(stride)
        dx = None
        if ctx.needs_input_grad[0]:
            dx = torch.ops.aten.convolution_backward(
                gy, x, weight, None, stride, padding, dilation, False, zeros, groups,
                [True, False, False])[0]

        def dw() -> None:
            want_w = weight.requires_grad
            want_b = bias is not None and bias.requires_grad
            _, gw, gb = torch.ops.aten.convolution_backward(
                gy, x, weight, [weight.shape[0]] if want_b else None, stride, padding,
                dilation, False, zeros, groups, [False, want_w, want_b])
            if want_w:
                accumulate(weight, gw)
            if want_b:
                accumulate(bias, gb)

        ctx.slot.push(*ctx.tag, (x, gy), dw)
        return dx, None, None, None, None, None


class _EmbeddingFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, idx: torch.Tensor, weight: torch.Tensor, conf: tuple, slot: Slot,
                tag: tuple[int, int]) -> torch.Tensor:
        ctx.slot, ctx.tag, ctx.conf = slot, tag, conf
        ctx.num_weights = weight.shape[0]
        ctx.save_for_backward(idx, weight)
        padding_idx, scale_grad_by_freq = conf
        return F.embedding(idx, weight, padding_idx, None, 2.0, scale_grad_by_freq, False)

    @staticmethod
    def backward(ctx: Any, gy: torch.Tensor) -> tuple[Any, ...]:
        idx, weight = ctx.saved_tensors
        padding_idx, scale_grad_by_freq = ctx.conf
        num_weights = ctx.num_weights

        def dw() -> None:
            accumulate(weight, torch.ops.aten.embedding_dense_backward(
                gy, idx, num_weights, -1 if padding_idx is None else padding_idx,
                scale_grad_by_freq))

        ctx.slot.push(*ctx.tag, (idx, gy), dw)
        return None, None, None, None, None


def _tag(slot: Slot, *tensors: torch.Tensor | None) -> tuple[int, int] | None:
    """(layer, micro-batch) when this forward records a graph, else ``None``."""
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors):
        return slot.forward_call()
    return None


def _same_padding(kernel: tuple[int, ...], dilation: tuple[int, ...]) -> list[tuple[int, int]]:
    """(before, after) per spatial dimension for ``padding="same"`` (the extra one after)."""
    pairs = []
    for k, d in zip(kernel, dilation, strict=True):
        total = d * (k - 1)
        pairs.append((total // 2, total - total // 2))
    return pairs


def _conv_input(m: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, ...]]:
    """The input padded as the module pads it, and the symmetric padding left to the conv."""
    n = len(m.kernel_size)
    if isinstance(m.padding, str):
        pairs = (_same_padding(m.kernel_size, m.dilation) if m.padding == "same"
                 else [(0, 0)] * n)
    else:
        pairs = [(p, p) for p in m.padding]
    if m.padding_mode == "zeros" and all(a == b for a, b in pairs):
        return x, tuple(a for a, _ in pairs)
    flat = [v for pair in reversed(pairs) for v in pair]  # F.pad: last dimension first
    mode = "constant" if m.padding_mode == "zeros" else m.padding_mode
    return F.pad(x, flat, mode=mode), (0,) * n


def split_forward(m: nn.Module, slot: Slot) -> Callable[..., torch.Tensor]:
    """The forward that replaces ``m``'s (a Linear, Conv or Embedding)."""
    if isinstance(m, nn.Linear):
        def linear(x: torch.Tensor) -> torch.Tensor:
            tag = _tag(slot, x, m.weight, m.bias)
            if tag is None:
                return F.linear(x, m.weight, m.bias)
            return _LinearFn.apply(x, m.weight, m.bias, slot, tag)
        return linear
    if isinstance(m, CONVS):
        n = len(m.kernel_size)

        def conv(x: torch.Tensor) -> torch.Tensor:
            unbatched = x.dim() == n + 1
            if unbatched:
                x = x.unsqueeze(0)
            x, padding = _conv_input(m, x)
            conf = (list(m.stride), list(padding), list(m.dilation), m.groups)
            tag = _tag(slot, x, m.weight, m.bias)
            if tag is None:
                y = torch.ops.aten.convolution(x, m.weight, m.bias, conf[0], conf[1], conf[2],
                                               False, [0] * n, m.groups)
            else:
                y = _ConvFn.apply(x, m.weight, m.bias, conf, slot, tag)
            return y.squeeze(0) if unbatched else y
        return conv
    assert isinstance(m, nn.Embedding)

    def embedding(idx: torch.Tensor) -> torch.Tensor:
        if m.max_norm is not None:
            with torch.no_grad():
                torch.embedding_renorm_(m.weight, idx, m.max_norm, m.norm_type)
        conf = (m.padding_idx, m.scale_grad_by_freq)
        tag = _tag(slot, m.weight)
        if tag is None:
            return F.embedding(idx, m.weight, m.padding_idx, None, 2.0,
                               m.scale_grad_by_freq, False)
        return _EmbeddingFn.apply(idx, m.weight, conf, slot, tag)
    return embedding
