"""The parameter server's messages on gloo point-to-point, and failures as user errors.

Every message is an int64 header of :data:`HEADER` fields and one flat float payload, each on
its fixed tag, header first. A worker sends ``(rank, read_version, clock, samples, kind,
local_us)`` with its gradient (``kind`` :data:`PUSH`; :data:`PULL` for the first pull of a
phase, payload ignored; ``local_us``: the microseconds its last batch took, for the straggler
detector); the server answers ``(status, version, samples applied, 0, 0, 0)`` with the
parameters (``status`` :data:`GO`, or :data:`STOP` at the end of the phase). Worker 0 also
tells the server, on :data:`TAG_CONTROL`, what the workers do next while they train under BSP
with an online straggler policy (:mod:`trainsched.runtime.sync.online`).

gloo's receive handles cannot be polled (they report completion only once waited on), so the
server's :class:`Inbox` keeps one receiver thread per worker, each with one posted receive into
that worker's buffers (sized once). A thread hands a full message to the server loop through a
queue, which the loop polls with a deadline, and posts its next receive only after the loop has
released the buffers. A worker that dies closes its connection: its thread reports it at once.
A posted receive waits up to ``wait_s`` (the run's deadline), not the process group's timeout:
a worker may train under BSP for longer than that before it next talks to the server. At the
end of the run every worker sends :data:`BYE`, which ends its receiver thread, so no receive is
left posted when the process group is destroyed (under ``torchrun`` the process lives on).
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Iterator, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from trainsched.errors import TrainschedError

__all__ = ["BYE", "GO", "HEADER", "PULL", "PUSH", "STOP", "TAG_CONTROL", "Inbox", "Link", "Outbox",
           "guard", "short"]

HEADER = 6
# header fields, worker -> server
RANK, READ_VERSION, CLOCK, SAMPLES, KIND, LOCAL_US = range(HEADER)
# header fields, server -> worker
STATUS, VERSION, APPLIED = range(3)
PUSH, PULL, BYE = 1, 2, 3
GO, STOP = 1, 2
TAG_HEADER, TAG_PAYLOAD, TAG_REPLY_HEADER, TAG_REPLY_PAYLOAD, TAG_CONTROL = 11, 12, 13, 14, 15


def short(exc: BaseException) -> str:
    """The first line of an exception, without gloo's source location."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if text.startswith("[") and "] " in text:
        text = text.split("] ", 1)[1]
    return text[:200]


@contextlib.contextmanager
def guard(what: str) -> Iterator[None]:
    """Turn a failed gloo operation (a peer died, closed its connection or timed out) into a
    :class:`TrainschedError` that says ``what`` was under way."""
    try:
        yield
    except TrainschedError:
        raise
    except RuntimeError as exc:  # DistBackendError, DistNetworkError and gloo's own
        raise TrainschedError(f"{what} failed: {short(exc)}; a peer rank died or hung "
                              f"(see its log)") from None


class Inbox:
    """The server's side: one posted receive per worker, polled through one queue."""

    def __init__(self, workers: int, numel: int, group: Any, *, wait_s: float) -> None:
        self.wait = timedelta(seconds=wait_s)
        self.headers = [torch.zeros(HEADER, dtype=torch.int64) for _ in range(workers)]
        self.payloads = [torch.zeros(numel) for _ in range(workers)]
        self.group = group
        self.ready: queue.Queue[tuple[int, str | None]] = queue.Queue()
        self.free = [threading.Semaphore(1) for _ in range(workers)]
        self.held: dict[int, bool] = {}  # workers whose message the loop has not released
        self.threads = [threading.Thread(target=self._receive, args=(r,), daemon=True,
                                         name=f"inbox-{r}") for r in range(workers)]
        for thread in self.threads:
            thread.start()

    def _receive(self, r: int) -> None:
        while True:
            self.free[r].acquire()
            try:
                dist.irecv(self.headers[r], src=r, group=self.group,
                           tag=TAG_HEADER).wait(self.wait)
                dist.irecv(self.payloads[r], src=r, group=self.group,
                           tag=TAG_PAYLOAD).wait(self.wait)
            except Exception as exc:  # the worker is gone: tell the loop and stop
                self.ready.put((r, short(exc)))
                return
            if int(self.headers[r][KIND]) == BYE:
                return
            self.ready.put((r, None))

    def close(self, timeout_s: float) -> None:
        """Wait for every receiver thread to end (each worker said :data:`BYE`)."""
        for thread in self.threads:
            thread.join(timeout_s)
            if thread.is_alive():
                raise TrainschedError(f"a worker did not say goodbye to the parameter server "
                                      f"within {timeout_s:g} s (see the workers' logs)")

    def next(self, timeout_s: float) -> int:
        """The next worker whose message arrived (its buffers held until :meth:`release`)."""
        try:
            r, error = self.ready.get(timeout=timeout_s)
        except queue.Empty:
            raise TrainschedError(f"the parameter server heard from no worker within "
                                  f"{timeout_s:g} s; a worker hung (see the workers' logs) or "
                                  f"the timeout is too short for one step") from None
        if error is not None:
            raise TrainschedError(f"worker {r} died mid-run (the parameter server lost its "
                                  f"connection: {error}); see worker {r}'s log")
        self.held[r] = True
        return r

    def header(self, r: int) -> list[int]:
        return self.headers[r].tolist()

    def release(self, r: int) -> None:
        del self.held[r]
        self.free[r].release()


class Outbox:
    """The server's replies: a header and a parameter snapshot per worker (sized once), sent
    without blocking; a worker's previous reply is complete before its buffers are reused
    (it has answered since, so it received them)."""

    def __init__(self, workers: int, numel: int, group: Any) -> None:
        self.headers = [torch.zeros(HEADER, dtype=torch.int64) for _ in range(workers)]
        self.payloads = [torch.zeros(numel) for _ in range(workers)]
        self.pending: list[list[Any]] = [[] for _ in range(workers)]
        self.group = group

    def send(self, r: int, status: int, version: int, applied: int,
             params_into: Any) -> None:
        for work in self.pending[r]:
            work.wait()
        self.headers[r].copy_(torch.tensor([status, version, applied, 0, 0, 0]))
        params_into(self.payloads[r])
        self.pending[r] = [
            dist.isend(self.headers[r], r, group=self.group, tag=TAG_REPLY_HEADER),
            dist.isend(self.payloads[r], r, group=self.group, tag=TAG_REPLY_PAYLOAD)]


class Link:
    """A worker's side: push a header and each shard's slice of the payload to that shard's
    server, wait for every answer; the answers' parameter slices land in :attr:`params`.

    ``servers``: the server ranks, shard ``j`` (``bounds[j]`` of the flat vector) on
    ``servers[j]``. A shard whose server said ``STOP`` takes no more messages: an exchange
    goes to the shards still ``active`` and keeps the others' last answer."""

    def __init__(self, rank: int, servers: Sequence[int], bounds: Sequence[tuple[int, int]],
                 numel: int, group: Any) -> None:
        self.rank, self.servers, self.bounds, self.group = rank, list(servers), list(bounds), group
        count = len(self.servers)
        self.out_headers = [torch.zeros(HEADER, dtype=torch.int64) for _ in range(count)]
        self.in_headers = [torch.zeros(HEADER, dtype=torch.int64) for _ in range(count)]
        self.params = torch.zeros(numel)
        self.pending: list[Any] = []

    def _who(self, j: int) -> str:
        shard = f" of shard {j}" if len(self.servers) > 1 else ""
        return (f"worker {self.rank} talking to the parameter server{shard} "
                f"(rank {self.servers[j]})")

    def close(self) -> None:
        """Say :data:`BYE` to every server (the run is over) and wait for the sends."""
        self.exchange(BYE, [0] * len(self.servers), 0, 0, self.params, expect_answer=False)
        for work in self.pending:
            work.wait()
        self.pending = []

    def exchange(self, kind: int, read_versions: Sequence[int], clock: int, samples: int,
                 payload: torch.Tensor, local_s: float = 0.0,
                 active: Sequence[bool] | None = None,
                 expect_answer: bool = True) -> list[list[int]]:
        """Send one message to every active shard's server and return every shard's last
        answer header (parameters in :attr:`params`)."""
        going = [True] * len(self.servers) if active is None else list(active)
        for work in self.pending:
            work.wait()
        self.pending = []
        for j, server in enumerate(self.servers):
            if not going[j]:
                continue
            lo, hi = self.bounds[j]
            with guard(self._who(j)):
                header = self.out_headers[j]
                header.copy_(torch.tensor([self.rank, read_versions[j], clock, samples, kind,
                                           round(local_s * 1e6)]))
                self.pending += [
                    dist.isend(header, server, group=self.group, tag=TAG_HEADER),
                    dist.isend(payload[lo:hi], server, group=self.group, tag=TAG_PAYLOAD)]
        for j, server in enumerate(self.servers):
            if not going[j] or not expect_answer:
                continue
            lo, hi = self.bounds[j]
            with guard(self._who(j)):
                dist.recv(self.in_headers[j], src=server, group=self.group,
                          tag=TAG_REPLY_HEADER)
                dist.recv(self.params[lo:hi], src=server, group=self.group,
                          tag=TAG_REPLY_PAYLOAD)
        return [h.tolist() for h in self.in_headers]
