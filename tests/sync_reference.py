"""The single-process reference the sync runtime's equivalence tests compare against: full-batch
training on the task's sample stream, ``batch`` samples per step, in this process."""

from __future__ import annotations

from typing import Any

import torch


def full_batch_params(task: Any, model: torch.nn.Module, opt: torch.optim.Optimizer, *,
                      steps: int, batch: int) -> torch.Tensor:
    """Train ``model`` with ``opt`` for ``steps`` steps of ``batch`` stream samples of ``task``
    (cross-entropy); its parameters, flattened."""
    data = task.data()
    for t in range(steps):
        index = task.stream_indices(t * batch, batch)
        loss = torch.nn.functional.cross_entropy(model(data.x_train[index]),
                                                 data.y_train[index])
        opt.zero_grad()
        loss.backward()
        opt.step()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])
