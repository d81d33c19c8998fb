"""The pipeline benchmark's model: a stack of transformer encoder layers (no dropout).

``encoder(batch_size, seq_len)`` returns ``(model, (x,))`` for ``trainsched.capture.build``'s
``path.py:function`` form; the layer count and width come from ``TRAINSCHED_ENCODER`` =
``layers,d_model,heads`` (default ``8,512,8``), so that a quick run can shrink the model.
``validation_encoder`` and ``tiny_encoder`` are fixed smaller stacks for
``benchmarks/validate_sim.py``'s transformer DDP sweep over batch sizes.
"""

from __future__ import annotations

import os

import torch
from torch import nn


def shape() -> tuple[int, int, int]:
    layers, d_model, heads = (int(v) for v in
                              os.environ.get("TRAINSCHED_ENCODER", "8,512,8").split(","))
    return layers, d_model, heads


def encoder(batch_size: int = 16, seq_len: int = 128) -> tuple[nn.Module, tuple]:
    layers, d_model, heads = shape()
    return _stack(layers, d_model, heads, batch_size, seq_len)


def validation_encoder(batch_size: int = 8, seq_len: int = 64) -> tuple[nn.Module, tuple]:
    """``validate_sim.py``'s transformer: 4 encoder layers of width 256 (4 heads), 12.6 MB of
    gradients, whatever ``TRAINSCHED_ENCODER`` says."""
    return _stack(4, 256, 4, batch_size, seq_len)


def tiny_encoder(batch_size: int = 8, seq_len: int = 32) -> tuple[nn.Module, tuple]:
    """``validate_sim.py --quick``'s transformer: 2 encoder layers of width 64 (2 heads)."""
    return _stack(2, 64, 2, batch_size, seq_len)


def _stack(layers: int, d_model: int, heads: int, batch_size: int,
           seq_len: int) -> tuple[nn.Module, tuple]:
    model = nn.Sequential(*[nn.TransformerEncoderLayer(d_model, heads, 4 * d_model, dropout=0.0,
                                                       batch_first=True)
                            for _ in range(layers)])
    return model, (torch.randn(batch_size, seq_len, d_model),)
