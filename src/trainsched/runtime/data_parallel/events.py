"""What other threads tell the dispatcher thread, as typed messages on one queue.

The training thread's hooks post :class:`Ready` (a gradient is ready) and, after the first
backward pass, :class:`Plan` (the task table every rank agreed on); ``retune`` posts
:class:`Retune`; a follower's decision reader posts :class:`Decision` (rank 0's next
collective) or :class:`Failed`; a collective's completion callback posts :class:`Done`;
``close`` posts :class:`Stop`. Each is a small frozen value, handled by
:meth:`~trainsched.runtime.data_parallel.loop.DispatchLoop.handle`.
"""

from __future__ import annotations

import queue
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias

from trainsched.comm.policy import CommPolicy, Gradient
from trainsched.errors import TrainschedError

__all__ = ["Decision", "Done", "Event", "Failed", "Inbox", "Plan", "Ready", "Retune", "Stop",
           "TaskTable"]


@dataclass(frozen=True, kw_only=True)
class TaskTable:
    """Rank 0's view of the first backward pass, the same on every rank: the gradients (layer
    and ready order) and when each became ready (seconds from the first)."""

    gradients: tuple[Gradient, ...]
    ready_s: Mapping[str, float]


@dataclass(frozen=True)
class Ready:
    """Parameter ``param``'s gradient became ready at ``t`` (seconds on the run's clock)."""

    param: int
    t: float


@dataclass(frozen=True)
class Plan:
    """The task table: build the collectives."""

    table: TaskTable


@dataclass(frozen=True)
class Retune:
    """Rank 0 runs ``policy`` from ``step`` on."""

    step: int
    policy: CommPolicy


@dataclass(frozen=True)
class Decision:
    """Rank 0 issued collective ``collective`` next (a follower of ``order="leader"``)."""

    collective: int


@dataclass(frozen=True)
class Done:
    """The all-reduce of ``collective`` completed (or failed: ``future.wait()`` raises) at
    ``t``."""

    collective: int
    future: Any
    t: float


@dataclass(frozen=True)
class Failed:
    """Another thread of the dispatcher's failed; the dispatcher raises ``error``."""

    error: TrainschedError


@dataclass(frozen=True)
class Stop:
    """Leave the loop (``close``)."""


Event: TypeAlias = Ready | Plan | Retune | Decision | Done | Failed | Stop
Inbox: TypeAlias = queue.SimpleQueue[Event]
