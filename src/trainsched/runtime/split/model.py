"""Which modules of a model are split, and the wrapper that holds the split.

:func:`split_backward` walks the module tree from the root and picks the *layers*, each
split one way:

- a ``Linear``, ``Conv1d/2d/3d`` or ``Embedding`` whose forward is the stock one: the
  function backend (:mod:`.functions`), unless ``backend="graph"``;
- a normalisation layer (BatchNorm, LayerNorm, GroupNorm, InstanceNorm, RMSNorm) stays whole:
  its small dW stays fused with its dX (autograd accumulates it as usual);
- any other module owning parameters itself: the graph backend (:mod:`.graph`), for the whole
  module with its children (``backend="function"`` refuses it, naming it);
- anything else (a container): its children are examined.

The split is installed *in place*: each layer's ``forward`` is replaced by an instance
attribute, so the parameters, their names and the ``state_dict`` stay the model's own.
:class:`SplitModel` wraps the model (``forward`` calls it) and holds the dW queue;
:meth:`SplitModel.unsplit` puts the original forwards back. Parameter names under the wrapper
carry the prefix ``module.`` (as DDP's do); ``split.module.state_dict()`` has the model's.

**Stock DDP is refused.** DDP marks a parameter ready from autograd's accumulation, which a
split layer never does (the function backend returns no weight gradient; the queue
accumulates it later): DDP would reduce nothing useful and ranks would silently diverge. The
wrapper and the split model both carry ``_ddp_params_and_buffers_to_ignore`` (the attribute
DDP's constructor reads before any collective) as an object whose iteration raises
:class:`~trainsched.errors.TrainschedError` naming trainsched's scheduled data parallel.

A ``torch.compile``'d model or submodule is refused (``OptimizedModule``, or compiled in place
with ``Module.compile``): the split swaps Python forwards that a compiled graph would bypass.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from torch import nn

from trainsched.backprop.deferral import DeferralOrder, deferral_order
from trainsched.errors import TrainschedError
from trainsched.runtime.split.functions import FUNCTION_KINDS, Slot, split_forward
from trainsched.runtime.split.graph import graph_forward
from trainsched.runtime.split.queue import QueueListener, WGradQueue

__all__ = ["BACKENDS", "NORMS", "SplitLayer", "SplitModel", "count_layers", "find_layers",
           "split_backward"]

#: ``auto``: the function backend where it applies, the graph backend elsewhere.
BACKENDS = ("auto", "function", "graph")
#: Layers whose backward stays whole (their affine dW is tiny).
NORMS: tuple[type[nn.Module], ...] = (
    nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm, nn.LayerNorm,
    nn.GroupNorm, nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d,
    *((nn.RMSNorm,) if hasattr(nn, "RMSNorm") else ()))

_IGNORE = "_ddp_params_and_buffers_to_ignore"


@dataclass(frozen=True, kw_only=True)
class SplitLayer:
    """A split module: its path in the model (``""``: the root), type name and backend."""

    path: str
    kind: str
    backend: str


class _RefuseDDP:
    """Stands in DDP's list of ignored parameters: DDP iterates it first, and fails."""

    def __iter__(self) -> Iterator[str]:
        raise TrainschedError(
            "this model's backward is split (trainsched.runtime.split): stock "
            "DistributedDataParallel would reduce its weight gradients before they exist and "
            "ranks would silently diverge; use trainsched's ScheduledDataParallel with "
            "backprop_k=K instead, or unsplit() the model first")


def _is_compiled(m: nn.Module) -> bool:
    return type(m).__name__ == "OptimizedModule" or getattr(m, "_compiled_call_impl",
                                                            None) is not None


def _stock_forward(m: nn.Module) -> bool:
    kind = next(k for k in FUNCTION_KINDS if isinstance(m, k))
    return type(m).forward is kind.forward and "forward" not in vars(m)


def find_layers(model: nn.Module, backend: str = "auto",
                ) -> list[tuple[str, nn.Module, str]]:
    """The modules :func:`split_backward` splits: ``(path, module, backend)`` in module-tree
    order (a module reached twice is listed once)."""
    if backend not in BACKENDS:
        raise TrainschedError(f"backend must be one of {', '.join(BACKENDS)}, got "
                              f"{backend!r}")
    found: list[tuple[str, nn.Module, str]] = []
    seen: set[int] = set()

    def visit(path: str, m: nn.Module) -> None:
        if id(m) in seen:
            return
        seen.add(id(m))
        where = f"module {path or '<root>'!r} ({type(m).__name__})"
        if _is_compiled(m):
            raise TrainschedError(f"{where} is torch.compile'd: split backward works on eager "
                                  f"modules only; split the model before compiling it, or "
                                  f"do not compile it")
        if isinstance(m, nn.modules.lazy.LazyModuleMixin) and m.has_uninitialized_params():
            raise TrainschedError(f"{where} has uninitialised (lazy) parameters: run one "
                                  f"forward pass before splitting")
        own = [p for p in m.parameters(recurse=False) if p.requires_grad]
        if isinstance(m, NORMS):
            return
        if isinstance(m, FUNCTION_KINDS) and _stock_forward(m):
            if not any(p.requires_grad for p in m.parameters()):
                return
            sparse = isinstance(m, nn.Embedding) and m.sparse
            if backend == "graph" or (sparse and backend == "auto"):
                found.append((path, m, "graph"))
            elif sparse:
                raise TrainschedError(f"{where} has sparse=True: the function backend "
                                      f"makes dense weight gradients; use backend='auto' or "
                                      f"'graph', or sparse=False")
            else:
                found.append((path, m, "function"))
            return
        if own:
            if backend == "function":
                raise TrainschedError(
                    f"{where} owns parameters and is not a Linear, Conv1d/2d/3d or "
                    f"Embedding with its stock forward, so the function backend cannot split "
                    f"it; use backend='auto' (the graph backend splits it) or freeze its "
                    f"parameters")
            found.append((path, m, "graph"))
            return
        for name, child in m.named_children():
            visit(f"{path}.{name}" if path else name, child)

    visit("", model)
    return found


def count_layers(model: nn.Module, backend: str = "auto") -> int:
    """How many layers :func:`split_backward` would split (``k`` ranges over 0..this)."""
    return len(find_layers(model, backend))


class SplitModel(nn.Module):
    """``module`` with its backward split (see the module docstring); ``queue`` holds the
    deferred dW. Call :meth:`drain` before the optimizer step of a single process (unless the
    order runs everything by the end of the backward pass), evaluation and checkpoints."""

    def __init__(self, module: nn.Module, *, backend: str = "auto",
                 order: DeferralOrder | str = "standard", auto_end: bool = True,
                 listener: QueueListener | None = None) -> None:
        super().__init__()
        if isinstance(module, SplitModel) or isinstance(vars(module).get(_IGNORE), _RefuseDDP):
            raise TrainschedError("this module is split already")
        found = find_layers(module, backend)
        if not found:
            raise TrainschedError(f"{type(module).__name__} has no layer with trainable "
                                  f"parameters to split")
        self.module = module
        if isinstance(order, str):
            order = deferral_order(order)
        self.queue = WGradQueue(order, auto_end=auto_end, listener=listener)
        self.layers = tuple(SplitLayer(path=p, kind=type(m).__name__, backend=b)
                            for p, m, b in found)
        unique = {id(p): p for _, m, _ in found for p in m.parameters() if p.requires_grad}
        #: The trainable parameters of the split layers (their dW go through the queue).
        self.split_params = tuple(unique.values())
        self._installed: list[tuple[nn.Module, Any]] = []
        bound: list[tuple[nn.Module, object]] = []
        for path, m, how in found:
            slot = Slot(self.queue, path, m)
            bound.append((m, slot))
            previous = vars(m).get("forward")
            own = m.forward
            m.forward = (split_forward(m, slot) if how == "function"
                         else graph_forward(m, slot, own))
            self._installed.append((m, previous))
        #: ``(module, key)`` per split layer, in module-tree order: ``queue.layer_index(key)``
        #: is the module's layer index once it ran forward.
        self.layer_keys: tuple[tuple[nn.Module, object], ...] = tuple(bound)
        self._ignore_before = vars(module).get(_IGNORE)
        setattr(module, _IGNORE, _RefuseDDP())
        setattr(self, _IGNORE, _RefuseDDP())

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    def drain(self) -> None:
        """Run every deferred dW now (their gradients are then complete in ``.grad``)."""
        self.queue.drain()

    def unsplit(self, *, drain: bool = True) -> nn.Module:
        """Drain (or, ``drain=False``, drop what waits: after a failed step), put the
        original forwards back and return the model."""
        if drain:
            self.drain()
        else:
            self.queue.discard()
        for m, previous in self._installed:
            del m.forward
            if previous is not None:
                m.forward = previous
        self._installed = []
        if self._ignore_before is None:
            delattr(self.module, _IGNORE)
        else:
            setattr(self.module, _IGNORE, self._ignore_before)
        delattr(self, _IGNORE)
        return self.module


def split_backward(model: nn.Module, *, backend: str = "auto",
                   order: DeferralOrder | str = "standard") -> SplitModel:
    """Split ``model``'s backward into dX now and dW in a queue run by ``order`` (a
    :mod:`~trainsched.backprop.deferral` order or a registered name without parameters:
    ``"standard"``, ``"fifo"``, ``"priority"``). ``backend``: ``"auto"``, ``"function"`` or
    ``"graph"``. The model is changed in place (its layers' forwards); the returned wrapper
    holds the queue."""
    return SplitModel(model, backend=backend, order=order)
