"""A communication-bound MLP for ``benchmarks/ooo_real.py``: ``LAYERS`` linear layers of
``WIDTH`` x ``WIDTH`` (4 MiB of fp32 weights each) on a small batch, so that reducing the
gradients costs about as much as computing them on this host's cores.

``build`` is the model for ``trainsched.runtime.train`` (``benchmarks/_widemlp.py:build``).
"""

from __future__ import annotations

LAYERS = 8
WIDTH = 1024


def build(batch_size: int | None = None):  # -> (model, args)
    import torch
    from torch import nn

    blocks: list[nn.Module] = []
    for _ in range(LAYERS):
        blocks += [nn.Linear(WIDTH, WIDTH), nn.Tanh()]
    batch = 8 if batch_size is None else batch_size
    return nn.Sequential(*blocks), (torch.randn(batch, WIDTH),)
