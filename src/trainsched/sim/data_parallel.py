"""Data parallelism: every rank runs the whole training graph; gradients are all-reduced.

:func:`simulate_data_parallel` lowers one step of ``ranks`` replicas to a task graph and
replays it:

- **Compute.** Rank r runs every op on device r's compute stream (``cluster`` device r), ready
  ops by their position in ``order`` (default the graph's topological order: program order,
  in-order backprop), durations times the rank's straggler factor.
- **Gradients.** The gradient of each ``backward_weight`` op is ready when that op ends;
  the policy (:mod:`trainsched.comm.policy`) groups gradients into collectives and sets the
  issue rule, the queue and the credit. A collective is *issued* at the rendezvous: when the
  last rank has all its members ready (and, with ``ordered_issue``, issued the one before it);
  it waits in the queue, is dispatched under the credit, and runs on every rank's channel at
  once, one collective at a time per channel, for ``collective_s(size, ranks)``.
- **Passes over the bytes.** ``comm.memory_passes(policy, collective)`` says which of two passes
  over a collective's bytes its runtime makes on the rank: one before it is issued (DDP's copy
  of each gradient into its bucket; the scheduled runtime's packing of a fused group) and one
  after it ends (DDP's copy back; the scheduled runtime's division by the world size). Each is
  a compute task of ``2 · size / memory bandwidth`` (read and write) on the rank's stream,
  ahead of waiting ops.
- **Host-driven communication.** With ``cluster.device.comm_compute_share`` = γ > 0, a
  collective that starts on the wire also puts a task of γ times its duration on each rank's
  compute stream, ahead of every op waiting there (it cannot preempt a running op): the CPU
  time a process that both computes and drives gloo loses to communication. γ = 0 (GPUs, the
  default) leaves compute untouched; γ = 1 makes communication and compute take turns.
  ``cluster.device.collective_host_s`` > 0 adds a fixed part to that task, on two or more
  ranks, whichever interference model the device has: the processor time each collective
  takes from its rank's compute however small its bytes (the dispatch, the transport's loop,
  the completion), so a plan of many small collectives pays for each on the compute stream.
- **Buffer sync.** A policy with ``buffer_sync`` (DDP's ``broadcast_buffers``) on a model
  with buffers (batch norm's running statistics) starts each step with a blocking broadcast
  of the buffers from rank 0: a ``buffer sync`` task on every rank's compute stream
  (:func:`buffer_sync_s`: the device's measured ``buffer_sync_s`` plus the buffers' bytes over
  the collective link), after every rank's step boundary (a rendezvous) and before the step's
  first ops. A device without ``buffer_sync_s`` (0, the default) charges nothing.
- **Collective after compute.** The first collective of each step to become ready (the one
  holding the gradient produced first) takes the device's ``collective_after_compute_s``
  longer than its α–β cost below, on two or more ranks, in place of the
  ``collective_overhead_s`` every later collective of the step pays: what a collective that
  starts as the ranks' compute ends pays beyond one timed from a barrier (``trainsched
  calibrate`` measures both, each as what it is charged for). 0, the default, charges
  nothing.
- **Optimizer.** Each optimizer op waits for the collectives holding its gradients
  (``cross_barrier``) or for all collectives (the baselines' barrier). Step time = last end.
- **Steps.** ``steps`` > 1 repeats the step: step s+1 starts once step s's backward has
  returned (with the barrier: once its optimizer has stepped too), a zero-time
  ``step boundary`` task per rank; each forward op of step s+1 also waits for the optimizer
  ops of its parameters in step s. So with ``cross_barrier`` layer 0's next forward runs while
  later layers' gradients are still being reduced (ByteScheduler's gain), and the step time is
  the steady period: the start of the last step's first op minus that of the step before.
  Collectives of step s queue before those of step s+1; issue order (DDP) runs on across
  steps. Without ``cross_barrier`` the period equals the one-step time.

**Wire.** A collective's cost is a start-up (``collective_startup_s``: the latency terms) plus
its bytes over the bandwidth, plus the device's ``collective_overhead_s`` (launch and
framework work per collective; the step's first collective pays ``collective_after_compute_s``
instead). The wire runs transfers one at a time in dispatch order. With
``startup_overlap`` a collective dispatched while others are in flight starts its start-up
under the transfer ahead of it (it begins that long before the one ahead ends); without it,
or with one collective in flight at a time, every collective starts when the one ahead ends.
A strict-credit policy with ``backfill`` dispatches the most urgent collective that fits when
the head of the queue does not (``comm.take_dispatchable``).

**By rate.** A device whose collectives and compute share it by rate
(``DeviceSpec.comm_by_rate``: a rate below 1, or several collective slots) replaces the FIFO
wire with a shared one (:class:`~trainsched.comm.dispatch.SharedWire`): up to
``collective_slots`` collectives in flight at once, and each representative's compute tasks
(ops, bucket copies, host tasks) and collective tasks form one coupling group
(:mod:`trainsched.sim.coupling`): compute runs at ``compute_rate_with_comm`` while one of its
collectives is in flight, a collective at ``comm_rate_with_compute`` while its rank computes,
and k collectives in flight at ``1 / (1 + collective_contention·(k − 1))`` each. The cost
above is then a collective's work at full rate, but for its overhead
(``collective_overhead_s``, or the first collective's ``collective_after_compute_s``) and its
start-up (:func:`collective_startup_s`, the latency terms): a delay at its start that no rate
stretches (on a host it is mostly waiting, and two collectives in flight wait side by side;
the rates and the contention are measured on collectives whose bytes dominate), the
collective counting as in flight meanwhile. So many small collectives in flight at once
overlap their latencies, and only their bytes share the wire.
``startup_overlap`` belongs to the FIFO wire and is refused here (several slots overlap
start-ups by themselves). A collective stretched
differently on two representatives (a straggler computes longer) frees its slot when it
ended on both.

**Slowest rank.** A device with ``step_cv`` > 0 (the coefficient of variation of one rank's
compute time per step, ``DeviceSpec``) stretches every op of every rank by
``costs.slowest_rank_factor(step_cv, ranks)`` = ``1 + step_cv · E[max of ranks standard
normals]``: each rank's step compute is one normal draw, independent across ranks and steps,
and a synchronous step runs at the pace of the slowest, so every rank is simulated as that
expected slowest one. The draw is per step, not per op: one factor for all the step's ops (the
rendezvous of each collective then sees the slowest rank's times; nothing compounds), the same
in every step (the expected maximum: deterministic). Bucket copies and host tasks are not
stretched. It multiplies the ``stragglers`` factors; one rank, or ``step_cv`` 0, is untouched.
A device with ``device_cv`` > 0 (a fixed spread of speed across devices of the kind) counts
the same way: each rank's step time is its device's draw plus its step's draw, so the factor
takes ``DeviceSpec.slowest_rank_cv`` = √(device_cv² + step_cv²) for ``step_cv``.

**Symmetry.** Ranks identical in device, costs, schedule and straggler state form a class
(:func:`rank_classes`); only one representative per class is simulated (the lowest rank), the
collective's rendezvous is the latest representative issue time and its cost uses all
``ranks``. 1,024 identical ranks cost one representative; one straggler makes two.
``expand=True`` simulates every rank (to check that collapsing changes nothing).

**Link.** All ranks on one node (``ranks <= devices_per_node``): the intra-node link. Else the
ring spans nodes and runs at the pace of its slowest hop: laid out node by node, one ring edge
leaves each node and one enters it, so the NIC carries one edge's traffic: bandwidth
``min(intra, NIC)``; latency ``max(intra, inter)`` for each of the 2(nodes−1) hops of the
2(n−1) steps that cross the network, the intra-node latency for the others
(``costs.ring_allreduce_nodes_s``). A tree (recursive halving and doubling) sends from every
device of a node across the network at once: ``min(intra, NIC / devices_per_node)``.
Parameter-server traffic leaves the node: ``ps`` gives each worker its NIC share
(intra-node link on a cluster of one node without an inter-node link), the server link
``cluster.ps_link``; ``ps-local`` first all-reduces inside each node (intra-node ring), then
each node pushes and pulls once over its whole NIC (no server traffic on one node).

**Replay.** The task graph is replayed by the engine (:func:`trainsched.sim.engine.run_tasks`)
like every executor's; the collectives' and host tasks go through an engine gate,
:class:`~trainsched.sim.dispatch_gate.DispatchGate`, which drives the runtime's dispatch core
(:class:`trainsched.comm.dispatch.Dispatcher`: issue, queue, credit, backfill) on a simulated
wire (:class:`trainsched.comm.dispatch.FifoWire`), so the dispatch rule is written once.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import time
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

from trainsched.cluster import Cluster, Link
from trainsched.comm.policy import (
    CommPolicy,
    check_plan,
    check_policy,
    comm_policy,
    gradient_tensors,
    gradients_with_sources,
    memory_passes,
)
from trainsched.costs import (
    ALGORITHMS,
    parameter_server_s,
    ring_allreduce_nodes_s,
    ring_allreduce_s,
    slowest_rank_factor,
    tree_allreduce_s,
)
from trainsched.errors import TrainschedError
from trainsched.graph import Graph, gc_paused
from trainsched.sim.coupling import couple_devices
from trainsched.sim.dispatch_gate import DispatchGate
from trainsched.sim.engine import run_tasks
from trainsched.sim.executors import (
    _checked_order,
    _Lowering,
    check_inputs,
    simulate_single,
)
from trainsched.sim.result import Allocation, SimResult, _merge, _subtract, build_result
from trainsched.units import is_int

__all__ = ["ALGORITHMS", "buffer_sync_s", "collective_link", "collective_s",
           "collective_startup_s", "crossing_bound_s", "rank_classes", "simulate_data_parallel"]

MIB = 1 << 20



def _check_ranks(cluster: Cluster, ranks: Any) -> None:
    if not (is_int(ranks) and ranks >= 1):
        raise TrainschedError(f"ranks must be an integer >= 1, got {ranks!r}")
    if ranks > cluster.num_devices:
        raise TrainschedError(
            f"{ranks} ranks need {ranks} devices, but cluster {cluster.name!r} has "
            f"{cluster.num_devices} ({cluster.num_nodes} node(s) of {cluster.devices_per_node}); "
            f"give it more nodes (cluster.with_nodes(n), or 'preset:n')")


def rank_classes(ranks: int, stragglers: Mapping[int, float] | None = None, *,
                 expand: bool = False) -> tuple[tuple[int, ...], ...]:
    """Ranks ``0..ranks-1`` grouped into classes of identical ranks: the same compute factor
    (1 unless ``stragglers`` maps the rank to a slowdown factor). Each class lists its ranks in
    order; classes come by their first rank (the representative). ``expand``: one class per
    rank."""
    if not (is_int(ranks) and ranks >= 1):
        raise TrainschedError(f"ranks must be an integer >= 1, got {ranks!r}")
    factor = _straggler_factors(ranks, stragglers)
    if expand:
        return tuple((r,) for r in range(ranks))
    groups: dict[float, list[int]] = {}
    for r in range(ranks):
        groups.setdefault(factor.get(r, 1.0), []).append(r)
    return tuple(sorted(tuple(members) for members in groups.values()))


def _straggler_factors(ranks: int, stragglers: Mapping[int, float] | None) -> dict[int, float]:
    """Rank -> compute factor for the ranks ``stragglers`` names, checked."""
    if stragglers is None:
        return {}
    if not isinstance(stragglers, Mapping):
        raise TrainschedError(f"stragglers maps ranks to slowdown factors, got "
                              f"{type(stragglers).__name__}")
    out = {}
    for rank, factor in stragglers.items():
        if not (is_int(rank) and 0 <= rank < ranks):
            raise TrainschedError(f"stragglers: rank {rank!r} is not one of the {ranks} ranks "
                                  f"(0..{ranks - 1})")
        number = isinstance(factor, numbers.Real) and not isinstance(factor, bool)
        if not (number and math.isfinite(factor) and factor > 0):
            raise TrainschedError(f"stragglers: rank {rank} needs a finite factor > 0 (compute "
                                  f"time multiplier), got {factor!r}")
        out[rank] = float(factor)
    return out


def collective_link(cluster: Cluster, ranks: int, algorithm: str = "ring") -> Link:
    """The link a collective over ranks ``0..ranks-1`` runs at (module docstring)."""
    _check_ranks(cluster, ranks)
    intra = cluster.collective_link
    if ranks <= cluster.devices_per_node:
        return intra
    inter = cluster.inter_node
    assert inter is not None  # more than one node always has an inter-node link
    nic = inter.bandwidth_bytes_per_s
    if algorithm != "ring":  # every device of a node crosses the network at once
        nic /= cluster.devices_per_node
    return Link(bandwidth_bytes_per_s=min(intra.bandwidth_bytes_per_s, nic),
                latency_s=max(intra.latency_s, inter.latency_s))


def _worker_link(cluster: Cluster) -> Link:
    """A worker's path to the parameter servers: its share of the node's NIC."""
    inter = cluster.inter_node
    if inter is None:
        return cluster.intra_node
    return Link(bandwidth_bytes_per_s=inter.bandwidth_bytes_per_s / cluster.devices_per_node,
                latency_s=inter.latency_s)


def collective_s(size_bytes: float, ranks: int, cluster: Cluster,
                 algorithm: str = "ring") -> float:
    """How long an all-reduce of ``size_bytes`` over ``ranks`` ranks takes: ring
    (``costs.ring_allreduce_s`` on one node, ``costs.ring_allreduce_nodes_s`` across nodes),
    tree (Rabenseifner, ``costs.tree_allreduce_s``), ``ps`` (every rank pushes and pulls
    through the cluster's parameter servers, ``costs.parameter_server_s``) or ``ps-local``
    (parameter servers with local aggregation: the ranks of a node all-reduce over the
    intra-node ring, then the node pushes and pulls once over its whole NIC; on one node the
    local all-reduce is all there is). One rank communicates nothing (0 s)."""
    if algorithm not in ALGORITHMS:
        raise TrainschedError(f"unknown collective algorithm {algorithm!r}; expected one of "
                              f"{', '.join(ALGORITHMS)}")
    _check_ranks(cluster, ranks)
    if ranks == 1:
        return 0.0
    per_node = cluster.devices_per_node
    nodes = -(-ranks // per_node)
    if algorithm in ("ps", "ps-local"):
        if cluster.parameter_servers == 0 or cluster.ps_link is None:
            raise TrainschedError(f"algorithm {algorithm!r} needs parameter servers, and "
                                  f"cluster {cluster.name!r} has none")
        if algorithm == "ps":
            return parameter_server_s(size_bytes, ranks, cluster.parameter_servers,
                                      _worker_link(cluster), cluster.ps_link)
        local = ring_allreduce_s(size_bytes, min(ranks, per_node), cluster.collective_link)
        if nodes == 1:
            return local
        assert cluster.inter_node is not None  # more than one node
        return local + parameter_server_s(size_bytes, nodes, cluster.parameter_servers,
                                          cluster.inter_node, cluster.ps_link)
    link = collective_link(cluster, ranks, algorithm)
    if algorithm == "tree":
        return tree_allreduce_s(size_bytes, ranks, link)
    return ring_allreduce_nodes_s(size_bytes, ranks, nodes, cluster.collective_link, link)


def buffer_sync_s(graph: Graph, cluster: Cluster, *, ranks: int, policy: CommPolicy) -> float:
    """Seconds DDP's buffer broadcast costs at the start of each step of ``graph`` on
    ``ranks`` ranks of ``cluster`` under ``policy``: the device's ``buffer_sync_s`` plus the
    forward ops' ``buffer_bytes`` over the collective link; 0 on one rank, under a policy
    without ``buffer_sync``, on a device without ``buffer_sync_s``, or for a model without
    buffers (DDP then broadcasts nothing)."""
    fixed = cluster.device.buffer_sync_s
    if ranks < 2 or not fixed or not getattr(policy, "buffer_sync", False):
        return 0.0
    size = sum(op.buffer_bytes for op in graph.ops if op.kind == "forward")
    if not size:
        return 0.0
    return fixed + size / collective_link(cluster, ranks).bandwidth_bytes_per_s


def collective_startup_s(ranks: int, cluster: Cluster, algorithm: str = "ring") -> float:
    """The start-up part of :func:`collective_s` for ``ranks`` and ``algorithm``: the time a
    collective takes beyond its bytes over the bandwidth (the per-hop or per-message
    latencies). Every cost model here is ``α + k·S`` for a size ``S > 0``, so
    ``α = 2·cost(S) − cost(2S)`` for any S; 0 for one rank."""
    one = collective_s(MIB, ranks, cluster, algorithm)
    return min(one, max(0.0, 2 * one - collective_s(2 * MIB, ranks, cluster, algorithm)))


def crossing_bound_s(graph: Graph, cluster: Cluster, *, ranks: int, algorithm: str = "ring",
                     order: Sequence[str] | None = None) -> tuple[float, str | None]:
    """The shortest steady step any communication policy can reach while every rank computes
    in ``order`` (a topological order; default program order, in-order backprop), from the
    loop every gradient closes: forward op f of step s starts, the ops up to its weight
    gradient's ``backward_weight`` op run, the gradient is all-reduced, f's optimizer ops
    update the parameter, and only then may f run in step s+1. So for gradient g of f

        step >= end(dW_g) - start(f) + collective_s(size_g) + U_f

    with start and end taken from one device computing in ``order`` without communication
    (:func:`simulate_single`) and U_f the longest optimizer op of f, both stretched by the
    slowest-rank factor of the device's ``slowest_rank_cv`` as the simulation stretches them. A
    policy changes when gradients are reduced, never what the compute stream runs between f
    and dW_g, so no policy beats it (tested on random graphs for every policy, credit,
    partition and start-up overlap); reordering the compute (out-of-order backprop) can.
    Returns the bound and the gradient that sets it (``(0.0, None)`` for one rank or a
    training graph without gradients; a forward-only graph is refused, as by
    :func:`simulate_data_parallel`).

    It says what no communication schedule can hide: a gradient ready last in backward and
    needed first in forward (BERT's word embedding) pays its whole all-reduce in every step.
    """
    check_inputs(graph, cluster, "crossing_bound_s", allow_forward_only=False)
    _check_ranks(cluster, ranks)
    if ranks == 1:
        return 0.0, None
    single = simulate_single(graph, order=order)
    stretch = slowest_rank_factor(cluster.device.slowest_rank_cv, ranks)  # as simulated
    start = {t.name: t.start_s for t in single.tasks}
    end = {t.name: t.end_s for t in single.tasks}
    updates: dict[str, float] = {}
    for op in graph.ops:
        if op.kind == "optimizer" and op.forward_op is not None:
            updates[op.forward_op] = max(updates.get(op.forward_op, 0.0), op.compute_s)
    best: tuple[float, str | None] = (0.0, None)
    for op in graph.ops:
        forward = op.forward_op
        if op.kind != "backward_weight" or forward not in start:
            continue
        # each tensor is reduced on its own (a tied reader's dW adds into its owner's: none)
        for name, size in gradient_tensors(graph, op) or ((f"{forward}:grad", 0),):
            chain = (stretch * (end[op.name] - start[forward])
                     + collective_s(size, ranks, cluster, algorithm)
                     + stretch * updates.get(forward, 0.0))
            if chain > best[0] or (chain == best[0] and best[1] is not None and name < best[1]):
                best = (chain, name)
    return best


def simulate_data_parallel(graph: Graph, cluster: Cluster, *, ranks: int,
                           policy: CommPolicy | str, algorithm: str = "ring",
                           stragglers: Mapping[int, float] | None = None, expand: bool = False,
                           order: Sequence[str] | None = None, steps: int = 1,
                           startup_overlap: bool = False) -> SimResult:
    """One data-parallel step of training graph ``graph`` over ``ranks`` ranks (rank r on
    device r of ``cluster``), gradients reduced as ``policy`` (a :class:`CommPolicy` or a
    registered name such as ``"fifo"``, ``"ddp"``) says with ``algorithm`` (``ring``, ``tree``,
    ``ps``). ``stragglers`` maps ranks to compute slowdown factors; the device's ``step_cv``
    and ``device_cv`` stretch every rank's compute by the slowest rank's expected factor
    (module docstring, *Slowest rank*). The result holds one representative rank per class
    (``expand=True``: every rank), named by its device. ``order`` (a topological order of all
    ops) sets the compute priority; default the graph's topological order.

    ``steps`` > 1 simulates that many consecutive steps, each layer's forward waiting for the
    update of its parameters in the step before (module docstring, *Steps*); the result holds
    every step's tasks, and its ``step_time_s`` is the period before the last step: when the
    first op of the last step started minus when that of the step before started (3 steps
    reach the steady state on the zoo models); ``busy_s``, ``idle_s`` and ``exposed_comm_s``
    are taken over that period, the rest over the whole run.

    ``startup_overlap``: collectives in flight together overlap the start-up latency of each
    with the transfer of the one before it on the wire (module docstring, *Wire*); off, every
    collective pays its whole start-up on a wire of its own."""
    began = time.perf_counter()
    check_inputs(graph, cluster, "simulate_data_parallel", allow_forward_only=False)
    if cluster is None:
        raise TrainschedError("simulate_data_parallel needs the cluster the ranks run on")
    if not isinstance(startup_overlap, bool):
        raise TrainschedError(f"startup_overlap must be True or False, got "
                              f"{startup_overlap!r}")
    _check_ranks(cluster, ranks)
    if not (is_int(steps) and steps >= 1):
        raise TrainschedError(f"steps must be an integer >= 1, got {steps!r}")
    if algorithm not in ALGORITHMS:
        raise TrainschedError(f"unknown collective algorithm {algorithm!r}; expected one of "
                              f"{', '.join(ALGORITHMS)}")
    by_rate = cluster.device.comm_by_rate
    if startup_overlap and by_rate:
        raise TrainschedError(
            f"startup_overlap is a rule of the FIFO wire, but cluster {cluster.name!r} runs "
            f"collectives by rate (device {cluster.device.kind}: compute_rate_with_comm "
            f"{cluster.device.compute_rate_with_comm:g}, comm_rate_with_compute "
            f"{cluster.device.comm_rate_with_compute:g}, collective_slots "
            f"{cluster.device.collective_slots}); drop startup_overlap (--startup-overlap) or "
            f"set those to 1 in the cluster file")
    if isinstance(policy, str):
        policy = comm_policy(policy)
    check_policy(policy)
    classes = rank_classes(ranks, stragglers, expand=expand)
    factor = _straggler_factors(ranks, stragglers)
    slowest = slowest_rank_factor(cluster.device.slowest_rank_cv, ranks)
    with gc_paused():
        order = graph.topological_order() if order is None else _checked_order(graph, order)
        gradients, sources = gradients_with_sources(graph, order)
        plan: tuple[Any, ...] = ()
        if ranks > 1:
            plan = tuple(policy.plan(gradients))
            check_plan(gradients, plan, f"comm policy {type(policy).__name__}")
        reps = [members[0] for members in classes]
        low = _Lowering(cluster, reps)
        lowered = _lower(low, graph, order, plan, gradients, sources, policy, algorithm, ranks,
                         [factor.get(r, 1.0) * slowest for r in reps], reps,
                         [len(m) for m in classes], steps)
        alpha = collective_startup_s(ranks, cluster, algorithm) if plan else 0.0
        if startup_overlap and plan:
            lowered.startups = [min(alpha, low.tasks.duration_s[row[0]])
                                for row in lowered.parts]  # fmt: skip
        slots = None
        if by_rate and plan:
            slots = cluster.device.collective_slots
            # the start-up, like the overhead, is a delay that no rate stretches
            fixed = {t: min(lowered.fixed_s.get(t, 0.0) + alpha, low.tasks.duration_s[t])
                     for row in lowered.parts for t in row}
            couple_devices(low.tasks, cluster.device, len(reps), fixed)
        gate = DispatchGate(low.tasks, policy, parts=lowered.parts, sizes=lowered.sizes,
                            priorities=lowered.priorities, steals=lowered.steals,
                            startups=lowered.startups, slots=slots)
        replay = run_tasks(low.tasks, (gate,))
        for c, row in enumerate(lowered.parts):
            for t in row:
                low.tasks.args[t].update(issued_s=gate.issued_s[c],
                                         dispatched_s=gate.dispatched_s[c])
        result = build_result(low.tasks, replay, devices=low.names,
                              allocations=low.allocations,
                              memory_capacity_bytes=cluster.device.memory_bytes,
                              wall_s=time.perf_counter() - began)  # fmt: skip
    if steps == 1:
        return result
    starts = [replay.start_s[t] for t in lowered.firsts]
    return _steady(result, starts[-2], starts[-1])


def _steady(result: SimResult, begin: float, end: float) -> SimResult:
    """``result`` of several steps, its per-step figures taken over the window [begin, end)
    (the last full period): ``step_time_s``, ``busy_s``/``idle_s`` and ``exposed_comm_s``.
    Tasks, memory, the critical path and the dependency bound stay those of the whole run."""
    def clip(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
        return [(max(a, begin), min(b, end)) for a, b in spans if a < end and b > begin]

    busy = dict.fromkeys(result.busy_s, 0.0)
    streams = {r.name for r in result.resources if r.kind == "compute"}
    channels = {r.name for r in result.resources if r.kind == "channel"}
    wire: dict[str, list[tuple[float, float]]] = {}  # collectives may overlap (start-up)
    comm: dict[str, list[tuple[float, float]]] = {}
    compute: dict[str, list[tuple[float, float]]] = {}
    for t in result.tasks:
        for a, b in clip([(t.start_s, t.end_s)]):
            for r in t.resources:
                if r in channels:
                    wire.setdefault(r, []).append((a, b))
                else:
                    busy[r] += b - a
        if t.category == "comm":
            comm.setdefault(t.device, []).append((t.start_s, t.end_s))
        if streams.intersection(t.resources):
            compute.setdefault(t.device, []).append((t.start_s, t.end_s))
    for r, spans in wire.items():
        busy[r] = math.fsum(b - a for a, b in _merge(spans))
    exposed: list[tuple[float, float]] = []
    for d in sorted(comm):
        exposed += _subtract(_merge(comm[d]), _merge(compute.get(d, [])))
    period = end - begin
    capacity = {r.name: r.capacity for r in result.resources}
    return dataclasses.replace(
        result, step_time_s=period, busy_s=MappingProxyType(busy),
        idle_s=MappingProxyType({r: capacity[r] * period - b for r, b in busy.items()}),
        exposed_comm_s=math.fsum(b - a for a, b in clip(_merge(exposed))))


class _Lowered:
    """What the dispatch gate needs beyond the task graph: per collective (all steps, in plan
    order) its task on each representative, its size, its ``(step, priority)`` queue key, its
    host tasks and start-up overlap; per step the first op's task (the period)."""

    def __init__(self) -> None:
        self.parts: list[list[int]] = []
        self.sizes: list[int] = []
        self.priorities: list[tuple[int, int]] = []
        self.steals: list[list[int]] = []  # per collective: its compute-stream task per rep
        self.after: list[int] = []  # per (collective, rep): the task that ends it there
        self.firsts: list[int] = []  # per step: the first op's task on the first rep
        self.startups: list[float] | None = None  # per collective: start-up that may overlap
        self.fixed_s: dict[int, float] = {}  # comm task -> its overhead (a delay, by rate)


def _lower(low: _Lowering, graph: Graph, order: Sequence[str], plan: Sequence[Any],
           gradients: Sequence[Any], sources: Sequence[str], policy: CommPolicy,
           algorithm: str, ranks: int,
           factors: Sequence[float], reps: Sequence[int], class_sizes: Sequence[int],
           steps: int = 1) -> _Lowered:
    tasks = low.tasks
    ops = [graph.op(name) for name in order]
    position = {name: k for k, name in enumerate(order)}
    pairs = sorted({(position[e.src], position[e.dst]) for e in graph.edges})
    users: list[list[int]] = [[] for _ in ops]
    has_pred = [False] * len(ops)
    for a, b in pairs:
        users[a].append(b)
        has_pred[b] = True
    # forward op -> its optimizer ops: the next step's forward reads the updated parameters
    updates: dict[str, list[int]] = {}
    for p, op in enumerate(ops):
        if op.kind == "optimizer" and op.forward_op in position:
            updates.setdefault(op.forward_op, []).append(p)
    channels = [tasks.add_resource(f"{name}/channel", device=k, kind="channel",
                                   policy=policy.queue)
                for k, name in enumerate(low.names)] if plan else []  # fmt: skip
    # gradient -> the position of its backward_weight op; that op -> its gradients
    grad_pos = {g.name: position[s] for g, s in zip(gradients, sources, strict=True)}
    grad_of_op: dict[str, list[str]] = {}
    for g, source in zip(gradients, sources, strict=True):
        grad_of_op.setdefault(source, []).append(g.name)
    holders: dict[str, list[int]] = {g.name: [] for g in gradients}  # gradient -> collectives
    for c, coll in enumerate(plan):
        for m in coll.members:
            holders[m].append(c)
    optimizers = [p for p, op in enumerate(ops) if op.kind == "optimizer"]
    out = _Lowered()
    share = low.cluster.device.comm_compute_share if low.cluster is not None else 0.0
    copy_bw = low.cluster.device.memory_bandwidth_bytes_per_s if low.cluster is not None else 0
    overhead = low.cluster.device.collective_overhead_s if low.cluster is not None else 0.0
    host_s = low.cluster.device.collective_host_s \
        if low.cluster is not None and ranks > 1 else 0.0
    n_ops, n_coll = len(ops), len(plan)
    # the first collective of a step to become ready starts as compute ends: it pays the
    # device's collective_after_compute_s beyond its alpha-beta cost, every later one the
    # collective_overhead_s
    after_s = low.cluster.device.collective_after_compute_s \
        if low.cluster is not None and ranks > 1 else 0.0
    first_c = min(range(n_coll), key=lambda c: min(grad_pos[m] for m in plan[c].members)) \
        if (after_s or overhead) and plan else -1
    fixed = [after_s if c == first_c else overhead for c in range(n_coll)]
    durations = [collective_s(coll.size_bytes, ranks, low.cluster, algorithm)
                 + (0.0 if c == first_c else overhead)
                 for c, coll in enumerate(plan)]  # fmt: skip
    passes = [memory_passes(policy, coll) if copy_bw else (False, False) for coll in plan]
    copy_s = [2 * coll.size_bytes / copy_bw if any(p) else 0.0  # read and write every byte
              for coll, p in zip(plan, passes, strict=True)]
    sync_s = buffer_sync_s(graph, low.cluster, ranks=ranks, policy=policy) \
        if low.cluster is not None else 0.0
    previous: list[int] = []  # per representative: the base task index of the step before

    for step in range(steps):
        base, boundaries = [], []
        for k, rank in enumerate(reps):
            f = factors[k]
            boundary = -1
            if step:  # the next step starts when backward returned (and, with the barrier,
                # the optimizer stepped): a zero-time task per rank
                boundary = tasks.add_task("step boundary", 0.0, (), priority=step * n_ops,
                                          category="barrier", device=k,
                                          args={"rank": rank, "step": step})
                for p, op in enumerate(ops):
                    if policy.cross_barrier is False or op.kind != "optimizer":
                        tasks.add_dependency(previous[k] + p, boundary)
                boundaries.append(boundary)
            first = len(tasks)
            for p, op in enumerate(ops):
                args = {"op": op.name, "bytes": op.output_bytes, "rank": rank,
                        "represents": class_sizes[k]}
                if steps > 1:
                    args["step"] = step
                low.compute(op.name, op.compute_s * f, k, priority=step * n_ops + p,
                            category=op.kind, args=args)
            for a, b in pairs:
                tasks.add_dependency(first + a, first + b)
            if step:
                for p, op in enumerate(ops):
                    if not has_pred[p]:
                        tasks.add_dependency(boundary, first + p)
                    for u in updates.get(op.name, ()) if op.kind == "forward" else ():
                        tasks.add_dependency(previous[k] + u, first + p)
            base.append(first)
            _allocate(low, ops, users, k, first, resident=step == 0)
        if sync_s:
            _buffer_sync(low, ops, has_pred, base, boundaries, reps, sync_s, step, n_ops)

        for c, coll in enumerate(plan):
            g = step * n_coll + c  # collectives of every step in one plan order
            duration = durations[c] + (after_s if c == first_c else 0.0)
            if share or host_s:
                out.steals.append([low.compute(f"{coll.name} (host)",
                                               share * durations[c] + host_s, k,
                                               priority=-1, category="comm-host",
                                               args={"collective": coll.name, "rank": rank})
                                   for k, rank in enumerate(reps)])  # fmt: skip
            row = []
            for k, rank in enumerate(reps):
                args = {"collective": coll.name, "bytes": coll.size_bytes,
                        "members": coll.members, "priority": coll.priority,
                        "algorithm": algorithm, "ranks": ranks, "rank": rank}
                if steps > 1:
                    args["step"] = step
                t = tasks.add_task(coll.name, duration, (channels[k],),
                                   priority=steps * n_ops + g, category="comm", device=k,
                                   args=args)  # fmt: skip
                if fixed[c]:
                    out.fixed_s[t] = fixed[c]
                out.after.append(t)
                before, after = passes[c]
                info = {"collective": coll.name, "bytes": coll.size_bytes, "rank": rank}
                if before:
                    into = low.compute(f"{coll.name} copy-in", copy_s[c], k, priority=-1,
                                       category="comm-copy", args=info)
                    for m in coll.members:
                        tasks.add_dependency(base[k] + grad_pos[m], into)
                    tasks.add_dependency(into, t)
                else:
                    for m in coll.members:
                        tasks.add_dependency(base[k] + grad_pos[m], t)
                if after:
                    back = low.compute(f"{coll.name} copy-out", copy_s[c], k, priority=-1,
                                       category="comm-copy", args=info)
                    tasks.add_dependency(t, back)
                    out.after[-1] = back
                row.append(t)
            out.parts.append(row)
            out.sizes.append(coll.size_bytes)
            out.priorities.append((step, coll.priority))

        # this step's collective c ends on representative k with task ended[c][k]
        ended = [out.after[(step * n_coll + c) * len(reps):][:len(reps)] for c in range(n_coll)]
        for k, rank in enumerate(reps):
            if not plan:
                break
            if policy.cross_barrier:
                for p in optimizers:
                    waits = sorted({c for pred in graph.predecessors(ops[p].name)
                                    for g in grad_of_op.get(pred, ())
                                    for c in holders[g]})  # fmt: skip
                    for c in waits:
                        tasks.add_dependency(ended[c][k], base[k] + p)
            else:
                args = {"rank": rank, "represents": class_sizes[k]}
                if steps > 1:
                    args["step"] = step
                barrier = tasks.add_task("barrier", 0.0, (), priority=steps * (n_ops + n_coll),
                                         category="barrier", device=k, args=args)
                for c in range(n_coll):
                    tasks.add_dependency(ended[c][k], barrier)
                for p in optimizers:
                    tasks.add_dependency(barrier, base[k] + p)
        out.firsts.append(base[0])
        previous = base
    return out


def _buffer_sync(low: _Lowering, ops: Sequence[Any], has_pred: Sequence[bool],
                 base: Sequence[int], boundaries: Sequence[int], reps: Sequence[int],
                 duration_s: float, step: int, n_ops: int) -> None:
    """Each representative's ``buffer sync`` task of ``step``: after every representative's
    step boundary (a broadcast waits for all ranks), before its step's first ops."""
    for k, rank in enumerate(reps):
        sync = low.compute("buffer sync", duration_s, k, priority=step * n_ops - 1,
                           category="buffer-sync", args={"rank": rank, "step": step})
        for boundary in boundaries:
            low.tasks.add_dependency(boundary, sync)
        for p, op in enumerate(ops):
            if not has_pred[p] and op.kind == "forward":
                low.tasks.add_dependency(sync, base[k] + p)


def _allocate(low: _Lowering, ops: Sequence[Any], users: Sequence[Sequence[int]], k: int,
              first: int, *, resident: bool = True) -> None:
    """Memory of representative k, by the rules of the other executors: parameters, buffers,
    optimizer state and gradients resident; outputs from their op's start to their last local
    consumer's end; workspace while the op runs. Collectives reduce in place (no buffers)."""
    resident_bytes = 0
    allocations = low.allocations
    for p, op in enumerate(ops):
        t = first + p
        resident_bytes += op.param_bytes + op.buffer_bytes + op.optimizer_state_bytes
        if op.kind == "backward_weight":
            resident_bytes += op.output_bytes
        elif op.output_bytes:
            allocations.append(Allocation(device=k, size_bytes=op.output_bytes, at_task=t,
                                          until_tasks=tuple(first + u for u in users[p])))
        if op.temp_bytes:
            allocations.append(Allocation(device=k, size_bytes=op.temp_bytes, at_task=t,
                                          until_tasks=(t,)))
    if resident:  # once per rank, however many steps
        allocations.append(Allocation(device=k, size_bytes=resident_bytes))
