"""The pipeline benchmark's model: a stack of transformer encoder layers (no dropout).

``encoder(batch_size, seq_len)`` returns ``(model, (x,))`` for ``trainsched.capture.build``'s
``path.py:function`` form; the layer count and width come from ``TRAINSCHED_ENCODER`` =
``layers,d_model,heads`` (default ``8,512,8``), so that a quick run can shrink the model.
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
    model = nn.Sequential(*[nn.TransformerEncoderLayer(d_model, heads, 4 * d_model, dropout=0.0,
                                                       batch_first=True)
                            for _ in range(layers)])
    return model, (torch.randn(batch_size, seq_len, d_model),)
