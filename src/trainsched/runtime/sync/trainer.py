"""The life of one rank of a sync run (inside the worker processes; torch).

Ranks ``0 .. N-1`` are workers; when a phase needs the parameter server, ranks ``N .. N+S-1``
are its ``S`` shard servers (world ``N + S``; shard ``j`` of the flat parameter vector on rank
``N + j``), outside the workers' gloo group and talking to them on a point-to-point group of
their own. The process group comes from ``tcp://`` on this host when trainsched launched the
ranks, from ``env://`` under ``torchrun`` (``cfg["port"]`` is ``None``). Every rank walks the
same list of segments (:func:`~trainsched.runtime.sync.config.plan_segments`); each ends at a
**synchronisation point** where all ranks agree on the state (spec §2.5):

1. the server has drained (every worker was answered ``STOP``); 2. a barrier: the point's
first collective, no extra call; 3. buffers: floating-point averaged over the workers, integer
from worker 0; 4. weights and optimizer state by the phase left: after BSP the workers' state
digests are compared (all equal, or an error); after local SGD they are averaged; then, when a
server phase is left or entered, the owner (the server after a server phase, else worker 0)
broadcasts its state to every rank (after a server phase each shard's server its slice of the
parameters and momentum); 5. the next segment derives its learning rate from its own
protocol (base x schedule(samples) x effective batch / (N·b)), so a scale is applied once and
survives a restart. Worker 0 records a switch event when the protocol changes and writes a
checkpoint where the plan says, after the synchronisation point. The server's counters reach
worker 0 at checkpoints and at the end (one collective fewer per switch).

With a straggler policy (``cfg["straggler_policy"]``) the BSP segments run under watch
(:mod:`~trainsched.runtime.sync.online`): a relaxed episode may interrupt one, and later
segments shrink by its samples so the run's total is kept.

``TRAINSCHED_SYNC_FAULT=R:K`` (tests) makes worker ``R`` exit with status 3 before its ``K``-th
batch, or the server (``R = N``) before its ``K``-th update.
"""

from __future__ import annotations

import json
import os
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from trainsched.errors import TrainschedError
from trainsched.runtime.launch import serve_worker
from trainsched.runtime.sync.config import (
    LR_SCHEDULES,
    Segment,
    check_phases,
    needs_server,
    plan_segments,
    shard_bounds,
    update_samples,
)
from trainsched.runtime.sync.ledger import Ledger, checkpoint_name
from trainsched.runtime.sync.online import Online
from trainsched.runtime.sync.server import Server
from trainsched.runtime.sync.state import Replica
from trainsched.runtime.sync.wire import Link, guard
from trainsched.runtime.sync.worker import SENT, Worker
from trainsched.runtime.tasks import task_from_json
from trainsched.sync.faults import Straggler
from trainsched.sync.policy import lr_scale
from trainsched.sync.protocols import Bsp, LocalSgd, format_protocol, parse_protocol
from trainsched.sync.straggler import parse_straggler_policy

__all__ = ["FAULT_ENV", "main", "work"]

FAULT_ENV = "TRAINSCHED_SYNC_FAULT"


def main() -> None:  # pragma: no cover - the worker processes' entry
    serve_worker(work)


def _fault(rank: int) -> int | None:
    text = os.environ.get(FAULT_ENV, "")
    if not text:
        return None
    who, _, at = text.partition(":")
    return int(at or 0) if int(who) == rank else None


def _build_model(cfg: dict[str, Any], task: Any) -> Any:
    if cfg.get("model") is None:
        return task.student()
    import importlib

    module, _, function = cfg["model"].partition(":")
    torch.manual_seed(task.seed + 1)
    return getattr(importlib.import_module(module), function)(task)


def _evaluate(model: Any, task: Any, data: Any) -> tuple[float, float]:
    model.eval()
    with torch.no_grad():
        loss, accuracy = task.evaluate(model, data)
    model.train()
    return loss, accuracy


class _Rank:
    """Everything one rank holds for the run."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        self.cfg = cfg
        self.rank, self.n, self.b = int(cfg["rank"]), int(cfg["ranks"]), int(cfg["batch_per_rank"])
        self.phases = check_phases([(parse_protocol(t), s) for t, s in cfg["phases"]],
                                   self.n, self.b)
        policy = cfg.get("straggler_policy")
        self.straggler = parse_straggler_policy(policy) if policy else None
        self.has_server = any(needs_server(p) for p, _ in self.phases) or (
            self.straggler is not None and self.straggler.action == "relax")
        self.server_count = int(cfg.get("servers", 1)) if self.has_server else 0
        self.server_ranks = list(range(self.n, self.n + self.server_count))
        self.server_rank = self.n if self.has_server else None  # shard 0's: counters, online
        world = self.n + self.server_count
        timeout_s = float(cfg["timeout_s"])
        self.timeout_s = timeout_s
        init = "env://" if cfg["port"] is None else f"tcp://127.0.0.1:{cfg['port']}"
        dist.init_process_group("gloo", init_method=init, rank=self.rank, world_size=world,
                                timeout=timedelta(seconds=timeout_s))
        with guard("building the workers' and the server's process groups"):
            if self.has_server:
                self.workers_group = dist.new_group(list(range(self.n)))
                self.p2p_group = dist.new_group(list(range(world)))
            else:
                self.workers_group, self.p2p_group = dist.group.WORLD, None
        self.is_worker = self.rank < self.n
        self.task = task_from_json(cfg["task"])
        self.data = self.task.data()
        self.replica = Replica(_build_model(cfg, self.task), lr=float(cfg["lr"]),
                               momentum=float(cfg["momentum"]),
                               weight_decay=float(cfg["weight_decay"]),
                               nesterov=bool(cfg["nesterov"]),
                               optimizer=cfg.get("optimizer", "sgd"))
        self.bounds = (shard_bounds(self.replica.numel, self.server_count)
                       if self.has_server else ())
        self.total = sum(s for _, s in self.phases)
        self.segments = plan_segments(self.phases, ranks=self.n, batch_per_rank=self.b,
                                      checkpoint_every=cfg["checkpoint_every"])
        self.ledger = Ledger(ranks=self.n, eval_every=cfg["eval_every"])
        self.t0 = time.perf_counter()
        self.next_segment = 0
        self.server: Server | None = None
        self.worker: Worker | None = None
        self.sent: dict[int, dict[str, float]] = {}  # phase -> this worker's message counters
        if self.is_worker:
            link = (Link(self.rank, self.server_ranks, self.bounds, self.replica.numel,
                         self.p2p_group) if self.has_server else None)
            self.worker = Worker(rank=self.rank, workers=self.n, batch=self.b,
                                 replica=self.replica, task=self.task, data=self.data,
                                 group=self.workers_group, link=link,
                                 stragglers=[Straggler(**s) for s in cfg["stragglers"]],
                                 die_at_batch=_fault(self.rank), on_progress=self._progress,
                                 comm=cfg.get("comm"), comm_order=cfg.get("comm_order", "leader"),
                                 timeout_s=timeout_s)
        elif self.has_server:
            order = cfg["push_order"] if cfg["deterministic"] else None
            if cfg["deterministic"] and order is None:
                order = list(range(self.n))
            self.server = Server(self.replica, self.n, self.p2p_group, timeout_s=timeout_s,
                                 wait_s=float(cfg["deadline_s"]), order=order,
                                 die_at_update=_fault(self.rank),
                                 shard=self.bounds[self.rank - self.n])
        self.online = (Online(self, self.straggler, int(cfg["observe_every"]))
                       if self.straggler is not None else None)

    def _progress(self, samples: int) -> None:
        if self.rank == 0:
            self.ledger.maybe_evaluate(samples, lambda: _evaluate(self.replica.model,
                                                                  self.task, self.data))

    # --- resume ----------------------------------------------------------------------------

    def resume(self, meta_path: str) -> None:
        meta = json.loads(Path(meta_path).read_text())
        if meta["model"] != self.replica.describe():
            raise TrainschedError(f"checkpoint {meta_path} holds another model's parameters "
                                  f"(names and shapes differ from this run's); resume with "
                                  f"the model that wrote it, or start afresh")
        saved = torch.load(Path(meta_path).with_suffix(".pt"), weights_only=True)
        self.replica.load_state(saved["state"])
        if self.is_worker:
            buffers = dict(self.replica.model.named_buffers())
            with torch.no_grad():
                for name, value in saved["buffers"].items():
                    buffers[name].copy_(value)
            assert self.worker is not None
            self.worker.position = int(meta["positions"][self.rank])
        self.ledger.restore(meta["record"], int(meta["samples"]))
        self.next_segment = int(meta["next_segment"])

    # --- the run ---------------------------------------------------------------------------

    def run(self) -> dict[str, Any] | None:
        self._start()
        if self.rank == 0 and self.ledger.resumed_from is None:
            self.ledger.first_point(_evaluate(self.replica.model, self.task, self.data))
        for index in range(self.next_segment, len(self.segments)):
            segment = self.segments[index]
            peak = self._peak_lr(segment)
            self.replica.lr_at = self.lr_function(peak)
            self.replica.set_lr(peak)
            start = time.perf_counter()
            counters = self._run_segment(index, segment)
            local_done = time.perf_counter()
            following = self.segments[index + 1] if index + 1 < len(self.segments) else None
            self.synchronise(segment.protocol, following.protocol if following else None)
            if (following is not None and segment.last_of_phase and self.worker is not None
                    and self.worker.scheduled and isinstance(following.protocol, Bsp)):
                with guard(f"worker {self.rank} building the scheduled runtime for BSP"):
                    self.worker.open_scheduled()  # part of the switch's cost
            if self.rank == 0:
                self.ledger.add(segment, counters, lr=peak,
                                wall_s=local_done - start, batches=counters["batches"])
            if self.rank == 0 and following is not None and segment.last_of_phase:
                now = time.perf_counter()
                assert self.worker is not None
                self.ledger.switch(segment, following, step=self.worker.position,
                                   at_s=now - self.t0, cost_s=now - local_done,
                                   samples=self._shifted(segment).start
                                   + self._shifted(segment).samples)
            if segment.checkpoint or following is None:
                self._collect_server_counters()
            if segment.checkpoint:
                self._checkpoint(index + 1, segment.start + segment.samples)
        return self._finish()

    def _peak_lr(self, segment: Segment) -> float:
        return self.lr_of(segment.protocol)

    def lr_of(self, protocol: Any) -> float:
        """The learning rate under ``protocol`` before the schedule's factor."""
        return float(self.cfg["lr"]) * lr_scale(protocol, self.n, self.b)

    def _shifted(self, segment: Segment) -> Segment:
        """``segment`` as it runs (the online policy's episodes move it; else as planned)."""
        return self.online.shifted(segment) if self.online is not None else segment

    def _start(self) -> None:
        """Every worker built the same state (digests compared), and the server has it."""
        if self.online is not None:  # time the start's work: a switch's first estimate
            with guard(f"rank {self.rank} at the start barrier"):
                dist.barrier()
        began = time.perf_counter()
        if self.is_worker and self.n > 1:
            self.check_equal("at the start")
        if self.has_server:
            state = self.replica.state_into()
            with guard(f"rank {self.rank} receiving the initial state from worker 0"):
                dist.broadcast(state, src=0)
            self.replica.load_state(state)
        if self.online is not None:
            self.online.estimate_s = time.perf_counter() - began

    def _collect_server_counters(self) -> None:
        """The server's counters of the segments served since the last call, to worker 0's
        ledger (at checkpoints and at the end, not at every switch: one collective less)."""
        if not self.has_server:
            return
        box = [self.server.take_stats() if self.server is not None else None]
        with guard(f"rank {self.rank} collecting the parameter server's counters"):
            dist.broadcast_object_list(box, src=self.server_rank)
        if self.rank == 0:
            for index, counters in box[0]:
                segment = self.segments[index]
                self.ledger.add(segment, {**counters, "batches": 0}, lr=self._peak_lr(segment),
                                wall_s=0.0, batches=0)

    def lr_function(self, peak: float) -> Any:
        schedule, total = LR_SCHEDULES.lookup(self.cfg["lr_schedule"]), self.total
        return lambda samples: peak * schedule(samples / total)

    def _run_segment(self, index: int, planned: Segment) -> dict[str, Any]:
        protocol = planned.protocol
        segment = self._shifted(planned)
        unit = update_samples(protocol, self.n, self.b)
        watched = self.online is not None and isinstance(protocol, Bsp)
        if not self.is_worker:
            if watched:
                assert self.online is not None
                self.online.server_bsp(index)
            elif needs_server(protocol):
                assert self.server is not None
                self.server.serve(index, protocol, segment.samples // unit,
                                  samples_per_update=unit, samples_before=segment.start)
            return {}
        assert self.worker is not None
        before, local_before = self.worker.position, self.worker.local_sum_s
        sent_before = dict(self.worker.sent)
        self.worker.in_flight_bytes = 0.0
        try:
            counters = self._train_segment(segment, planned, protocol, watched, unit)
        finally:
            account = self.sent.setdefault(segment.phase, dict.fromkeys(SENT, 0))
            for key in SENT:
                account[key] += self.worker.sent[key] - sent_before[key]
            self.worker.release()
            account["in_flight_bytes"] = max(account.get("in_flight_bytes", 0.0),
                                             self.worker.in_flight_bytes)
        return {**counters, "batches": self.worker.position - before,
                "local_s": self.worker.local_sum_s - local_before}

    def _train_segment(self, segment: Segment, planned: Segment, protocol: Any, watched: bool,
                       unit: int) -> dict[str, Any]:
        """A worker's part of :meth:`_run_segment`: train, and the segment's counters."""
        assert self.worker is not None
        if needs_server(protocol):
            self.worker.run_server()
            # the server's counters come later (_collect_server_counters)
            counters: dict[str, Any] = {
                "updates": 0, "gradients": 0, "dropped": 0, "drained": 0, "samples": 0,
                "staleness": [[] for _ in range(self.n)], "max_clock_lead": None}
        elif isinstance(protocol, LocalSgd):
            phase_start = sum(s for _, s in self.phases[:segment.phase])
            rounds = self.worker.run_local(segment, protocol.period_steps,
                                           (planned.start - phase_start) // unit)
            counters = self._collective_counters(rounds, segment, staleness=False)
        else:
            assert isinstance(protocol, Bsp), protocol
            if watched:
                assert self.online is not None
                rounds = self.online.worker_bsp(planned)
            else:
                rounds = self.worker.run_bsp(segment)
            counters = self._collective_counters(rounds, segment, staleness=True)
        return counters

    def _collective_counters(self, rounds: int, segment: Segment,
                             staleness: bool) -> dict[str, Any]:
        unit = update_samples(segment.protocol, self.n, self.b)
        return {"updates": rounds, "gradients": rounds * self.n, "dropped": 0, "drained": 0,
                "staleness": [[rounds] if staleness and rounds else [] for _ in range(self.n)],
                "max_clock_lead": None, "samples": rounds * unit}

    def synchronise(self, leaving: Any, entering: Any) -> None:
        """The synchronisation point after a segment of ``leaving`` (``entering``: the next
        segment's protocol, ``None`` at the end). Its first collective is the barrier: the
        workers' buffer, digest or average collectives, then the state broadcast, which waits
        for the server to have drained; the broadcast is left out where no server phase is
        left or entered."""
        if self.is_worker:
            with guard(f"worker {self.rank} reconciling buffers"):
                self.replica.reconcile_buffers(self.workers_group, self.n)
            if isinstance(leaving, LocalSgd) and self.n > 1:
                state = self.replica.state_into()
                with guard(f"worker {self.rank} averaging the local SGD replicas"):
                    dist.all_reduce(state, group=self.workers_group)
                state.div_(self.n)
                self.replica.load_state(state)
            if isinstance(leaving, Bsp) and self.n > 1:
                self.check_equal("after a BSP phase")
        if self.has_server and needs_server(leaving):
            self._gather_shards()
        elif self.has_server and entering is not None and needs_server(entering):
            state = self.replica.state_into()
            with guard(f"rank {self.rank} receiving the state from worker 0"):
                dist.broadcast(state, src=0)
            if self.rank != 0:
                self.replica.load_state(state)

    def _gather_shards(self) -> None:
        """Leaving a server phase: every shard's server broadcasts its slice of the parameters
        and of the optimizer's slots (momentum; Adam's moments) to every rank, and the step
        counts (Adam) of the tensors whose first value its shard holds."""
        replica = self.replica
        state, numel = replica.state_into(), replica.numel
        owners = replica.owners(self.bounds) if replica.counted else []
        steps = replica.parts * numel
        for j, (lo, hi) in enumerate(self.bounds):
            src = self.n + j
            spans = [(part * numel + lo, part * numel + hi) for part in range(replica.parts)]
            spans += [(steps + i, steps + i + 1) for i, owner in enumerate(owners) if owner == j]
            for a, b in spans:
                piece = state[a:b].clone()
                with guard(f"rank {self.rank} receiving shard {j}'s state from rank {src}"):
                    dist.broadcast(piece, src=src)
                state[a:b].copy_(piece)
        replica.load_state(state)

    def check_equal(self, when: str) -> None:
        mine = torch.tensor([self.replica.digest()], dtype=torch.int64)
        every = [torch.zeros(1, dtype=torch.int64) for _ in range(self.n)]
        with guard(f"worker {self.rank} comparing replica digests"):
            dist.all_gather(every, mine, group=self.workers_group)
        digests = [int(t) for t in every]
        if len(set(digests)) != 1:
            raise TrainschedError(f"the replicas differ {when} (state digests "
                                  f"{digests}); a rank computed a different step — check that "
                                  f"every rank builds the same model and optimizer")

    def _checkpoint(self, next_segment: int, samples: int) -> None:
        if not self.is_worker:
            return
        positions: list[Any] = [None] * self.n
        assert self.worker is not None
        with guard(f"worker {self.rank} gathering sampler positions for a checkpoint"):
            dist.all_gather_object(positions, self.worker.position, group=self.workers_group)
        if self.rank != 0:
            return
        folder = Path(self.cfg["checkpoint_dir"])
        folder.mkdir(parents=True, exist_ok=True)
        name = checkpoint_name(samples)
        self.ledger.checkpoints.append(samples)
        tmp = folder / f"{name}.pt.tmp"
        torch.save({"state": self.replica.state_into().clone(),
                    "buffers": self.replica.buffers_state()}, tmp)
        os.replace(tmp, folder / f"{name}.pt")
        meta = {"format": "trainsched.sync-checkpoint/1", "run": self.cfg["fingerprint"],
                "model": self.replica.describe(), "samples": samples,
                "next_segment": next_segment, "positions": positions,
                "record": self.ledger.to_json()}
        tmp = folder / f"{name}.json.tmp"
        tmp.write_text(json.dumps(meta))
        os.replace(tmp, folder / f"{name}.json")
        tmp = folder / "latest.json.tmp"
        tmp.write_text(json.dumps({"checkpoint": f"{name}.json"}))
        os.replace(tmp, folder / "latest.json")

    def _finish(self) -> dict[str, Any] | None:
        if self.has_server and self.worker is not None:
            assert self.worker.link is not None
            self.worker.link.close()
        if self.server is not None:
            self.server.inbox.close(self.timeout_s)
        every: list[Any] = [None] * self.n
        if self.is_worker:
            with guard(f"worker {self.rank} gathering the workers' message counters"):
                dist.all_gather_object(every, self.sent, group=self.workers_group)
        with guard(f"rank {self.rank} at the final barrier"):
            dist.barrier()
        if self.rank != 0:
            return None
        links = [{"rank": r, "phase": phase, **every[r][phase]}
                 for phase in sorted({k for sent in every for k in sent})
                 for r in range(self.n) if phase in every[r]]
        loss, accuracy = _evaluate(self.replica.model, self.task, self.data)
        params = (self.replica.params_into(torch.zeros(self.replica.numel)).tolist()
                  if self.cfg["return_params"] else None)
        result = self.ledger.result(task=self.task.describe(), batch_per_rank=self.b,
                                    final=(loss, accuracy),
                                    wall_s=time.perf_counter() - self.t0, params=params,
                                    protocols=[format_protocol(p) for p, _ in self.phases],
                                    straggler_policy=self.cfg.get("straggler_policy"),
                                    links=links)
        return {**result, "comm": self.cfg.get("comm_name")}


def work(cfg: dict[str, Any]) -> dict[str, Any] | None:  # pragma: no cover - in the workers
    """One rank's whole run (``cfg``: :func:`~trainsched.runtime.sync.run_sync`'s config with
    this rank's ``rank``); worker 0 returns the result as JSON data, every other rank ``None``."""
    torch.set_num_threads(1)
    me = _Rank(cfg)
    if cfg.get("resume") is not None:
        me.resume(cfg["resume"])
    return me.run()
