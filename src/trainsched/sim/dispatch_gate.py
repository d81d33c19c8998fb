"""The data-parallel executor's engine gate: its collectives go through the runtime's dispatcher.

:mod:`trainsched.sim.data_parallel` lowers each collective to one task per representative rank
on that rank's channel and, with host-driven communication, one host task per representative
on its compute stream. :class:`DispatchGate` (an engine :class:`~trainsched.sim.engine.Gate`)
holds those tasks back from the engine's queues and runs the collectives through the dispatch
core the runtime uses, :class:`~trainsched.comm.dispatch.Dispatcher`, on the simulated
transport :class:`~trainsched.comm.dispatch.FifoWire`, so the rule ready → queue → credit
(and backfill) → wire is written once, in :mod:`trainsched.comm.dispatch`:

- **Issue.** A collective's task on a representative becomes ready when its gradients (or its
  bucket copy) are there. Once it is ready on every representative (the rendezvous) the gate
  reports the collective ready to the dispatcher, keyed by the time, and the dispatcher queues
  it (and, with ordered issue, whatever waited for it).
- **Dispatch.** When the instant is over the gate pumps the dispatcher; each collective it
  hands to the wire starts when the wire says (at once, or behind the collective dispatched
  before it, less the start-up overlap). The gate releases the collective's tasks to run from
  then and its host tasks to queue on their streams from then.
- **Done.** When a collective's tasks end the gate reports it done, which frees its credit.

**Shared wire.** With ``slots`` the transport is :class:`~trainsched.comm.dispatch.SharedWire`
instead: up to ``slots`` collectives in flight at once, each released to run at once when it
starts, its end left to the engine (the collectives' tasks are coupled to the compute by the
executor, :mod:`trainsched.sim.coupling`, so their durations stretch under load). A collective
waiting for a slot starts when one of those in flight ends on every representative.

The dispatcher's plan spans all steps: collective c of step s is plan position ``s·C + c``,
queued by ``(step, priority)`` on a priority queue, so a step's collectives queue before the
next step's and ordered issue runs on across steps. Each has one "gradient": its input on every
representative. All representatives hold a collective's channel at once, so their channels act
as one wire, which the gate owns: each channel is busy while the wire is.

Critical path: a collective behind another on the wire is fixed by that one, one held back by
the credit by the collective whose end freed it (both through the resource), any other by the
task that issued it; its host tasks inherit that.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from trainsched.comm.dispatch import Dispatcher, FifoWire, SharedWire
from trainsched.comm.policy import Collective, CommPolicy
from trainsched.sim.engine import Release, TaskGraph

__all__ = ["DispatchGate"]


class DispatchGate:
    """The collectives of a lowered data-parallel run, as an engine gate (module docstring).

    ``parts[c]`` are collective c's tasks (one per representative, each needing only its
    channel), ``sizes[c]`` its bytes, ``priorities[c]`` its ``(step, priority)`` queue key,
    ``steals[c]`` its host tasks (one per representative; empty list: none) and
    ``startups[c]`` the start-up of its duration that may overlap the collective ahead of it
    (``None``: no overlap); ``slots`` (``None``: a FIFO wire) runs them on a shared wire of
    that many slots (module docstring, *Shared wire*). After the replay ``issued_s`` and
    ``dispatched_s`` say when each collective was queued and handed to the wire."""

    name = "the collective dispatcher (waiting to be issued or dispatched)"

    def __init__(self, tasks: TaskGraph, policy: CommPolicy, *, parts: Sequence[Sequence[int]],
                 sizes: Sequence[int], priorities: Sequence[tuple[int, int]],
                 steals: Sequence[Sequence[int]],
                 startups: Sequence[float] | None = None, slots: int | None = None) -> None:
        self.parts = parts
        self.steals = steals
        self.held = [t for row in parts for t in row] + [t for row in steals for t in row]
        self.watched = [t for row in parts for t in row]
        self.channel = {t: tasks.needs[t][0] for t in self.watched}
        self.resources = sorted(set(self.channel.values()))
        self.part_of = {t: c for c, row in enumerate(parts) for t in row}
        rank = {key: k for k, key in enumerate(sorted(set(priorities)))}
        plan = [Collective(name=f"{tasks.label[row[0]]} (step {priorities[c][0]})",
                           members=(f"{tasks.label[row[0]]} (step {priorities[c][0]}) input",),
                           size_bytes=sizes[c], priority=rank[priorities[c]])
                for c, row in enumerate(parts)]  # fmt: skip
        self.inputs = [c.members[0] for c in plan]
        cost = [tasks.duration_s[row[0]] for row in parts]
        assert slots is None or startups is None, "start-up overlap needs the FIFO wire"
        self.shared = SharedWire(slots) if slots is not None else None
        self.wire = FifoWire(cost.__getitem__, startups.__getitem__ if startups else None)
        transport = self.shared if self.shared is not None else self.wire
        self.dispatcher = Dispatcher(plan, queue=policy.queue, credit_bytes=policy.credit_bytes,
                                     credit_mode=policy.credit_mode,
                                     ordered_issue=policy.ordered_issue, transport=transport,
                                     backfill=bool(getattr(policy, "backfill", False)))
        count = len(parts)
        self.unready = [len(row) for row in parts]  # tasks not yet ready, per collective
        self.running = [len(row) for row in parts]  # tasks not yet ended, per collective
        self.issued_s = [0.0] * count
        self.dispatched_s = [0.0] * count
        self.issuer = [-1] * count  # the task whose end issued it
        self.ended_last = -1  # the collective that ended last
        self.busy = dict.fromkeys(self.resources, 0.0)
        self.due = False

    def on_ready(self, task: int, now: float, by: int) -> None:
        c = self.part_of.get(task)
        if c is None:  # a host task: released when its collective starts
            return
        self.unready[c] -= 1
        if self.unready[c]:
            return
        for k in self.dispatcher.ready((self.inputs[c],), at=now):
            self.issued_s[k] = now
            self.issuer[k] = by
        self.due = True

    def on_end(self, task: int, now: float) -> None:
        c = self.part_of[task]
        self.running[c] -= 1
        if not self.running[c]:
            if self.shared is not None:
                self.shared.now = now
                self.shared.finish(c)
            self.dispatcher.done(c)
            self.ended_last = c
            self.due = True

    def flush(self, now: float) -> list[Release]:
        if not self.due:
            return []
        self.due = False
        if self.shared is not None:
            return self._flush_shared(now)
        wire = self.wire
        wire.now = now
        out: list[Release] = []
        for c in self.dispatcher.pump():
            self.dispatched_s[c] = now
            begin = wire.start_s[c]
            if wire.behind[c] >= 0:  # behind the collective before it on the wire
                by: Sequence[int] | None = self.parts[wire.behind[c]]
            elif now > self.issued_s[c]:  # held back by the credit: freed by the one that ended
                by = self.parts[self.ended_last]
            else:
                by = None
            row = self.parts[c]
            for k, t in enumerate(row):
                out.append((t, begin, by[k] if by is not None else self.issuer[c],
                            by is not None))
                self.busy[self.channel[t]] += wire.busy_s[c]
            if self.steals:
                for k, s in enumerate(self.steals[c]):
                    out.append((s, begin, by[k] if by is not None else self.issuer[c],
                                by is not None))
        return out

    def _flush_shared(self, now: float) -> list[Release]:
        wire = self.shared
        assert wire is not None
        wire.now = now
        for c in self.dispatcher.pump():
            self.dispatched_s[c] = now
        out: list[Release] = []
        for c in wire.take_started():
            if wire.behind[c] >= 0:  # waited for a slot: the collective that freed it
                by: Sequence[int] | None = self.parts[wire.behind[c]]
            elif now > self.issued_s[c]:  # held back by the credit: freed by the one that ended
                by = self.parts[self.ended_last]
            else:
                by = None
            for row in (self.parts[c], self.steals[c] if self.steals else ()):
                for k, t in enumerate(row):
                    out.append((t, now, by[k] if by is not None else self.issuer[c],
                                by is not None))
        return out

    def busy_s(self) -> Mapping[int, float]:
        if self.shared is not None:
            return dict.fromkeys(self.resources, self.shared.busy_s)
        return self.busy
