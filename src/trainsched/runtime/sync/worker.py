"""A worker rank: its data, its batches, and the three ways it trains.

* **BSP**, on the scheduled data-parallel runtime when the run has a comm policy
  (``comm``): each BSP run of steps wraps the model in a
  :class:`~trainsched.runtime.data_parallel.ScheduledDataParallel` over the workers' group
  with that policy (``ddp``: its pass-through to stock DDP), whose per-parameter optimizers
  share the replica's optimizer state (:meth:`Replica.optimizer_over`), so the gradients are
  reduced while backward runs, in the policy's order, and each parameter is updated as soon as
  its gradient is reduced. The wrapper is drained after every step, so a rank's local time
  stays its own compute (the straggler detector compares them) and the wait is the step's
  exposed communication (updates do not cross into the next forward here). It stays open
  across the runs of BSP steps of a segment (:meth:`Worker.open_scheduled`; the trainer opens
  it during a switch into BSP, so the switch's cost includes building it) and is closed
  (:meth:`Worker.release`) at the segment's end and before any other way of training: its
  hooks must never see another protocol's backward.
  Without a comm policy every rank's gradient is summed by one flat all-reduce after backward
  and divided by N, then every rank takes the same optimizer step. Either way replicas stay
  bit-identical (every rank receives the same sums).
* **Local SGD** with period H: every rank steps on its own gradient; every H rounds of the
  phase the parameters are averaged over the workers' group (the optimizer state is averaged
  when the phase ends, at the synchronisation point).
* **Server protocols** (ASP, SSP, k-of-N): pull the parameters, compute a gradient, push it,
  and repeat with the parameters the server answers, until it says stop.

Every message a worker sends while training (its part of a BSP all-reduce round, a local-SGD
average, a push to the servers, which also asks for the next weights, and the first pull of a
server phase) goes through :meth:`Worker.sending`: an injected delayed link
(``Straggler(link=True)``, ``1:20ms@link``) holds it first, and the worker counts it, the time
held and the time it took (:attr:`Worker.sent`). The synchronisation points' collectives and
the final goodbye are not training messages and are neither held nor counted. On the scheduled
runtime a BSP step's gradient is one message however many collectives carry it: the delayed
link holds the step's first collective (the wrapper's ``link_hold``), and its time is the
step's exposed communication (the wait for the step's last updates after backward).

Worker ``r``'s ``j``-th batch (``j``: its position, every batch it computed so far across
phases, which is also the step a :class:`~trainsched.sync.faults.Straggler` counts) is
block ``j·N + r`` of the task's sample stream, so under BSP step ``t`` reads stream samples
``t·N·b .. (t+1)·N·b`` and equals one full-batch step on them.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist

from trainsched.runtime.sync.config import Segment, update_samples
from trainsched.runtime.sync.state import Replica
from trainsched.runtime.sync.wire import APPLIED, GO, PULL, PUSH, STATUS, VERSION, Link, guard
from trainsched.runtime.tasks import Task, TaskData
from trainsched.sync.faults import Straggler, link_delay_s

__all__ = ["SENT", "Worker"]

#: The counters of :attr:`Worker.sent`: messages sent, how many a delayed link held, the time
#: held (measured) and the time the sends took, hold included (measured).
SENT = ("messages", "delayed", "delay_s", "comm_s")


class Worker:
    """One worker: ``rank`` of ``workers``, batches of ``batch`` samples from ``task``."""

    def __init__(self, *, rank: int, workers: int, batch: int, replica: Replica,
                 task: Task, data: TaskData, group: Any, link: Link | None,
                 stragglers: Sequence[Straggler], die_at_batch: int | None,
                 on_progress: Callable[[int], None], comm: dict[str, Any] | None = None,
                 comm_order: str = "leader", timeout_s: float = 60.0) -> None:
        self.rank, self.workers, self.batch = rank, workers, batch
        self.replica, self.task, self.data = replica, task, data
        self.group, self.link = group, link
        self.stragglers = [s for s in stragglers if s.rank == rank and not s.link]
        self.links = [s for s in stragglers if s.rank == rank and s.link]
        self.sent: dict[str, float] = dict.fromkeys(SENT, 0)
        self.die_at_batch = die_at_batch
        self.on_progress = on_progress  # called with the samples applied so far
        self.position = 0
        self.buffer = torch.zeros(replica.numel)
        self.local_s = 0.0  # the last batch's local time (compute + injected delay)
        self.local_sum_s = 0.0  # local times added up since the caller last reset it
        self.comm, self.comm_order, self.timeout_s = comm, comm_order, timeout_s
        self.net: Any = None  # the scheduled runtime's wrapper while open (open_scheduled)
        self.in_flight_bytes = 0.0  # the most gradient bytes in flight at once in BSP steps

    # --- one batch ---------------------------------------------------------------------------

    def compute(self, net: Any = None) -> None:
        """Forward and backward on this rank's next batch; the gradient lands in
        ``replica.grad`` (through ``net``, the scheduled runtime's wrapper, when given: it takes
        the gradients and updates the model itself). A straggler sleeps after computing; the
        batch's local time (compute and sleep: until the gradient is ready) goes to
        :attr:`local_s`."""
        if self.die_at_batch is not None and self.position == self.die_at_batch:
            sys.stdout.flush()
            os._exit(3)
        start = time.perf_counter()
        block = self.position * self.workers + self.rank
        index = self.task.stream_indices(block * self.batch, self.batch)
        model = self.replica.model if net is None else net
        model.train()
        if net is None:
            for p in self.replica.params:
                p.grad = None
        loss = self.task.loss(self.task.forward(model, self.data.x_train[index]),
                              self.data.y_train[index])
        loss.backward()
        if net is None:
            self.replica.grads_into(self.replica.grad)
        elapsed = time.perf_counter() - start
        for s in self.stragglers:
            if s.active(self.position):
                time.sleep(s.delay_s if s.delay_s is not None else (s.factor - 1) * elapsed)
        self.local_s = time.perf_counter() - start
        self.local_sum_s += self.local_s
        self.position += 1

    @contextlib.contextmanager
    def sending(self, step: int) -> Iterator[None]:
        """One message this worker sends in its step ``step`` (the body sends it): held first
        by a delayed link active in that step, then counted and timed into :attr:`sent`."""
        start = time.perf_counter()
        hold = link_delay_s(self.links, self.rank, step)
        if hold > 0:
            time.sleep(hold)
            self.sent["delayed"] += 1
            self.sent["delay_s"] += time.perf_counter() - start
        yield
        self.sent["messages"] += 1
        self.sent["comm_s"] += time.perf_counter() - start

    # --- the protocols -------------------------------------------------------------------------

    def run_bsp(self, segment: Segment, first: int = 0, count: int | None = None) -> int:
        """Steps ``first .. first + count`` of the segment (default: all of them)."""
        unit = update_samples(segment.protocol, self.workers, self.batch)
        last = segment.samples // unit if count is None else first + count
        if self.scheduled:
            return self._run_bsp_scheduled(segment, unit, first, last)
        grad = self.replica.grad
        for t in range(first, last):
            self.compute()
            with self.sending(self.position - 1), \
                    guard(f"worker {self.rank}'s gradient all-reduce"):
                dist.all_reduce(grad, group=self.group)
            self.in_flight_bytes = max(self.in_flight_bytes, grad.numel() * grad.element_size())
            grad.div_(self.workers)
            self.replica.step(grad, samples=segment.start + t * unit)
            self.on_progress(segment.start + (t + 1) * unit)
        return last - first

    def _run_bsp_scheduled(self, segment: Segment, unit: int, first: int, last: int) -> int:
        """:meth:`run_bsp` on the scheduled data-parallel runtime (module docstring)."""
        net = self.open_scheduled()
        lr = None
        for t in range(first, last):
            samples = segment.start + t * unit
            if self.replica.lr_at(samples) != lr:
                lr = self.replica.lr_at(samples)
                net.set_lr(lr)
            self.compute(net)
            start = time.perf_counter()
            net.drain()  # what backward did not hide: the step's exposed communication
            self.sent["messages"] += 1
            self.sent["comm_s"] += time.perf_counter() - start
            self.on_progress(segment.start + (t + 1) * unit)
        return last - first

    @property
    def scheduled(self) -> bool:
        """BSP runs on the scheduled runtime: a comm policy was given and there are peers."""
        return self.comm is not None and self.workers > 1

    def open_scheduled(self) -> Any:
        """The scheduled runtime's wrapper around the model over the workers' group (built
        now if none is open: collective over the workers). It stays open across runs of BSP
        steps until :meth:`release`, which every other way of training calls first."""
        if self.net is None:
            from trainsched.comm.policy import DdpBucketPolicy, policy_from_json
            from trainsched.runtime.data_parallel import ScheduledDataParallel

            assert self.comm is not None
            for p in self.replica.params:  # a server phase's last gradient: not this step's
                p.grad = None
            policy = policy_from_json(self.comm)
            stock = isinstance(policy, DdpBucketPolicy)
            base = self.position  # the wrapper counts its steps from 0
            self.net = ScheduledDataParallel(
                self.replica.model, policy, process_group=self.group,
                optimizer=self.replica.optimizer_over, enabled=not stock, update="parameter",
                order="leader" if stock else self.comm_order, timeout_s=self.timeout_s,
                link_hold=(lambda step: self._hold(base + step)) if self.links else None)
        return self.net

    def release(self) -> None:
        """Close the scheduled runtime's wrapper if one is open (drained; its hooks removed, so
        the next backward of another protocol is the model's own)."""
        if self.net is not None:
            net, self.net = self.net, None
            net.close()
            self.in_flight_bytes = max(self.in_flight_bytes, net.max_in_flight_bytes)

    def _hold(self, step: int) -> None:
        """A delayed link's hold of step ``step``'s gradient (called by the wrapper)."""
        hold = link_delay_s(self.links, self.rank, step)
        if hold > 0:
            start = time.perf_counter()
            time.sleep(hold)
            self.sent["delayed"] += 1
            self.sent["delay_s"] += time.perf_counter() - start

    def run_local(self, segment: Segment, period: int, rounds_before: int) -> int:
        """Local steps; parameters averaged every ``period`` rounds of the phase
        (``rounds_before``: rounds of this phase done in earlier segments)."""
        self.release()
        unit = update_samples(segment.protocol, self.workers, self.batch)
        for t in range(segment.samples // unit):
            self.compute()
            self.replica.step(self.replica.grad, samples=segment.start + t * unit)
            if (rounds_before + t + 1) % period == 0:
                self.average_params()
            self.on_progress(segment.start + (t + 1) * unit)
        return segment.samples // unit

    def average_params(self) -> None:
        self.replica.params_into(self.buffer)
        with self.sending(self.position - 1), \
                guard(f"worker {self.rank}'s parameter averaging"):
            dist.all_reduce(self.buffer, group=self.group)
        self.buffer.div_(self.workers)
        self.replica.load_params(self.buffer)

    def run_server(self) -> int:
        """Pull, compute, push until every shard's server says stop; returns the batches
        computed. Each shard keeps its own version; a shard that stopped keeps its last
        parameters while the others go on (sharded ASP: the shards' quotas fill
        independently)."""
        assert self.link is not None
        self.release()
        link, grad = self.link, self.replica.grad
        shards = len(link.servers)
        with self.sending(self.position):
            headers = link.exchange(PULL, [0] * shards, 0, 0, grad)
        clock = 0
        while any(h[STATUS] == GO for h in headers):
            active = [h[STATUS] == GO for h in headers]
            self.replica.load_params(link.params)
            self.on_progress(min(h[APPLIED] for h in headers))
            self.compute()
            clock += 1
            with self.sending(self.position - 1):
                headers = link.exchange(PUSH, [h[VERSION] for h in headers], clock,
                                        self.batch, grad, self.local_s, active)
        return clock
