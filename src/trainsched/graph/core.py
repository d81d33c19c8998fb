"""Op, Edge, Graph: the computation graph that every policy and the simulator read.

A graph is a DAG of ops (units of computation with costs and memory sizes) joined by edges
(tensors passed from one op to another). Capture builds forward graphs;
:func:`trainsched.graph.training.to_training` turns them into training graphs. A Graph is
immutable and validated once, when it is built, so every consumer can trust it: unique names,
known kinds, finite non-negative numbers, edges between existing ops, no cycles. It round-trips
exactly through a versioned JSON file (:mod:`trainsched.graph.io`,
:mod:`trainsched.graph.compact`) whose fields are documented in ``docs/graph-format.md``.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import gc
import heapq
import itertools
import math
import operator
import os
from array import array
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import numpy

from trainsched.errors import TrainschedError
from trainsched.graph.fields import _FIELD_TYPES, OP_KINDS, _check_op, _check_sums, _number

#: A measured phase whose p90 exceeds this many times its p10 was disturbed while it was timed
#: (another process, a frequency change): capture times it again, ``show`` counts what is left.
SPREAD_LIMIT = 2.0

#: The key of ``graph.meta`` recording the trainable parameters of each forward op that owns
#: two or more (capture): op name -> ``[[parameter, bytes], ...]``, in the order the op reads
#: them, each named relative to the op's module (a coarsened op: its
#: members' records, ``member.parameter``). Each is a gradient tensor of its own
#: (:func:`trainsched.comm.policy.gradient_tensors`).
PARAM_TENSORS = "param_tensors"


def param_tensor_record(meta: Mapping[str, Any], op: str) -> list[tuple[str, int]] | None:
    """``meta[PARAM_TENSORS][op]`` as ``(parameter, bytes)`` pairs, ``None`` where there is none;
    a record of another shape (a graph file edited by hand) is a :class:`TrainschedError`."""
    record = meta.get(PARAM_TENSORS)
    if record is None:
        return None
    if not isinstance(record, Mapping):
        raise TrainschedError(f"graph meta {PARAM_TENSORS!r} must map op names to "
                              f"[[parameter, bytes], ...], got {record!r}; "
                              f"capture the model again or remove the entry")
    rows = record.get(op)
    if rows is None:
        return None
    if not (isinstance(rows, (list, tuple)) and all(
            isinstance(r, (list, tuple)) and len(r) == 2 and isinstance(r[0], str)
            and isinstance(r[1], int) and not isinstance(r[1], bool) and r[1] >= 0
            for r in rows)):
        raise TrainschedError(f"graph meta {PARAM_TENSORS!r}[{op!r}] must be a list of "
                              f"[parameter name, bytes >= 0] pairs, got {rows!r}; capture the "
                              f"model again or remove the entry")
    return [(name, size) for name, size in rows]


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector inside (restored after). Reading a large graph
    and lowering it for the simulator make millions of small objects and no reference cycles;
    the collector's passes over them would take about a third of the reading and half of the
    lowering."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@dataclass(frozen=True, kw_only=True, slots=True)
class Op:
    """One unit of computation: its identity, its cost and the memory it holds.

    Times are for the device the graph's ``meta`` describes; sizes are bytes. Validated on
    construction: a non-empty name, a known kind, finite non-negative numbers.
    """

    name: str
    kind: str = "forward"
    compute_s: float = 0.0
    flops: float = 0.0
    bytes_accessed: int = 0  # bytes read + written (roofline input)
    param_bytes: int = 0  # trainable parameters this op owns
    buffer_bytes: int = 0  # persistent non-trainable state (e.g. BN running stats)
    optimizer_state_bytes: int = 0
    output_bytes: int = 0  # bytes of the tensors it produces (allocated at start)
    temp_bytes: int = 0  # workspace alive only while it runs
    saved_bytes: int = 0  # activations autograd keeps for this op's backward
    group: str | None = None  # co-location group: ops with the same group share a device
    layer_index: int | None = None  # index among parameterised forward ops (comm priority)
    module_path: str = ""  # owning nn.Module, e.g. "layer1.0.conv1"
    target: str = ""  # what runs: an ATen op or a module type
    forward_op: str | None = None  # backward/optimizer ops: the forward op they derive from
    members: tuple[str, ...] = ()  # an op made by grouping: the op-level names it contains
    # Tied weights: the ops owning parameters this op also reads; its dW adds into their grads.
    tied_to: tuple[str, ...] = ()
    # Per-phase costs carried by forward ops (None = not known); the training transform reads them.
    backward_input_s: float | None = None
    backward_weight_s: float | None = None
    backward_input_flops: float | None = None
    backward_weight_flops: float | None = None
    # Spread of measured times (None unless measured; see SPREAD_LIMIT).
    compute_p10_s: float | None = None
    compute_p90_s: float | None = None
    backward_input_p10_s: float | None = None
    backward_input_p90_s: float | None = None
    backward_weight_p10_s: float | None = None
    backward_weight_p90_s: float | None = None
    samples: int = 0  # how many measured repeats the medians come from

    def __post_init__(self) -> None:
        _check_op(self)


@dataclass(frozen=True, kw_only=True, slots=True)
class Edge:
    """A tensor of ``size_bytes`` passed from op ``src`` to op ``dst``.

    ``tensor`` keys the tensor carried; several edges may carry one tensor (one output read by
    several consumers), and a device that received it once need not receive it again. An empty
    key means the producer's output and is normalised to ``src``.
    """

    src: str
    dst: str
    size_bytes: int
    tensor: str = ""

    def __post_init__(self) -> None:
        for field in ("src", "dst", "tensor"):
            if not isinstance(getattr(self, field), str):
                raise TrainschedError(
                    f"edge {self.src!r} -> {self.dst!r}: {field} must be a string, "
                    f"got {getattr(self, field)!r}"
                )
        if type(self.size_bytes) is not int or self.size_bytes < 0:
            owner = f"edge {self.src!r} -> {self.dst!r}"
            size = _number(owner, "size_bytes", self.size_bytes, True)
            object.__setattr__(self, "size_bytes", size)
        if not self.tensor:
            object.__setattr__(self, "tensor", self.src)


class _OpsToMake:
    """The ops of a graph a reader decoded into checked columns (field -> values, ``name``
    among them; a field left out has its default everywhere), made as Op records only when
    first asked for: a one-device simulation reads a few columns and never asks."""

    __slots__ = ("build", "columns", "count")

    def __init__(self, count: int, columns: dict[str, Any],
                 build: Callable[[int, dict[str, Any]], list[Op]]) -> None:
        self.count, self.columns, self.build = count, columns, build

    def column(self, field: str) -> tuple[Any, ...]:
        values = self.columns.get(field)
        if values is None:
            return (_OP_DEFAULTS[field],) * self.count
        if isinstance(_OP_DEFAULTS[field], tuple):  # a list of names per op: a tuple in an Op
            return tuple(map(tuple, values))
        return tuple(values)

    def make(self) -> list[Op]:
        return self.build(self.count, self.columns)

    def record(self, i: int) -> Op:
        """The Op record of op ``i`` alone."""
        return self.build(1, {field: [values[i]] for field, values in self.columns.items()})[0]


@dataclass(frozen=True, kw_only=True)
class GraphTotals:
    """Sums over a graph: op counts per kind, costs and sizes (see :meth:`Graph.totals`)."""

    num_ops: int
    ops_by_kind: Mapping[str, int]  # every kind of OP_KINDS, in that order (read-only)
    num_edges: int
    compute_s: float
    flops: float
    param_bytes: int
    buffer_bytes: int
    optimizer_state_bytes: int
    output_bytes: int
    saved_bytes: int
    edge_bytes: int  # sum of size_bytes over all edges


_OP_FIELDS = tuple(f.name for f in dataclasses.fields(Op))
_EDGE_FIELDS = tuple(f.name for f in dataclasses.fields(Edge))
#: Each Op field's default (the name, which has none: None).
_OP_DEFAULTS = {f.name: None if f.default is dataclasses.MISSING else f.default
                for f in dataclasses.fields(Op)}
assert set(_FIELD_TYPES) == set(_OP_FIELDS)
_src_of = operator.attrgetter("src")
_dst_of = operator.attrgetter("dst")


class _Adjacency:
    """Per op, the edges at one of its ends (into it, or out of it) in edge order: two flat
    arrays of machine integers (offsets per op, edge indices) rather than a list per op, which
    on a graph of a million ops saves hundreds of MB."""

    __slots__ = ("at", "edges")

    def __init__(self, ends: Sequence[int], count: int) -> None:
        """``ends[k]``: the op at this end of edge k; ``count``: the number of ops."""
        x = numpy.asarray(ends, dtype=numpy.int64)
        at = numpy.zeros(count + 1, dtype=numpy.int64)
        numpy.cumsum(numpy.bincount(x, minlength=count), out=at[1:])
        # a stable sort by op keeps edge order within an op (a counting sort, done in C)
        order = numpy.argsort(x, kind="stable")
        self.at = array("q", at.tobytes())
        self.edges = array("q", order.astype(numpy.int64).tobytes())

    def __getitem__(self, i: int) -> array[int]:
        return self.edges[self.at[i] : self.at[i + 1]]

    def degrees(self) -> list[int]:
        """Per op, how many edges."""
        at = self.at
        return list(map(operator.sub, itertools.islice(at, 1, None), at))


class _EdgesToMake:
    """Edges a reader has checked (ends, sizes, keys) but not yet made into :class:`Edge`
    records: ``len()`` and ``make()`` (the records, in order). A graph built from one (by
    :meth:`Graph._with_ends`) makes them the first time its edges are read: a simulation of a
    million-op graph never reads them, and 1.6 million records cost a second to make."""

    __slots__ = ()

    def __len__(self) -> int:
        raise NotImplementedError

    def make(self) -> list[Edge]:
        raise NotImplementedError

    def size_bytes(self) -> int:
        """The edges' sizes, summed."""
        raise NotImplementedError


class Graph:
    """An immutable, validated DAG of ops and edges, plus provenance ``meta``.

    The constructor checks op names, edge ends, duplicate edges and cycles (reporting one cycle
    in order). Queries by name are O(1) or O(degree); orders are deterministic: ties break on the
    position in ``ops``.
    """

    __slots__ = ("_dst", "_edges", "_in", "_index", "_lazy", "_meta", "_ops", "_out", "_src",
                 "_topo")

    def __init__(
        self, ops: Iterable[Op], edges: Iterable[Edge], meta: Mapping[str, Any] | None = None
    ) -> None:
        self._build(ops, edges, meta, None)

    @classmethod
    def _with_ends(cls, ops: Iterable[Op], edges: Iterable[Edge] | _EdgesToMake,
                   meta: Mapping[str, Any],
                   src: Sequence[int], dst: Sequence[int], *, sums_fit: bool = False) -> Graph:
        """``Graph(ops, edges, meta)`` where edge k is known to run from ``ops[src[k]]`` to
        ``ops[dst[k]]`` (a reader that has the positions already); checked all the same, but
        for the summed costs and sizes when ``sums_fit`` says the reader found them finite
        (``trainsched.graph.fields._sums_fit`` over its columns)."""
        graph = cls.__new__(cls)
        graph._build(ops, edges, meta, (src, dst), sums_fit=sums_fit)
        return graph

    def _build(self, ops: Iterable[Op], edges: Iterable[Edge] | _EdgesToMake,
               meta: Mapping[str, Any] | None, ends: tuple[Sequence[int], Sequence[int]] | None, *,
               sums_fit: bool = False) -> None:
        # (ops to make come from a reader, with their ends: checked as columns)
        assert not isinstance(ops, _OpsToMake) or ends is not None
        self._lazy: _OpsToMake | None = ops if isinstance(ops, _OpsToMake) else None
        self._ops: tuple[Op, ...] | None = None if self._lazy is not None else tuple(ops)
        # (edges to make come with their ends: checked without the records)
        assert not isinstance(edges, _EdgesToMake) or ends is not None
        self._edges: tuple[Edge, ...] | _EdgesToMake = (
            edges if isinstance(edges, _EdgesToMake) else tuple(edges))
        self._meta: dict[str, Any] = copy.deepcopy(dict(meta or {}))
        count = len(self)
        if self._ops is not None and not all(map(isinstance, self._ops, itertools.repeat(Op))):
            i = next(i for i, op in enumerate(self._ops) if not isinstance(op, Op))
            raise TrainschedError(f"ops[{i}] is a {type(self._ops[i]).__name__}, not an Op")
        # Built in C; a repeated name keeps its last position, but then the graph is refused.
        # With the edges' ends known (a reader), the index by name waits until it is asked for
        # (a simulation never does): a set of the names finds repeats for a third of the cost.
        self._index: dict[str, int] | None = None
        names = self.column("name")
        if ends is None:
            self._index = dict(zip(names, range(count), strict=True))
        if len(self._index if ends is None else set(names)) < count:
            counts = Counter(names)
            repeated = ", ".join(repr(name) for name, n in counts.items() if n > 1)
            raise TrainschedError(f"duplicate op names: {repeated}; every op needs a unique "
                                  f"name")
        if not sums_fit:
            _check_sums(self.ops, self._edge_records())
        # Per edge the positions of its ends; per op the edges into and out of it.
        self._src: list[int] = []
        self._dst: list[int] = []
        self._link_edges(ends)
        self._topo: Sequence[int] = self._sort()

    def _link_edges(self, ends: tuple[Sequence[int], Sequence[int]] | None) -> None:
        """Positions of every edge's ends (``ends`` when known) and the per-op edge lists; the
        first problem in edge order (not an Edge, an unknown end, a self-loop, a duplicate) is
        an error."""
        index, edges = self._index, self._edges
        try:  # the common case, every end known, in C
            if type(edges) is tuple and not all(map(isinstance, edges,
                                                    itertools.repeat(Edge))):
                raise KeyError
            if ends is not None:  # ints shared by all the ends rather than one per end
                arrays = tuple(numpy.asarray(e, dtype=numpy.int64) for e in ends)
                at = list(range(len(self)))
                self._src = list(map(at.__getitem__, arrays[0].tolist()))
                self._dst = list(map(at.__getitem__, arrays[1].tolist()))
                loop = bool((arrays[0] == arrays[1]).any())
            else:
                assert index is not None
                self._src = list(map(index.__getitem__, map(_src_of, edges)))
                self._dst = list(map(index.__getitem__, map(_dst_of, edges)))
                loop = any(map(operator.eq, self._src, self._dst))
        except (KeyError, TypeError):
            loop = True
        if loop:  # find the first problem, one edge at a time
            self._src, self._dst = [], []
            bad = self._first_bad_edge()
        else:
            bad = len(edges)
        if ends is None or loop:
            arrays = tuple(numpy.array(e, dtype=numpy.int64) for e in (self._src, self._dst))
        self._in = _Adjacency(arrays[1], len(self))
        self._out = _Adjacency(arrays[0], len(self))
        twins = self._first_duplicate(bad, arrays)
        if twins is not None:
            first, k = twins
            e = self._edge_records()[k]
            raise TrainschedError(
                f"edges[{first}] and edges[{k}] are duplicates: {e.src!r} -> {e.dst!r} "
                f"carrying tensor {e.tensor!r}"
            )
        if bad < len(edges):
            e = self._edge_records()[bad]
            if not isinstance(e, Edge):
                raise TrainschedError(f"edges[{bad}] is a {type(e).__name__}, not an Edge")
            raise TrainschedError(self._edge_problem(bad, e))

    def _first_bad_edge(self) -> int:
        """Fill ``_src`` and ``_dst`` up to the first edge that is not an Edge or has a bad end
        (unknown, a self-loop); its index (``len(edges)`` if none)."""
        index, edges, src, dst = self._names(), self._edge_records(), self._src, self._dst
        for k, e in enumerate(edges):
            if type(e) is not Edge and not isinstance(e, Edge):
                return k
            a = index.get(e.src)
            b = index.get(e.dst)
            if a is None or b is None or a == b:
                return k
            src.append(a)
            dst.append(b)
        return len(edges)

    def _first_duplicate(self, before: int, ends: tuple[numpy.ndarray, numpy.ndarray]
                         ) -> tuple[int, int] | None:
        """Among edges ``0..before-1``: the earliest edge repeating an earlier one's source,
        destination and tensor, with that earlier one; None if there is none. ``ends``: the
        positions of ``_src`` and ``_dst`` as arrays."""
        dst, count = self._dst, len(self._edges)
        found: tuple[int, int] | None = None
        if count and before == count:  # no two edges join one pair: no duplicates
            keys = numpy.sort(ends[0] * len(self) + ends[1])
            if not (keys[1:] == keys[:-1]).any():
                return None
        edges = self._edge_records()
        several = map(operator.gt, self._out.degrees(), itertools.repeat(1))
        for i in itertools.compress(range(len(self)), several):
            outs = self._out[i]
            if len(outs) == 2:  # the common case, without a dict
                a, b = outs
                if dst[a] != dst[b] or edges[a].tensor != edges[b].tensor:
                    continue
            seen: dict[tuple[int, str], int] = {}
            for k in outs:  # in edge order
                first = seen.setdefault((dst[k], edges[k].tensor), k)
                if first != k and (found is None or k < found[1]):
                    found = (first, k)
        assert found is None or found[1] < before
        return found

    def _edge_problem(self, k: int, e: Edge) -> str:
        where = f"edges[{k}] {e.src!r} -> {e.dst!r}"
        for end, name in (("source", e.src), ("destination", e.dst)):
            if name not in self._names():
                return f"{where}: {end} {name!r} is not an op of the graph"
        return f"{where} is a self-loop; graph has a cycle: {e.src} -> {e.src}"

    def _sort(self, key: Callable[[int], Any] | None = None) -> Sequence[int]:
        """Kahn's algorithm; among ready ops the smallest ``key(index)`` goes first, then the
        earliest in ``ops``; reports a cycle."""
        if key is None and all(map(operator.lt, self._src, self._dst)):
            # Every edge runs forward in ``ops``: the earliest ready op is always the next one
            # listed, so the order is the listing (the common case: graphs are saved sorted).
            return range(len(self))
        indegree = self._in.degrees()
        dst = self._dst
        rank = (lambda i: (key(i), i)) if key is not None else (lambda i: i)
        ready = [(rank(i), i) for i, d in enumerate(indegree) if d == 0]
        heapq.heapify(ready)
        order: list[int] = []
        while ready:
            i = heapq.heappop(ready)[1]
            order.append(i)
            for k in self._out[i]:
                j = dst[k]
                indegree[j] -= 1
                if indegree[j] == 0:
                    heapq.heappush(ready, (rank(j), j))
        if len(order) < len(self):
            raise TrainschedError(f"graph has a cycle: {self._find_cycle(indegree)}")
        return tuple(order)

    def _find_cycle(self, indegree: list[int]) -> str:
        """Walk back through unsorted ops (each has an unsorted predecessor) until one repeats."""
        step = min(i for i, d in enumerate(indegree) if d > 0)
        position: dict[int, int] = {}
        walk: list[int] = []
        while step not in position:
            position[step] = len(walk)
            walk.append(step)
            preds = (self._src[k] for k in self._in[step])
            step = next(p for p in preds if indegree[p] > 0)
        cycle = walk[position[step] :][::-1]
        start = cycle.index(min(cycle))
        cycle = cycle[start:] + cycle[:start] + [cycle[start]]
        names = self.column("name")
        return " -> ".join(names[i] for i in cycle)

    # --- queries -------------------------------------------------------------------------------

    @property
    def ops(self) -> tuple[Op, ...]:
        """The ops, in the order given (a graph read from a binary file makes them now, the
        first time they are asked for)."""
        if self._ops is None:
            assert self._lazy is not None
            with gc_paused():
                self._ops = tuple(self._lazy.make())
            self._lazy = None
        return self._ops

    def forward_only(self) -> bool:
        """Whether every op is a forward op (a captured model before
        :func:`~trainsched.graph.to_training`; an empty graph too)."""
        return self.column("kind").count("forward") == len(self)

    def column(self, field: str) -> tuple[Any, ...]:
        """Every op's value of the :class:`Op` field ``field``, in ``ops`` order: what
        ``tuple(op.<field> for op in graph.ops)`` gives, but a graph read from a binary file
        answers from its columns without making its Op records."""
        if field not in _OP_DEFAULTS:
            raise TrainschedError(f"no op field {field!r}; the fields are "
                                  f"{', '.join(sorted(_OP_DEFAULTS))}")
        if self._ops is None:
            assert self._lazy is not None
            return self._lazy.column(field)
        return tuple(map(operator.attrgetter(field), self._ops))

    @property
    def edges(self) -> tuple[Edge, ...]:
        """The edges, in the order given."""
        return self._edge_records()

    def _edge_records(self) -> tuple[Edge, ...]:
        """The edges, made now if a reader left them to make (:class:`_EdgesToMake`)."""
        if type(self._edges) is not tuple:
            with gc_paused():
                self._edges = tuple(self._edges.make())
        return self._edges

    @property
    def meta(self) -> dict[str, Any]:
        """Provenance (tier, model, batch size, device, ...): a copy, so the graph stays intact."""
        return copy.deepcopy(self._meta)

    def _at(self, name: str) -> int:
        try:
            return self._names()[name]
        except (KeyError, TypeError):
            raise TrainschedError(f"no op named {name!r} in the graph") from None

    def op(self, name: str) -> Op:
        """The op called ``name``; an unknown name is a TrainschedError."""
        return self._op_at(self._at(name))

    def _op_at(self, i: int) -> Op:
        """The op at position ``i`` (a graph read from a binary file makes that one record)."""
        return self._ops[i] if self._ops is not None else self._lazy.record(i)

    def index(self, name: str) -> int:
        """Position of op ``name`` in ``ops``."""
        return self._at(name)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self._names()

    def _names(self) -> dict[str, int]:
        """Op name -> position, made the first time it is asked for (see :meth:`_build`)."""
        if self._index is None:
            self._index = dict(zip(self.column("name"), range(len(self)), strict=True))
        return self._index

    def __len__(self) -> int:
        return self._lazy.count if self._ops is None else len(self._ops)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Graph):
            return NotImplemented
        return (self.ops, self.edges, self._meta) == (other.ops, other.edges, other._meta)

    __hash__ = None  # type: ignore[assignment]  # meta is a dict

    def __repr__(self) -> str:
        return f"<Graph: {len(self)} ops, {len(self._edges)} edges>"

    def in_edges(self, name: str) -> tuple[Edge, ...]:
        """Edges into ``name``, in edge order."""
        edges = self._edge_records()
        return tuple(edges[k] for k in self._in[self._at(name)])

    def out_edges(self, name: str) -> tuple[Edge, ...]:
        """Edges out of ``name``, in edge order."""
        edges = self._edge_records()
        return tuple(edges[k] for k in self._out[self._at(name)])

    def predecessors(self, name: str) -> tuple[str, ...]:
        """Distinct ops with an edge into ``name``, in edge order."""
        return tuple(dict.fromkeys(e.src for e in self.in_edges(name)))

    def successors(self, name: str) -> tuple[str, ...]:
        """Distinct ops with an edge from ``name``, in edge order."""
        return tuple(dict.fromkeys(e.dst for e in self.out_edges(name)))

    def sources(self) -> tuple[str, ...]:
        """Ops without predecessors, in ``ops`` order."""
        return tuple(name for name, ins in zip(self.column("name"), self._in.degrees(),
                                               strict=True) if not ins)

    def sinks(self) -> tuple[str, ...]:
        """Ops without successors, in ``ops`` order."""
        return tuple(name for name, outs in zip(self.column("name"), self._out.degrees(),
                                                strict=True) if not outs)

    def topological_order(self) -> tuple[str, ...]:
        """Op names, every edge forward; among ready ops the earliest in ``ops`` goes first.

        A graph listed in program order therefore keeps that order.
        """
        names = self.column("name")
        return tuple(map(names.__getitem__, self._topo))

    def topological_indices(self) -> Sequence[int]:
        """:meth:`topological_order` as positions in ``ops`` (a ``range`` when the listing is
        itself the order, as in every saved graph)."""
        return self._topo

    def edge_ends(self) -> tuple[list[int], list[int]]:
        """Per edge, in edge order, the positions in ``ops`` of its source and of its
        destination (copies)."""
        return list(self._src), list(self._dst)

    def ordered_by(self, key: Callable[[str], Any]) -> tuple[str, ...]:
        """Op names, every edge forward; among ready ops the smallest ``key(name)`` goes first,
        then the earliest in ``ops``: a priority order a schedule may follow."""
        names = self.column("name")
        return tuple(names[i] for i in self._sort(lambda i: key(names[i])))

    def critical_path(self) -> tuple[float, tuple[str, ...]]:
        """The longest path by ``compute_s`` (edges weigh 0): its length and its ops in order.

        Ties go to the op earliest in ``ops``, both for the end of the path and at each step back.
        """
        if not len(self):
            return 0.0, ()
        finish = [0.0] * len(self)
        back = [-1] * len(self)
        compute = self.column("compute_s")
        at, into, src = self._in.at, self._in.edges, self._src
        for i in self._topo:
            best, start = -1, 0.0
            for k in into[at[i] : at[i + 1]]:
                p = src[k]
                f = finish[p]
                if best < 0 or f > start or (f == start and p < best):
                    best, start = p, f
            finish[i] = start + compute[i]
            back[i] = best
        end = finish.index(max(finish))  # the latest finish; ties: the earliest op
        path = [end]
        while back[path[-1]] >= 0:
            path.append(back[path[-1]])
        names = self.column("name")
        return finish[end], tuple(names[i] for i in reversed(path))

    def totals(self) -> GraphTotals:
        """Op counts per kind and sums of costs and sizes over the whole graph."""
        count = dict.fromkeys(OP_KINDS, 0)
        count.update(Counter(self.column("kind")))

        def total(field: str) -> int:
            return sum(self.column(field))

        edges = self._edges  # records, or a reader's columns: summed without making records
        return GraphTotals(
            num_ops=len(self),
            ops_by_kind=MappingProxyType(count),
            num_edges=len(edges),
            compute_s=math.fsum(self.column("compute_s")),
            flops=math.fsum(self.column("flops")),
            param_bytes=total("param_bytes"),
            buffer_bytes=total("buffer_bytes"),
            optimizer_state_bytes=total("optimizer_state_bytes"),
            output_bytes=total("output_bytes"),
            saved_bytes=total("saved_bytes"),
            edge_bytes=(sum(map(operator.attrgetter("size_bytes"), edges))
                        if type(edges) is tuple else edges.size_bytes()),
        )

    def heaviest(self, n: int) -> tuple[Op, ...]:
        """The ``n`` ops with the largest ``compute_s`` (ties: name ascending)."""
        if n <= 0 or not len(self):
            return ()
        compute, names = self.column("compute_s"), self.column("name")
        cut = heapq.nlargest(n, compute)[-1]  # only ops at least this heavy can be among them
        heavy = itertools.compress(range(len(self)), map(operator.ge, compute,
                                                         itertools.repeat(cut)))
        best = sorted(heavy, key=lambda i: (-compute[i], names[i]))[:n]
        return tuple(map(self._op_at, best))

    # --- derived graphs ------------------------------------------------------------------------

    def replace_ops(self, replacements: Iterable[Op]) -> Graph:
        """A graph with the ops of the same names swapped for ``replacements``; edges kept."""
        new = {}
        for op in replacements:
            self._at(op.name)
            new[op.name] = op
        return Graph((new.get(op.name, op) for op in self.ops), self.edges, self._meta)

    def with_meta(self, meta: Mapping[str, Any]) -> Graph:
        """The same ops and edges with ``meta`` replaced."""
        return Graph(self.ops, self.edges, meta)

    # --- JSON (the format lives in trainsched.graph.io, which builds on this module) ----------

    def to_json(self, *, format: str | None = None) -> str:
        """The file text, byte-identical for equal graphs: the compact ``trainsched.graph/2``,
        or ``format="trainsched.graph/1"`` (one object per op and edge, every field)."""
        from trainsched.graph.io import FORMAT, graph_to_json

        return graph_to_json(self, format=format or FORMAT)

    @classmethod
    def from_json(cls, text: str, source: str = "<string>") -> Graph:
        """Parse the file text; every problem is a TrainschedError that starts with ``source``."""
        from trainsched.graph.io import graph_from_json

        return graph_from_json(text, source)

    def save(self, path: str | os.PathLike[str], *, format: str | None = None) -> None:
        """Write the file atomically (see :func:`trainsched.graph.io.atomic_write_bytes`): the
        binary ``trainsched.graph/3`` when ``format`` asks for it or, without a ``format``, when
        ``path`` ends in ``.tsg``; else the JSON text (:meth:`to_json`, ``format`` as there)."""
        from trainsched.graph.binary import BINARY_FORMAT, BINARY_SUFFIX, graph_to_binary
        from trainsched.graph.io import atomic_write_bytes, atomic_write_text

        if format == BINARY_FORMAT or (format is None
                                       and str(path).lower().endswith(BINARY_SUFFIX)):
            atomic_write_bytes(path, graph_to_binary(self))
        else:
            atomic_write_text(path, self.to_json(format=format))

    @classmethod
    def load(cls, path: str | os.PathLike[str], *,
             progress: Callable[[int, int, str], None] | None = None) -> Graph:
        """Read a graph file written by :meth:`save` (or by hand, see docs/graph-format.md), in
        any of its formats (the binary one is told by its first bytes).

        ``progress(done, total, "")``, if given, hears now and then how many of the file's
        bytes are read (a progress bar for a large graph)."""
        from trainsched.graph.fastread import load_graph

        return load_graph(path, progress)
