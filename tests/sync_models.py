"""Students for the sync runtime's straggler tests, built in the worker processes through
``run_sync(model="sync_models:...")`` (this folder on ``PYTHONPATH``): the task's student
behind a forward that sleeps, so a batch's local time is dominated by a known delay rather than
by the compute time a loaded machine stretches at random.

* :func:`steady`: 20 ms per forward on every worker (a fair run);
* :func:`noisy`: 20 ms times a factor drawn uniformly from [0.9, 1.1] per forward, from a
  stream seeded by the worker's rank (a noisy but fair run).
"""

from __future__ import annotations

import random
import time
from typing import Any

import torch.distributed as dist
from torch import nn

BASE_S = 0.02


class _Sleepy(nn.Module):
    def __init__(self, inner: nn.Module, spread: float) -> None:
        super().__init__()
        self.inner = inner
        self.spread = spread
        self.rng: random.Random | None = None

    def forward(self, x: Any) -> Any:
        if self.rng is None:
            self.rng = random.Random(1000 + dist.get_rank())
        time.sleep(BASE_S * self.rng.uniform(1 - self.spread, 1 + self.spread))
        return self.inner(x)


def steady(task: Any) -> nn.Module:
    return _Sleepy(task.student(), 0.0)


def noisy(task: Any) -> nn.Module:
    return _Sleepy(task.student(), 0.1)
