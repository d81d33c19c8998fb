"""Executors: lower a graph (and where its ops run) to engine tasks, run them, report.

- :func:`simulate_single` runs every op on one device's compute stream, in a given topological
  order (default: the graph's own, which keeps program order).
- :func:`simulate_placed` runs each op on the compute stream of the device a placement gives it
  (model parallelism), replaying one order: the placement's stored ``order`` (the order its
  placer ran the ops in), or without one the graph's topological order. Every edge between
  devices becomes a transfer of ``costs.p2p_s(size, cluster.link(src, dst))`` on the cluster's
  channels: with ``sequential`` communication it holds the sender's and the receiver's device
  channel together, with ``parallel`` communication the channel of its directed link. A tensor
  (an edge's ``tensor`` key) is sent to a device once, for its first consumer there in the
  order, with the largest size of its edges; later consumers there wait for that transfer.
  Compute and communication overlap.

  **The replay rule.** A device runs its ops strictly in the order: its next op starts when
  the device's previous op has ended and its inputs are there, and the device waits for it
  (idles) rather than run a later op first. A channel serves its transfers strictly in the
  order of the op each is made for (then the producer's position, then the tensor key): a
  transfer starts when its producer has ended and the channel's previous transfer has ended.
  This is how the placers build their schedules (:mod:`trainsched.placement.model`), so the
  replay of a placer's order reproduces its schedule, and how ``PlacedModule`` launches the
  ops, so the prediction is of the schedule that runs.

Memory (both executors, per device): ``param_bytes + buffer_bytes + optimizer_state_bytes`` of
its ops and the gradients its ``backward_weight`` ops produce (their ``output_bytes``) are
resident for the whole step. Every other op allocates its ``output_bytes`` when it starts and
frees them when all its consumers on that device and all transfers of its tensors from that
device have ended (an op with neither keeps them to the end); its ``temp_bytes`` live while it
runs. A received tensor is allocated on its destination when the transfer starts and freed when
its consumers there have ended.

Data-parallel and pipeline executors are to lower to the same :class:`TaskGraph` through the
same :class:`_Lowering` (streams, channels, transfers, allocations, results).
"""

from __future__ import annotations

import itertools
import operator
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy

from trainsched.cluster import Cluster
from trainsched.costs import p2p_s
from trainsched.errors import TrainschedError
from trainsched.graph import Graph, gc_paused
from trainsched.sim.engine import TaskGraph, run_tasks
from trainsched.sim.result import Allocation, Allocations, SimResult, build_result
from trainsched.trace import stream_name

__all__ = ["PHASES", "Progress", "priority_order", "simulate_placed", "simulate_single"]

#: ``progress(done, total, phase)``: how far a simulation is (``simulate_single(progress=)``).
Progress = Callable[[int, int, str], None]
#: The phases a simulation reports to ``progress``, in order.
PHASES = ("lowering", "replaying", "summarising")


def priority_order(graph: Graph) -> tuple[str, ...]:
    """A topological order that, among ready ops, takes the one with the longest remaining path
    (its own ``compute_s`` plus the longest chain after it) first, then the smallest name.

    It puts critical work first (``v:dX`` before ``v:dW``: backward flows on) and depends only
    on the graph's contents, never on the order it lists its ops, so a priority built from it
    gives the same schedule for any listing.
    """
    ops = graph.ops
    index = {op.name: i for i, op in enumerate(ops)}
    successors: list[list[int]] = [[] for _ in ops]
    for e in graph.edges:
        successors[index[e.src]].append(index[e.dst])
    remaining = {}
    for name in reversed(graph.topological_order()):
        i = index[name]
        remaining[name] = ops[i].compute_s + max(
            (remaining[ops[j].name] for j in successors[i]), default=0.0)
    return graph.ordered_by(lambda name: (-remaining[name], name))


def simulate_single(graph: Graph, cluster: Cluster | None = None, *, device: int = 0,
                    order: Sequence[str] | None = None,
                    allow_forward_only: bool = False,
                    progress: Progress | None = None) -> SimResult:
    """Every op of ``graph`` on one compute stream, in ``order`` (a topological order of all
    ops; default ``graph.topological_order()``). ``cluster`` gives the device's name and memory
    capacity (without one the device is ``device<k>`` and nothing is out of memory).

    ``graph`` is a training graph (:func:`trainsched.graph.to_training`); a forward-only graph
    is refused unless ``allow_forward_only`` says its forward pass is what to simulate.
    ``progress(done, total, phase)``, if given, hears each phase begin (:data:`PHASES`: a
    progress bar for a large graph) and the end (``done == total``)."""
    began = time.perf_counter()
    check_inputs(graph, cluster, "simulate_single", allow_forward_only=allow_forward_only)
    if cluster is not None:
        _check_device(cluster, device, "device")
    elif not (isinstance(device, int) and device >= 0):
        raise TrainschedError(f"device must be an index >= 0, got {device!r}")
    with gc_paused():
        return _simulate(graph, cluster, None, _positions(graph, order), [device], began, progress)


def simulate_placed(graph: Graph, cluster: Cluster, placement: Any, *,
                    order: Sequence[str] | None = None,
                    allow_forward_only: bool = False,
                    progress: Progress | None = None) -> SimResult:
    """Each op on the device ``placement`` gives it (a ``Mapping[str, int]`` from op name to
    device index, or an object with such a ``device_of``, such as a
    :class:`~trainsched.plan.Placement`), transfers between devices on the cluster's channels,
    replayed in one order (the module's replay rule): ``order`` (a topological order of all
    ops) if given, else the placement's stored ``order``, else ``graph.topological_order()``.
    ``allow_forward_only`` and ``progress``: as for :func:`simulate_single`."""
    began = time.perf_counter()
    check_inputs(graph, cluster, "simulate_placed", allow_forward_only=allow_forward_only)
    if cluster is None:
        raise TrainschedError("simulate_placed needs the cluster the placement's devices are "
                              "in")
    with gc_paused():
        device_of = _checked_placement(graph, cluster, placement)
        if order is None:
            order = getattr(placement, "order", None)
        return _simulate(graph, cluster, device_of, _positions(graph, order),
                         sorted(set(device_of.values())), began, progress)


def check_inputs(graph: Any, cluster: Any, where: str, *, allow_forward_only: bool) -> None:
    """Refuse what an executor cannot simulate: not a :class:`Graph` or :class:`Cluster`, or
    a forward-only graph where a training step is meant (it has no backward, no gradients)."""
    if not isinstance(graph, Graph):
        raise TrainschedError(f"{where} takes a trainsched.graph.Graph, got "
                              f"{type(graph).__name__} {graph!r:.60}")
    if cluster is not None and not isinstance(cluster, Cluster):
        raise TrainschedError(f"{where} takes a trainsched.cluster.Cluster "
                              f"(trainsched.cluster.resolve_cluster makes one from a preset "
                              f"name), got {type(cluster).__name__} {cluster!r:.60}")
    if not isinstance(allow_forward_only, bool):
        raise TrainschedError(f"allow_forward_only must be True or False, got "
                              f"{allow_forward_only!r}")
    if not allow_forward_only and graph.forward_only():
        raise TrainschedError(
            f"{where} simulates a training step, but graph "
            f"{graph.meta.get('model', '(unnamed)')!r} has forward ops only: call "
            f"trainsched.graph.to_training(graph) first (or use trainsched.sim.simulate, "
            f"which does), or pass allow_forward_only=True to simulate the forward pass alone")


def _check_device(cluster: Cluster, device: Any, where: str) -> None:
    if not (isinstance(device, int) and not isinstance(device, bool)
            and 0 <= device < cluster.num_devices):
        raise TrainschedError(f"{where}: device {device!r} is not a device of cluster "
                              f"{cluster.name!r} (0..{cluster.num_devices - 1})")


def _checked_placement(graph: Graph, cluster: Cluster, placement: Any) -> dict[str, int]:
    device_of = getattr(placement, "device_of", placement)
    if not isinstance(device_of, Mapping):
        raise TrainschedError(f"a placement maps op names to device indices, got "
                              f"{type(placement).__name__}")
    missing = [op.name for op in graph.ops if op.name not in device_of]
    if missing:
        raise TrainschedError(f"placement has no device for {len(missing)} op(s): "
                              f"{', '.join(missing[:5])}{', ...' if len(missing) > 5 else ''}")
    unknown = sorted(name for name in device_of if name not in graph)
    if unknown:
        raise TrainschedError(f"placement names {len(unknown)} op(s) not in the graph: "
                              f"{', '.join(unknown[:5])}{', ...' if len(unknown) > 5 else ''}")
    first_on = {}  # each device once, named by the first op placed on it
    for op in graph.ops:
        first_on.setdefault(device_of[op.name], op.name)
    for device, name in first_on.items():
        _check_device(cluster, device, f"placement of op {name!r}")
    return {op.name: device_of[op.name] for op in graph.ops}


def _checked_order(graph: Graph, order: Sequence[str]) -> tuple[str, ...]:
    order = tuple(order)
    position = {name: k for k, name in enumerate(order)}
    if len(position) != len(order) or len(order) != len(graph) or any(
            name not in graph for name in order):
        raise TrainschedError(f"order must list each of the graph's {len(graph)} ops once, got "
                              f"{len(order)} names ({len(position)} distinct)")
    for e in graph.edges:
        if position[e.src] > position[e.dst]:
            raise TrainschedError(f"order is not topological: {e.dst!r} comes before "
                                  f"{e.src!r}, which it depends on")
    return order


def _positions(graph: Graph, order: Sequence[str] | None) -> Sequence[int]:
    """The positions in ``graph.ops`` of the ops of ``order`` (checked: a topological order of
    all ops), or of the graph's own topological order."""
    if order is None:
        return graph.topological_indices()
    return list(map(graph.index, _checked_order(graph, order)))


class _Lowering:
    """One TaskGraph plus its allocations over the devices in use, numbered 0..D-1 here.

    Every executor builds its tasks through it: compute on a device's stream, transfers on the
    channels ``cluster.comm`` implies, then :meth:`run` for the :class:`SimResult`.
    """

    def __init__(self, cluster: Cluster | None, used: Sequence[int]) -> None:
        self.cluster = cluster
        self.used = tuple(used)  # local index -> cluster device index
        self.tasks = TaskGraph()
        self.allocations = Allocations()
        names = cluster.device_names() if cluster is not None else None
        self.names = [names[d] if names is not None else f"device{d}" for d in used]
        self.stream = [self.tasks.add_resource(stream_name(name, "compute"), device=k,
                                               kind="compute", policy="priority")
                       for k, name in enumerate(self.names)]  # fmt: skip
        self.stream_needs = [(x,) for x in self.stream]  # what a compute task needs, per device
        self.channels: dict[tuple[int, int], tuple[int, ...]] = {}  # (src, dst) -> resources
        self.device_channel: dict[int, int] = {}  # sequential: device -> its channel

    def add_channels(self, pairs: Sequence[tuple[int, int]]) -> None:
        """Channels for transfers between local device pairs (src, dst), per ``cluster.comm``:
        one per device, held at both ends (sequential), or one per directed pair (parallel).
        Pairs that have channels already keep them."""
        new = sorted(set(pairs) - set(self.channels))
        if not new:
            return
        assert self.cluster is not None
        if self.cluster.comm == "sequential":
            for d in sorted({d for pair in new for d in pair} - set(self.device_channel)):
                self.device_channel[d] = self.tasks.add_resource(
                    stream_name(self.names[d], "channel"), device=d, kind="channel")
            for a, b in new:
                self.channels[a, b] = (self.device_channel[a], self.device_channel[b])
        else:
            for a, b in new:
                self.channels[a, b] = (self.tasks.add_resource(
                    f"{self.names[a]}->{self.names[b]}", device=a, kind="channel"),)

    def compute(self, name: str, duration_s: float, device: int, *, priority: int,
                category: str, args: Mapping[str, Any]) -> int:
        """A task on ``device``'s compute stream."""
        return self.tasks.add_task(name, duration_s, (self.stream[device],), priority=priority,
                                   category=category, device=device, args=args)

    def transfer(self, tensor: str, size_bytes: int, src: int, dst: int, *,
                 priority: int) -> int:
        """``size_bytes`` of ``tensor`` from ``src`` to ``dst`` (local devices): α + S/B."""
        assert self.cluster is not None
        link = self.cluster.link(self.used[src], self.used[dst])
        return self.tasks.add_task(
            f"{tensor}->{self.names[dst]}", p2p_s(size_bytes, link), self.channels[src, dst],
            priority=priority, category="comm", device=dst,
            args={"tensor": tensor, "bytes": size_bytes, "src": self.names[src],
                  "dst": self.names[dst]},
        )  # fmt: skip

    def run(self, began: float, progress: Progress | None = None) -> SimResult:
        """Replay the tasks and summarise; ``began`` is when the executor was called;
        ``progress`` hears the phases (:data:`PHASES`) begin and end."""
        if progress is not None:
            progress(1, len(PHASES), PHASES[1])
        replay = run_tasks(self.tasks)
        if progress is not None:
            progress(2, len(PHASES), PHASES[2])
        capacity = self.cluster.device.memory_bytes if self.cluster is not None else None
        result = build_result(self.tasks, replay, devices=self.names,
                              allocations=self.allocations, memory_capacity_bytes=capacity,
                              wall_s=time.perf_counter() - began)  # fmt: skip
        if progress is not None:
            progress(len(PHASES), len(PHASES), "")
        return result


class OpArgs(Mapping[str, Any]):
    """The trace arguments of an op's compute task, ``{"op": name, "bytes": output_bytes}``,
    in two slots rather than a dict: a million-op replay holds one per task."""

    __slots__ = ("_bytes", "_op")

    def __init__(self, op: str, output_bytes: int) -> None:
        self._op = op
        self._bytes = output_bytes

    def __getitem__(self, key: str) -> Any:
        if key == "op":
            return self._op
        if key == "bytes":
            return self._bytes
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return iter(("op", "bytes"))

    def __len__(self) -> int:
        return 2


def _edges_in_order(graph: Graph, at: Sequence[int]
                    ) -> tuple[numpy.ndarray, list[int], list[int]]:
    """The graph's edges by producer, consumer and tensor (their positions in the order ``at``,
    positions in ``graph.ops``): an order that does not depend on how the graph lists them.
    Returns the edges' indices in that order (an array), and their producers' and consumers'
    positions."""
    n = len(at)
    src, dst = (numpy.array(ends, dtype=numpy.int64) for ends in graph.edge_ends())
    if not (isinstance(at, range) and at == range(n)):  # positions in the order, not in ops
        position = numpy.empty(n, dtype=numpy.int64)
        position[numpy.array(at, dtype=numpy.int64)] = numpy.arange(n, dtype=numpy.int64)
        src, dst = position[src], position[dst]
    keys = src * n + dst
    perm = numpy.argsort(keys, kind="stable")
    ordered = keys[perm]
    if len(ordered) > 1 and bool((ordered[1:] == ordered[:-1]).any()):
        # two edges between one pair: the tensor decides
        edges, a, b = graph.edges, src.tolist(), dst.tolist()
        order = numpy.array(sorted(range(len(edges)), key=lambda k: (a[k], b[k],
                                                                     edges[k].tensor)),
                            dtype=numpy.int64)
    else:
        order = perm
    return order, src[order].tolist(), dst[order].tolist()


def _simulate(graph: Graph, cluster: Cluster | None, device_of: Mapping[str, int] | None,
              at: Sequence[int], used: Sequence[int], began: float,
              progress: Progress | None = None) -> SimResult:
    """Lower ops (compute), edges (dependencies or transfers) and memory, then run: each
    device's ops and each channel's transfers chained in the order ``at`` (positions in
    ``graph.ops``; the replay rule). ``device_of`` None: every op on ``used[0]``."""
    if progress is not None:
        progress(0, len(PHASES), PHASES[0])
    low = _Lowering(cluster, used)
    local = {d: k for k, d in enumerate(used)}
    n = len(at)
    in_order = isinstance(at, range) and at == range(n)

    def column(field: str) -> list[Any]:  # the ops' values of one field, in the order at
        values = graph.column(field)
        return list(values) if in_order else list(map(values.__getitem__, at))

    order, kinds, outputs = column("name"), column("kind"), column("output_bytes")
    dev = [0] * n if device_of is None else [local[device_of[name]] for name in order]
    # The op at position k is task k.
    tasks = low.tasks
    tasks.add_tasks(order, column("compute_s"), list(map(low.stream_needs.__getitem__, dev)),
                    priorities=list(range(n)), categories=kinds,
                    devices=dev, args=list(map(OpArgs, order, outputs)))
    if len(used) == 1:  # one device: its ops chained in order
        tasks.add_dependencies(range(n - 1), range(1, n))
    else:
        last_on: dict[int, int] = {}  # device -> its previous op's task
        for t, d in enumerate(dev):
            if d in last_on:
                tasks.add_dependency(last_on[d], t)
            last_on[d] = t
    edge_order, src, dst = _edges_in_order(graph, at)
    edges = [] if len(used) == 1 else list(map(graph.edges.__getitem__, edge_order.tolist()))
    if len(used) > 1:
        low.add_channels([(dev[a], dev[b]) for a, b in zip(src, dst, strict=True)
                          if dev[a] != dev[b]])
    transfers: dict[tuple[int, str, int], int] = {}  # (producer, tensor, device) -> transfer
    users: list[list[int] | None] = [None] * n  # consumers on the producer's device
    sent: dict[int, list[int]] = {}  # producer -> its transfers
    received: dict[int, tuple[int, int, list[int]]] = {}  # transfer -> (device, bytes, consumers)
    queued: list[tuple[int, int, str, int]] = []  # (consumer, producer, tensor, transfer)
    size_of: dict[tuple[int, str], int] = {}  # one tensor, one size: the largest of its edges'
    if len(used) > 1:
        for e, a in zip(edges, src, strict=True):
            key = (a, e.tensor)
            size_of[key] = max(size_of.get(key, 0), e.size_bytes)
    local_src: list[int] = []
    local_dst: list[int] = []
    if len(used) == 1 and src:  # the chain in topological order implies every edge; a
        # producer's consumers: a run
        cuts = [0, *itertools.compress(range(1, len(src)),
                                       map(operator.ne, itertools.islice(src, 1, None), src)),
                len(src)]
        for first, last in itertools.pairwise(cuts):
            users[src[first]] = dst[first:last]
    for e, a, b in zip(edges, src, dst, strict=False):
        da, db = dev[a], dev[b]
        if da == db:
            local_src.append(a)
            local_dst.append(b)
            mine = users[a]
            if mine is None:
                users[a] = [b]
            else:
                mine.append(b)
            continue
        if local_src:  # keep the dependencies in edge order
            tasks.add_dependencies(local_src, local_dst)
            local_src, local_dst = [], []
        x = transfers.get((a, e.tensor, db))
        if x is None:  # the first edge carrying this tensor to db sends it; later ones reuse it
            size = size_of[a, e.tensor]
            x = low.transfer(e.tensor, size, da, db, priority=b)
            tasks.add_dependency(a, x)
            transfers[a, e.tensor, db] = x
            queued.append((b, a, e.tensor, x))
            sent.setdefault(a, []).append(x)
            received[x] = (db, size, [])
        tasks.add_dependency(x, b)
        received[x][2].append(b)
    tasks.add_dependencies(local_src, local_dst)
    last_transfer: dict[int, int] = {}  # channel resource -> its previous transfer
    for _, _, _, x in sorted(queued):
        for channel in tasks.needs[x]:
            if channel in last_transfer:
                tasks.add_dependency(last_transfer[channel], x)
            last_transfer[channel] = x

    resident = [0] * len(used)
    allocations = low.allocations
    gradient = list(map(operator.eq, kinds, itertools.repeat("backward_weight")))
    # What stays all step: parameters, buffers, optimizer state, and the gradients dW ops make.
    params, buffers, states = (column(f) for f in ("param_bytes", "buffer_bytes",
                                                   "optimizer_state_bytes"))
    if len(used) == 1:  # the same sums, added up in C
        resident[0] = (sum(params) + sum(buffers) + sum(states)
                       + sum(itertools.compress(outputs, gradient)))
    else:
        for d, p, b, st, out, grad in zip(dev, params, buffers, states, outputs, gradient,
                                          strict=True):
            held = p + b + st
            resident[d] += (held + out) if grad else held
    del params, buffers, states
    # The rest, in task order: its output (0 bytes changes nothing: not made), its workspace.
    temps = column("temp_bytes")
    made = [(out > 0 and not grad) or temp > 0
            for out, grad, temp in zip(outputs, gradient, temps, strict=True)]
    if len(used) == 1 and not any(temps):  # the usual one-device graph: outputs only, added
        ts = list(itertools.compress(range(n), made))  # as columns
        allocations.extend([0] * len(ts), list(map(outputs.__getitem__, ts)), ts,
                           [() if u is None else tuple(u) for u in map(users.__getitem__, ts)])
    else:
        for t in itertools.compress(range(n), made):
            d = dev[t]
            if outputs[t] and not gradient[t]:
                mine = users[t] or ()
                until = (*mine, *sent[t]) if t in sent else tuple(mine)
                allocations.add(d, outputs[t], t, until)
            if temps[t]:
                allocations.add(d, temps[t], t, (t,))
    for x, (dst_device, size, consumers) in received.items():
        allocations.append(Allocation(device=dst_device, size_bytes=size, at_task=x,
                                      until_tasks=tuple(consumers)))
    for d, b in enumerate(resident):
        allocations.append(Allocation(device=d, size_bytes=b))
    # What only the lowering needed goes before the replay: on a large graph, hundreds of MB.
    del kinds, edges, edge_order, src, dst, users, transfers, sent, received, size_of, outputs
    del gradient, temps, made
    return low.run(began, progress)
