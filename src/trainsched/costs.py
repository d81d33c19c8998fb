"""Closed-form cost models: how long an op computes and how long bytes take to move.

Plain formulas in seconds, shared by the placers and the simulator so that both charge the same
price (``specs/simulator.md`` §1.6 and §2.2). Communication uses the alpha-beta model: a message
of S bytes over a link of latency α and bandwidth B costs α + S/B. Collectives over n ranks give
each rank bandwidth B (its own link) and count α once per algorithm step.

Conventions: moving 0 bytes costs 0 s (there is no message, so no latency either); any
collective over one rank costs 0 s; an op with neither FLOPs nor bytes (a view) costs 0 s and
pays no launch overhead.
"""

from __future__ import annotations

import math
from functools import lru_cache

from trainsched.cluster import DeviceSpec, Link
from trainsched.errors import TrainschedError

__all__ = [
    "ALGORITHMS",
    "allgather_s",
    "binomial_tree_allreduce_s",
    "byteps_optimal_s",
    "expected_max_normal",
    "p2p_s",
    "parameter_server_s",
    "reduce_scatter_s",
    "ring_allreduce_nodes_s",
    "ring_allreduce_s",
    "roofline_s",
    "slowest_rank_factor",
    "tree_allreduce_s",
]

#: The all-reduce algorithms the collective costs model: ring, tree (recursive halving and
#: doubling), parameter servers (``ps``) and a node-local all-reduce before the servers
#: (``ps-local``).
ALGORITHMS = ("ring", "tree", "ps", "ps-local")


def _check(size_bytes: float, *counts: tuple[str, int, int]) -> None:
    if size_bytes < 0:
        raise TrainschedError(f"message size must be >= 0 bytes, got {size_bytes!r}")
    for name, value, minimum in counts:
        if value < minimum:
            raise TrainschedError(f"{name} must be >= {minimum}, got {value!r}")


def _log2_ceil(n: int) -> int:
    return (n - 1).bit_length()


def roofline_s(
    *,
    flops: float,
    bytes_accessed: float,
    device: DeviceSpec,
    dtype: str = "fp32",
    compute_efficiency: float = 0.75,
    memory_efficiency: float = 1.0,
) -> float:
    """``max(F / (η_c·peak[dtype]), Q / (η_m·bandwidth)) + launch``; 0 for a free op.

    The defaults follow PyTorch's ``RuntimeEstimator``: 75 % of peak compute, nominal bandwidth.
    """
    if flops < 0 or bytes_accessed < 0:
        raise TrainschedError(f"FLOPs and bytes must be >= 0, got {flops!r} and "
                              f"{bytes_accessed!r}")
    if not (0 < compute_efficiency <= 1 and 0 < memory_efficiency <= 1):
        raise TrainschedError(f"efficiencies must be in (0, 1], got {compute_efficiency!r} and "
                              f"{memory_efficiency!r}")
    if flops == 0 and bytes_accessed == 0:
        return 0.0
    compute_s = flops / (compute_efficiency * device.peak_flops(dtype))
    memory_s = bytes_accessed / (memory_efficiency * device.memory_bandwidth_bytes_per_s)
    return max(compute_s, memory_s) + device.launch_overhead_s


def p2p_s(size_bytes: float, link: Link) -> float:
    """One transfer: ``α + S/B``; 0 bytes cost nothing."""
    _check(size_bytes)
    if size_bytes == 0:
        return 0.0
    return link.latency_s + size_bytes / link.bandwidth_bytes_per_s


def ring_allreduce_s(size_bytes: float, n: int, link: Link) -> float:
    """Ring all-reduce: ``2(n−1)α + 2(n−1)/n · S/B``."""
    _check(size_bytes, ("n", n, 1))
    if n == 1 or size_bytes == 0:
        return 0.0
    return 2 * (n - 1) * link.latency_s + 2 * (n - 1) / n * size_bytes / link.bandwidth_bytes_per_s


def ring_allreduce_nodes_s(size_bytes: float, n: int, nodes: int, intra: Link,
                           cross: Link) -> float:
    """Ring all-reduce over n ranks laid out node by node on ``nodes`` nodes, ``cross`` the
    link of a hop between nodes: ``2(nodes−1)·α_cross + 2(n−nodes)·α_intra + 2(n−1)/n · S/B``,
    B the slower of the two bandwidths.

    A rank's step waits only for the chunk its ring neighbour sent the step before, so the
    latency that accumulates over the 2(n−1) steps is that of the hops along the ring, of
    which 2(nodes−1) cross the network (the count NCCL's tuning model uses for its ring), not
    2(n−1) times the slowest hop. One node: :func:`ring_allreduce_s` on ``intra``.
    """
    _check(size_bytes, ("n", n, 1), ("nodes", nodes, 1))
    if nodes > n:
        raise TrainschedError(f"{n} ranks cannot span {nodes} nodes")
    if nodes == 1:
        return ring_allreduce_s(size_bytes, n, intra)
    if size_bytes == 0:
        return 0.0
    bandwidth = min(intra.bandwidth_bytes_per_s, cross.bandwidth_bytes_per_s)
    return (2 * (nodes - 1) * cross.latency_s + 2 * (n - nodes) * intra.latency_s
            + 2 * (n - 1) / n * size_bytes / bandwidth)


def reduce_scatter_s(size_bytes: float, n: int, link: Link) -> float:
    """Ring reduce-scatter of S bytes: half a ring all-reduce, ``(n−1)α + (n−1)/n · S/B``."""
    return ring_allreduce_s(size_bytes, n, link) / 2


def allgather_s(size_bytes: float, n: int, link: Link) -> float:
    """Ring all-gather to S bytes in total: half a ring all-reduce."""
    return ring_allreduce_s(size_bytes, n, link) / 2


def tree_allreduce_s(size_bytes: float, n: int, link: Link) -> float:
    """Rabenseifner (reduce-scatter + all-gather by halving/doubling):
    ``2⌈log₂n⌉α + 2(n−1)/n · S/B``."""
    _check(size_bytes, ("n", n, 1))
    if n == 1 or size_bytes == 0:
        return 0.0
    return (2 * _log2_ceil(n) * link.latency_s
            + 2 * (n - 1) / n * size_bytes / link.bandwidth_bytes_per_s)


def binomial_tree_allreduce_s(size_bytes: float, n: int, link: Link) -> float:
    """Binomial-tree reduce then broadcast of the whole message: ``2⌈log₂n⌉(α + S/B)``."""
    _check(size_bytes, ("n", n, 1))
    if n == 1 or size_bytes == 0:
        return 0.0
    return 2 * _log2_ceil(n) * (link.latency_s + size_bytes / link.bandwidth_bytes_per_s)


def parameter_server_s(
    size_bytes: float, n_workers: int, n_servers: int, worker_link: Link, server_link: Link
) -> float:
    """Push then pull of S bytes between n workers and k servers holding 1/k of the model each.

    Each direction takes ``α + max(S/B_worker, n·S/(k·B_server))``: a worker moves its S bytes,
    a server moves n·S/k. α is the larger of the two links' latencies (each link's latency is an
    end-to-end figure, so a message is charged one, not the sum).
    """
    _check(size_bytes, ("n_workers", n_workers, 1), ("n_servers", n_servers, 1))
    if size_bytes == 0:
        return 0.0
    alpha = max(worker_link.latency_s, server_link.latency_s)
    one_way = alpha + max(size_bytes / worker_link.bandwidth_bytes_per_s,
                          n_workers * size_bytes / (n_servers * server_link.bandwidth_bytes_per_s))
    return 2 * one_way


def byteps_optimal_s(size_bytes: float, n: int, k: int, bandwidth_bytes_per_s: float) -> float:
    """BytePS's optimal all-reduce time with n workers and k extra CPU servers, bandwidth B each:
    ``2n(n−1)S / ((n² + kn − 2k)B)``; the ring bound 2(n−1)S/(nB) at k = 0, S/B at k = n.

    Bandwidth term only (no latency).
    """
    _check(size_bytes, ("n", n, 1), ("k", k, 0))
    if bandwidth_bytes_per_s <= 0:
        raise TrainschedError(f"bandwidth must be > 0, got {bandwidth_bytes_per_s!r}")
    if n == 1 or size_bytes == 0:
        return 0.0
    return 2 * n * (n - 1) * size_bytes / ((n * n + k * n - 2 * k) * bandwidth_bytes_per_s)


#: Simpson's rule for :func:`expected_max_normal`: the grid spacing and the half-width of the
#: range integrated (the density of the maximum of up to 10^9 normals is below 1e-30 outside).
_MAX_GRID_STEP = 1 / 256
_MAX_GRID_HALF_WIDTH = 12.0


def expected_max_normal(n: int) -> float:
    """E[max of ``n`` independent standard normals]: 0 for one, 1/√π for two, about 1.0294 for
    four and 1.4236 for eight.

    ``∫ x · n φ(x) Φ(x)^(n−1) dx`` by Simpson's rule on a fixed grid over [−12, 12] (spacing
    1/256): the same float operations in the same order every call, so the same bits.
    """
    if not (isinstance(n, int) and not isinstance(n, bool) and n >= 1):
        raise TrainschedError(f"the number of ranks must be an integer >= 1, got {n!r}")
    return 0.0 if n == 1 else _expected_max_normal(n)


@lru_cache(maxsize=256)
def _expected_max_normal(n: int) -> float:
    steps = int(2 * _MAX_GRID_HALF_WIDTH / _MAX_GRID_STEP)  # even
    total = 0.0
    for i in range(steps + 1):
        x = -_MAX_GRID_HALF_WIDTH + i * _MAX_GRID_STEP
        upper = 0.5 * math.erfc(x / math.sqrt(2))  # 1 − Φ(x), without cancellation
        log_cdf = math.log1p(-upper) if x > 0 else math.log(0.5 * math.erfc(-x / math.sqrt(2)))
        density = n * math.exp(-0.5 * x * x + (n - 1) * log_cdf) / math.sqrt(2 * math.pi)
        weight = 1 if i in (0, steps) else (4 if i % 2 else 2)
        total += weight * x * density
    return total * _MAX_GRID_STEP / 3


def slowest_rank_factor(step_cv: float, ranks: int) -> float:
    """How much longer a synchronous step computes than one rank's mean: ``1 + cv · E[max of
    ranks standard normals]``, each rank's step compute time normal with coefficient of
    variation ``step_cv``, independent across ranks, and the step waiting for the slowest.
    Exactly 1 for ``step_cv`` 0 or one rank."""
    if not (isinstance(step_cv, int | float) and not isinstance(step_cv, bool)
            and math.isfinite(step_cv) and step_cv >= 0):
        raise TrainschedError(f"step_cv must be a number >= 0, got {step_cv!r}")
    if step_cv == 0 or ranks == 1:
        return 1.0
    return 1.0 + step_cv * expected_max_normal(ranks)
