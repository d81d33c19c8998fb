"""The online straggler policy inside a sync run: relax BSP to ASP while a worker is slow, or
exclude the slow worker from BSP (:mod:`.exclude`).

A sync policy with a straggler part (``bsp;straggler(relax)``, spec §2.4) makes every BSP
segment of :func:`~trainsched.runtime.sync.run_sync` watch its workers. Every ``M`` steps the
workers all-gather one row each: their mean *local* time over those steps (compute until the
gradient is ready, injected delays included: under BSP the wall step time is the same on every
rank), and worker 0's wall time since the last observation and its current estimate of a
switch's cost. Every worker feeds the same rows to its own
:class:`~trainsched.sync.StragglerController`, so all of them take the same decisions without
another message. The BSP synchronisation time the controller needs is read off the same rows:
worker 0's wall time per step minus the slowest mean local time.

On an ``out`` event with the action ``relax`` the workers switch in process (spec §2.5): worker
0 tells the server (a control message: the server waits for one during the BSP segments of
such a run), the synchronisation point leaving BSP sends the state to the server, and the
controller goes with it. The server runs ASP and keeps observing: once per ``N`` gradients
applied, each worker's latest local time (carried in its push header). When the controller
says ``back``, the episode ends at the next multiple of ``N`` updates (so the samples stay a
whole number of BSP steps), the state and the controller come back, and BSP resumes its
quota where it stood.

Samples are the clock and the run's total is kept: relaxed samples never count toward a BSP
phase's quota (BSP trains its whole quota after the episode), so the run's later phases
shrink by them, from the end of the run; an episode that lasts until the run's samples are
spent ends the run relaxed (its ``end`` says so). The first estimate of a switch's cost is the
time the run's start took for the same work (the replica digest check and the state
broadcast to the server); after that, the mean of the switches measured.

Worker 0 records every detector event, every switch (with the reason ``straggler``) and every
episode in the ledger. With the action ``exclude`` no server takes part: the workers run the
episode among themselves (:func:`~trainsched.runtime.sync.exclude.exclude_episode`).
"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from trainsched.runtime.sync.config import Segment, update_samples
from trainsched.runtime.sync.exclude import exclude_episode, fast_groups
from trainsched.runtime.sync.wire import TAG_CONTROL, guard
from trainsched.sync.protocols import Asp, Bsp
from trainsched.sync.straggler import StragglerPolicy
from trainsched.sync.switching import StragglerController

__all__ = ["END", "EPISODE", "Online"]

#: Control messages from worker 0 to the server during a watched BSP segment.
END, EPISODE = 1, 2


class Online:
    """One rank's side of the online policy (``me``: the rank's
    :class:`~trainsched.runtime.sync.trainer` state) with detector settings ``policy``,
    observing every ``every`` BSP steps."""

    def __init__(self, me: Any, policy: StragglerPolicy, every: int) -> None:
        self.me = me
        self.policy = policy
        self.every = every
        self.controller = StragglerController(me.n, policy, switch_s=0.0)
        self.relaxed = 0  # samples applied in episodes so far (every rank agrees)
        self.costs: list[float] = []  # worker 0: switch costs measured
        self.estimate_s = 0.0  # worker 0: the first estimate (from the start)
        self.mark = time.perf_counter()
        self.local_mark = 0.0  # the worker's local-time sum at the last observation
        self.control = torch.zeros(3, dtype=torch.int64)
        # exclude: the fast workers' groups (made by every rank, servers included)
        self.groups = fast_groups(me.n) if policy.action == "exclude" else {}

    # --- shared bookkeeping ------------------------------------------------------------------

    def trained(self, segment: Segment) -> int:
        """The samples ``segment`` trains: its plan's, less what episodes took from the end of
        the run, rounded down to whole updates of its protocol."""
        me = self.me
        room = max(0, min(segment.samples, me.total - self.relaxed - segment.start))
        unit = update_samples(segment.protocol, me.n, me.b)
        return room - room % unit

    def shifted(self, segment: Segment) -> Segment:
        """``segment`` as it runs: its trained samples, starting at the samples really applied
        before it (so the learning rate schedule and the evaluations key on those)."""
        return replace(segment, start=segment.start + self.relaxed, samples=self.trained(segment))

    def switch_s(self) -> float:
        return sum(self.costs) / len(self.costs) if self.costs else self.estimate_s

    # --- the workers ---------------------------------------------------------------------------

    def worker_bsp(self, segment: Segment) -> int:
        """Run a BSP segment under watch; returns its BSP steps."""
        me, worker = self.me, self.me.worker
        unit = me.n * me.b
        done = since = 0
        self.local_mark = worker.local_sum_s
        self.mark = time.perf_counter()
        while True:
            steps = self.trained(segment) // unit
            if done >= steps:
                break
            count = min(self.every - since, steps - done)
            worker.run_bsp(replace(segment, start=segment.start + self.relaxed), done, count)
            done += count
            since += count
            left = me.total - self.relaxed - (segment.start + done * unit)
            if since < self.every or left <= 0:
                continue
            events = self.observe(since, segment.start + self.relaxed + done * unit)
            since = 0
            self.local_mark = worker.local_sum_s
            out = [e for e in events if e.kind == "out"]
            if out:
                at = segment.start + self.relaxed + done * unit
                if self.policy.action == "exclude":
                    self.relaxed += exclude_episode(self, out[0].ranks, at, left)
                else:
                    self._episode(out[0].ranks, at, left)
                self.mark = time.perf_counter()
                self.local_mark = worker.local_sum_s
        if me.has_server:
            self._tell(END, 0, 0)
        return done

    def observe(self, steps: int, samples: int, local_s: float | None = None) -> tuple[Any, ...]:
        """One observation after ``steps`` steps, at ``samples`` applied: every worker's row
        all-gathered and fed to its controller (``local_s``: this worker's local time, by
        default its mean over the steps since the last observation)."""
        me = self.me
        now = time.perf_counter()
        if local_s is None:
            local_s = (me.worker.local_sum_s - self.local_mark) / steps
        mine = torch.tensor([local_s, now - self.mark, self.switch_s()], dtype=torch.float64)
        rows = [torch.zeros(3, dtype=torch.float64) for _ in range(me.n)]
        with guard(f"worker {me.rank} gathering local step times"):
            dist.all_gather(rows, mine, group=me.workers_group)
        self.mark = now
        local = [float(r[0]) for r in rows]
        elapsed, switch_s = float(rows[0][1]), float(rows[0][2])
        c = self.controller
        c.set_switch_s(switch_s)
        c.sync_s = max(0.0, elapsed / steps - max(local))
        seen, declined = len(c.detector_events), c.declined
        events = c.observe(local, elapsed)
        if me.rank == 0:
            ledger = me.ledger
            ledger.observations += 1
            ledger.declined += c.declined - declined
            for e in c.detector_events[seen:]:
                ledger.detector_event(kind=e.kind, rank=e.rank, observation=e.observation,
                                      ratio=e.ratio, samples=samples,
                                      step=me.worker.position, at_s=now - me.t0)
        return events

    def _tell(self, kind: int, updates: int, samples: int) -> None:
        me = self.me
        if me.rank != 0:
            return
        self.control.copy_(torch.tensor([kind, updates, samples]))
        with guard("worker 0 telling the parameter server what comes next"):
            dist.isend(self.control, me.server_rank, group=me.p2p_group, tag=TAG_CONTROL).wait()

    def _episode(self, ranks: tuple[int, ...], samples: int, left: int) -> None:
        """Leave BSP for ASP at ``samples`` applied (at most ``left`` more samples)."""
        me = self.me
        began = time.perf_counter()
        self._tell(EPISODE, left // me.b, samples)
        me.synchronise(Bsp(), Asp())
        with guard(f"worker {me.rank} handing the straggler controller to the server"):
            dist.broadcast_object_list([self.controller], src=0)
        ready = time.perf_counter()
        step = me.worker.position
        me.replica.lr_at = me.lr_function(me.lr_of(Asp()))
        me.worker.run_server()
        trained = time.perf_counter()
        me.synchronise(Asp(), Bsp())
        box: list[Any] = [None]
        with guard(f"worker {me.rank} taking the straggler controller back from the server"):
            dist.broadcast_object_list(box, src=me.server_rank)
        back = time.perf_counter()
        self.controller, stats, log = box[0]
        me.replica.lr_at = me.lr_function(me.lr_of(Bsp()))
        if me.rank == 0:
            self._record(ranks, samples, stats, log, step=step,
                         times=(began - me.t0, ready - began, trained - ready, back - trained))
        self.relaxed += stats["samples"]

    def _record(self, ranks: tuple[int, ...], samples: int, stats: dict[str, Any],
                log: list[dict[str, Any]], *, step: int,
                times: tuple[float, float, float, float]) -> None:
        me, ledger = self.me, self.me.ledger
        at_s, out_s, wall_s, back_s = times
        self.costs += [out_s, back_s]
        ledger.straggler_switch("bsp", "asp", ranks=ranks, samples=samples, step=step,
                                at_s=at_s, cost_s=out_s)
        ended = "run end"
        for item in log:
            if item["kind"] == "back":
                ended = "recovered"
                continue
            fields = {k: v for k, v in item.items() if k != "batches"}
            ledger.detector_event(**{**fields, "step": step + item["batches"],
                                     "at_s": at_s + out_s + item["at_s"]})
        ledger.observations += stats["observations"]
        ledger.episode({
            "protocol": "asp", "start_samples": samples, "samples": stats["samples"],
            "updates": stats["updates"], "gradients": stats["gradients"],
            "drained": stats["drained"], "staleness": stats["staleness"],
            "start_s": at_s, "wall_s": wall_s, "ranks": list(ranks), "end": ended})
        ledger.straggler_switch("asp", "bsp", ranks=ranks, samples=samples + stats["samples"],
                                step=me.worker.position, at_s=at_s + out_s + wall_s,
                                cost_s=back_s)

    # --- the server ------------------------------------------------------------------------------

    def server_bsp(self, index: int) -> None:
        """While the workers run a watched BSP segment: serve the episodes they start."""
        me = self.me
        wait = timedelta(seconds=float(me.cfg["deadline_s"]))
        while True:
            with guard("the parameter server waiting for worker 0 during BSP"):
                dist.irecv(self.control, 0, group=me.p2p_group, tag=TAG_CONTROL).wait(wait)
            kind, updates, samples = (int(v) for v in self.control.tolist())
            if kind == END:
                return
            assert kind == EPISODE, kind
            me.synchronise(Bsp(), Asp())
            box: list[Any] = [None]
            with guard("the parameter server taking the straggler controller"):
                dist.broadcast_object_list(box, src=0)
            self.controller = box[0]
            me.replica.lr_at = me.lr_function(me.lr_of(Asp()))
            log: list[dict[str, Any]] = []
            watch = _Watch(self.controller, me.n, me.b, samples, log)
            stats = me.server.serve(index, Asp(), updates, samples_per_update=me.b,
                                    samples_before=samples, watch=watch)
            me.server.stats.pop()  # an episode's counters are not its BSP phase's
            stats = {**stats, "observations": watch.observations}
            me.synchronise(Asp(), Bsp())
            with guard("the parameter server handing the straggler controller back"):
                dist.broadcast_object_list([(self.controller, stats, log)], src=me.server_rank)
            self.relaxed += stats["samples"]


class _Watch:
    """The server's observer during an episode: once per ``ranks`` gradients applied (every
    worker seen at least once), the latest local time of each; on ``back``, the number of
    updates to end at (the next multiple of ``ranks``)."""

    def __init__(self, controller: StragglerController, ranks: int, batch: int, samples: int,
                 log: list[dict[str, Any]]) -> None:
        self.c, self.ranks, self.batch, self.samples, self.log = (controller, ranks, batch,
                                                                  samples, log)
        self.latest = [0.0] * ranks
        self.seen = [False] * ranks
        self.batches = 0  # worker 0's gradients pushed in the episode
        self.count = self.observations = 0
        self.start = self.mark = time.perf_counter()
        self.ended = False

    def __call__(self, rank: int, local_s: float, updates: int) -> int | None:
        if self.ended:
            return None
        self.latest[rank], self.seen[rank] = max(local_s, 1e-6), True
        self.batches += rank == 0
        self.count += 1
        if self.count % self.ranks or not all(self.seen):
            return None
        now = time.perf_counter()
        seen = len(self.c.detector_events)
        events = self.c.observe(self.latest, now - self.mark)
        self.mark = now
        self.observations += 1
        samples = self.samples + updates * self.batch
        for e in self.c.detector_events[seen:]:
            self.log.append({"kind": e.kind, "rank": e.rank, "observation": e.observation,
                             "ratio": e.ratio, "samples": samples, "at_s": now - self.start,
                             "batches": self.batches})
        if any(e.kind == "back" for e in events):
            self.ended = True
            self.log.append({"kind": "back"})
            return math.ceil(updates / self.ranks) * self.ranks
        return None
