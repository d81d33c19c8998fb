"""One rank's copy of the model and its optimizer, as flat vectors for the wire.

Every rank (workers and the server) holds a :class:`Replica`: the model, a ``torch.optim.SGD``
or ``torch.optim.Adam`` over its parameters, and flat buffers sized once — the gradient the
optimizer steps with and the *state* vector that moves at a switch: the parameters, then each
per-element optimizer slot in the same layout (SGD: the momentum buffers, if any; Adam: the
first, then the second moment), then, for Adam, one step count per parameter tensor. The slots
start as PyTorch would make them lazily (zeros, step 0), so the state has one fixed layout from
the first step on.

The optimizer never reads a ``p.grad`` left from before: :meth:`Replica.step` points every
parameter's gradient at a slice of the flat vector it is given, then steps. Buffers (BatchNorm
statistics) stay local and are reconciled at synchronisation points: floating-point ones
averaged over the workers, integer ones (batch counters) taken from worker 0.

A shard's server steps only the parameters its shard overlaps (:meth:`Replica.restrict`): the
others get no gradient, which both optimizers skip. Each parameter it does step is the
whole tensor, as in an unsharded run, so its shard's values come out bit for bit the same;
the values of a boundary tensor outside the shard are never sent and are overwritten at the
next synchronisation point.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from trainsched.runtime.sync.config import OPTIMIZERS

__all__ = ["Replica"]


class Replica:
    """``model`` with ``optimizer`` at learning rate ``lr``: SGD (``momentum``,
    ``weight_decay``, ``nesterov``) or Adam (default betas and eps, ``weight_decay`` as L2);
    flat views for gradients and state."""

    def __init__(self, model: nn.Module, *, lr: float, momentum: float, weight_decay: float,
                 nesterov: bool, optimizer: str = "sgd") -> None:
        assert optimizer in OPTIMIZERS, optimizer
        self.model = model
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.numel = sum(p.numel() for p in self.params)
        self.momentum = momentum
        self.counted = optimizer == "adam"  # per-tensor step counts in the state
        if optimizer == "adam":
            self.opt: torch.optim.Optimizer = torch.optim.Adam(self.params, lr=lr,
                                                               weight_decay=weight_decay)
            self.slots: tuple[str, ...] = ("exp_avg", "exp_avg_sq")
            for p in self.params:
                self.opt.state[p]["step"] = torch.tensor(0.0)
        else:
            self.opt = torch.optim.SGD(self.params, lr=lr, momentum=momentum,
                                       weight_decay=weight_decay, nesterov=nesterov)
            self.slots = ("momentum_buffer",) if momentum else ()
        for p in self.params:
            for slot in self.slots:
                self.opt.state[p][slot] = torch.zeros_like(p)
        self.float_buffers = [b for b in model.buffers() if b.is_floating_point()]
        self.int_buffers = [b for b in model.buffers() if not b.is_floating_point()]
        self.grad = torch.zeros(self.numel)
        self.lr_at: Callable[[int], float] = lambda samples: lr  # set per segment
        self.state = torch.zeros(self.state_numel)
        self.stepped = list(range(len(self.params)))  # the parameters step() updates

    def restrict(self, lo: int, hi: int) -> None:
        """Step only the parameters that overlap ``[lo, hi)`` of the flat vector."""
        self.stepped, offset = [], 0
        for i, p in enumerate(self.params):
            if offset < hi and offset + p.numel() > lo:
                self.stepped.append(i)
            offset += p.numel()

    @property
    def state_numel(self) -> int:
        return self.numel * (1 + len(self.slots)) + (len(self.params) if self.counted else 0)

    def owners(self, bounds: list[tuple[int, int]] | tuple[tuple[int, int], ...]) -> list[int]:
        """For each parameter tensor, the shard (of ``bounds``) holding its first value: the
        one whose server's step count for it is the run's."""
        out, offset = [], 0
        for p in self.params:
            out.append(next(j for j, (lo, hi) in enumerate(bounds) if lo <= offset < hi)
                       if offset < self.numel else len(bounds) - 1)
            offset += p.numel()
        return out

    def set_lr(self, lr: float) -> None:
        for group in self.opt.param_groups:
            group["lr"] = lr

    def optimizer_over(self, params: list[torch.Tensor]) -> torch.optim.Optimizer:
        """An optimizer over ``params`` that shares this replica's state: the replica's own for
        all of them, else one of its class and settings at its current learning rate whose
        per-parameter state *is* the replica's (the same dicts, updated in place), so a wrapper
        stepping parameters one by one (the scheduled data-parallel runtime) moves the state
        that switches, digests and checkpoints read."""
        if [id(p) for p in params] == [id(p) for p in self.params]:
            return self.opt
        opt = type(self.opt)(params, **{**self.opt.defaults,
                                        "lr": self.opt.param_groups[0]["lr"]})
        for p in params:
            opt.state[p] = self.opt.state[p]
        return opt

    def _views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        out, offset = [], 0
        for p in self.params:
            out.append(flat[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
        return out

    def _slot(self, index: int) -> list[torch.Tensor]:
        return [self.opt.state[p][self.slots[index]] for p in self.params]

    @property
    def parts(self) -> int:
        """Per-element blocks of ``numel`` values at the state's start (parameters, slots)."""
        return 1 + len(self.slots)

    # --- parameters and gradients ------------------------------------------------------------

    def params_into(self, out: torch.Tensor) -> torch.Tensor:
        """The parameters, copied into ``out`` (``numel`` long)."""
        with torch.no_grad():
            for view, p in zip(self._views(out), self.params, strict=True):
                view.copy_(p)
        return out

    def load_params(self, flat: torch.Tensor) -> None:
        with torch.no_grad():
            for view, p in zip(self._views(flat), self.params, strict=True):
                p.copy_(view)

    def grads_into(self, out: torch.Tensor) -> torch.Tensor:
        """The gradients of the last backward, copied into ``out`` (zeros where none)."""
        for view, p in zip(self._views(out), self.params, strict=True):
            if p.grad is None:
                view.zero_()
            else:
                view.copy_(p.grad)
        return out

    def step(self, flat_grad: torch.Tensor, *, samples: int) -> None:
        """One optimizer step with the gradient ``flat_grad`` (``numel`` long), at the
        learning rate of ``samples`` applied so far."""
        self.set_lr(self.lr_at(samples))
        views = self._views(flat_grad)
        for i in self.stepped:
            self.params[i].grad = views[i]
        self.opt.step()
        for p in self.params:
            p.grad = None

    # --- the state that moves at a switch ------------------------------------------------------

    def state_into(self) -> torch.Tensor:
        """Parameters, then the optimizer's slots, then (Adam) the step counts, in
        :attr:`state` (returned)."""
        n = self.numel
        self.params_into(self.state[:n])
        with torch.no_grad():
            for k in range(len(self.slots)):
                block = self.state[(k + 1) * n:(k + 2) * n]
                for view, m in zip(self._views(block), self._slot(k), strict=True):
                    view.copy_(m)
            if self.counted:
                for i, p in enumerate(self.params):
                    self.state[self.parts * n + i] = self.opt.state[p]["step"]
        return self.state

    def load_state(self, flat: torch.Tensor) -> None:
        n = self.numel
        self.load_params(flat[:n])
        with torch.no_grad():
            for k in range(len(self.slots)):
                block = flat[(k + 1) * n:(k + 2) * n]
                for view, m in zip(self._views(block), self._slot(k), strict=True):
                    m.copy_(view)
            if self.counted:
                for i, p in enumerate(self.params):
                    self.opt.state[p]["step"].fill_(flat[self.parts * n + i])

    def digest(self) -> int:
        """A 63-bit hash of the state's bytes (equal states, equal digests)."""
        data = self.state_into().numpy().tobytes()
        return int.from_bytes(hashlib.sha256(data).digest()[:8], "little") >> 1

    # --- buffers -------------------------------------------------------------------------------

    def reconcile_buffers(self, group: Any, workers: int) -> None:
        """Floating-point buffers averaged over ``group``'s ``workers``; integer ones from the
        group's first rank."""
        if workers == 1:
            return
        with torch.no_grad():
            for b in self.float_buffers:
                dist.all_reduce(b, group=group)
                b.div_(workers)
            for b in self.int_buffers:
                dist.broadcast(b, src=0, group=group)

    def buffers_state(self) -> dict[str, torch.Tensor]:
        return {name: b.detach().clone() for name, b in self.model.named_buffers()}

    def describe(self) -> list[list[Any]]:
        """Names and shapes of the parameters (to check a checkpoint belongs to this model)."""
        return [[n, list(p.shape)] for n, p in self.model.named_parameters()
                if p.requires_grad]
