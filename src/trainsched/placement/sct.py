"""m-SCT: favourite children from a linear program, then m-ETF with reservations.

The LP (Hanen and Munier's relaxation, as Baechi uses it) on the reduced graph: a start s_i per
op, x_e ∈ [0, 1] per edge (0: the child runs on its parent's device, its communication is
free), the makespan w::

    minimise w  s.t.  s_i + p_i + c_e·x_e ≤ s_j           for every edge e = i→j
                      Σ_{e out of i} x_e ≥ outdeg(i) − 1   (at most one favourite child)
                      Σ_{e into j} x_e ≥ indeg(j) − 1      (at most one favourite parent)
                      s_i + p_i ≤ w                         for every sink

solved with HiGHS (``scipy.optimize.linprog``), times rescaled so the median compute is 1. The
LP is degenerate (x off the critical path is arbitrary), so a second solve keeps w ≤ w*(1+1e-9)
and minimises Σ c_e·x_e. Rounding: edges with x_e ≤ θ are candidates, taken in order of
(x_e, −c_e, parent, child) when neither the parent has a favourite child nor the child a
favourite parent yet, so each op has at most one of each. Scheduling: m-ETF, except that an
idle device whose last op's favourite child f is ready and starts there no later than anywhere
else waits for f, or takes an urgent op (one whose latest start over its devices has come).
w* bounds the optimum from below only when every c_e ≤ min p.
"""

from __future__ import annotations

import statistics

from trainsched.errors import TrainschedError
from trainsched.placement.model import Machine, PlacerSchedule, fewest_devices, run_schedule
from trainsched.placement.reduce import Problem

PHASE2_SLACK = 1e-9


def edge_costs(problem: Problem, machine: Machine) -> list[tuple[int, int, float]]:
    """(parent, child, c) per distinct pair: c is the time of its distinct tensors over an
    average link (one device: nothing to send)."""
    m = machine.num_devices
    pairs = [(a, b) for a in range(m) for b in range(m) if a != b]
    latency = sum(machine.latency_s[a][b] for a, b in pairs) / len(pairs) if pairs else 0.0
    per_byte = sum(1 / machine.bandwidth[a][b] for a, b in pairs) / len(pairs) if pairs else 0.0
    per_pair: dict[tuple[int, int], float] = {}
    for v in range(problem.n):
        for u, _, size in problem.inputs[v]:
            cost = latency + size * per_byte if size and pairs else 0.0
            per_pair[u, v] = per_pair.get((u, v), 0.0) + cost
    return [(u, v, c) for (u, v), c in sorted(per_pair.items())]


def solve_lp(problem: Problem, edges: list[tuple[int, int, float]]) -> tuple[float, list[float]]:
    """w* in seconds and x per edge (same order as ``edges``)."""
    import numpy as np  # here, not at import: the command line lists the placers without them
    from scipy.optimize import linprog
    from scipy.sparse import csr_array

    n, ne = problem.n, len(edges)
    p = np.asarray(problem.compute_s, dtype=float)
    if n == 0:
        return 0.0, []
    positive = [c for c in problem.compute_s if c > 0]
    scale = statistics.median(problem.compute_s) or (statistics.fmean(positive)
                                                      if positive else 1.0)
    ps = p / scale
    c = np.asarray([e[2] for e in edges], dtype=float) / scale
    w_col = n + ne
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    rhs: list[float] = []
    outs: dict[int, list[int]] = {}
    ins: dict[int, list[int]] = {}
    for k, (u, v, _) in enumerate(edges):
        r = len(rhs)
        rows += [r, r, r]
        cols += [u, v, n + k]
        vals += [1.0, -1.0, c[k]]
        rhs.append(-ps[u])
        outs.setdefault(u, []).append(k)
        ins.setdefault(v, []).append(k)
    for group in (outs, ins):
        for _, ks in sorted(group.items()):
            if len(ks) >= 2:
                r = len(rhs)
                rows += [r] * len(ks)
                cols += [n + k for k in ks]
                vals += [-1.0] * len(ks)
                rhs.append(1.0 - len(ks))
    for i in range(n):
        if not problem.successors[i]:
            r = len(rhs)
            rows += [r, r]
            cols += [i, w_col]
            vals += [1.0, -1.0]
            rhs.append(-ps[i])
    a_ub = csr_array((vals, (rows, cols)), shape=(len(rhs), w_col + 1))
    b_ub = np.asarray(rhs)
    bounds = np.zeros((w_col + 1, 2))
    bounds[:, 1] = np.inf
    bounds[n:w_col, 1] = 1.0
    objective = np.zeros(w_col + 1)
    objective[w_col] = 1.0
    first = linprog(objective, A_ub=a_ub, b_ub=b_ub, bounds=bounds, method="highs")
    if first.status != 0:
        raise TrainschedError(f"m-SCT's linear program failed: {first.message}")
    w_star = float(first.x[w_col])
    x = first.x
    if ne:
        bounds[w_col, 1] = w_star * (1 + PHASE2_SLACK) + PHASE2_SLACK
        objective = np.zeros(w_col + 1)
        objective[n:w_col] = c
        second = linprog(objective, A_ub=a_ub, b_ub=b_ub, bounds=bounds, method="highs")
        if second.status == 0:
            x = second.x
    return w_star * scale, [float(v) for v in x[n:w_col]]


def favourites(n: int, edges: list[tuple[int, int, float]], x: list[float],
               threshold: float) -> list[int]:
    """Round x: at most one favourite child per op and one favourite parent per op."""
    candidates = sorted((x[k], -c, u, v) for k, (u, v, c) in enumerate(edges)
                        if x[k] <= threshold + 1e-9)  # fmt: skip
    child = [-1] * n
    has_parent = [False] * n
    for _, _, u, v in candidates:
        if child[u] < 0 and not has_parent[v]:
            child[u] = v
            has_parent[v] = True
    return child


def m_sct(problem: Problem, machine: Machine, threshold: float = 0.5
          ) -> tuple[PlacerSchedule, float, list[int]]:
    """m-SCT's schedule, the LP value w* (seconds) and the favourite child of each op."""
    edges = edge_costs(problem, machine)
    w_star, x = solve_lp(problem, edges)
    fav = favourites(problem.n, edges, x, threshold)
    schedule = fewest_devices(machine, lambda on: run_schedule(problem, on, favourite=fav),
                              problem)
    return schedule, w_star, fav
