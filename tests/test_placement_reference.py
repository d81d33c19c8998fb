"""m-ETF and m-SCT against small reference implementations written from their descriptions.

The references below follow ``docs/placement.md`` ("The algorithms"; Hwang et al.'s ETF, Hanen
and Munier's favourite-child LP as Baechi uses it) with ample memory, in the plainest form:
every step recomputes every estimate from scratch, with no heaps, memos or clock. They take the
reduced problem the library placed (reduction is tested elsewhere) and must give the same
device to every op as ``place(..., "m-etf" | "m-sct")`` with default options, on seeded
layered DAGs, in both channel modes.
"""

from __future__ import annotations

import functools
import random
import statistics

import numpy as np
import pytest
from scipy.optimize import linprog

from trainsched import placement
from trainsched.cluster import cluster_from_flags
from trainsched.graph import Edge, Graph, Op, to_training
from trainsched.sim import predict_placement

place = functools.partial(placement.place, predict=predict_placement)

LATENCY_S, BANDWIDTH = 0.1, 100.0  # the clusters below: 10-300 B take 0.2-3.1 s


def layered_dag(seed: int, n: int) -> Graph:
    rng = random.Random(seed)
    layer = sorted(rng.randrange(max(1, n // 4)) for _ in range(n))
    ops = [Op(name=f"op{i:03d}", compute_s=rng.choice([0.5, 1.0, 2.0, 3.0]),
              param_bytes=rng.choice([0, 100]), output_bytes=rng.choice([50, 200]),
              group=f"g{rng.randrange(n // 3 + 1)}" if rng.random() < 0.15 else None)
           for i in range(n)]  # fmt: skip
    edges = []
    for j in range(n):
        for i in range(j):
            if layer[i] < layer[j] and rng.random() < 2.5 / max(1, j):
                edges.append(Edge(src=ops[i].name, dst=ops[j].name,
                                  size_bytes=rng.choice([10, 100, 300])))
    return Graph(ops, edges)


# --- the reference ------------------------------------------------------------------------------


class Reference:
    """ETF on a reduced problem: repeatedly start, among ready ops (all predecessors placed)
    and the devices their group allows, the pair with the smallest (est, topological index,
    device), at est = max(device free, data ready). Data ready appends the op's uncached inputs
    (by first reader among its members, producer's place in the order ops were started,
    tensor) to the channels: a transfer starts at max(producer end, its channels free) and
    takes latency + bytes / bandwidth (nothing for 0 bytes); sequential: one channel per
    device, held at both ends; parallel: one per directed pair. A tensor reaches a device once.
    With ``favourite`` (m-SCT): a device whose last op's favourite child f is ready, allowed
    there and starts there no later than anywhere else waits for f, or takes an urgent op (one
    whose latest est over its devices is no later than f's est there, taken at that time);
    device ties go to the reserved device."""

    def __init__(self, problem, m: int, sequential: bool, favourite=None) -> None:
        self.p, self.m, self.seq, self.fav = problem, m, sequential, favourite
        n = problem.n
        self.dev, self.start, self.end = [-1] * n, [0.0] * n, [0.0] * n
        self.free = [0.0] * m
        self.last = [-1] * m
        self.chan = {}  # channel -> free time
        self.arrival = {}  # (tensor, device) -> time
        self.started: list[int] = []
        self.group_dev = {}

    def channels(self, a: int, b: int) -> tuple:
        return (a, b) if self.seq else ((a, b),)

    def inputs(self, o: int) -> list:
        p = self.p
        ranks = p.input_rank[o]
        return [x for _, _, _, x in sorted((r, self.started.index(x[0]), x[1], x)
                                           for r, x in zip(ranks, p.inputs[o], strict=True))]

    def ready_time(self, o: int, d: int, commit: bool = False) -> float:
        chan = dict(self.chan)
        ready = 0.0
        for u, tid, size in self.inputs(o):
            if self.dev[u] == d:
                t = self.end[u]
            elif (tid, d) in self.arrival:
                t = self.arrival[tid, d]
            else:
                s = max([self.end[u], *(chan.get(c, 0.0) for c in self.channels(self.dev[u], d))])
                t = s + (LATENCY_S + size / BANDWIDTH if size else 0.0)
                for c in self.channels(self.dev[u], d):
                    chan[c] = t
                if commit:
                    self.arrival[tid, d] = t
            ready = max(ready, t)
        if commit:
            self.chan = chan
        return ready

    def est(self, o: int, d: int) -> float:
        return max(self.free[d], self.ready_time(o, d))

    def devices(self, o: int) -> list[int]:
        g = self.group_dev.get(self.p.group[o])
        return list(range(self.m)) if g is None else [g]

    def ready(self) -> list[int]:
        return [o for o in range(self.p.n) if self.dev[o] < 0
                and all(self.dev[u] >= 0 for u, _, _ in self.p.inputs[o])]

    def reserved(self, d: int, ready: list[int]) -> int:
        if self.fav is None or self.last[d] < 0:
            return -1
        f = self.fav[self.last[d]]
        if f < 0 or f not in ready or d not in self.devices(f):
            return -1
        mine = self.est(f, d)
        return f if all(self.est(f, x) >= mine for x in self.devices(f)) else -1

    def run(self) -> tuple[list[int], float]:
        while len(self.started) < self.p.n:
            ready = self.ready()
            best = None
            for d in range(self.m):
                f = self.reserved(d, ready)
                if f >= 0:
                    urgent = [(max(self.est(o, x) for x in self.devices(o)), o) for o in ready
                              if d in self.devices(o)]
                    choice = min([(self.est(f, d), f), *(u for u in urgent
                                                         if u[0] <= self.est(f, d))])
                else:
                    options = [(self.est(o, d), o) for o in ready if d in self.devices(o)]
                    if not options:
                        continue
                    choice = min(options)
                key = (choice[0], choice[1], choice[1] != f, d)
                best = key if best is None or key < best else best
            _, o, _, d = best
            start = self.est(o, d)
            self.ready_time(o, d, commit=True)
            self.dev[o], self.start[o], self.end[o] = d, start, start + self.p.compute_s[o]
            self.free[d], self.last[d] = self.end[o], o
            self.group_dev.setdefault(self.p.group[o], d)
            self.started.append(o)
        return self.dev, max(self.end)


def fewest_devices(problem, m: int, run) -> list[int]:
    """trainsched's rule around both placers: the shortest schedule on the first k devices,
    k = m, then 1, 2, 4, ... (ties: fewer), skipping a k whose lower bound is beaten."""
    work = sum(problem.compute_s)
    finish = [0.0] * problem.n
    for v in range(problem.n):
        finish[v] = problem.compute_s[v] + max((finish[u] for u, _, _ in problem.inputs[v]),
                                               default=0.0)
    critical = max(finish)
    best = None
    for k in [m, *sorted(2**i for i in range(m.bit_length()) if 2**i < m)]:
        if best is not None and best[0] < max(critical, work / k):
            continue
        devices, makespan = run(k)
        if best is None or (makespan, k) < best[:2]:
            best = (makespan, k, devices)
    return best[2]


def favourites(problem, m: int, threshold: float = 0.5) -> list[int]:
    """The favourite-child LP (minimise w: s_i + p_i + c_e x_e <= s_j per edge, at most one
    favourite child and parent per op, sinks end by w), then minimum Σ c_e x_e at that w,
    rounded: x_e <= θ candidates by (x, -c, parent, child), matched one-to-one."""
    c_pair = {}
    for v in range(problem.n):
        for u, _, size in problem.inputs[v]:
            c = LATENCY_S + size / BANDWIDTH if size and m > 1 else 0.0
            c_pair[u, v] = c_pair.get((u, v), 0.0) + c
    edges = sorted(c_pair)
    n, ne = problem.n, len(edges)
    scale = statistics.median(problem.compute_s)
    p = np.asarray(problem.compute_s) / scale
    cost = np.asarray([c_pair[e] for e in edges]) / scale
    rows, rhs = [], []

    def row(entries: dict[int, float], bound: float) -> None:
        r = np.zeros(n + ne + 1)
        for k, v in entries.items():
            r[k] = v
        rows.append(r)
        rhs.append(bound)

    for k, (u, v) in enumerate(edges):
        row({u: 1.0, v: -1.0, n + k: cost[k]}, -p[u])
    for side in (0, 1):
        groups = {}
        for k, e in enumerate(edges):
            groups.setdefault(e[side], []).append(k)
        for _, ks in sorted(groups.items()):
            if len(ks) >= 2:
                row({n + k: -1.0 for k in ks}, 1.0 - len(ks))
    for i in range(n):
        if not problem.successors[i]:
            row({i: 1.0, n + ne: -1.0}, -p[i])
    bounds = [(0, None)] * n + [(0, 1)] * ne + [(0, None)]
    objective = np.zeros(n + ne + 1)
    objective[-1] = 1.0
    first = linprog(objective, A_ub=np.array(rows), b_ub=rhs, bounds=bounds, method="highs")
    x = first.x
    if ne:
        w = first.x[-1]
        bounds[-1] = (0, w * (1 + 1e-9) + 1e-9)
        objective = np.concatenate([np.zeros(n), cost, [0.0]])
        second = linprog(objective, A_ub=np.array(rows), b_ub=rhs, bounds=bounds,
                         method="highs")
        x = second.x
    xs = x[n:n + ne]
    child, has_parent = [-1] * n, [False] * n
    for _, _, u, v in sorted((xs[k], -c_pair[e], *e) for k, e in enumerate(edges)
                             if xs[k] <= threshold + 1e-9):
        if child[u] < 0 and not has_parent[v]:
            child[u], has_parent[v] = v, True
    return child


def reference_devices(problem, m: int, sequential: bool, algorithm: str) -> list[int]:
    fav = favourites(problem, m) if algorithm == "m-sct" else None
    return fewest_devices(problem, m,
                          lambda k: Reference(problem, k, sequential, fav).run())


# --- the checks ---------------------------------------------------------------------------------


def cluster(m: int, comm: str):
    return cluster_from_flags(devices=m, memory="1TB", bandwidth=f"{BANDWIDTH:g}B/s",
                              latency=f"{LATENCY_S:g}s", comm=comm)


CASES = [(seed, n, m, comm) for seed, (n, m) in enumerate([(6, 2), (12, 3), (20, 4), (30, 2),
                                                            (40, 4), (25, 3)])
         for comm in ("parallel", "sequential")]


@pytest.mark.parametrize("algorithm", ["m-etf", "m-sct"])
@pytest.mark.parametrize(("seed", "n", "m", "comm"), CASES)
def test_placers_match_the_reference(algorithm, seed, n, m, comm):
    graph = layered_dag(seed, n)
    r = place(graph, cluster(m, comm), algorithm)
    devices = reference_devices(r.problem, m, comm == "sequential", algorithm)
    assert list(r.schedule.device) == devices


@pytest.mark.parametrize("algorithm", ["m-etf", "m-sct"])
@pytest.mark.parametrize("seed", range(4))
def test_placers_match_the_reference_on_training_graphs(algorithm, seed):
    graph = to_training(layered_dag(100 + seed, 16))
    r = place(graph, cluster(3, "sequential"), algorithm)
    devices = reference_devices(r.problem, 3, True, algorithm)
    assert list(r.schedule.device) == devices
