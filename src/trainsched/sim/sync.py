"""Multi-step time simulation of the synchronisation protocols and of sync policies.

The step simulator (:mod:`trainsched.sim.data_parallel`) predicts one step of one plan in
detail; this module predicts *thousands* of steps of N ranks whose local step times vary, to see
what each protocol does with the spread: who waits, how stale the gradients get, how many samples
a second reach the shared model. A :class:`SyncWorkload` gives each rank's mean local step time
(compute until its gradient is ready), the run-to-run spread and the communication times; its
per-step local times are drawn once per ``(seed, rank, step)`` (common random numbers: every
protocol sees the same draws) and stretched by the injected stragglers
(:class:`trainsched.sync.Straggler`, windows in the rank's own step count: under ASP a slowed
rank takes longer in wall time to get through its window than under BSP).

Per protocol (each phase starts with every rank at a barrier):

* **BSP**: a step takes the slowest rank's local time plus ``allreduce_s``; one update of
  N·b samples, staleness 0.
* **ASP / SSP(s)**: a parameter server. A rank computes, pushes (``push_s`` on its link), the
  server applies pushes one at a time in arrival order (``server_s`` each: the apply and the
  server link's share: the server load), and the rank pulls the new weights (``pull_s``) and
  starts again. Staleness of an applied gradient = updates applied since the rank read its
  weights. Under SSP a rank that has finished c steps of the phase may start another only once
  every rank has finished c − s; ASP never waits (s = ∞). With no communication costs the ASP
  sample rate is the sum of the ranks' rates.
* **k-of-N**: every rank computes on the current weights; the update is made when the k-th
  fastest push has arrived (its local time + ``push_s``), + ``server_s`` + ``pull_s``; the other
  ranks' work is dropped and they restart on the new weights. k·b samples per update.
* **local SGD(H)**: ranks run H local steps alone, then average (``allreduce_s``) at a barrier:
  a period takes the slowest rank's H-step sum plus the all-reduce; N·b samples per local step.

**A delayed link** (:class:`~trainsched.sync.Straggler` with ``link``, ``1:20ms@link``) adds its
delay to the messages the rank sends, not to its compute: BSP, its part of each step's
all-reduce (the step waits for it); ASP / SSP / k-of-N, each push (which also asks for the next
weights, as in the runtime; a phase's first pull is not simulated); local SGD, each average,
once per H steps. Each rank's push, pull and server times may differ (one number, or one per
rank): a parameter server colocated with a worker makes that worker's messages to it local.

A phase runs until its sample quota (:meth:`trainsched.sync.SyncPolicy.phase_samples`, on
multiples of N·b) is applied: a server-protocol rank starts a step only while the quota has room
for it, and the phase ends when the last reserved gradient is applied and pulled. Each switch
between phases costs ``switch_s``. Without noise and with equal ranks the time of ``bsp:f,X:1-f``
is exactly f·T_bsp + (1−f)·T_X + C_switch.

This is its own small event loop rather than a task graph on :mod:`trainsched.sim.engine`: a
run is ~10⁵ updates of one number each, where the engine's per-task records would dominate.
:mod:`trainsched.sim.quadratic` replays the updates on a noisy quadratic for time to a target
loss.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from trainsched.cluster import Cluster
from trainsched.comm.policy import graph_gradients
from trainsched.errors import TrainschedError
from trainsched.graph import Graph
from trainsched.sim.data_parallel import _worker_link, collective_s
from trainsched.sim.executors import simulate_single
from trainsched.sync import (
    Asp,
    Bsp,
    KOfN,
    LocalSgd,
    Ssp,
    Straggler,
    SyncPolicy,
    SyncProtocol,
    format_protocol,
    link_delay_s,
    slowed_s,
)
from trainsched.units import is_int

__all__ = ["PhaseRecord", "SyncSimResult", "SyncWorkload", "simulate_sync",
           "sync_workload"]

_BLOCK = 4096


@dataclass(frozen=True, kw_only=True)
class SyncWorkload:
    """N ranks of ``batch_per_rank`` samples each: ``compute_s`` the mean local step time (one
    number for all ranks, or one per rank), ``noise_cv`` its coefficient of variation (each
    step's time is the mean times a log-normal factor of mean 1), the communication times of
    the module docstring (``push_s``, ``pull_s`` and ``server_s``: one number, or one per rank;
    ``server_s[r]`` is the server's time for rank r's gradient), and the injected
    ``stragglers`` (delayed links among them)."""

    ranks: int
    batch_per_rank: int
    compute_s: float | tuple[float, ...]
    noise_cv: float = 0.0
    allreduce_s: float = 0.0
    push_s: float | tuple[float, ...] = 0.0
    pull_s: float | tuple[float, ...] = 0.0
    server_s: float | tuple[float, ...] = 0.0
    stragglers: tuple[Straggler, ...] = ()

    def __post_init__(self) -> None:
        for name in ("ranks", "batch_per_rank"):
            value = getattr(self, name)
            if not (is_int(value) and value >= 1):
                raise TrainschedError(f"sync workload: {name} must be a whole number >= 1, got "
                                      f"{value!r}")
        compute = self.compute_s if isinstance(self.compute_s, Sequence) else \
            (self.compute_s,) * self.ranks
        if len(compute) != self.ranks or not all(_seconds(t) and t > 0 for t in compute):
            raise TrainschedError(f"sync workload: compute_s must be seconds > 0, one number or "
                                  f"one per rank ({self.ranks}), got {self.compute_s!r}")
        object.__setattr__(self, "compute_s", tuple(float(t) for t in compute))
        for name in ("noise_cv", "allreduce_s"):
            if not _seconds(getattr(self, name)):
                raise TrainschedError(f"sync workload: {name} must be a finite number >= 0, "
                                      f"got {getattr(self, name)!r}")
        for name in ("push_s", "pull_s", "server_s"):
            value = getattr(self, name)
            each = tuple(value) if isinstance(value, Sequence) else None
            if each is None and _seconds(value):
                continue
            if each is None or len(each) != self.ranks or not all(map(_seconds, each)):
                raise TrainschedError(f"sync workload: {name} must be seconds >= 0, one number "
                                      f"or one per rank ({self.ranks}), got {value!r}")
            object.__setattr__(self, name, tuple(float(t) for t in each))
        stragglers = tuple(self.stragglers)
        for s in stragglers:
            if not isinstance(s, Straggler) or s.rank >= self.ranks:
                raise TrainschedError(f"sync workload: straggler {s!r} is not a Straggler on "
                                      f"one of the {self.ranks} ranks (0..{self.ranks - 1})")
        object.__setattr__(self, "stragglers", stragglers)

    def per_rank(self, name: str) -> tuple[float, ...]:
        """``push_s``, ``pull_s`` or ``server_s`` as one number per rank."""
        value = getattr(self, name)
        return tuple(value) if isinstance(value, tuple) else (float(value),) * self.ranks


def _seconds(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and \
        math.isfinite(value) and value >= 0


class _LocalTimes:
    """Rank r's local time in its step k: mean × log-normal factor drawn from rank r's own
    stream (blocks of fixed size, so a draw depends on (seed, r, k) only), then stragglers."""

    def __init__(self, workload: SyncWorkload, seed: int) -> None:
        self.w = workload
        self.sigma = math.sqrt(math.log1p(workload.noise_cv ** 2))
        self.rngs = [np.random.default_rng(s) for s in
                     np.random.SeedSequence(seed).spawn(workload.ranks)]
        self.blocks: list[list[np.ndarray]] = [[] for _ in range(workload.ranks)]

    def __call__(self, rank: int, step: int) -> float:
        base = self.w.compute_s[rank]  # type: ignore[index]
        if self.sigma > 0:
            blocks = self.blocks[rank]
            while len(blocks) <= step // _BLOCK:
                z = self.rngs[rank].standard_normal(_BLOCK)
                blocks.append(np.exp(self.sigma * z - self.sigma ** 2 / 2))
            base *= float(blocks[step // _BLOCK][step % _BLOCK])
        return slowed_s(self.w.stragglers, rank, step, base)


@dataclass(frozen=True, kw_only=True)
class PhaseRecord:
    """One phase as simulated: its protocol's text, samples applied, shared-model updates,
    start and end (seconds), and its staleness histogram ``((staleness, updates), ...)``."""

    protocol: str
    samples: int
    updates: int
    start_s: float
    end_s: float
    staleness: tuple[tuple[int, int], ...]

    @property
    def time_s(self) -> float:
        return self.end_s - self.start_s


@dataclass(frozen=True, kw_only=True)
class SyncSimResult:
    """A simulated run: total ``time_s``, samples and updates, per phase records, and the log of
    every shared-model update (end time, samples, staleness, learning-rate scale) in the order
    applied, for :mod:`trainsched.sim.quadratic`."""

    time_s: float
    samples: int
    ranks: int
    batch_per_rank: int
    phases: tuple[PhaseRecord, ...]
    update_end_s: tuple[float, ...]
    update_samples: tuple[int, ...]
    update_staleness: tuple[int, ...]
    update_lr_scale: tuple[float, ...]

    @property
    def time_per_sample_s(self) -> float:
        return self.time_s / self.samples if self.samples else 0.0

    @property
    def step_time_s(self) -> float:
        """Time per N·b samples (one BSP step's worth), comparable across protocols."""
        return self.time_per_sample_s * self.ranks * self.batch_per_rank

    @property
    def staleness(self) -> tuple[tuple[int, int], ...]:
        counts = Counter(self.update_staleness)
        return tuple(sorted(counts.items()))

    @property
    def mean_staleness(self) -> float:
        n = len(self.update_staleness)
        return sum(self.update_staleness) / n if n else 0.0


class _Run:
    """The state carried from phase to phase: time, every rank's step count, the update log."""

    def __init__(self, workload: SyncWorkload, seed: int) -> None:
        self.w = workload
        self.local = _LocalTimes(workload, seed)
        self.push, self.pull, self.serve = (workload.per_rank(name) for name in
                                            ("push_s", "pull_s", "server_s"))
        self.now = 0.0
        self.clock = [0] * workload.ranks
        self.end_s: list[float] = []
        self.samples: list[int] = []
        self.staleness: list[int] = []
        self.lr: list[float] = []

    def log(self, end_s: float, samples: int, staleness: int, lr: float) -> None:
        self.end_s.append(end_s)
        self.samples.append(samples)
        self.staleness.append(staleness)
        self.lr.append(lr)

    def link(self, rank: int, step: int) -> float:
        """How long a message ``rank`` sends in its ``step`` is held (delayed links)."""
        return link_delay_s(self.w.stragglers, rank, step)

    def step_times(self, ranks: Sequence[int], *, sends: bool = True) -> list[float]:
        """Each rank's local time in its next step, plus the hold of the message it sends
        after it when ``sends``."""
        out = []
        for r in ranks:
            step = self.clock[r]
            out.append(self.local(r, step) + (self.link(r, step) if sends else 0.0))
            self.clock[r] += 1
        return out

    # --- one phase per protocol family; each applies ``quota`` samples from ``self.now`` ------

    def lockstep(self, quota: int, per_step: int, lr: float,
                 step_s: Callable[[], float]) -> None:
        """Steps of ``per_step`` samples until ``quota``; ``step_s()`` is each step's time."""
        done = 0
        while done < quota:
            self.now += step_s()
            take = min(per_step, quota - done)
            done += take
            self.log(self.now, take, 0, lr)

    def bsp(self, quota: int) -> None:
        w, ranks = self.w, range(self.w.ranks)
        self.lockstep(quota, w.ranks * w.batch_per_rank, 1.0,
                      lambda: max(self.step_times(ranks)) + w.allreduce_s)

    def k_of_n(self, quota: int, k: int) -> None:
        w, ranks = self.w, range(self.w.ranks)

        def step() -> float:
            # a rank's push (held by its link) after its pull of the last version: in steady
            # lockstep the pull is part of the rank's cycle
            arrivals = sorted((t + self.push[r] + self.pull[r], r) for r, t in
                              zip(ranks, self.step_times(ranks), strict=True))
            first = arrivals[:k]
            return first[-1][0] + max(self.serve[r] for _, r in first)

        self.lockstep(quota, k * w.batch_per_rank, k / w.ranks, step)

    def local_sgd(self, quota: int, period: int) -> None:
        w, ranks = self.w, range(self.w.ranks)
        per_step, done = w.ranks * w.batch_per_rank, 0
        while done < quota:
            steps = min(period, -(-(quota - done) // per_step))
            start, sums = self.now, [0.0] * w.ranks
            for _ in range(steps):
                for r, t in zip(ranks, self.step_times(ranks, sends=False), strict=True):
                    sums[r] += t
            held = [self.link(r, self.clock[r] - 1) for r in ranks]  # the average's message
            self.now = start + max(a + b for a, b in zip(sums, held, strict=True)) \
                + w.allreduce_s
            for _ in range(steps):
                take = min(per_step, quota - done)
                done += take
                self.log(self.now, take, 0, 1.0)

    def server(self, quota: float, bound: float, *,
               on_apply: Callable[[int, float], bool] | None = None) -> int:
        """ASP (``bound`` = inf) or SSP(s): the parameter-server loop of the docstring. After
        each applied gradient ``on_apply(rank, its local time)`` may answer True to close the
        phase (no new steps start; those under way are applied). Returns the samples
        applied."""
        w, b = self.w, self.w.batch_per_rank
        lr = 1.0 / w.ranks
        phase_clock = [0] * w.ranks
        read = [0] * w.ranks
        version, reserved, server_free, closed = 0, 0, self.now, False
        events: list[tuple[float, int, int, float]] = []  # a push arrives: (time, seq, rank, local)
        waiting: list[int] = []
        seq = 0
        ready_at = [self.now] * w.ranks

        def start(r: int, t: float) -> bool:
            nonlocal reserved, seq
            if reserved >= quota or closed:
                return False
            if phase_clock[r] - min(phase_clock) > bound:
                waiting.append(r)
                return False
            reserved += b
            compute = self.local(r, self.clock[r])
            held = self.link(r, self.clock[r])
            self.clock[r] += 1
            heapq.heappush(events, (t + compute + held + self.push[r], seq, r, compute))
            seq += 1
            return True

        for r in range(w.ranks):
            start(r, self.now)
        applied = 0
        while events:
            arrival, _, r, compute = heapq.heappop(events)
            server_free = max(server_free, arrival) + self.serve[r]
            staleness = version - read[r]
            version += 1
            take = int(min(b, quota - applied))
            applied += take
            self.log(server_free, take, staleness, lr)
            phase_clock[r] += 1
            read[r] = version
            ready_at[r] = server_free + self.pull[r]
            if on_apply is not None and not closed:
                self.now = server_free
                closed = on_apply(r, compute)
            start(r, ready_at[r])
            for other in sorted(waiting):
                if phase_clock[other] - min(phase_clock) <= bound:
                    # its pull is answered now, with the weights of this version
                    waiting.remove(other)
                    read[other] = version
                    ready_at[other] = max(ready_at[other], server_free + self.pull[other])
                    start(other, ready_at[other])
        self.now = max(ready_at)
        return applied


def simulate_sync(policy: SyncPolicy | SyncProtocol, workload: SyncWorkload, *,
                  total_samples: int, seed: int = 0, switch_s: float = 0.0) -> SyncSimResult:
    """Simulate ``total_samples`` samples of ``workload`` under ``policy`` (a policy, or one
    protocol for the whole run); each switch between phases costs ``switch_s``."""
    if not isinstance(policy, SyncPolicy):
        policy = SyncPolicy(phases=((policy, 1.0),))
    if not (is_int(total_samples) and total_samples >= 1):
        raise TrainschedError(f"total_samples must be a whole number >= 1, got "
                              f"{total_samples!r}")
    if not _seconds(switch_s):
        raise TrainschedError(f"switch_s must be seconds >= 0, got {switch_s!r}")
    w = workload
    quotas = policy.phase_samples(total_samples, quantum=w.ranks * w.batch_per_rank)
    run = _Run(w, seed)
    records = []
    for k, ((protocol, _), quota) in enumerate(zip(policy.phases, quotas, strict=True)):
        if k > 0:
            run.now += switch_s
        start, first = run.now, len(run.end_s)
        if quota > 0:
            if isinstance(protocol, Bsp):
                run.bsp(quota)
            elif isinstance(protocol, KOfN):
                protocol.server_rule(w.ranks)  # refuses k > N
                run.k_of_n(quota, protocol.k)
            elif isinstance(protocol, LocalSgd):
                run.local_sgd(quota, protocol.period_steps)
            elif isinstance(protocol, Ssp):
                run.server(quota, protocol.staleness_steps)
            else:
                assert isinstance(protocol, Asp), protocol
                run.server(quota, math.inf)
        staleness = Counter(run.staleness[first:])
        records.append(PhaseRecord(protocol=format_protocol(protocol),
                                   samples=sum(run.samples[first:]),
                                   updates=len(run.end_s) - first, start_s=start,
                                   end_s=run.now, staleness=tuple(sorted(staleness.items()))))
    return SyncSimResult(time_s=run.now, samples=sum(run.samples), ranks=w.ranks,
                         batch_per_rank=w.batch_per_rank, phases=tuple(records),
                         update_end_s=tuple(run.end_s), update_samples=tuple(run.samples),
                         update_staleness=tuple(run.staleness), update_lr_scale=tuple(run.lr))


def sync_workload(graph: Graph, cluster: Cluster, *, ranks: int, batch_per_rank: int,
                  algorithm: str = "ring", noise_cv: float = 0.0,
                  stragglers: Sequence[Straggler] = (),
                  allreduce_s: float | None = None, servers: int | None = None,
                  server_placement: str = "dedicated") -> SyncWorkload:
    """The workload of a training graph on ``cluster``: the local step is the graph's one-device
    step time (:func:`~trainsched.sim.simulate_single`), the all-reduce moves every gradient at
    once (:func:`~trainsched.sim.collective_s`), a push or pull moves them over a worker's
    share of the node's NIC (its link: latency + bytes / bandwidth), and the server spends
    their bytes over its link. ``allreduce_s`` overrides the all-reduce time (e.g. the exposed
    communication the step simulator predicts for the plan's comm policy, so BSP here matches
    its step time).

    The servers (a data-parallel plan's ``servers`` and ``server_placement``), each holding
    1/S of the gradient bytes G:

    * ``servers=None``: the cluster's parameter servers sharing its parameter-server link (G /
      (count × its bandwidth)); without them one server behind a worker's link;
    * ``dedicated``: S servers on hosts of their own, each behind the cluster's
      parameter-server link (a worker's link where the cluster describes none): server time
      G / (S × its bandwidth), every worker's push and pull crossing its own link;
    * ``colocated``: shard j on worker j's host (j < S), sharing its link. Worker r's push and
      pull cross its link only for the shards on other hosts (G·(1 − 1/S) for r < S, all of G
      otherwise; no time at all when nothing leaves the host), and the servers receive each
      gradient's remote shards over the workers' links, in parallel: (G/S) / bandwidth, 0 for
      the one worker whose gradient stays on its host (S = 1, worker 0)."""
    compute = simulate_single(graph, cluster).step_time_s
    size = float(sum(g.size_bytes for g in graph_gradients(graph)))
    link = _worker_link(cluster)

    def transfer(size_bytes: float) -> float:
        return link.latency_s + size_bytes / link.bandwidth_bytes_per_s if size_bytes else 0.0

    push: float | tuple[float, ...] = transfer(size)
    server: float | tuple[float, ...]
    if servers is not None and not (is_int(servers) and servers >= 1):
        raise TrainschedError(f"servers must be a whole number >= 1, got {servers!r}")
    if servers is None and cluster.ps_link is not None and cluster.parameter_servers:
        server = size / (cluster.parameter_servers * cluster.ps_link.bandwidth_bytes_per_s)
    elif servers is None:
        server = size / link.bandwidth_bytes_per_s
    elif server_placement == "dedicated":
        host = cluster.ps_link if cluster.ps_link is not None else link
        server = size / (servers * host.bandwidth_bytes_per_s)
    elif server_placement == "colocated":
        if servers > ranks:
            raise TrainschedError(f"{servers} colocated servers on {ranks} ranks: shard j "
                                  f"shares worker j's host, so give at most {ranks}")
        remote = [size * (1 - 1 / servers) if r < servers else size for r in range(ranks)]
        push = tuple(transfer(b) for b in remote)
        server = tuple(size / servers / link.bandwidth_bytes_per_s if b else 0.0
                       for b in remote)
    else:
        raise TrainschedError(f"server_placement must be dedicated or colocated, got "
                              f"{server_placement!r}")
    return SyncWorkload(ranks=ranks, batch_per_rank=batch_per_rank, compute_s=compute,
                        noise_cv=noise_cv,
                        allreduce_s=collective_s(size, ranks, cluster, algorithm)
                        if allreduce_s is None else allreduce_s,
                        push_s=push, pull_s=push, server_s=server,
                        stragglers=tuple(stragglers))
