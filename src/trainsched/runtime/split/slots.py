"""Single-device out-of-order backprop: each layer's dW in its slot (``specs/backprop.md`` §2a).

:class:`SlottedModel` splits a model's backward (:mod:`trainsched.runtime.split`) and runs
layer i's weight gradient where its :class:`~trainsched.backprop.reorder.Slot` says:

- ``inline``: right after its dX, on the main stream (the baseline);
- ``overlap_backward``: launched on a second stream as soon as its output gradient exists,
  so it runs beside the dX of the layers below;
- ``overlap_forward(j)`` (j < i): held past the end of the backward pass; in the next step it
  is launched on the second stream right after layer j's forward, and layer i's parameters
  are updated (its own optimizer, its gradient of the step before) just before layer i's
  forward. Layer i therefore computes with exactly the weights standard training would give
  it, so N steps equal N standard steps (up to the order of float sums on tied weights).

The optimizer is split accordingly: one over every parameter outside the deferred layers,
stepped by :meth:`SlottedModel.step` at the end of a step, and one per deferred layer,
stepped lazily. :meth:`SlottedModel.drain` runs what waits and applies the pending updates
(before evaluation, a checkpoint, or the end of training).

**Streams.** On a CUDA model the second stream is a real ``torch.cuda.Stream``: the side
stream first waits for everything issued on the main stream (so the layer's output gradient
exists), the closure runs there, and an event marks it done; the main stream waits on that
event before the optimizer step or the lazy update reads the gradient. Tensors the closure
read are ``record_stream``-ed on the side stream and gradients it made on the main stream,
so the caching allocator never hands their memory out while a kernel still uses it. On a CPU
there is one stream: a launch runs at once, so the slots change the order of the work but
nothing overlaps (:attr:`SlottedModel.overlaps` is ``False``), which is what the tests on this
host check. The CUDA stream path has not been run on a GPU in this project's test suite.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from trainsched.backprop.deferral import PendingW, slotted
from trainsched.backprop.reorder import Slot, parse_slot
from trainsched.errors import TrainschedError
from trainsched.runtime.split.model import SplitModel

__all__ = ["SlottedModel"]


class _InOrderLane:
    """One stream: a launch runs at once."""

    overlaps = False

    def launch(self, run: Callable[[], None], tensors: Sequence[torch.Tensor],
               params: Sequence[nn.Parameter]) -> Any:
        run()
        return None

    def wait(self, token: Any) -> None:
        pass

    def join(self, tokens: Sequence[Any]) -> None:
        pass


class _CudaLane:
    """A second CUDA stream beside the current one."""

    overlaps = True

    def __init__(self, device: torch.device) -> None:
        self.side = torch.cuda.Stream(device=device)
        self.device = device

    def launch(self, run: Callable[[], None], tensors: Sequence[torch.Tensor],
               params: Sequence[nn.Parameter]) -> Any:
        main = torch.cuda.current_stream(self.device)
        self.side.wait_stream(main)
        with torch.cuda.stream(self.side):
            run()
        for t in tensors:
            if t.is_cuda:
                t.record_stream(self.side)
        done = torch.cuda.Event()
        done.record(self.side)
        return done, tuple(params)

    def wait(self, token: Any) -> None:
        if token is None:
            return
        done, params = token
        main = torch.cuda.current_stream(self.device)
        main.wait_event(done)
        for p in params:
            if p.grad is not None:
                p.grad.record_stream(main)

    def join(self, tokens: Sequence[Any]) -> None:
        for token in tokens:
            self.wait(token)


class SlottedModel(nn.Module):
    """``module`` trained with its layers' dW in ``slots`` (one per split layer, in forward
    order: :class:`~trainsched.backprop.reorder.Slot` or its text). ``optimizer`` and
    ``optimizer_kwargs`` build the optimizers (a torch optimizer class and its arguments).
    Use it as model and optimizer at once: ``loss(net(x)).backward(); net.step();
    net.zero_grad()``, and :meth:`drain` before evaluating or saving."""

    def __init__(self, module: nn.Module, slots: Sequence[Slot | str], *,
                 optimizer: type[torch.optim.Optimizer],
                 optimizer_kwargs: dict[str, Any] | None = None, backend: str = "auto") -> None:
        super().__init__()
        self.slots = tuple(s if isinstance(s, Slot) else parse_slot(s) for s in slots)
        for i, slot in enumerate(self.slots):
            if slot.after is not None and slot.after >= i:
                raise TrainschedError(
                    f"layer {i}: slot {slot} launches its dW after the forward of layer "
                    f"{slot.after}, but its update must come before its own forward; use "
                    f"overlap_forward(j) with j < {i}")
        deferred = [i for i, s in enumerate(self.slots) if s.after is not None]
        self.split = SplitModel(module, backend=backend, order=slotted(deferred))
        if len(self.split.layer_keys) != len(self.slots):
            count = len(self.split.layer_keys)
            self.split.unsplit(drain=False)
            raise TrainschedError(
                f"{len(self.slots)} dW slots for a model with {count} split layers (Linear, "
                f"Conv, Embedding and other modules owning parameters, norms excluded); give "
                f"one slot per layer in forward order")
        self._deferred = frozenset(deferred)
        self._launch_after: dict[int, tuple[int, ...]] = {}
        for i in deferred:
            after = self.slots[i].after
            assert after is not None
            self._launch_after[after] = (*self._launch_after.get(after, ()), i)
        self._optimizer = (optimizer, dict(optimizer_kwargs or {}))
        self._main: torch.optim.Optimizer | None = None
        self._lazy: dict[int, torch.optim.Optimizer] = {}
        self._tokens: dict[int, Any] = {}      # layer -> its last launch, not yet waited for
        self._updated: set[int] = set()        # deferred layers updated in this step
        self._launched: set[int] = set()       # layers j whose launch ran this step
        params = list(module.parameters())
        cuda = next((p.device for p in params if p.is_cuda), None)
        self.lane: _InOrderLane | _CudaLane = _InOrderLane() if cuda is None else _CudaLane(cuda)
        self.split.queue.executor = self._execute
        self._handles = []
        for m, key in self.split.layer_keys:
            self._handles.append(m.register_forward_pre_hook(self._before(key)))
            self._handles.append(m.register_forward_hook(self._after(key)))

    @property
    def overlaps(self) -> bool:
        """Whether dW on the second stream can run beside other work (a CUDA model)."""
        return self.lane.overlaps

    @property
    def module(self) -> nn.Module:
        """The model (its forwards split in place)."""
        return self.split.module

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.split(*args, **kwargs)

    # -- where the dW run ----------------------------------------------------------------------

    def _execute(self, info: PendingW, run: Callable[[], None],
                 params: Sequence[nn.Parameter], tensors: Sequence[torch.Tensor]) -> None:
        if self.slots[info.layer].kind == "inline":
            # The main stream may only add into a gradient the side stream is done with.
            for layer, token in list(self._tokens.items()):
                if token is not None and any(p in token[1] for p in params):
                    self.lane.wait(self._tokens.pop(layer))
            run()
            return
        self._tokens[info.layer] = self.lane.launch(run, tensors, params)

    def _before(self, key: object) -> Callable[..., None]:
        def hook(module: nn.Module, args: Any) -> None:
            layer = self.split.queue.layer_index(key)
            if layer is None or layer not in self._deferred or layer in self._updated:
                return
            self._updated.add(layer)
            self.split.queue.run_layers([layer])  # if its launch point did not come first
            self.lane.wait(self._tokens.pop(layer, None))
            self._update(layer)
        return hook

    def _after(self, key: object) -> Callable[..., None]:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            layer = self.split.queue.layer_index(key)
            if layer is None or layer in self._launched or layer not in self._launch_after:
                return
            self._launched.add(layer)
            self.split.queue.run_layers(self._launch_after[layer])
        return hook

    # -- updates -------------------------------------------------------------------------------

    def _params_of(self, layer: int) -> list[nn.Parameter]:
        key_of = {self.split.queue.layer_index(k): m for m, k in self.split.layer_keys}
        return [p for p in key_of[layer].parameters() if p.requires_grad]

    def _build_optimizers(self) -> None:
        index = {self.split.queue.layer_index(k): m for m, k in self.split.layer_keys}
        missing = [i for i in range(len(self.slots)) if i not in index]
        if missing:
            raise TrainschedError(f"split layers {missing} did not run forward in the first "
                                  f"step, so their slots cannot be placed")
        cls, kwargs = self._optimizer
        held: dict[int, int] = {}
        for layer in sorted(self._deferred):
            for p in self._params_of(layer):
                if id(p) in held:
                    raise TrainschedError(
                        f"layers {held[id(p)]} and {layer} share a parameter, and layer "
                        f"{layer}'s dW is deferred into the next step; give shared-weight "
                        f"layers an inline or overlap_backward slot")
                held[id(p)] = layer
            self._lazy[layer] = cls(self._params_of(layer), **kwargs)
        for i in range(len(self.slots)):
            if i not in self._deferred and any(id(p) in held for p in self._params_of(i)):
                raise TrainschedError(
                    f"layer {i} shares a parameter with deferred layer "
                    f"{held[next(id(p) for p in self._params_of(i) if id(p) in held)]}; give "
                    f"shared-weight layers an inline or overlap_backward slot")
        rest = [p for p in self.module.parameters() if p.requires_grad and id(p) not in held]
        self._main = cls(rest, **kwargs) if rest else None

    def _update(self, layer: int) -> None:
        opt = self._lazy.get(layer)
        if opt is not None:
            opt.step()
            opt.zero_grad(set_to_none=True)

    def step(self) -> None:
        """End of a training step: wait for the dW on the second stream and update every
        parameter outside the deferred layers (those update before their next forward)."""
        if self._main is None and not self._lazy:
            self._build_optimizers()
        self.lane.join([self._tokens.pop(layer) for layer in sorted(self._tokens)])
        if self._main is not None:
            self._main.step()
        self._updated.clear()
        self._launched.clear()

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the gradients :meth:`step` used (the deferred layers clear their own)."""
        if self._main is not None:
            self._main.zero_grad(set_to_none=set_to_none)

    def drain(self) -> None:
        """Run every waiting dW and apply the deferred layers' pending updates: the
        parameters are then those of standard training after the same steps."""
        self.split.drain()
        self.lane.join([self._tokens.pop(layer) for layer in sorted(self._tokens)])
        for layer in sorted(self._lazy):
            self._update(layer)

    def unsplit(self) -> nn.Module:
        """Drain, remove the hooks and the split; return the model."""
        self.drain()
        for h in self._handles:
            h.remove()
        self._handles = []
        self.split.queue.executor = None
        return self.split.unsplit()
