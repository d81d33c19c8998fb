"""Scheduled data parallelism on ``torch.distributed`` (see :mod:`.module`)."""

from trainsched.runtime.data_parallel.module import (
    ORDERS,
    STATIC_WIRE,
    ScheduledDataParallel,
    static_issue_order,
)

__all__ = ["ORDERS", "STATIC_WIRE", "ScheduledDataParallel", "static_issue_order"]
