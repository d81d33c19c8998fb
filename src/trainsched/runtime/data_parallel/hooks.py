"""Readiness hooks: the training thread's side of the scheduler.

- ``Tensor.register_post_accumulate_grad_hook`` on every trainable parameter hands its
  gradient to the dispatcher thread (:class:`~.events.Ready`) the moment it is accumulated.
- A forward pre-hook on every module owning parameters waits only for those parameters'
  updates, so layer l's next forward starts as soon as layer l is updated (crossing the
  barrier: the rest of the step may still be in flight).
- An autograd final callback ends each backward pass: every parameter must have had its
  gradient. The first one's observation (:class:`~.layout.FirstStep`: the layer order of
  forward, the ready order and times of backward) goes to the owner, which publishes the
  task table.
- With a timeline, the hooks record ``FWD``, ``BWD`` and ``WAIT`` spans.
- With out-of-order backprop (:mod:`.deferred`), a split layer's parameters are handed over
  by the dW queue instead of by autograd's accumulation (their gradient hook refuses a use
  outside the split layer), and the end-of-backward callback runs the deferred dW first.

The owner is told of each forward and of the first backward through :class:`StepListener`.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
from torch import nn

from trainsched.comm.timeline import Span
from trainsched.errors import TrainschedError
from trainsched.runtime.data_parallel.deferred import DeferredWeights
from trainsched.runtime.data_parallel.events import Inbox, Ready
from trainsched.runtime.data_parallel.layout import FirstStep, Trainable, owning_modules
from trainsched.runtime.data_parallel.sync import Progress
from trainsched.runtime.data_parallel.trace import Recorder, clock

__all__ = ["Hooks", "StepListener"]


class StepListener(Protocol):
    """What the hooks tell their owner (training thread)."""

    def forward_starts(self, step: int) -> None:
        """A forward of the wrapped module begins; ``step`` backward passes are done."""

    def first_backward_done(self, first: FirstStep) -> None:
        """The first backward pass ended, as ``first`` shows."""


class Hooks:
    """The hooks on ``module`` and its ``trainable`` parameters; ``remove`` takes them off."""

    def __init__(self, module: nn.Module, trainable: Trainable, *, progress: Progress,
                 recorder: Recorder, inbox: Inbox, timeout_s: float,
                 listener: StepListener, deferred: DeferredWeights | None = None) -> None:
        self.trainable = trainable
        self._progress = progress
        self._recorder = recorder
        self._inbox = inbox
        self._timeout_s = timeout_s
        self._listener = listener
        self._deferred = deferred
        self.backwards = 0  # completed backward passes (= the next forward's step)
        self._seen: set[int] | None = None  # this backward's parameters; None between passes
        self._first = FirstStep()
        self._last_ready_s = 0.0  # where the next BWD slice starts
        self._gates: list[list[int]] = []  # per gated module: the parameters it owns
        self._fwd_start: dict[int, float] = {}
        self._handles: list[Any] = []
        self._install(module)

    @property
    def in_backward(self) -> bool:
        return self._seen is not None

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def _install(self, module: nn.Module) -> None:
        deferred = self._deferred
        split = deferred.params if deferred is not None else frozenset()
        for k, p in enumerate(self.trainable.tensors):
            if k in split:  # autograd brings it no gradient: the dW queue hands it over
                self._handles.append(p.register_hook(
                    lambda grad, k=k: self._used_outside(k, grad)))
            else:
                self._handles.append(p.register_post_accumulate_grad_hook(
                    lambda param, k=k: self._on_grad(k)))
        if deferred is not None:
            deferred.connect(self._begin, self._on_grad)
        for g, (label, m, own) in enumerate(owning_modules(module, self.trainable.tensors)):
            self._gates.append(own)
            self._handles.append(m.register_forward_pre_hook(
                lambda mod, args, g=g, label=label: self._gate(g, label)))
            if self._recorder.enabled:
                self._handles.append(m.register_forward_hook(
                    lambda mod, args, out, g=g, label=label: self._forward_done(g, label)))
        self._handles.append(module.register_forward_pre_hook(
            lambda mod, args: self._forward_starts(), prepend=True))
        self._handles.append(module.register_forward_hook(
            lambda mod, args, out: self._after_forward()))

    # -- forward -------------------------------------------------------------------------------

    def _forward_starts(self) -> None:
        self._listener.forward_starts(self.backwards)
        if self._deferred is not None:
            self._deferred.forward_starts()

    def _after_forward(self) -> None:
        self._last_ready_s = self._recorder.now()  # where the first BWD slice starts

    def _gate(self, g: int, label: str) -> None:
        """Forward pre-hook of a module owning parameters: wait for their updates."""
        own = self._gates[g]
        if self.backwards == 0:
            layer_of = self._first.layer_of
            for k in own:
                if k not in layer_of:
                    layer_of[k] = len(layer_of)
        start = clock()
        behind = self._progress.wait_updated(own, start + self._timeout_s)
        if behind:
            raise TrainschedError(
                f"layer {label}: parameter {self.trainable.names[behind[0]]!r} was not "
                f"updated within {self._timeout_s:g} s after step {self.backwards - 1}; a "
                f"rank died or hung, or its all-reduce is stuck")
        end = clock()
        recorder = self._recorder
        if recorder.in_window(self.backwards):
            if end - start > 1e-4:
                recorder.compute.append(Span(
                    track="compute", phase="WAIT", label=label, start_s=start - recorder.t0,
                    end_s=end - recorder.t0, step=self.backwards, args={"layer": label}))
            self._fwd_start[g] = end - recorder.t0

    def _forward_done(self, g: int, label: str) -> None:
        start = self._fwd_start.pop(g, None)
        if start is not None and self._recorder.in_window(self.backwards):
            self._recorder.compute.append(Span(
                track="compute", phase="FWD", label=label, start_s=start,
                end_s=self._recorder.now(), step=self.backwards, args={"layer": label}))

    # -- backward ------------------------------------------------------------------------------

    def _on_grad(self, k: int) -> None:
        """Post-accumulate-grad hook: hand the gradient to the dispatcher."""
        self._progress.raise_error()
        t = self._recorder.now()
        self._begin()
        assert self._seen is not None
        name = self.trainable.names[k]
        if k in self._seen:
            raise TrainschedError(
                f"parameter {name!r} received a gradient twice in one backward pass; "
                f"accumulating gradients over several backward passes is not supported")
        if not self._progress.post(k, self.trainable.tensors[k]):
            raise TrainschedError(
                f"parameter {name!r} got a new gradient before its last update was applied: "
                f"it is used outside the module that owns it (the forward gate never ran "
                f"for it), which ScheduledDataParallel cannot schedule")
        self._seen.add(k)
        if self.backwards == 0:
            self._first.ready_log.append(k)
            self._first.ready_times.append(t)
        self._inbox.put(Ready(k, t))
        if self._recorder.in_window(self.backwards):
            self._recorder.backward(self.trainable.labels[k], self.backwards, self._last_ready_s, t)
        self._last_ready_s = t

    def _begin(self) -> None:
        """The first gradient (or deferred dW) of a backward pass: end it with one callback."""
        if self._seen is None:
            self._seen = set()
            torch.autograd.Variable._execution_engine.queue_callback(self._final)

    def _used_outside(self, k: int, grad: torch.Tensor | None) -> None:
        """The gradient hook of a split layer's parameter: autograd calls it with no
        gradient after the split layer's backward (which returns none for it); a gradient
        means a use outside the layer (or the graph backend's own dW pass, which runs
        inside the queue)."""
        assert self._deferred is not None
        if grad is None or self._deferred.split.queue.running:
            return
        error = TrainschedError(
            f"parameter {self.trainable.names[k]!r} belongs to a split layer but is also used "
            f"outside it (autograd brought it a gradient); with backprop_k > 0 every use of a "
            f"split layer's parameter must go through that layer")
        self._progress.fail(error)
        raise error

    def _final(self) -> None:
        """The end of a backward pass: the deferred dW (layer 0 first), then the check."""
        if self._deferred is not None:
            self._deferred.end_backward()
        self._backward_end()

    def _backward_end(self) -> None:
        """Runs once at the end of each backward pass (an autograd final callback)."""
        seen, self._seen = self._seen or set(), None
        names = self.trainable.names
        missing = [names[k] for k in range(len(names)) if k not in seen]
        if missing:
            more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
            error = TrainschedError(
                f"parameter(s) {', '.join(map(repr, missing[:3]))}{more} got no gradient in "
                f"step {self.backwards}: every trainable parameter must take part in every "
                f"step (a static used set); freeze unused ones with requires_grad_(False)")
            self._progress.fail(error)
            raise error
        if self.backwards == 0:
            self._listener.first_backward_done(self._first)
        self.backwards += 1
