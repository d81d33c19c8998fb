"""The dW queue: deferred weight-gradient closures, run in the order a policy says.

A split layer's backward computes dX at once and hands :meth:`WGradQueue.push` a closure that
later computes dW (and the bias gradient) and *accumulates* it into the parameters' ``.grad``
(never a per-micro-batch copy: memory would grow with the micro-batches). The queue tags each
entry (:class:`~trainsched.backprop.deferral.PendingW`: layer in forward order, micro-batch,
arrival, parameters, the storages it keeps alive) and asks its order
(:mod:`trainsched.backprop.deferral`) which entries run when: at once, at the end of the
backward pass, or at :meth:`WGradQueue.drain`.

Bytes held are storage-deduplicated: a storage read by several entries (an input shared by
two projections, views of one buffer) counts once; parameters are not counted (they live
anyway). :attr:`WGradQueue.peak_held_bytes` is the most held between two pushes, after the
order ran what it runs at once (in-order backprop holds nothing across a push).

The layer index of a split module is its position in the first forward; the micro-batch of
an entry is the layer's forward call since the queue was last empty at a drain or at the end
of a backward pass.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from trainsched.backprop.deferral import DeferralOrder, PendingW, held_bytes
from trainsched.errors import TrainschedError

__all__ = ["Executor", "QueueListener", "WGradQueue", "storage_sizes"]


class QueueListener(Protocol):
    """Who wants to know what the queue did (the scheduled data-parallel runtime)."""

    def layer_forward(self, params: Sequence[torch.nn.Parameter]) -> None:
        """A split layer holding ``params`` ran forward with gradients (an entry will come)."""

    def backward_started(self) -> None:
        """The first entry of a backward pass was pushed."""

    def ran(self, params: Sequence[torch.nn.Parameter]) -> None:
        """An entry ran: its dW is accumulated into these parameters' ``.grad``."""


@dataclass(eq=False)
class _Entry:
    info: PendingW
    run: Callable[[], None] | None
    params: tuple[torch.nn.Parameter, ...]
    tensors: tuple[torch.Tensor, ...]


class Executor(Protocol):
    """Runs one entry's closure where it belongs (the single-device slots put some on a
    second CUDA stream); without one the queue calls the closure itself."""

    def __call__(self, info: PendingW, run: Callable[[], None],
                 params: Sequence[torch.nn.Parameter],
                 tensors: Sequence[torch.Tensor]) -> None:
        """Run (or launch) ``run``, which reads ``tensors`` and accumulates into ``params``."""


def storage_sizes(tensors: Iterable[torch.Tensor | None],
                  exclude: Iterable[torch.Tensor] = ()) -> tuple[tuple[int, int], ...]:
    """``(key, bytes)`` of the storages of ``tensors`` (each once), leaving out those of
    ``exclude`` (the parameters)."""
    skip = {t.untyped_storage().data_ptr() for t in exclude}
    found: dict[int, int] = {}
    for t in tensors:
        if t is None or t.is_sparse:
            continue
        storage = t.untyped_storage()
        key = storage.data_ptr()
        if key not in skip:
            found[key] = storage.nbytes()
    return tuple(found.items())


class WGradQueue:
    """Deferred dW closures run as ``order`` says (see the module docstring).

    ``auto_end``: at the end of each backward pass that pushed something, run what the order
    runs then (``reverse_first_k``'s deferred layers). A runtime that owns the end of the
    backward pass itself passes ``False`` and calls :meth:`end_backward`."""

    def __init__(self, order: DeferralOrder, *, auto_end: bool = True,
                 listener: QueueListener | None = None) -> None:
        self.order = order
        self.listener = listener
        #: Who runs an entry's closure (``None``: the queue, at once, on this thread).
        self.executor: Executor | None = None
        self._auto_end = auto_end
        self._pending: list[_Entry] = []
        self._seq = 0
        self._in_backward = False
        self._layers: dict[int, int] = {}  # id(layer key) -> index in forward order
        self._calls: dict[int, int] = {}  # layer index -> forward calls since last empty
        self.peak_held_bytes = 0
        self.ran_count = 0
        #: An entry is running (the graph backend's dW pass fires the parameters' tensor
        #: hooks with their gradients).
        self.running = False

    # -- what callers read ---------------------------------------------------------------------

    @property
    def pending(self) -> tuple[PendingW, ...]:
        """The entries waiting, in arrival order."""
        return tuple(e.info for e in self._pending)

    @property
    def held_bytes(self) -> int:
        """The bytes the waiting entries keep alive (each storage once)."""
        return held_bytes(self.pending)

    def __len__(self) -> int:
        return len(self._pending)

    # -- forward -------------------------------------------------------------------------------

    def forward_call(self, key: object, params: Sequence[torch.nn.Parameter] = ()
                     ) -> tuple[int, int]:
        """A split layer (identified by the object ``key``, holding ``params``) runs forward
        with gradients: its layer index and this call's micro-batch."""
        layer = self._layers.setdefault(id(key), len(self._layers))
        microbatch = self._calls.get(layer, 0)
        self._calls[layer] = microbatch + 1
        if self.listener is not None:
            self.listener.layer_forward(params)
        return layer, microbatch

    def layer_index(self, key: object) -> int | None:
        """The layer index of the split layer ``key`` (``None`` before its first forward)."""
        return self._layers.get(id(key))

    @property
    def num_layers_seen(self) -> int:
        """Split layers that ran forward so far."""
        return len(self._layers)

    # -- entries -------------------------------------------------------------------------------

    def push(self, *, layer: int, microbatch: int, params: Sequence[tuple[str, torch.nn.Parameter]],
             tensors: Iterable[torch.Tensor | None], run: Callable[[], None],
             in_backward: bool = True) -> None:
        """Queue ``run`` (computes a dW and accumulates it into ``params``, given as
        ``(name, parameter)``), which keeps ``tensors`` alive; then run what the order runs
        now. ``in_backward``: called from inside a backward pass (the end-of-backward rule
        applies to it)."""
        info = PendingW(layer=layer, microbatch=microbatch, seq=self._seq,
                        params=tuple(n for n, _ in params),
                        storages=storage_sizes(tensors, exclude=[p for _, p in params]))
        self._seq += 1
        kept = tuple(t for t in tensors if t is not None)
        self._pending.append(_Entry(info, run, tuple(p for _, p in params), kept))
        if in_backward and not self._in_backward:
            self._in_backward = True
            if self._auto_end:
                torch.autograd.Variable._execution_engine.queue_callback(self.end_backward)
            if self.listener is not None:
                self.listener.backward_started()
        self._run(self.order.run_now(self.pending))
        self.peak_held_bytes = max(self.peak_held_bytes, self.held_bytes)

    def end_backward(self) -> None:
        """The backward pass ended: run what the order runs after the last dX."""
        self._in_backward = False
        self._run(self.order.at_backward_end(self.pending))
        if not self._pending:
            self._calls.clear()

    def drain(self) -> None:
        """Run every waiting entry, in the order's drain order (before evaluation,
        checkpoints, the optimizer step of a single process, and at the end)."""
        if self._in_backward:
            raise TrainschedError("drain() runs after a backward pass, not inside one")
        self._run(self.order.drain(self.pending))
        assert not self._pending
        self._calls.clear()

    def run_layers(self, layers: Iterable[int]) -> None:
        """Run the waiting entries of ``layers`` now, in arrival order (the slots runtime
        launches a deferred dW after a chosen forward)."""
        wanted = set(layers)
        self._run(tuple(i for i, e in enumerate(self._pending) if e.info.layer in wanted))

    def discard(self) -> None:
        """Drop every waiting entry without running it (a failed step's)."""
        self._pending.clear()
        self._in_backward = False
        self._calls.clear()

    def _run(self, indices: Sequence[int]) -> None:
        if not indices:
            return
        chosen = [self._pending[i] for i in indices]
        assert len({id(e) for e in chosen}) == len(chosen), "an order ran an entry twice"
        taken = {id(e) for e in chosen}
        self._pending = [e for e in self._pending if id(e) not in taken]
        for entry in chosen:
            run, entry.run = entry.run, None  # drop the closure (and its tensors) once run
            tensors, entry.tensors = entry.tensors, ()
            assert run is not None
            self.running = True
            try:
                with torch.no_grad():
                    if self.executor is None:
                        run()
                    else:
                        self.executor(entry.info, run, entry.params, tensors)
            finally:
                self.running = False
            self.ran_count += 1
            if self.listener is not None:
                self.listener.ran(entry.params)


def accumulate(param: torch.nn.Parameter, grad: torch.Tensor) -> None:
    """Add ``grad`` into ``param.grad`` (set it if there is none)."""
    if param.grad is None:
        param.grad = grad.detach()
    else:
        param.grad.add_(grad)
