"""The parameter server: one loop for ASP, SSP, k-of-N and BSP, parametrised by ``(k, s)``.

The server is its own rank (the last one), outside the workers' all-reduce group. It owns the
shared model's optimizer and a flat accumulator; it never relies on a ``p.grad`` left from a
previous step. Per phase, every worker first pulls, then pushes a gradient and waits for fresh
parameters, over and over:

* a pushed gradient is added to the accumulator; once ``k`` are in, their mean is one
  optimizer step and the version goes up by one. k-of-N drops a gradient computed on an older
  version than the current one (a backup worker's late work). Every applied gradient's
  staleness (version now - version read) is counted per worker;
* the pull that follows a push is answered once the worker may go on: for ASP and SSP when the
  slowest worker's clock is at least ``c - s`` (``c``: the asking worker's clock, its pushes so
  far; ``s = inf`` for ASP; a worker that has not pulled yet is at clock -1, so with ``s = 0``
  the first pulls wait for each other and every clock's gradients share one version); for
  k-of-N (BSP is k = N) once the version the worker computed on has been used or dropped;
* once the phase's updates are done, every worker's next message is answered ``STOP`` (a
  gradient still in flight is drained: received, not applied), and the phase ends when all
  workers have stopped.

With ``S`` servers the flat parameter vector is cut into ``S`` contiguous shards, one per
server rank (:func:`~trainsched.runtime.sync.config.shard_bounds`); each runs this same loop on
its slice: its own accumulator, version, clocks and quota of updates, and its replica steps
only the parameters its shard overlaps (:meth:`~trainsched.runtime.sync.state.Replica.restrict`).
A worker's pushes reach every shard in the same order of its clock, so with ``k = N`` (BSP) or
in the deterministic mode every shard takes the same decisions as one unsharded server.

The *deterministic* mode consumes the messages in a scripted cyclic order of worker ranks
(round robin by default) instead of as they arrive, so a run is bit for bit repeatable, also
from a checkpoint. An order the staleness bound cannot follow (its next worker is held back
waiting) is an error, not a hang.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from trainsched.errors import TrainschedError
from trainsched.runtime.sync.state import Replica
from trainsched.runtime.sync.wire import (
    CLOCK,
    GO,
    KIND,
    LOCAL_US,
    PUSH,
    READ_VERSION,
    STOP,
    Inbox,
    Outbox,
)
from trainsched.sync.protocols import KOfN, SyncProtocol

__all__ = ["Server", "ServerRule", "rule_for"]


@dataclass(frozen=True, kw_only=True)
class ServerRule:
    """``k`` gradients per update; ``staleness`` the SSP bound (``inf``: none); ``drop_late``:
    k-of-N's rule (late gradients dropped, a pull waits for the next version)."""

    k: int
    staleness: float
    drop_late: bool


def rule_for(protocol: SyncProtocol, workers: int) -> ServerRule:
    rule = protocol.server_rule(workers)
    assert rule is not None, protocol
    k, s = rule
    return ServerRule(k=k, staleness=s, drop_late=isinstance(protocol, KOfN))


class Server:
    """The server rank's state across phases: the replica, the inbox and outbox, the version,
    and the deterministic push order (``None``: arrival order)."""

    def __init__(self, replica: Replica, workers: int, group: Any, *, timeout_s: float,
                 wait_s: float, order: Sequence[int] | None,
                 die_at_update: int | None = None,
                 shard: tuple[int, int] | None = None) -> None:
        self.replica = replica
        self.workers = workers
        self.lo, self.hi = shard if shard is not None else (0, replica.numel)
        size = self.hi - self.lo
        replica.restrict(self.lo, self.hi)
        self.inbox = Inbox(workers, size, group, wait_s=wait_s)
        self.outbox = Outbox(workers, size, group)
        self.flat = torch.zeros(replica.numel)  # the parameters, for this shard's slice
        self.step_grad = torch.zeros(replica.numel)  # zero outside this shard
        self.timeout_s = timeout_s
        self.order = tuple(order) if order is not None else None
        self.version = 0
        self.applied = 0  # updates applied by this process (for the fault injection)
        self.die_at_update = die_at_update
        self.acc = torch.zeros(size)
        self.mean = torch.zeros(size)
        self.stats: list[tuple[int, dict[str, Any]]] = []  # (segment, counters) not yet taken

    def serve(self, segment: int, protocol: SyncProtocol, updates: int, *,
              samples_per_update: int, samples_before: int,
              watch: Callable[[int, float, int], int | None] | None = None) -> dict[str, Any]:
        """Run segment ``segment`` of ``updates`` updates; returns its counters (also kept
        for :meth:`take_stats`). ``watch(rank, local_s, updates_done)``, called after each
        push consumed, may answer a smaller number of updates to end the phase sooner (the
        online straggler policy ends a relaxed episode so)."""
        rule = rule_for(protocol, self.workers)
        n = self.workers
        clocks = [-1] * n  # -1: not pulled yet; then the pushes so far
        read: list[int | None] = [None] * n  # the version each worker read last
        waiting: list[int] = []  # workers whose pull is not answered yet, in arrival order
        stopped = [False] * n
        held: list[int] = []  # deterministic mode: arrived, not yet consumed
        staleness: list[dict[int, int]] = [{} for _ in range(n)]
        count = done_updates = gradients = dropped = drained = 0
        max_lead: int | None = None if rule.drop_late else 0
        position = 0
        self.acc.zero_()

        def reply(w: int, status: int) -> None:
            applied = samples_before + done_updates * samples_per_update
            self.outbox.send(w, status, self.version, applied, self._shard_params)

        while not all(stopped):
            finished = done_updates == updates
            expected = None
            if self.order is not None and not finished:
                expected = self.order[position % len(self.order)]
                position += 1
            r = self._take(expected, held, waiting)
            header = self.inbox.header(r)
            if header[KIND] == PUSH:
                gradients += 1
            if finished:
                drained += header[KIND] == PUSH
                self.inbox.release(r)
                reply(r, STOP)
                stopped[r] = True
                continue
            if header[KIND] != PUSH:
                assert clocks[r] == -1, (header, clocks)
                clocks[r] = 0
            else:
                assert header[CLOCK] == clocks[r] + 1, (header, clocks)
                clocks[r] = header[CLOCK]
                version_read = header[READ_VERSION]
                if rule.drop_late and version_read != self.version:
                    dropped += 1
                else:
                    self.acc.add_(self.inbox.payloads[r])
                    age = self.version - version_read
                    staleness[r][age] = staleness[r].get(age, 0) + 1
                    count += 1
                    if count == rule.k:
                        self._apply(rule.k, samples_before + done_updates * samples_per_update)
                        count = 0
                        done_updates += 1
                if watch is not None:
                    target = watch(r, header[LOCAL_US] / 1e6, done_updates)
                    if target is not None:
                        updates = max(done_updates, min(updates, target))
            self.inbox.release(r)
            waiting.append(r)
            if done_updates == updates:
                for w in waiting:
                    reply(w, STOP)
                    stopped[w] = True
                waiting.clear()
                continue
            for w in list(waiting):
                slowest = min(clocks)
                if rule.drop_late:
                    version_read = read[w]
                    go = version_read is None or self.version > version_read
                else:
                    go = slowest >= clocks[w] - rule.staleness
                if go:
                    if max_lead is not None:
                        max_lead = max(max_lead, clocks[w] - slowest)
                    reply(w, GO)
                    read[w] = self.version
                    waiting.remove(w)
        hist = [[d.get(s, 0) for s in range(max(d, default=-1) + 1)] for d in staleness]
        stats = {"updates": done_updates, "gradients": gradients, "dropped": dropped,
                 "drained": drained, "staleness": hist, "max_clock_lead": max_lead,
                 "samples": done_updates * samples_per_update}
        self.stats.append((segment, stats))
        return stats

    def take_stats(self) -> list[tuple[int, dict[str, Any]]]:
        """The counters of the segments served since the last call."""
        taken, self.stats = self.stats, []
        return taken

    def _take(self, expected: int | None, held: list[int], waiting: list[int]) -> int:
        """The next message to consume: the scripted worker's (waiting for it, keeping any
        other arrival for later), or else whichever came first."""
        if expected is None:
            return held.pop(0) if held else self.inbox.next(self.timeout_s)
        while expected not in held:
            if expected in waiting:
                raise TrainschedError(
                    f"the scripted push order {list(self.order or ())} needs worker "
                    f"{expected} next, but it waits for the slowest worker (staleness "
                    f"bound); use an order every worker appears in evenly, e.g. round robin")
            held.append(self.inbox.next(self.timeout_s))
        held.remove(expected)
        return expected

    def _shard_params(self, out: torch.Tensor) -> None:
        out.copy_(self.replica.params_into(self.flat)[self.lo:self.hi])

    def _apply(self, k: int, samples: int) -> None:
        if self.die_at_update is not None and self.applied == self.die_at_update:
            sys.stdout.flush()
            os._exit(3)
        torch.div(self.acc, k, out=self.mean)
        self.step_grad[self.lo:self.hi].copy_(self.mean)
        self.replica.step(self.step_grad, samples=samples)
        self.acc.zero_()
        self.version += 1
        self.applied += 1
