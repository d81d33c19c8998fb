"""The placers' shared model: devices, channels, memory, and the clock loop of m-ETF.

:class:`Machine` is what a placer needs of a cluster: devices, usable memory, the cost of a
transfer between two devices, and how transfers contend (``sequential``: each device has one
channel for its sends and receives, a transfer holds both ends; ``parallel``: one channel per
directed pair, as the simulator models them). :func:`run_schedule` is the list scheduler every
dynamic placer shares (``specs/placement.md`` §2 and §4):

- **time**: op o starts on device d at ``est(o, d) = max(free_at(d), data_ready(o, d))``;
  ``data_ready`` takes, per input, the producer's end on d, the arrival of a copy already sent
  to d (caching per (tensor, device)), or a new transfer appended to a copy of the channel
  state, ordered by the member that first reads it (fused ops), the producer's position in the
  commit order, then tensor; commit replays the same appends, so estimate = outcome.
  Transfers are never back-filled: a channel serves them in commit order. Schedules are
  semi-active: a chosen op starts at its est even when chosen later (an m-SCT reservation
  that lapsed, an urgent op), unless memory held it back. So the commit order
  (``PlacerSchedule.sequence``), replayed with each device and channel strictly in that order
  (``trainsched.sim.simulate_placed``'s rule), reproduces the schedule.
- **choice**: among ready ops (all predecessors placed) and devices, the pair with the smallest
  (est, topological index, device) starts, unless memory says no (m-ETF); with ``fixed``
  devices it is a list schedule of a given placement; with ``favourite`` children it is m-SCT
  (device ties then go to the device reserved for the op). The topological index is the
  structural one of :func:`~trainsched.placement.reduce.structural_order`, never a name.
- **memory** (the simulator's accounting, so a replay agrees): a group's resident bytes are
  charged from the step's start, when its first op lands; an op allocates output + temp at
  its start and frees temp at its end; a copy is allocated on its destination when its
  transfer starts. An output is freed when all consumers on its device and all its transfers
  have ended, a copy when its consumers there have ended (known once every consumer is placed;
  a free in the past is applied to the past). (o, d) is feasible iff the device's level, from
  the earliest new transfer onwards, plus what o adds, stays within the device's capacity.
  Pairs that do not fit wait for a free on that device.

Estimates are memoised per (op, device) and invalidated by epochs of the channels they read.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from trainsched.cluster import Cluster
from trainsched.errors import TrainschedError
from trainsched.placement.memory import DeviceMemory
from trainsched.placement.reduce import Problem

__all__ = ["Machine", "PlacerSchedule", "Stall", "Transfer", "fewest_devices", "run_schedule"]


@dataclass(frozen=True, kw_only=True)
class Machine:
    """Devices as placers see them: capacity per device, links, contention mode."""

    names: tuple[str, ...]
    capacity: tuple[int, ...]  # usable bytes per device
    sequential: bool
    latency_s: tuple[tuple[float, ...], ...]  # [src][dst], 0 on the diagonal
    bandwidth: tuple[tuple[float, ...], ...]  # bytes/s, [src][dst]

    @property
    def num_devices(self) -> int:
        return len(self.names)

    @classmethod
    def from_cluster(cls, cluster: Cluster, *, memory_fraction: float = 1.0,
                     reserved_bytes: int = 0) -> Machine:
        """Usable memory ``memory_bytes × memory_fraction − reserved_bytes`` per device."""
        if not 0 < memory_fraction <= 1:
            raise TrainschedError(f"memory_fraction must be in (0, 1], got {memory_fraction!r}")
        cap = int(cluster.device.memory_bytes * memory_fraction) - int(reserved_bytes)
        if cap <= 0:
            raise TrainschedError(
                f"reserved_bytes {reserved_bytes} leaves no usable memory on a "
                f"{cluster.device.memory_bytes}-byte device")
        m = cluster.num_devices
        lat = [[0.0] * m for _ in range(m)]
        bw = [[1.0] * m for _ in range(m)]
        for a in range(m):
            for b in range(m):
                if a != b:
                    link = cluster.link(a, b)
                    lat[a][b], bw[a][b] = link.latency_s, link.bandwidth_bytes_per_s
        return cls(names=cluster.device_names(), capacity=(cap,) * m,
                   sequential=cluster.comm == "sequential",
                   latency_s=tuple(map(tuple, lat)), bandwidth=tuple(map(tuple, bw)))

    def first(self, k: int) -> Machine:
        """The same machine restricted to its first ``k`` devices."""
        return Machine(names=self.names[:k], capacity=self.capacity[:k],
                       sequential=self.sequential,
                       latency_s=tuple(row[:k] for row in self.latency_s[:k]),
                       bandwidth=tuple(row[:k] for row in self.bandwidth[:k]))

    def comm_s(self, size_bytes: int, src: int, dst: int) -> float:
        """``costs.p2p_s`` on the (src, dst) link: 0 for 0 bytes or the same device."""
        if size_bytes == 0 or src == dst:
            return 0.0
        return self.latency_s[src][dst] + size_bytes / self.bandwidth[src][dst]


@dataclass(frozen=True, kw_only=True)
class Transfer:
    """One copy of ``tensor`` (a Problem tensor index) from ``src`` to ``dst``."""

    tensor: int
    src: int
    dst: int
    size_bytes: int
    start_s: float
    end_s: float


@dataclass(frozen=True, kw_only=True)
class PlacerSchedule:
    """A placer's schedule of a Problem: device, start and end per op, transfers in commit
    order (each channel serves its transfers in this order), peak bytes per device."""

    device: tuple[int, ...]
    start_s: tuple[float, ...]
    end_s: tuple[float, ...]
    order: tuple[tuple[int, ...], ...]  # per device, ops in start order
    sequence: tuple[int, ...]  # every op, in the order the placer committed them
    transfers: tuple[Transfer, ...]
    peak_bytes: tuple[int, ...]
    makespan_s: float


class Stall(Exception):
    """No ready op fits anywhere and nothing will be freed: ``op`` (a Problem index) and the
    bytes it would need on the device where it came closest."""

    def __init__(self, op: int, needed_bytes: int) -> None:
        super().__init__(op, needed_bytes)
        self.op = op
        self.needed_bytes = needed_bytes


def fewest_devices(machine: Machine, schedule_on: Callable[[Machine], PlacerSchedule],
                   problem: Problem) -> PlacerSchedule:
    """The shortest of ``schedule_on`` over the first k devices, k = m and then 1, 2, 4, ...
    (ties: fewer devices), padded to all m devices. A greedy placer spreads work as soon as
    another device can start it sooner; when transfers cost more than the parallelism gains,
    fewer devices do better, and this finds it. A count whose lower bound max(critical path,
    work / k) is already beaten is skipped. Raises the :class:`Stall` of the full machine when
    no count fits."""
    m = machine.num_devices
    work = sum(problem.compute_s)
    critical = problem.critical_path_s()
    counts = [m, *sorted(2**i for i in range(m.bit_length()) if 2**i < m)]
    best: PlacerSchedule | None = None
    best_k = 0
    stall: Stall | None = None
    for k in counts:
        if best is not None and best.makespan_s < max(critical, work / k):
            continue
        try:
            schedule = schedule_on(machine.first(k))
        except Stall as exc:
            stall = stall or exc
            continue
        if best is None or (schedule.makespan_s, k) < (best.makespan_s, best_k):
            best, best_k = schedule, k
    if best is None:
        assert stall is not None
        raise stall
    pad = m - len(best.order)
    return dataclasses.replace(best, order=best.order + ((),) * pad,
                               peak_bytes=best.peak_bytes + (0,) * pad)


def run_schedule(problem: Problem, machine: Machine, *, fixed: Sequence[int] | None = None,
                 favourite: Sequence[int] | None = None) -> PlacerSchedule:
    """m-ETF on ``problem`` (see the module docstring); with ``fixed`` (a device per op) the
    list schedule of that placement; with ``favourite`` (a child per op, -1 for none) m-SCT's
    reservations. Raises :class:`Stall` when memory leaves nothing to start."""
    return _Scheduler(problem, machine, fixed, favourite).run()


class _Scheduler:
    def __init__(self, problem: Problem, machine: Machine, fixed: Sequence[int] | None,
                 favourite: Sequence[int] | None) -> None:
        p = problem
        n, m = p.n, machine.num_devices
        self.p, self.n, self.m = p, n, m
        self.seq = machine.sequential
        self.lat, self.bw = machine.latency_s, machine.bandwidth
        self.fixed = fixed
        self.fav = favourite
        self.dev = [-1] * n
        self.start = [0.0] * n
        self.end = [0.0] * n
        self.preds = [sorted({u for u, _, _ in ins}) for ins in p.inputs]
        self.npred = [len(x) for x in self.preds]
        self.nsucc = [len(s) for s in p.successors]
        self.srcdevs: list[tuple[int, ...]] = [()] * n
        self.tensors_of: list[list[int]] = [[] for _ in range(n)]
        for tid, u in enumerate(p.tensor_producer):
            self.tensors_of[u].append(tid)
        self.free_at = [0.0] * m
        self.order: list[list[int]] = [[] for _ in range(m)]
        self.sequence: list[int] = []  # ops in commit order
        self.position = [-1] * n  # index in sequence
        # Inputs of a ready op in the order its new transfers are appended: by the member that
        # first reads it (fused ops), the producer's position in the commit order, then tensor
        # (what a replay of the commit order, fused ops expanded, does).
        self.ins: list[tuple[tuple[int, int, int], ...]] = [() for _ in range(n)]
        self.last_op = [-1] * m
        self.chan = [0.0] * m if self.seq else [[0.0] * m for _ in range(m)]
        self.arrival: dict[int, float] = {}  # tensor * m + device -> arrival time
        self.copy_alloc: dict[int, int] = {}  # tensor * m + device -> allocation index
        self.sent_end = [-1.0] * n  # latest end of a transfer of an op's tensors
        self.transfers: list[Transfer] = []
        self.mem = DeviceMemory(machine.capacity)
        self.group_res = p.group_resident()
        self.group_dev = [-1] * len(p.group_ops)
        if fixed is not None:
            for i, d in enumerate(fixed):
                self.group_dev[p.group[i]] = d
        self.group_charged = [False] * len(p.group_ops)
        self.out_alloc = [-1] * n
        # Candidate heaps per device: A (data not ready by free_at: key data_ready), B (ready:
        # key topo index); tokens invalidate stale entries; blocked pairs wait for a free.
        self.A: list[list[tuple[float, int, int]]] = [[] for _ in range(m)]
        self.B: list[list[tuple[int, int]]] = [[] for _ in range(m)]
        self.tok = [0] * (n * m)
        self.blocked: list[list[int]] = [[] for _ in range(m)]
        self.is_blocked = bytearray(n * m)
        # Memoised data_ready per (op, device), valid while its channels' epochs are older.
        self.epoch = 0
        self.chan_ep = [0] * m  # sequential: a device's channel; parallel: transfers into it
        self.memo_v = [0.0] * (n * m)
        self.memo_e = [-1] * (n * m)
        # m-SCT: urgent ops (heap by the latest est over their devices), per device and free.
        # Urgent time = max(devices' free time F, data part D = max over devices of data ready).
        # Per heap (ops free to go anywhere; ops whose group is on d): A keyed by D (lower
        # bounds) for ops with D > F, B by topological index for ops with D <= F (all at F).
        self.gtok = [0] * n
        self.UA_free: list[tuple[float, int, int]] = []
        self.UB_free: list[tuple[int, int]] = []
        self.UA_dev: list[list[tuple[float, int, int]]] = [[] for _ in range(m)]
        self.UB_dev: list[list[tuple[int, int]]] = [[] for _ in range(m)]
        self.now = 0.0
        self.reserved = -1  # set by best_on

    # --- estimates -----------------------------------------------------------------------

    def data_ready(self, o: int, d: int, record: list | None = None) -> float:
        """When all of o's inputs can be on d; ``record`` gets the new transfers."""
        dev, end, m = self.dev, self.end, self.m
        arrival = self.arrival
        ready = 0.0
        over: dict[int, float] = {}
        seq = self.seq
        chan = self.chan
        for u, tid, size in self.ins[o]:
            du = dev[u]
            if du == d:
                a = end[u]
            else:
                a = arrival.get(tid * m + d)
                if a is None:
                    s = end[u]
                    if seq:
                        c = over[du] if du in over else chan[du]
                        if c > s:
                            s = c
                        c = over[d] if d in over else chan[d]
                        if c > s:
                            s = c
                    else:
                        c = over[du] if du in over else chan[du][d]
                        if c > s:
                            s = c
                    a = s if size == 0 else s + (self.lat[du][d] + size / self.bw[du][d])
                    over[du] = a
                    if seq:
                        over[d] = a
                    if record is not None:
                        record.append((tid, du, size, s, a))
            if a > ready:
                ready = a
        return ready

    def dr(self, o: int, d: int) -> float:
        """Memoised :meth:`data_ready`."""
        k = o * self.m + d
        e = self.memo_e[k]
        if e >= 0:
            ep = self.chan_ep
            valid = e >= ep[d]
            if valid and self.seq:
                for x in self.srcdevs[o]:
                    if ep[x] > e:
                        valid = False
                        break
            if valid:
                return self.memo_v[k]
        v = self.data_ready(o, d)
        self.memo_v[k] = v
        self.memo_e[k] = self.epoch
        return v

    def est(self, o: int, d: int) -> float:
        r = self.dr(o, d)
        f = self.free_at[d]
        return f if f > r else r

    def eligible(self, o: int, d: int) -> bool:
        g = self.group_dev[self.p.group[o]]
        return g < 0 or g == d

    # --- candidate heaps -----------------------------------------------------------------

    def push(self, o: int, d: int) -> None:
        k = o * self.m + d
        self.tok[k] += 1
        heapq.heappush(self.A[d], (self.dr(o, d), o, self.tok[k]))

    def push_urgent(self, o: int) -> None:
        self.gtok[o] += 1
        g = self.group_dev[self.p.group[o]]
        heap = self.UA_free if g < 0 else self.UA_dev[g]
        heapq.heappush(heap, (0.0, o, self.gtok[o]))

    def devices_for(self, o: int) -> range | tuple[int, ...]:
        g = self.group_dev[self.p.group[o]]
        return range(self.m) if g < 0 else (g,)

    def best_plain(self, d: int) -> tuple[float, int] | None:
        """The best (est, op) on d by (est, topo), keeping the heaps clean."""
        F = self.free_at[d]
        A, B = self.A[d], self.B[d]
        tok, dev, m = self.tok, self.dev, self.m
        pop, push = heapq.heappop, heapq.heappush
        while True:
            while A and A[0][0] <= F:
                _, o, t = pop(A)
                if tok[o * m + d] == t:
                    push(B, (o, t))
            while B:
                o, t = B[0]
                if tok[o * m + d] != t or dev[o] >= 0 or not self.eligible(o, d):
                    pop(B)
                    continue
                r = self.dr(o, d)
                if r > F:
                    pop(B)
                    push(A, (r, o, t))
                    continue
                return F, o
            moved = False
            while A:
                key, o, t = A[0]
                if tok[o * m + d] != t or dev[o] >= 0 or not self.eligible(o, d):
                    pop(A)
                    continue
                r = self.dr(o, d)
                if r != key:
                    heapq.heapreplace(A, (r, o, t))
                    if r <= F:
                        moved = True
                        break
                    continue
                return r, o
            if not moved:
                return None

    def urgent_data(self, o: int) -> float:
        """When o's inputs can be on every device it may go to (its urgent time is the later of
        this and those devices' free times)."""
        return max(self.dr(o, x) for x in self.devices_for(o))

    def best_urgent(self, d: int, bound: float) -> tuple[float, int] | None:
        """The ready op, placeable on d, that could start on every device soonest (its urgent
        time), with that time, if it is no later than ``bound``; ties by topological index."""
        best = None
        for free in (True, False):
            c = self.urgent_in(d, bound, free)
            if c is not None and (best is None or c < best):
                best = c
        return best

    def urgent_in(self, d: int, bound: float, free: bool) -> tuple[float, int] | None:
        if free:
            UA, UB, F = self.UA_free, self.UB_free, max(self.free_at)
        else:
            UA, UB, F = self.UA_dev[d], self.UB_dev[d], self.free_at[d]
        pop, push = heapq.heappop, heapq.heappush
        gtok, dev = self.gtok, self.dev

        def valid(o: int, t: int) -> bool:
            if gtok[o] != t or dev[o] >= 0:
                return False
            if free and self.group_dev[self.p.group[o]] >= 0:  # its group was placed: move it
                self.push_urgent(o)
                return False
            return True

        while UA and UA[0][0] <= F:
            _, o, t = pop(UA)
            if valid(o, t):
                push(UB, (o, t))
        while True:
            while UB:
                o, t = UB[0]
                if not valid(o, t):
                    pop(UB)
                    continue
                data = self.urgent_data(o)
                if data > F:
                    pop(UB)
                    push(UA, (data, o, t))
                    continue
                if bound < F or self.is_blocked[o * self.m + d]:
                    return None
                return F, o
            while UA and UA[0][0] <= bound:
                key, o, t = UA[0]
                if not valid(o, t):
                    pop(UA)
                    continue
                data = self.urgent_data(o)
                if data <= F:  # its data got ready sooner (a copy another op had sent)
                    pop(UA)
                    push(UB, (o, t))
                    break
                if data != key:
                    heapq.heapreplace(UA, (data, o, t))
                    continue
                return None if self.is_blocked[o * self.m + d] else (data, o)
            else:
                return None

    def reserved_for(self, d: int) -> int:
        """m-SCT: the favourite child d waits for, or -1."""
        last = self.last_op[d]
        if last < 0:
            return -1
        f = self.fav[last]
        if f < 0 or self.dev[f] >= 0 or self.npred[f] > 0 or not self.eligible(f, d) \
                or self.is_blocked[f * self.m + d]:
            return -1
        mine = self.est(f, d)
        for x in self.devices_for(f):
            if x != d and not self.is_blocked[f * self.m + x] and self.est(f, x) < mine:
                return -1
        return f

    def best_on(self, d: int) -> tuple[float, int] | None:
        """The op d would start next and when (its est, or for an urgent op its urgent time);
        sets :attr:`reserved` to the op d is reserved for (-1: none)."""
        self.reserved = -1
        if self.fav is not None:
            f = self.reserved_for(d)
            self.reserved = f
            if f >= 0:
                best = (self.est(f, d), f)
                urgent = self.best_urgent(d, best[0])
                if urgent is not None and urgent < best:
                    best = urgent
                return best
        return self.best_plain(d)

    # --- memory --------------------------------------------------------------------------

    def fits(self, o: int, d: int, record: list, start: float | None = None) -> bool:
        """Whether o, with the transfers in ``record``, fits on d now (or from ``start`` on, a
        time in the past: its output and temp then count from there, to the end)."""
        p = self.p
        g = p.group[o]
        extra_res = 0 if self.group_charged[g] else self.group_res[g]
        return self.mem.fits(d, p.output[o] + p.temp[o], [(s, size) for _, _, size, s, _ in record],
                             extra_res, start)

    def schedule_free(self, d: int, at_alloc: float, when: float, size: int, idx: int) -> None:
        if self.mem.free(d, at_alloc, when, size, idx, self.now):
            self.unblock(d)

    def apply_frees(self, upto: float, past_instant: bool) -> None:
        """Apply pending frees before ``upto``, and at ``upto`` those of earlier allocations
        (all of them when the clock moves past that instant)."""
        for d in self.mem.apply_frees(upto, past_instant):
            self.unblock(d)

    def unblock(self, d: int) -> None:
        if not self.blocked[d]:
            return
        waiting, self.blocked[d] = self.blocked[d], []
        for o in waiting:
            self.is_blocked[o * self.m + d] = 0
            if self.dev[o] < 0 and self.eligible(o, d):
                self.push(o, d)
                if self.fav is not None:
                    self.push_urgent(o)

    def block(self, o: int, d: int) -> None:
        k = o * self.m + d
        self.tok[k] += 1
        self.is_blocked[k] = 1
        self.blocked[d].append(o)

    def finalize(self, u: int) -> None:
        """Every consumer of u is placed: schedule the frees of its output and its copies."""
        p, dev, end = self.p, self.dev, self.end
        du = dev[u]
        last = self.sent_end[u]
        local = False
        for v in p.successors[u]:
            if dev[v] == du:
                local = True
                if end[v] > last:
                    last = end[v]
        if local or last >= 0:
            self.schedule_free(du, self.start[u], last, p.output[u], self.out_alloc[u])
        m = self.m
        for tid in self.tensors_of[u]:
            for x in range(m):
                idx = self.copy_alloc.get(tid * m + x)
                if idx is None:
                    continue
                when = max(end[v] for v in p.tensor_consumers[tid] if dev[v] == x)
                a = self.mem.allocs[idx]
                self.schedule_free(x, a[2], when, a[1], idx)

    # --- commit --------------------------------------------------------------------------

    def commit(self, o: int, d: int, t: float, record: list) -> None:
        p, m = self.p, self.m
        self.epoch += 1
        ep = self.epoch
        for tid, src, size, s, a in record:
            if self.seq:
                self.chan[src] = a
                self.chan[d] = a
                self.chan_ep[src] = ep
            else:
                self.chan[src][d] = a
            self.chan_ep[d] = ep
            self.arrival[tid * m + d] = a
            self.transfers.append(Transfer(tensor=tid, src=src, dst=d, size_bytes=size,
                                           start_s=s, end_s=a))
            u = p.tensor_producer[tid]
            if a > self.sent_end[u]:
                self.sent_end[u] = a
            self.copy_alloc[tid * m + d] = self.mem.allocate(d, size, s)
        g = p.group[o]
        if not self.group_charged[g]:
            self.group_charged[g] = True
            self.group_dev[g] = d
            self.mem.resident[d] += self.group_res[g]
        end = t + p.compute_s[o]
        self.dev[o] = d
        self.start[o] = t
        self.end[o] = end
        self.free_at[d] = end
        self.order[d].append(o)
        self.position[o] = len(self.sequence)
        self.sequence.append(o)
        self.last_op[d] = o
        self.out_alloc[o] = self.mem.allocate(d, p.output[o], t, together=p.temp[o])
        temp_idx = self.out_alloc[o] + 1
        self.schedule_free(d, t, end, p.temp[o], temp_idx)
        for u in self.preds[o]:
            self.nsucc[u] -= 1
            if self.nsucc[u] == 0:
                self.finalize(u)
        if self.nsucc[o] == 0:
            self.finalize(o)
        # Copies just sent to d may make other consumers' data ready sooner there.
        for tid, _, _, _, _ in record:
            for v in p.tensor_consumers[tid]:
                if v != o and self.npred[v] == 0 and self.dev[v] < 0 and self.eligible(v, d) \
                        and not self.is_blocked[v * m + d]:
                    self.push(v, d)
                    if self.fav is not None:
                        self.push_urgent(v)
        for v in p.successors[o]:
            self.npred[v] -= 1
            if self.npred[v] == 0:
                self.make_ready(v)

    def make_ready(self, v: int) -> None:
        position = self.position
        ins = self.p.inputs[v]
        ranks = self.p.input_rank[v] if self.p.input_rank else (0,) * len(ins)
        self.ins[v] = tuple(x for _, _, _, x in sorted(
            (r, position[x[0]], x[1], x) for r, x in zip(ranks, ins, strict=True)))
        self.srcdevs[v] = tuple(sorted({self.dev[u] for u in self.preds[v]}))
        targets = (self.fixed[v],) if self.fixed is not None else self.devices_for(v)
        for d in targets:
            self.push(v, d)
        if self.fav is not None:
            self.push_urgent(v)

    # --- the clock loop ------------------------------------------------------------------

    def run(self) -> PlacerSchedule:
        n, m = self.n, self.m
        for v in range(n):
            if self.npred[v] == 0:
                self.make_ready(v)
        placed = 0
        while placed < n:
            best = None
            best_reserved = -1
            for d in range(m):
                c = self.best_on(d)
                # Ties: the op's device reserved for it (m-SCT), then the lower index.
                if c is not None and (best is None or (c[0], c[1], c[1] != self.reserved, d)
                                      < (best[0], best[1], best[1] != best_reserved, best[2])):
                    best, best_reserved = (c[0], c[1], d), self.reserved
            pending = self.mem.pending
            if best is None:
                if not pending:
                    raise self.stall()
                self.now = max(self.now, pending[0][0])
                self.apply_frees(pending[0][0], past_instant=True)
                continue
            when = max(best[0], self.now)
            if pending and pending[0][0] < when:
                self.now = max(self.now, pending[0][0])
                self.apply_frees(pending[0][0], past_instant=True)
                continue
            if pending and pending[0][0] == when and pending[0][1] == 0:
                self.now = when
                self.apply_frees(when, past_instant=False)
                continue
            _, o, d = best
            self.now = when
            record: list = []
            self.data_ready(o, d, record)
            # Semi-active: the op starts as soon as its device and inputs allow (what a replay
            # of the orders does), even if it was chosen later (an m-SCT reservation that
            # lapsed, an urgent op), unless memory held it back until now.
            start = self.est(o, d)
            if start < when and self.fits(o, d, record, start):
                self.commit(o, d, start, record)
            elif self.fits(o, d, record):
                self.commit(o, d, when, record)
            else:
                self.block(o, d)
                continue
            placed += 1
        return self.result()

    def stall(self) -> Stall:
        """The first op (topologically) that waits on memory, with what it would need."""
        waiting = sorted({o for d in range(self.m) for o in self.blocked[d]})
        o = waiting[0] if waiting else next(i for i in range(self.n) if self.dev[i] < 0)
        p = self.p
        g = p.group[o]
        extra = 0 if self.group_charged[g] else self.group_res[g]
        need = min(self.mem.resident[d] + extra + self.mem.level[d] + p.output[o] + p.temp[o]
                   for d in self.devices_for(o))
        return Stall(o, need)

    def result(self) -> PlacerSchedule:
        peaks = self.mem.peaks()
        return PlacerSchedule(device=tuple(self.dev), start_s=tuple(self.start),
                              end_s=tuple(self.end), order=tuple(tuple(x) for x in self.order),
                              sequence=tuple(self.sequence), transfers=tuple(self.transfers),
                              peak_bytes=tuple(peaks), makespan_s=max(self.end, default=0.0))

