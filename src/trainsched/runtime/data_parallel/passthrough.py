"""``enabled=False``: a true pass-through with the scheduler's training-loop API.

``specs/comm.md`` §11 (byteps #370 measured a disabled scheduler 7% slower than none): stock
``DistributedDataParallel`` (default buckets) reduces the gradients, one optimizer over all
parameters is stepped lazily (at the next forward, or in ``drain``/``close``/``optimizers``,
after a backward pass), and there are no per-parameter hooks, no threads and no store traffic
per step. What only the scheduler does is refused at construction (:func:`refuse_disabled`)
or when asked for.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from trainsched.comm.policy import CommPolicy
from trainsched.errors import TrainschedError
from trainsched.runtime.data_parallel.layout import Trainable
from trainsched.runtime.data_parallel.options import DataParallelOptions
from trainsched.runtime.data_parallel.units import make_optimizer

__all__ = ["PassThrough", "refuse_disabled"]


def refuse_disabled(options: DataParallelOptions, tuner: Any) -> None:
    """``enabled=False`` hands the gradients to stock DDP: refuse what only the scheduler
    does."""
    asked = [what for what, given in (
        ("a tuner (it retunes the scheduler's partition and credit)", tuner is not None),
        ("a timeline (it records the scheduler's queue, collectives and updates)",
         options.timeline is not None),
        ("verify_order_every (it checks the scheduler's collective order)",
         options.verify_order_every != 0),
        (f"order={options.order!r} (DDP orders its own buckets)", options.order != "leader"),
        ("update='partition' (one optimizer steps all parameters)",
         options.update == "partition"),
        ("backprop_k (DDP cannot reduce split weight gradients)", options.backprop_k != 0),
    ) if given]
    if asked:
        raise TrainschedError(f"enabled=False is a pass-through to DistributedDataParallel; "
                              f"it refuses {'; '.join(asked)}: drop "
                              f"{'them' if len(asked) > 1 else 'it'} or use enabled=True")


class PassThrough:
    """Stock DDP around ``module`` on ``data_group`` and one ``optimizer`` (a class with
    ``kwargs``, or a factory called with the list of all of ``trainable``'s parameters)."""

    update = "parameter"
    max_in_flight_bytes = 0.0
    dw_peak_held_bytes = 0
    switches: tuple[tuple[int, CommPolicy], ...] = ()

    def __init__(self, module: nn.Module, policy: CommPolicy, trainable: Trainable,
                 optimizer: Any, kwargs: dict | None, data_group: Any,
                 hold: Callable[[int], Any] | None = None) -> None:
        self.policy = policy  # unused: DDP reduces
        self._params = trainable.tensors
        self._optimizer = make_optimizer(optimizer, kwargs, list(self._params),
                                         "all parameters")
        self._stepped = 0  # optimizer steps so far: the backward passes applied
        self._closed = False
        # Not a submodule of the wrapper: its state_dict stays the module's alone.
        self._ddp: nn.Module | None = nn.parallel.DistributedDataParallel(
            module, process_group=data_group)
        if hold is not None:
            self._ddp.register_comm_hook(data_group, self._held_allreduce(hold))

    def _held_allreduce(self, hold: Callable[[int], Any]) -> Callable[..., Any]:
        """DDP's own averaging all-reduce, with ``hold(step)`` called before the step's first
        bucket (in the autograd thread: a held bucket holds the backward too)."""
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        def hook(group, bucket):  # type: ignore[no-untyped-def]  # DDP reads the annotations
            if bucket.index() == 0:
                hold(self._stepped)
            return allreduce_hook(group, bucket)

        return hook

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if self._ddp is None:
            raise TrainschedError("this ScheduledDataParallel was closed")
        self._step_if_due()
        return self._ddp(*args, **kwargs)

    def _step_if_due(self) -> None:
        """Step the optimizer if a backward pass left gradients since the last step, then drop
        them (DDP has averaged them over the ranks)."""
        if any(p.grad is not None for p in self._params):
            self._optimizer.step()
            self._optimizer.zero_grad(set_to_none=True)
            self._stepped += 1

    @property
    def steps(self) -> int:
        return self._stepped + int(any(p.grad is not None for p in self._params))

    def optimizers(self) -> tuple[torch.optim.Optimizer, ...]:
        self._step_if_due()
        return (self._optimizer,)

    def policy_at(self, step: int) -> CommPolicy:
        return self.policy

    def static_order(self) -> tuple[str, ...]:
        raise TrainschedError("static_order is the order compiled with order='static'; this "
                              "wrapper uses order='leader' and enabled=False")

    def retune(self, policy: CommPolicy | None, at_step: int | None,
               changes: dict[str, Any]) -> int:
        raise TrainschedError("retune switches the scheduler's policy, but this wrapper was "
                              "built with enabled=False (stock DDP reduces the gradients); "
                              "build it with enabled=True to retune")

    def drain(self, timeout_s: float | None = None) -> None:
        self._step_if_due()

    def set_lr(self, lr: float) -> None:
        self._step_if_due()
        for group in self._optimizer.param_groups:
            group["lr"] = lr

    def close(self, timeout_s: float | None = None) -> None:
        if self._closed:
            return
        self._step_if_due()
        self._closed = True
        # Drop DDP now (its reducer's autograd hooks with it), so that the module can be
        # wrapped again without two reducers.
        self._ddp = None
        gc.collect()
