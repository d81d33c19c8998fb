"""Time whole eager training steps: what the ops timed one by one add up to in a real step.

A step here is the model's forward on the example batch, then backward from its outputs (a
gradient of ones, as the per-op timings use), parameters' gradients cleared before each step
the way ``zero_grad()`` does. The forward's end is timed too, so one run gives both the eager
forward and the whole step. :func:`trainsched.graph.overhead.charge_step_overhead` charges the
difference to the ops. :func:`time_optimizer_step` times what a training loop's optimizer adds
(plain SGD's ``step()`` and ``zero_grad()``), which the training transform charges to the
optimizer ops (:func:`trainsched.graph.training.charge_optimizer_step`).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from trainsched.capture.trace import _flatten, _tree_map

#: Untimed steps first (the allocator's first requests, lazy initialisation).
WARMUP_STEPS = 2
#: Timed steps: at least this many, and no more than ``repeats`` once they add up to
#: ``STEP_BUDGET_S`` (a large model's steps are stable, a small one's need samples).
MIN_STEPS = 5
STEP_BUDGET_S = 1.0


@dataclass(frozen=True)
class EagerStep:
    """Medians over ``steps`` timed eager steps: the whole step and its forward alone."""

    step_s: float
    forward_s: float
    steps: int


def time_eager_step(model: torch.nn.Module, args: tuple, kwargs: dict[str, Any], *,
                    device: torch.device, warmup: int = 0, repeats: int = 10,
                    inputs_require_grad: bool = False) -> EagerStep:
    """Time eager training steps of ``model`` on ``args``/``kwargs`` (already on ``device``),
    under the caller's thread count and precision context. ``warmup`` untimed steps (at least
    :data:`WARMUP_STEPS`), then up to ``max(repeats, MIN_STEPS)`` timed ones. Buffers (batch
    norm's running statistics) and gradients are restored afterwards: the model is as given."""
    if inputs_require_grad:
        args, kwargs = _tree_map(lambda v: v.detach().requires_grad_(True)
                                 if isinstance(v, torch.Tensor) and v.is_floating_point()
                                 else v, (args, kwargs))
    params = [p for p in model.parameters() if p.requires_grad]
    grads_before = [p.grad for p in params]
    buffers = [(b, b.detach().clone()) for b in model.buffers()]

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    ones: list[torch.Tensor] | None = None

    def step() -> tuple[float, float]:
        nonlocal ones
        for p in params:
            p.grad = None
        sync()
        start = time.perf_counter()
        out = model(*args, **kwargs)
        sync()
        middle = time.perf_counter()
        outs = [o for o in _flatten([out]) if isinstance(o, torch.Tensor) and o.requires_grad]
        if ones is None:
            ones = [torch.ones_like(o) for o in outs]
        if outs:
            torch.autograd.backward(outs, ones)
        sync()
        return middle - start, time.perf_counter() - start

    try:
        samples = _run(step, max(warmup, WARMUP_STEPS), max(repeats, MIN_STEPS))
    finally:
        with torch.no_grad():
            for buffer, saved in buffers:
                buffer.copy_(saved)
        for p, grad in zip(params, grads_before, strict=True):
            p.grad = grad
    return EagerStep(step_s=statistics.median(s for _, s in samples),
                     forward_s=statistics.median(f for f, _ in samples), steps=len(samples))


def _run(step: Callable[[], tuple[float, float]], warmup: int,
         most: int) -> list[tuple[float, float]]:
    """``warmup`` untimed steps, then timed ones until ``most``, or ``MIN_STEPS`` once they
    add up to ``STEP_BUDGET_S``."""
    for _ in range(warmup):
        step()
    samples: list[tuple[float, float]] = []
    while len(samples) < most:
        samples.append(step())
        if len(samples) >= MIN_STEPS and sum(s for _, s in samples) > STEP_BUDGET_S:
            break
    return samples


@dataclass(frozen=True)
class OptimizerStep:
    """The median of ``steps`` timed ``step()`` + ``zero_grad()`` of plain SGD over ``params``
    parameter tensors."""

    step_s: float
    steps: int
    params: int


def time_optimizer_step(model: torch.nn.Module, *, device: torch.device, warmup: int = 0,
                        repeats: int = 10) -> OptimizerStep | None:
    """Time what a training loop's ``optimizer.step()`` and ``optimizer.zero_grad()`` cost
    for ``model`` with plain SGD (``torch.optim.SGD``, its defaults for the device: a loop
    over the parameters on the CPU), gradients of zeros and a learning rate of 0, so the
    parameters stay as they are (p - 0 * 0 = p); the gradients are restored afterwards.
    ``warmup`` untimed steps (at least :data:`WARMUP_STEPS`), then ``max(repeats,
    MIN_STEPS)`` timed ones. None for a model without trainable parameters."""
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        return None
    grads_before = [p.grad for p in params]
    zeros = [torch.zeros_like(p) for p in params]
    optimizer = torch.optim.SGD(params, lr=0.0)

    def step() -> float:
        for p, zero in zip(params, zeros, strict=True):
            p.grad = zero
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - start

    try:
        for _ in range(max(warmup, WARMUP_STEPS)):
            step()
        samples = [step() for _ in range(max(repeats, MIN_STEPS))]
    finally:
        for p, grad in zip(params, grads_before, strict=True):
            p.grad = grad
    return OptimizerStep(step_s=statistics.median(samples), steps=len(samples),
                         params=len(params))
