"""What the training thread and the dispatcher thread share, under one condition variable.

Per parameter: how many gradients were handed over (``posted``) and how many updates were
applied (``applied``); a parameter is *behind* while ``applied < posted``, and its module's
next forward waits for it. ``grads`` holds the gradient each handed-over parameter is reduced
and stepped with (the dispatcher may replace it by its slice of a bucket). The first failure
of any thread is kept in ``error`` and raised in the training thread at its next wait or hook.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

import torch
from torch import nn

from trainsched.errors import TrainschedError
from trainsched.runtime.data_parallel.trace import clock

__all__ = ["Progress"]


class Progress:
    """Hand-over and update counts of ``count`` parameters, their gradients, the first failure
    and whether the wrapper was closed."""

    def __init__(self, count: int) -> None:
        self._cv = threading.Condition()
        self.posted = [0] * count  # gradients handed to the dispatcher
        self.applied = [0] * count  # updates done
        self.grads: list[torch.Tensor | None] = [None] * count
        self.error: TrainschedError | None = None
        self.closed = False

    def raise_error(self) -> None:
        """Raise (a copy of) the first failure, if any."""
        if self.error is not None:
            raise TrainschedError(str(self.error))

    def fail(self, error: TrainschedError) -> None:
        """Keep ``error`` unless one is kept already, and wake every waiter."""
        with self._cv:
            if self.error is None:
                self.error = error
            self._cv.notify_all()

    def post(self, k: int, param: nn.Parameter) -> bool:
        """Hand over ``param``'s gradient (made contiguous) as parameter ``k``'s; ``False``
        (and nothing handed over) while its last update is not applied yet."""
        with self._cv:
            if self.applied[k] < self.posted[k]:
                return False
            grad = param.grad
            assert grad is not None
            if not grad.is_contiguous():
                grad = grad.contiguous()
                param.grad = grad
            self.grads[k] = grad
            self.posted[k] += 1
        return True

    def updated(self, params: Iterable[int]) -> None:
        """The updates of ``params`` are applied (dispatcher thread): one wake-up of the
        waiters for all of them (a bucket's parameters are updated together)."""
        params = list(params)
        if not params:
            return
        for k in params:
            self.grads[k] = None
        with self._cv:
            for k in params:
                self.applied[k] += 1
            self._cv.notify_all()

    def wait_updated(self, params: Iterable[int], deadline: float) -> list[int]:
        """Wait until every update of ``params`` handed over so far is applied, or until
        ``deadline`` (on :func:`~.trace.clock`); return the parameters still behind then (empty:
        none). Raises a failure kept meanwhile."""
        params = list(params)
        with self._cv:
            while True:
                self.raise_error()
                behind = [k for k in params if self.applied[k] < self.posted[k]]
                if not behind:
                    return []
                left = deadline - clock()
                if left <= 0:
                    return behind
                self._cv.wait(min(left, 0.5))
