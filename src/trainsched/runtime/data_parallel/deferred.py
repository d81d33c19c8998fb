"""Reverse-first-k on the scheduled data-parallel runtime (``specs/backprop.md`` §2b).

With ``backprop_k = k > 0`` the wrapped module's backward is split
(:mod:`trainsched.runtime.split`, in place) and its dW queue runs the order
``reverse_first_k(k)``: layers >= k compute their dW right after their dX, as before; the dW
of the k layers nearest the input wait until the last dX and then run in forward order,
layer 0 first. :class:`DeferredWeights` connects that queue to the scheduler's hooks:

- a parameter of a split layer gets no gradient from autograd's accumulation (its
  post-accumulate-grad hook never fires), so it is handed to the dispatcher when the queue
  has run every dW entry of it this step (one per forward call of each layer that holds it:
  a tied weight waits for all its uses), in the order the queue runs them: layers L-1..k as
  produced, then 0, 1, ..., k-1, each issued at once (under the priority policy layer 0
  overtakes gradients still queued);
- the end of the backward pass (one autograd final callback, owned by the hooks) first runs
  the deferred dW, then checks that every parameter got its gradient;
- the updates stay lazy per layer, as without deferral: the step returns at once, and the
  next forward of layer i waits (its forward pre-hook) for layer i's update only.

``k = 0`` builds none of this: the runtime is unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from torch import nn

from trainsched.backprop.deferral import reverse_first_k
from trainsched.errors import TrainschedError
from trainsched.runtime.split import SplitModel, count_layers

__all__ = ["DeferredWeights", "check_backprop_k"]


def check_backprop_k(module: nn.Module, k: int, backend: str) -> None:
    """Refuse ``k`` above the number of layers the split finds in ``module``."""
    layers = count_layers(module, backend)
    if k > layers:
        raise TrainschedError(
            f"backprop_k={k} is above the model's {layers} split layers (Linear, Conv, "
            f"Embedding and other modules owning parameters, norms excluded, counted in "
            f"forward order); use a k from 0 to {layers}")


class DeferredWeights:
    """``module`` split in place with ``reverse_first_k(k)``; ``index`` maps a parameter to
    its position among the trainable ones. ``begin`` starts the hooks' end-of-backward
    callback; ``ready(k)`` hands parameter ``k``'s gradient to the dispatcher."""

    def __init__(self, module: nn.Module, k: int, backend: str, index: dict[int, int]) -> None:
        self._index = index
        self._expected = [0] * len(index)  # dW entries still to run per parameter, this step
        self._begin: Callable[[], None] = lambda: None
        self._ready: Callable[[int], None] = lambda k: None
        self.split = SplitModel(module, backend=backend, order=reverse_first_k(k),
                                auto_end=False, listener=self)
        #: The trainable parameters (positions) whose dW the queue computes.
        self.params = frozenset(index[id(p)] for p in self.split.split_params)

    def connect(self, begin: Callable[[], None], ready: Callable[[int], None]) -> None:
        self._begin, self._ready = begin, ready

    def forward_starts(self) -> None:
        """A forward of the whole module begins: this step's counts start from zero."""
        self._expected = [0] * len(self._expected)

    def end_backward(self) -> None:
        """After the last dX: the deferred dW, layer 0 first (each hands its gradients)."""
        self.split.queue.end_backward()

    def close(self) -> None:
        """Put the module's own forwards back (every backward pass ran its dW by its end;
        what still waits belongs to a failed one and is dropped)."""
        self.split.unsplit(drain=False)

    # -- the queue's listener ------------------------------------------------------------------

    def layer_forward(self, params: Sequence[nn.Parameter]) -> None:
        for p in params:
            self._expected[self._index[id(p)]] += 1

    def backward_started(self) -> None:
        self._begin()

    def ran(self, params: Sequence[nn.Parameter]) -> None:
        for p in params:
            k = self._index[id(p)]
            self._expected[k] -= 1
            if self._expected[k] == 0:
                self._ready(k)
