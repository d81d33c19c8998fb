"""The teacher-student task's student behind an emulated accelerator, for
``benchmarks/sync_targets.py``.

The forward pass first sleeps ``ACCELERATOR_S`` (the time a device would spend on a bigger
network's step), then runs the real student MLP, so training, loss and accuracy are real while a
worker's local time is set by the sleep, not by how the host's 2 cores are shared among 4
workers, a parameter server and other jobs. A straggler's factor then stretches a known time
(``Straggler(factor=3)`` sleeps twice the batch's local time more), as it would on a device.
Built in the worker processes by ``run_sync(model="_sync_student:build")`` with this folder on
``PYTHONPATH``.
"""

from __future__ import annotations

import time
from typing import Any

from torch import nn

#: Emulated accelerator time per forward pass, seconds.
ACCELERATOR_S = 0.02


class _Emulated(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: Any) -> Any:
        time.sleep(ACCELERATOR_S)
        return self.inner(x)


def build(task: Any) -> nn.Module:
    return _Emulated(task.student())
