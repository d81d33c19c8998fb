"""The optimizers a run can train with, by name: one list for every runtime entry.

``sgd`` (plain), ``momentum`` (SGD with momentum 0.9) and ``adam``. torch is imported only when
an optimizer is made, so the names can be checked in the parent process.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from trainsched.errors import TrainschedError
from trainsched.graph import OPTIMIZERS

__all__ = ["OPTIMIZERS", "check_optimizer", "make_optimizer", "optimizer_spec"]


def check_optimizer(name: str) -> None:
    if name not in OPTIMIZERS:
        raise TrainschedError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got "
                              f"{name!r}")


def optimizer_spec(name: str, lr: float) -> tuple[Any, dict[str, Any]]:
    """The torch optimizer class of ``name`` and its keyword arguments at learning rate
    ``lr`` (for wrappers that build one optimizer per parameter group themselves)."""
    import torch

    check_optimizer(name)
    if name == "adam":
        return torch.optim.Adam, {"lr": lr}
    if name == "momentum":
        return torch.optim.SGD, {"lr": lr, "momentum": 0.9}
    return torch.optim.SGD, {"lr": lr}


def make_optimizer(name: str, params: Iterable[Any], lr: float) -> Any:
    """The optimizer ``name`` over ``params`` at learning rate ``lr``."""
    cls, kwargs = optimizer_spec(name, lr)
    return cls(list(params), **kwargs)
