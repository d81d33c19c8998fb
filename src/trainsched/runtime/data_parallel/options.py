"""The settings of a :class:`~trainsched.runtime.data_parallel.ScheduledDataParallel`, as one
frozen value checked once.

Everything here is a plain value (no tensors, no process group): how collectives are ordered
across ranks, how often that order is verified, how long any wait may last, where a timeline
goes, how updates are split, gloo's worker threads, the fake wire a static order is compiled
on, whether the scheduler runs at all, the out-of-order backprop setting (how many
layers nearest the input defer their weight gradients, ``specs/backprop.md`` §2b) and a
fault-injection hook for a delayed link (``link_hold``). The
wrapper takes them as keyword arguments (or as ``options=``), so call sites keep naming only
what they change.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainsched.errors import TrainschedError

__all__ = ["ORDERS", "SPLIT_BACKENDS", "STATIC_WIRE", "UPDATES", "DataParallelOptions",
           "check_static_wire"]

#: How the ranks agree on the issue order (:mod:`.order`).
ORDERS = ("leader", "static", "local")
#: The fake wire ``order="static"`` compiles on: (α seconds per collective, bytes per second);
#: gloo on loopback, ``specs/comm.md`` §8 (α ≈ 0.5-2 ms, β ≈ 1 GB/s).
STATIC_WIRE = (1e-3, 1e9)
#: What one optimizer step covers (:mod:`.units`).
UPDATES = ("auto", "parameter", "partition")
#: How layers are split when ``backprop_k > 0`` (``trainsched.runtime.split.BACKENDS``).
SPLIT_BACKENDS = ("auto", "function", "graph")


@dataclass(frozen=True, kw_only=True)
class DataParallelOptions:
    """The wrapper's settings (the class docstring of ``ScheduledDataParallel`` says what each
    does). Invalid values raise :class:`~trainsched.errors.TrainschedError` on construction;
    ``timeout_s`` and ``static_wire`` are stored as floats, ``timeline`` as a ``Path``."""

    order: str = "leader"
    verify_order_every: int = 0
    timeout_s: float = 300.0
    timeline: Path | None = None
    timeline_steps: tuple[int, int] = (1, 3)
    update: str = "auto"
    comm_threads: int | None = None
    static_wire: tuple[float, float] = STATIC_WIRE
    enabled: bool = True
    backprop_k: int = 0
    split_backend: str = "auto"
    #: Fault injection, a delayed link: called with the step (backward passes before it) just
    #: before this rank hands the step's first gradient to the wire; it may hold (sleep).
    link_hold: Callable[[int], Any] | None = None

    def __post_init__(self) -> None:
        if self.order not in ORDERS:
            raise TrainschedError(f"order must be one of {', '.join(ORDERS)}, got "
                                  f"{self.order!r}")
        if self.update not in UPDATES:
            raise TrainschedError(f"update must be one of {', '.join(UPDATES)}, got "
                                  f"{self.update!r}")
        every = self.verify_order_every
        if not (isinstance(every, int) and every >= 0):
            raise TrainschedError(f"verify_order_every must be an integer >= 0, got {every!r}")
        timeout = self.timeout_s
        if not (isinstance(timeout, int | float) and math.isfinite(timeout) and timeout > 0):
            raise TrainschedError(f"timeout_s must be a positive number, got {timeout!r}")
        object.__setattr__(self, "timeout_s", float(timeout))
        object.__setattr__(self, "static_wire", check_static_wire(self.static_wire))
        if not isinstance(self.enabled, bool):
            raise TrainschedError(f"enabled must be True or False, got {self.enabled!r}")
        k = self.backprop_k
        if not (isinstance(k, int) and not isinstance(k, bool) and k >= 0):
            raise TrainschedError(f"backprop_k must be an integer >= 0 (0: in-order "
                                  f"backprop), got {k!r}")
        if self.split_backend not in SPLIT_BACKENDS:
            raise TrainschedError(f"split_backend must be one of {', '.join(SPLIT_BACKENDS)}, "
                                  f"got {self.split_backend!r}")
        threads = self.comm_threads
        if threads is not None and not (isinstance(threads, int)
                                        and not isinstance(threads, bool) and threads >= 1):
            raise TrainschedError(f"comm_threads must be a positive integer, got {threads!r}")
        if self.link_hold is not None and not callable(self.link_hold):
            raise TrainschedError(f"link_hold must be a function of the step, got "
                                  f"{self.link_hold!r}")
        if self.timeline is not None:
            object.__setattr__(self, "timeline", Path(self.timeline))
        object.__setattr__(self, "timeline_steps", tuple(self.timeline_steps))

    @property
    def coordinated(self) -> bool:
        """Every rank issues one order (``"leader"`` or ``"static"``)."""
        return self.order in ("leader", "static")


def check_static_wire(wire: Any) -> tuple[float, float]:
    """``(alpha_s, bytes_per_s)``: α finite and >= 0, bandwidth > 0."""
    ok = (isinstance(wire, tuple | list) and len(wire) == 2
          and all(isinstance(v, int | float) and not isinstance(v, bool) for v in wire))
    if ok:
        alpha_s, bytes_per_s = float(wire[0]), float(wire[1])
        ok = math.isfinite(alpha_s) and alpha_s >= 0 and bytes_per_s > 0
    if not ok:
        raise TrainschedError(f"static_wire must be (alpha_s, bytes_per_s): the start-up "
                              f"seconds of one collective (>= 0) and the bandwidth in bytes/s "
                              f"(> 0), e.g. {STATIC_WIRE}; got {wire!r}")
    return alpha_s, bytes_per_s
