"""The dispatcher thread: one loop over typed events (:mod:`.events`).

It runs :class:`trainsched.comm.dispatch.Dispatcher` (ready → queue → credit), one core per
plan: gradients arrive as :class:`~.events.Ready`, the first :class:`~.events.Plan` builds the
collectives (those ready before it are replayed), the core hands collectives to
:meth:`DispatchLoop.issue`, completions come back as :class:`~.events.Done`, and the units they
make due are stepped one per turn of the loop, lowest layer first, between events. At the
first gradient of each step the policy may switch (:mod:`.retune`) and the issue order learns
the step (:mod:`.order`).

Its collaborators are handed to it at construction; it knows nothing of the wrapper.
"""

from __future__ import annotations

import queue
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from trainsched.comm.dispatch import Dispatcher
from trainsched.comm.policy import CommPolicy
from trainsched.comm.timeline import Span
from trainsched.errors import TrainschedError
from trainsched.runtime.data_parallel.events import (
    Decision,
    Done,
    Event,
    Failed,
    Inbox,
    Plan,
    Ready,
    Retune,
    Stop,
    TaskTable,
)
from trainsched.runtime.data_parallel.layout import Layout
from trainsched.runtime.data_parallel.order import IssueOrder
from trainsched.runtime.data_parallel.retune import PolicyChannel, policy_fields
from trainsched.runtime.data_parallel.sync import Progress
from trainsched.runtime.data_parallel.trace import Recorder, clock
from trainsched.runtime.data_parallel.units import Unit, Updates
from trainsched.runtime.data_parallel.wire import Wire

__all__ = ["DispatchLoop"]


@dataclass
class _Cursor:
    """Where the dispatcher is in the current step."""

    step: int = -1
    position: int = 0  # issues so far in this step
    readies: int = 0  # gradients ready so far in this step
    missing: list[int] = field(default_factory=list)  # per collective: members not ready


class DispatchLoop:
    """The dispatcher thread's state and loop (:meth:`run`), which closes ``order`` when it
    ends."""

    def __init__(self, *, rank: int, inbox: Inbox, progress: Progress, recorder: Recorder,
                 order: IssueOrder, updates: Updates, wire: Wire, channel: PolicyChannel,
                 hold: Callable[[int], Any] | None = None) -> None:
        self._rank = rank
        self._inbox = inbox
        self._progress = progress
        self._recorder = recorder
        self._order = order
        self._updates = updates
        self._wire = wire
        self._channel = channel
        self._hold = hold  # a delayed link: before the first issue of each step
        self.core: Dispatcher | None = None
        self.layout: Layout | None = None
        self._table: TaskTable | None = None
        self._early: list[Ready] = []  # ready before the task table exists
        self._cursor = _Cursor()
        self.max_in_flight_bytes = 0.0  # the most this rank ever had in flight

    # -- what tests and the wrapper read -------------------------------------------------------

    @property
    def step(self) -> int:
        return self._cursor.step

    @property
    def position(self) -> int:
        return self._cursor.position

    @property
    def names(self) -> list[str]:
        """The current plan's collective names (empty before the first plan)."""
        return self.layout.names if self.layout is not None else []

    @property
    def static(self) -> tuple[int, ...]:
        """The compiled issue order (``order="static"``), as plan positions."""
        return self._order.sequence

    # -- the loop ------------------------------------------------------------------------------

    def run(self) -> None:
        """The thread's body: every failure reaches the training thread through
        :class:`~.sync.Progress`."""
        try:
            self._loop()
        except TrainschedError as exc:
            self._progress.fail(exc)
        except Exception as exc:  # a bug or a torch error: still reach the training thread
            self._progress.fail(TrainschedError(f"the dispatcher thread of rank {self._rank} "
                                                f"failed: {type(exc).__name__}: {exc}"))
        finally:
            self._order.close()

    def _loop(self) -> None:
        inbox = self._inbox
        while True:
            events = [] if self._updates else [inbox.get()]
            while True:
                try:
                    events.append(inbox.get_nowait())
                except queue.Empty:
                    break
            for event in events:
                if isinstance(event, Stop):
                    return
                self.handle(event)
            if self.core is not None:
                self.core.pump()
            if self._updates:
                self._update(self._updates.pop())

    def handle(self, event: Event) -> None:
        match event:
            case Ready():
                if self.core is None:
                    self._early.append(event)
                else:
                    self._ready(event)
            case Plan(table=table):
                self._table = table
                self._build(self._channel.policy)
                for early in self._early:
                    self._ready(early)
                self._early.clear()
            case Retune(step=step, policy=policy):
                self._channel.request(step, policy, self._cursor.step)
            case Decision(collective=c):
                assert self.core is not None
                self.core.decide(c)
            case Done():
                self._done(event)
            case Failed(error=error):
                raise error
            case _:
                raise AssertionError(f"unexpected event {event!r}")

    # -- plans and steps -----------------------------------------------------------------------

    def _build(self, policy: CommPolicy) -> None:
        """The collectives of ``policy`` over the task table, and everything per plan."""
        table = self._table
        assert table is not None
        core = Dispatcher.for_policy(policy, table.gradients, self, follow=self._order.follow)
        layout = Layout(policy, core.plan, table.gradients, self._updates.trainable)
        self._wire.new_plan()
        self.core, self.layout = core, layout
        self._order.compile(table, layout)
        core.follow = self._order.follow  # a plan in plan order on every rank follows no one
        self._updates.build(layout)

    def _switch(self, step: int, policy: CommPolicy) -> None:
        """Run ``policy`` from ``step`` on: at the first gradient of that step, with the last
        step's collectives all done."""
        while self._updates:  # the last step's updates first: they belong to the old plan
            self._update(self._updates.pop())
        self._updates.fold()
        self._build(policy)
        self._channel.switched(step, policy)
        if self._recorder.in_window(step):
            t = self._recorder.now()
            self._recorder.comm.append(Span(track="update", phase="SWITCH", label="switch",
                                            start_s=t, end_s=t, step=step,
                                            args=policy_fields(policy)))

    def _ready(self, event: Ready) -> None:
        cursor = self._cursor
        if cursor.readies == 0:  # the first gradient of a step
            assert self.core is not None
            if cursor.step >= 0 and not self.core.finished:
                raise TrainschedError("a new step began before the last one was reduced")
            step = cursor.step + 1
            policy = self._channel.incoming(step)
            if policy is not None:
                self._switch(step, policy)
            self._channel.announce(step)
            assert self.core is not None and self.layout is not None
            self.core.new_step()
            cursor.step = step
            cursor.position = 0
            cursor.missing = [len(row) for row in self.layout.parts]
            for c in self._order.begin_step(step, len(self.core.plan)):
                self.core.decide(c)
        core, layout = self.core, self.layout
        assert core is not None and layout is not None
        cursor.readies = (cursor.readies + 1) % len(layout.param_names)
        core.ready([layout.param_names[event.param]])
        for c in layout.holders[event.param]:
            cursor.missing[c] -= 1
            if not cursor.missing[c]:
                self._wire.queued(c, event.t)

    # -- collectives and updates ---------------------------------------------------------------

    def issue(self, c: int) -> None:
        """The dispatch core's transport: issue collective ``c`` of the current plan."""
        cursor, core, layout = self._cursor, self.core, self.layout
        assert core is not None and layout is not None
        if self._hold is not None and cursor.position == 0:
            self._hold(cursor.step)
        self._order.issued(cursor.step, cursor.position, c, layout.names[c])
        cursor.position += 1
        self.max_in_flight_bytes = max(self.max_in_flight_bytes, core.max_in_flight_bytes)
        self._wire.start(c, layout)

    def _done(self, event: Done) -> None:
        core, layout = self.core, self.layout
        assert core is not None and layout is not None
        self._wire.finish(event, layout, self._cursor.step)
        whole = [layout.index[name] for name in core.done(event.collective)]
        units = self._updates.due(event.collective, whole, layout.layer)
        self._updates.queue(units, cross_barrier=layout.policy.cross_barrier,
                            step_reduced=core.finished)

    def _update(self, unit: Unit) -> None:
        """Step the optimizer of ``unit``; a parameter's last unit releases its gate."""
        assert self.layout is not None
        params = self._updates.params_of(unit)
        start = clock()
        self._updates.step(unit, self._progress.grads)
        end = clock()
        step = self._cursor.step
        recorder = self._recorder
        if recorder.in_window(step):
            for k in params:  # one span per parameter: the timeline's layers stay per layer
                label = self._updates.trainable.labels[k]
                args = {"layer": label, "param": self.layout.param_names[k]}
                if unit.collective >= 0:
                    args["task"] = self.layout.names[unit.collective]
                recorder.comm.append(Span(track="update", phase="UPDATE", label=label,
                                          start_s=start - recorder.t0,
                                          end_s=end - recorder.t0, step=step, args=args))
        self._progress.updated([k for k in params if self._updates.finish(k)])
