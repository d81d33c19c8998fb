"""``enabled=True``: the scheduler behind :class:`~.module.ScheduledDataParallel`.

:class:`Scheduler` puts the rooms of this package together and answers the wrapper's API:
the training thread's hooks (:mod:`.hooks`), the state both threads share (:mod:`.sync`), the
dispatcher thread (:mod:`.loop`) with its wire (:mod:`.wire`), issue order (:mod:`.order`),
update units (:mod:`.units`) and policy switches (:mod:`.retune`), and the timeline
(:mod:`.trace`). It is the hooks' :class:`~.hooks.StepListener`.

An exit hook drains and stops a scheduler the program did not close (so that the process does
not hang on its threads); it writes no file: the timeline is written by :meth:`close` only.
"""

from __future__ import annotations

import atexit
import contextlib
import queue
import threading
import weakref
from typing import Any

import torch
from torch import nn

from trainsched.comm.policy import CommPolicy
from trainsched.errors import TrainschedError
from trainsched.runtime.data_parallel.deferred import DeferredWeights
from trainsched.runtime.data_parallel.events import Event, Plan, Retune, Stop
from trainsched.runtime.data_parallel.group import Peers
from trainsched.runtime.data_parallel.hooks import Hooks
from trainsched.runtime.data_parallel.layout import FirstStep, Trainable, task_table
from trainsched.runtime.data_parallel.loop import DispatchLoop
from trainsched.runtime.data_parallel.options import DataParallelOptions
from trainsched.runtime.data_parallel.order import make_order
from trainsched.runtime.data_parallel.retune import PolicyChannel, Roles, SwitchPlan, TunerFeed
from trainsched.runtime.data_parallel.sync import Progress
from trainsched.runtime.data_parallel.trace import Recorder, clock
from trainsched.runtime.data_parallel.units import Updates
from trainsched.runtime.data_parallel.wire import Wire

__all__ = ["Scheduler"]


class Scheduler:
    """Schedules ``module``'s gradients under ``policy`` among ``peers`` (on ``data_group``),
    with ``optimizer``/``kwargs`` per update unit; ``tuner`` (rank 0 only) retunes online."""

    def __init__(self, module: nn.Module, policy: CommPolicy, *, trainable: Trainable,
                 peers: Peers, options: DataParallelOptions, optimizer: Any,
                 kwargs: dict | None, tuner: Any, data_group: Any) -> None:
        self._module = module
        self._peers = peers
        self._options = options
        self.trainable = trainable
        self._updates = Updates(trainable, optimizer, kwargs, options.update)
        self._progress = Progress(len(trainable))
        self._recorder = Recorder(options.timeline, options.timeline_steps)
        roles = Roles.of(options.coordinated, peers.rank, peers.world_size)
        self._inbox: queue.SimpleQueue[Event] = queue.SimpleQueue()
        store = peers.client()  # the dispatcher thread's connection
        self._channel = PolicyChannel(policy, roles, peers, store)
        self._plan = SwitchPlan(policy, roles, self._channel, trainable.check_alignment)
        self._tuning = (TunerFeed(tuner, policy, self._plan.policy_at, self._apply_tuned)
                        if tuner is not None and roles.decides else None)
        self._deferred = (DeferredWeights(module, options.backprop_k, options.split_backend,
                                          {id(p): k for k, p in enumerate(trainable.tensors)})
                          if options.backprop_k else None)
        self._hooks = Hooks(module, trainable, progress=self._progress,
                            recorder=self._recorder, inbox=self._inbox,
                            timeout_s=options.timeout_s, listener=self,
                            deferred=self._deferred)
        order = make_order(options, peers, store, self._inbox)  # the loop closes it
        wire = Wire(group=data_group, rank=peers.rank, world_size=peers.world_size,
                    progress=self._progress, inbox=self._inbox, recorder=self._recorder)
        self.loop = DispatchLoop(rank=peers.rank, inbox=self._inbox, progress=self._progress,
                                 recorder=self._recorder, order=order,
                                 updates=self._updates, wire=wire, channel=self._channel,
                                 hold=options.link_hold)
        self._thread = threading.Thread(target=self.loop.run, name="trainsched-dispatcher",
                                        daemon=True)
        self._thread.start()
        atexit.register(_stop_at_exit, weakref.ref(self))

    # -- what the wrapper reads ----------------------------------------------------------------

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self._module(*args, **kwargs)

    @property
    def policy(self) -> CommPolicy:
        """The policy in force."""
        return self._channel.policy

    @property
    def update(self) -> str:
        return self._updates.mode

    @property
    def steps(self) -> int:
        return self._hooks.backwards

    @property
    def max_in_flight_bytes(self) -> float:
        return self.loop.max_in_flight_bytes

    @property
    def dw_peak_held_bytes(self) -> int:
        return 0 if self._deferred is None else self._deferred.split.queue.peak_held_bytes

    @property
    def switches(self) -> tuple[tuple[int, CommPolicy], ...]:
        return tuple(self._channel.switches)

    def policy_at(self, step: int) -> CommPolicy:
        return self._plan.policy_at(step)

    def optimizers(self) -> tuple[torch.optim.Optimizer, ...]:
        self.drain()
        self._updates.fold()
        return tuple(self._updates.whole)

    def static_order(self) -> tuple[str, ...]:
        order = self._options.order
        if order != "static":
            raise TrainschedError(f"static_order is the order compiled with order='static'; "
                                  f"this wrapper uses order={order!r}")
        self.drain()
        names = self.loop.names
        return tuple(names[c] for c in self.loop.static)

    # -- what the wrapper asks -----------------------------------------------------------------

    def retune(self, policy: CommPolicy | None, at_step: int | None,
               changes: dict[str, Any]) -> int:
        if not self._plan.roles.decides:
            raise TrainschedError(
                f"retune is rank 0's call (with order='leader' or 'static'); rank "
                f"{self._peers.rank} follows at the same step"
                if self._options.order != "local" else
                "retune needs order='leader' or 'static': with order='local' no rank can tell "
                "the others when to switch")
        if self._hooks.in_backward:
            raise TrainschedError("retune between steps, not during a backward pass")
        if self._progress.closed:
            raise TrainschedError("this ScheduledDataParallel was closed")
        step, policy = self._plan.plan(policy, at_step, changes,
                                       earliest=self._hooks.backwards + 1)
        self._inbox.put(Retune(step, policy))
        return step

    def _apply_tuned(self, step: int, policy: CommPolicy) -> None:
        self.retune(policy, step, {})

    def drain(self, timeout_s: float | None = None) -> None:
        limit = self._options.timeout_s if timeout_s is None else timeout_s
        behind = self._progress.wait_updated(range(len(self.trainable)), clock() + limit)
        if behind:
            raise TrainschedError(
                f"drain: {len(behind)} parameter(s) still not updated after {limit:g} s "
                f"(first: {self.trainable.names[behind[0]]!r}); a rank died or hung")

    def set_lr(self, lr: float) -> None:
        self.drain()
        for opt in self._updates.every_optimizer():
            for group in opt.param_groups:
                group["lr"] = lr

    def close(self, timeout_s: float | None = None, *, write: bool = True) -> None:
        """Drain, stop the threads, remove the hooks and (``write``) write the timeline; a
        failure found while draining is raised after cleaning up."""
        progress = self._progress
        if progress.closed:
            return
        failure = None
        try:
            if progress.error is None:
                self.drain(timeout_s)
        except TrainschedError as exc:
            failure = exc
        progress.closed = True
        self._inbox.put(Stop())
        self._thread.join(5.0 if timeout_s is None else max(0.1, timeout_s))
        self._hooks.remove()
        if self._deferred is not None:
            self._deferred.close()
        if write:
            self._recorder.write(self._peers.rank, {"policy": repr(self.policy),
                                                    "world_size": self._peers.world_size})
        if failure is not None:
            raise failure

    # -- the hooks' listener -------------------------------------------------------------------

    def forward_starts(self, step: int) -> None:
        self._progress.raise_error()
        if self._progress.closed:
            raise TrainschedError("this ScheduledDataParallel was closed")
        if self._tuning is not None:
            self._tuning.forward(step)

    def first_backward_done(self, first: FirstStep) -> None:
        self._inbox.put(Plan(task_table(self._peers, self.trainable, first)))


def _stop_at_exit(ref: weakref.ref) -> None:
    """Exit hook: drain and stop a scheduler still open; write nothing."""
    scheduler = ref()
    if scheduler is not None:
        with contextlib.suppress(TrainschedError):
            scheduler.close(timeout_s=5.0, write=False)
