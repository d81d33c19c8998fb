"""Placers against the optimum found by brute force on small graphs (specs/placement.md §8).

The optimum is the best list schedule over every placement (up to relabelling the devices) and
every topological order in which ops are committed, in the placers' own model: parallel
channels (one per directed pair, serving transfers in commit order), one copy per (tensor,
device), equal devices, ample memory. Every placer's schedule is such a list schedule, or a
later one, so each must be no shorter than the optimum, and the optimum no shorter than
max(critical path, total work / m). m-ETF also meets Hwang et al.'s bound.
"""

from __future__ import annotations

import functools
import math
import random

import pytest

from trainsched import placement
from trainsched.cluster import cluster_from_flags
from trainsched.graph import Edge, Graph, Op
from trainsched.placement import PLACERS
from trainsched.placement.reduce import canonical_order
from trainsched.sim import predict_placement

SEEDS = range(30)

# place() as the command line and compare call it: predicted by the simulator
place = functools.partial(placement.place, predict=predict_placement)


def small_graph(seed: int) -> tuple[Graph, int]:
    rng = random.Random(seed)
    m = 2 + seed % 2
    n = 7
    names = [f"v{i}" for i in range(n)]
    ops = [Op(name=name, compute_s=float(rng.randint(1, 4))) for name in names]
    edges = []
    for j in range(1, n):
        for i in rng.sample(range(j), k=min(j, rng.randint(0, 2))):
            edges.append(Edge(src=names[i], dst=names[j],
                              size_bytes=rng.choice([0, 1, 2, 3]) * 10**9))
    return Graph(ops, edges), m


def optimum(graph: Graph, m: int, comm_s_per_byte: float) -> float:
    """Branch and bound over (ready op, device) commit sequences."""
    names = canonical_order(graph)
    index = {name: k for k, name in enumerate(names)}
    n = len(names)
    p = [graph.op(name).compute_s for name in names]
    inputs: list[list[tuple[int, str, int]]] = [[] for _ in range(n)]
    for e in graph.edges:
        inputs[index[e.dst]].append((index[e.src], e.tensor, e.size_bytes))
    for ins in inputs:
        ins.sort()
    preds = [{u for u, _, _ in ins} for ins in inputs]
    tail = [0.0] * n  # longest compute path from an op, itself included
    for k in reversed(range(n)):
        succ = [j for j in range(n) if k in preds[j]]
        tail[k] = p[k] + max((tail[j] for j in succ), default=0.0)
    best = [math.inf]

    def dfs(dev, end, free_at, chan, arrival, used, makespan, left):
        if not left:
            best[0] = min(best[0], makespan)
            return
        work = sum(p[k] for k in left)
        bound = max(makespan, (sum(free_at) + work) / m)
        for k in left:
            if all(dev[u] >= 0 for u in preds[k]):
                bound = max(bound, max((end[u] for u in preds[k]), default=0.0) + tail[k])
        if bound >= best[0]:
            return
        for k in sorted(left):
            if any(dev[u] < 0 for u in preds[k]):
                continue
            for d in range(min(used + 1, m)):
                ch, arr = dict(chan), dict(arrival)
                ready = free_at[d]
                for u, tensor, size in inputs[k]:
                    if dev[u] == d:
                        t = end[u]
                    elif (u, tensor, d) in arr:
                        t = arr[u, tensor, d]
                    else:
                        start = max(end[u], ch.get((dev[u], d), 0.0))
                        t = start + size * comm_s_per_byte
                        ch[dev[u], d] = t
                        arr[u, tensor, d] = t
                    ready = max(ready, t)
                dev2, end2, free2 = list(dev), list(end), list(free_at)
                dev2[k], end2[k] = d, ready + p[k]
                free2[d] = end2[k]
                dfs(dev2, end2, free2, ch, arr, max(used, d + 1), max(makespan, end2[k]),
                    left - {k})

    dfs([-1] * n, [0.0] * n, [0.0] * m, {}, {}, 0, 0.0, frozenset(range(n)))
    return best[0]


def longest_comm_chain(graph: Graph) -> float:
    """The largest total transfer time along any path (Hwang et al.'s C)."""
    order = canonical_order(graph)
    total = dict.fromkeys(order, 0.0)
    for name in order:
        for e in graph.out_edges(name):
            total[e.dst] = max(total[e.dst], total[name] + e.size_bytes / 1e9)
    return max(total.values())


def cluster(m: int):
    return cluster_from_flags(devices=m, memory="1TB", bandwidth="1GB/s", latency="0s")


@pytest.mark.parametrize("seed", SEEDS)
def test_every_placer_is_no_better_than_the_optimum(seed):
    graph, m = small_graph(seed)
    opt = optimum(graph, m, 1e-9)
    critical, _ = graph.critical_path()
    lower = max(critical, graph.totals().compute_s / m)
    assert opt >= lower - 1e-9
    for algorithm in PLACERS:
        r = place(graph, cluster(m), algorithm, coplacement=False, fusion=False)
        assert r.makespan_s >= opt - 1e-9, algorithm
        assert r.lower_bound_s == lower
    etf = place(graph, cluster(m), "m-etf", coplacement=False, fusion=False)
    free = Graph(graph.ops, [Edge(src=e.src, dst=e.dst, size_bytes=0) for e in graph.edges])
    opt_free = optimum(free, m, 0.0)
    assert etf.makespan_s <= (2 - 1 / m) * opt_free + longest_comm_chain(graph) + 1e-9


def test_the_optimum_is_found_on_a_known_case():
    # The diamond of the hand-solved tests: optimum 7 on two devices.
    graph = Graph([Op(name=n, compute_s=p) for n, p in (("a", 1.0), ("b", 4.0), ("c", 4.0),
                                                        ("d", 1.0))],
                  [Edge(src=a, dst=b, size_bytes=10**9) for a, b in
                   (("a", "b"), ("a", "c"), ("b", "d"), ("c", "d"))])
    assert optimum(graph, 2, 1e-9) == 7.0
    assert optimum(graph, 1, 1e-9) == 10.0


def test_lp_value_bounds_the_optimum_when_transfers_are_cheap():
    """w* ≤ optimum when every transfer costs at most the shortest op."""
    for seed in range(6):
        rng = random.Random(100 + seed)
        n = 6
        ops = [Op(name=f"v{i}", compute_s=float(rng.randint(2, 4))) for i in range(n)]
        edges = [Edge(src=f"v{i}", dst=f"v{j}", size_bytes=rng.choice([1, 2]) * 10**9)
                 for j in range(1, n) for i in range(j) if rng.random() < 0.4]
        graph = Graph(ops, edges)
        r = place(graph, cluster(2), "m-sct", coplacement=False, fusion=False)
        assert r.lp_value_s <= optimum(graph, 2, 1e-9) + 1e-6
