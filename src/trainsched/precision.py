"""Training precisions: what the parameters are stored in and what the math runs in.

Capture turns a precision into PyTorch's own dtypes (converting the model, or autocast), the
training transform into optimizer state (an fp32 master copy for 16-bit parameters), and every
report names it beside the cost tier.
"""

from __future__ import annotations

from trainsched.errors import TrainschedError

__all__ = ["PRECISIONS", "check_precision", "master_weights"]

#: Training precisions. ``fp32``: everything in fp32. ``tf32``: fp32 storage, matrix math at the
#: device's TF32 rate. ``bf16``/``fp16``: parameters, activations and gradients (so the bytes
#: all-reduced) in 16 bits, with an fp32 master copy of the weights in the optimizer.
#: ``amp-bf16``/``amp-fp16``: autocast mixed precision: fp32 parameters and gradients, the
#: ops autocast lowers (matmuls, convolutions) computed and saved in 16 bits.
PRECISIONS = ("fp32", "tf32", "bf16", "fp16", "amp-bf16", "amp-fp16")


def check_precision(precision: object) -> str:
    """``precision`` if it is one of :data:`PRECISIONS`, else a clear error."""
    if precision not in PRECISIONS:
        raise TrainschedError(f"unknown precision {precision!r}; choose one of "
                              f"{', '.join(PRECISIONS)}")
    return str(precision)


def master_weights(precision: str) -> bool:
    """Whether the optimizer keeps an fp32 master copy of 16-bit parameters."""
    return check_precision(precision) in ("bf16", "fp16")
