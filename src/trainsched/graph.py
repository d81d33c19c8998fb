"""Op, Edge, Graph: the computation graph that every policy and the simulator read.

A graph is a DAG of ops (units of computation with costs and memory sizes) joined by edges
(tensors passed from one op to another). Capture builds forward graphs;
:func:`trainsched.training.to_training` turns them into training graphs. A Graph is immutable and
validated once, when it is built, so every consumer can trust it: unique names, known kinds,
finite non-negative numbers, edges between existing ops, no cycles. It round-trips exactly
through a versioned JSON file whose fields are documented in ``docs/graph-format.md``.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import difflib
import heapq
import json
import math
import numbers
import os
import sys
import tempfile
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from trainsched.errors import TrainschedError

FORMAT = "trainsched.graph/1"
OP_KINDS = ("forward", "backward_input", "backward_weight", "optimizer")


@dataclass(frozen=True, kw_only=True)
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
    # Per-phase costs carried by forward ops (None = not known); the training transform reads them.
    backward_input_s: float | None = None
    backward_weight_s: float | None = None
    backward_input_flops: float | None = None
    backward_weight_flops: float | None = None
    # Spread of measured times (None unless measured).
    compute_p10_s: float | None = None
    compute_p90_s: float | None = None
    backward_input_p10_s: float | None = None
    backward_input_p90_s: float | None = None
    backward_weight_p10_s: float | None = None
    backward_weight_p90_s: float | None = None
    samples: int = 0  # how many measured repeats the medians come from

    def __post_init__(self) -> None:
        _check_op(self)


@dataclass(frozen=True, kw_only=True)
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


# Op fields by type; drives validation and the JSON reader.
_FIELD_TYPES: dict[str, str] = {
    "name": "str", "kind": "str", "module_path": "str", "target": "str",
    "group": "opt_str", "forward_op": "opt_str", "members": "strs",
    "compute_s": "float", "flops": "float", "layer_index": "opt_int",
    "bytes_accessed": "int", "param_bytes": "int", "buffer_bytes": "int",
    "optimizer_state_bytes": "int", "output_bytes": "int", "temp_bytes": "int",
    "saved_bytes": "int", "samples": "int",
    **{f"{phase}{suffix}": "opt_float"
       for phase in ("backward_input", "backward_weight")
       for suffix in ("_s", "_flops", "_p10_s", "_p90_s")},
    "compute_p10_s": "opt_float", "compute_p90_s": "opt_float",
}  # fmt: skip
_EDGE_FIELD_TYPES = {"src": "str", "dst": "str", "size_bytes": "int", "tensor": "str"}
_OP_SPECS = {f: (k.removeprefix("opt_"), k.startswith("opt_")) for f, k in _FIELD_TYPES.items()}
_EDGE_SPECS = {f: (k, False) for f, k in _EDGE_FIELD_TYPES.items()}
_MAX_FLOAT = sys.float_info.max
_OP_FIELDS = tuple(f.name for f in dataclasses.fields(Op))
_EDGE_FIELDS = tuple(f.name for f in dataclasses.fields(Edge))
assert set(_FIELD_TYPES) == set(_OP_FIELDS)


def _number(owner: str, field: str, value: Any, integer: bool) -> int | float:
    """``value`` as a finite non-negative int or float, or a TrainschedError naming the field."""
    wrong_type = isinstance(value, bool) or not isinstance(
        value, numbers.Integral if integer else numbers.Real
    )
    if wrong_type:
        expected = "an integer" if integer else "a number"
        raise TrainschedError(f"{owner}: {field} must be {expected}, got {value!r}")
    value = int(value) if integer else float(value)
    if not math.isfinite(value):
        raise TrainschedError(f"{owner}: {field} must be finite, got {value!r}")
    if value < 0:
        raise TrainschedError(f"{owner}: {field} must be >= 0, got {value!r}")
    return value


def _check_op(op: Op) -> None:
    """Validate an Op's fields and normalise numbers to plain int/float (numpy scalars too)."""
    if not isinstance(op.name, str) or not op.name:
        raise TrainschedError(f"op name must be a non-empty string, got {op.name!r}")
    if op.kind not in OP_KINDS:
        raise TrainschedError(
            f"op {op.name!r}: unknown kind {op.kind!r}; expected one of {', '.join(OP_KINDS)}"
        )
    values = vars(op)
    for field, (base, optional) in _OP_SPECS.items():
        value = values[field]
        kind = type(value)
        # The common cases first, kept fast: graphs have tens of thousands of ops.
        if kind is float:
            if base == "float" and 0.0 <= value <= _MAX_FLOAT:
                continue
        elif kind is int:
            if base == "int" and value >= 0:
                continue
        elif kind is str or (value is None and optional):
            if base == "str" or value is None:
                continue
        elif kind is tuple and base == "strs" and all(type(v) is str for v in value):
            continue
        object.__setattr__(op, field, _normalised(op.name, field, value, base))


def _normalised(name: str, field: str, value: Any, base: str) -> Any:
    """The slow path of :func:`_check_op`: convert what can be converted, else explain."""
    if base in ("int", "float"):
        return _number(f"op {name!r}", field, value, base == "int")
    if base == "str" and isinstance(value, str):
        return str(value)
    if (
        base == "strs"
        and isinstance(value, tuple | list)
        and all(isinstance(v, str) for v in value)
    ):
        return tuple(str(v) for v in value)
    expected = {"str": "a string", "strs": "a tuple of names"}[base]
    raise TrainschedError(f"op {name!r}: {field} must be {expected}, got {value!r}")


class Graph:
    """An immutable, validated DAG of ops and edges, plus provenance ``meta``.

    The constructor checks op names, edge ends, duplicate edges and cycles (reporting one cycle
    in order). Queries by name are O(1) or O(degree); orders are deterministic: ties break on the
    position in ``ops``.
    """

    __slots__ = ("_edges", "_in", "_index", "_meta", "_ops", "_out", "_topo")

    def __init__(
        self, ops: Iterable[Op], edges: Iterable[Edge], meta: Mapping[str, Any] | None = None
    ) -> None:
        self._ops: tuple[Op, ...] = tuple(ops)
        self._edges: tuple[Edge, ...] = tuple(edges)
        self._meta: dict[str, Any] = copy.deepcopy(dict(meta or {}))
        self._index: dict[str, int] = {}
        for i, op in enumerate(self._ops):
            if not isinstance(op, Op):
                raise TrainschedError(f"ops[{i}] is a {type(op).__name__}, not an Op")
            self._index.setdefault(op.name, i)
        if len(self._index) < len(self._ops):
            counts = Counter(op.name for op in self._ops)
            names = ", ".join(repr(name) for name, n in counts.items() if n > 1)
            raise TrainschedError(f"duplicate op names: {names}; every op needs a unique name")
        self._in: list[list[int]] = [[] for _ in self._ops]
        self._out: list[list[int]] = [[] for _ in self._ops]
        self._link_edges()
        self._topo: tuple[int, ...] = self._sort()

    def _link_edges(self) -> None:
        seen: dict[tuple[str, str, str], int] = {}
        for k, e in enumerate(self._edges):
            if not isinstance(e, Edge):
                raise TrainschedError(f"edges[{k}] is a {type(e).__name__}, not an Edge")
            if e.src not in self._index or e.dst not in self._index or e.src == e.dst:
                raise TrainschedError(self._edge_problem(k, e))
            first = seen.setdefault((e.src, e.dst, e.tensor), k)
            if first != k:
                raise TrainschedError(
                    f"edges[{first}] and edges[{k}] are duplicates: {e.src!r} -> {e.dst!r} "
                    f"carrying tensor {e.tensor!r}"
                )
            self._out[self._index[e.src]].append(k)
            self._in[self._index[e.dst]].append(k)

    def _edge_problem(self, k: int, e: Edge) -> str:
        where = f"edges[{k}] {e.src!r} -> {e.dst!r}"
        for end, name in (("source", e.src), ("destination", e.dst)):
            if name not in self._index:
                return f"{where}: {end} {name!r} is not an op of the graph"
        return f"{where} is a self-loop; graph has a cycle: {e.src} -> {e.src}"

    def _sort(self) -> tuple[int, ...]:
        """Kahn's algorithm, earliest op in ``ops`` first among ready ones; reports a cycle."""
        indegree = [len(ins) for ins in self._in]
        ready = [i for i, d in enumerate(indegree) if d == 0]
        heapq.heapify(ready)
        order: list[int] = []
        while ready:
            i = heapq.heappop(ready)
            order.append(i)
            for k in self._out[i]:
                j = self._index[self._edges[k].dst]
                indegree[j] -= 1
                if indegree[j] == 0:
                    heapq.heappush(ready, j)
        if len(order) < len(self._ops):
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
            preds = (self._index[self._edges[k].src] for k in self._in[step])
            step = next(p for p in preds if indegree[p] > 0)
        cycle = walk[position[step] :][::-1]
        start = cycle.index(min(cycle))
        cycle = cycle[start:] + cycle[:start] + [cycle[start]]
        return " -> ".join(self._ops[i].name for i in cycle)

    # --- queries -------------------------------------------------------------------------------

    @property
    def ops(self) -> tuple[Op, ...]:
        """The ops, in the order given."""
        return self._ops

    @property
    def edges(self) -> tuple[Edge, ...]:
        """The edges, in the order given."""
        return self._edges

    @property
    def meta(self) -> dict[str, Any]:
        """Provenance (tier, model, batch size, device, ...): a copy, so the graph stays intact."""
        return copy.deepcopy(self._meta)

    def _at(self, name: str) -> int:
        try:
            return self._index[name]
        except (KeyError, TypeError):
            raise TrainschedError(f"no op named {name!r} in the graph") from None

    def op(self, name: str) -> Op:
        """The op called ``name``; an unknown name is a TrainschedError."""
        return self._ops[self._at(name)]

    def index(self, name: str) -> int:
        """Position of op ``name`` in ``ops``."""
        return self._at(name)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self._index

    def __len__(self) -> int:
        return len(self._ops)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Graph):
            return NotImplemented
        return (self._ops, self._edges, self._meta) == (other._ops, other._edges, other._meta)

    __hash__ = None  # type: ignore[assignment]  # meta is a dict

    def __repr__(self) -> str:
        return f"<Graph: {len(self._ops)} ops, {len(self._edges)} edges>"

    def in_edges(self, name: str) -> tuple[Edge, ...]:
        """Edges into ``name``, in edge order."""
        return tuple(self._edges[k] for k in self._in[self._at(name)])

    def out_edges(self, name: str) -> tuple[Edge, ...]:
        """Edges out of ``name``, in edge order."""
        return tuple(self._edges[k] for k in self._out[self._at(name)])

    def predecessors(self, name: str) -> tuple[str, ...]:
        """Distinct ops with an edge into ``name``, in edge order."""
        return tuple(dict.fromkeys(e.src for e in self.in_edges(name)))

    def successors(self, name: str) -> tuple[str, ...]:
        """Distinct ops with an edge from ``name``, in edge order."""
        return tuple(dict.fromkeys(e.dst for e in self.out_edges(name)))

    def sources(self) -> tuple[str, ...]:
        """Ops without predecessors, in ``ops`` order."""
        return tuple(op.name for op, ins in zip(self._ops, self._in, strict=True) if not ins)

    def sinks(self) -> tuple[str, ...]:
        """Ops without successors, in ``ops`` order."""
        return tuple(op.name for op, outs in zip(self._ops, self._out, strict=True) if not outs)

    def topological_order(self) -> tuple[str, ...]:
        """Op names, every edge forward; among ready ops the earliest in ``ops`` goes first.

        A graph listed in program order therefore keeps that order.
        """
        return tuple(self._ops[i].name for i in self._topo)

    def critical_path(self) -> tuple[float, tuple[str, ...]]:
        """The longest path by ``compute_s`` (edges weigh 0): its length and its ops in order.

        Ties go to the op earliest in ``ops``, both for the end of the path and at each step back.
        """
        if not self._ops:
            return 0.0, ()
        finish = [0.0] * len(self._ops)
        back = [-1] * len(self._ops)
        for i in self._topo:
            best, start = -1, 0.0
            for k in self._in[i]:
                p = self._index[self._edges[k].src]
                if best < 0 or finish[p] > start or (finish[p] == start and p < best):
                    best, start = p, finish[p]
            finish[i] = start + self._ops[i].compute_s
            back[i] = best
        end = max(range(len(finish)), key=lambda i: (finish[i], -i))
        path = [end]
        while back[path[-1]] >= 0:
            path.append(back[path[-1]])
        return finish[end], tuple(self._ops[i].name for i in reversed(path))

    def totals(self) -> GraphTotals:
        """Op counts per kind and sums of costs and sizes over the whole graph."""
        ops = self._ops
        count = dict.fromkeys(OP_KINDS, 0)
        for op in ops:
            count[op.kind] += 1
        return GraphTotals(
            num_ops=len(ops),
            ops_by_kind=MappingProxyType(count),
            num_edges=len(self._edges),
            compute_s=math.fsum(op.compute_s for op in ops),
            flops=math.fsum(op.flops for op in ops),
            param_bytes=sum(op.param_bytes for op in ops),
            buffer_bytes=sum(op.buffer_bytes for op in ops),
            optimizer_state_bytes=sum(op.optimizer_state_bytes for op in ops),
            output_bytes=sum(op.output_bytes for op in ops),
            saved_bytes=sum(op.saved_bytes for op in ops),
            edge_bytes=sum(e.size_bytes for e in self._edges),
        )

    def heaviest(self, n: int) -> tuple[Op, ...]:
        """The ``n`` ops with the largest ``compute_s`` (ties: name ascending)."""
        return tuple(sorted(self._ops, key=lambda op: (-op.compute_s, op.name))[: max(n, 0)])

    # --- derived graphs ------------------------------------------------------------------------

    def replace_ops(self, replacements: Iterable[Op]) -> Graph:
        """A graph with the ops of the same names swapped for ``replacements``; edges kept."""
        new = {}
        for op in replacements:
            self._at(op.name)
            new[op.name] = op
        return Graph((new.get(op.name, op) for op in self._ops), self._edges, self._meta)

    def with_meta(self, meta: Mapping[str, Any]) -> Graph:
        """The same ops and edges with ``meta`` replaced."""
        return Graph(self._ops, self._edges, meta)

    # --- JSON ----------------------------------------------------------------------------------

    def to_json(self) -> str:
        """The file text (format ``trainsched.graph/1``): byte-identical for equal graphs."""
        try:
            meta = _dump(self._meta)
        except (TypeError, ValueError) as exc:
            raise TrainschedError(f"graph meta is not JSON-serialisable: {exc}") from None
        ops = [_dump({f: getattr(op, f) for f in _OP_FIELDS} | {"members": list(op.members)})
               for op in self._ops]  # fmt: skip
        edges = [_dump({f: getattr(e, f) for f in _EDGE_FIELDS}) for e in self._edges]
        return (
            f'{{"format": {_dump(FORMAT)},\n"meta": {meta},\n'
            f'"ops": [{_lines(ops)}],\n"edges": [{_lines(edges)}]}}\n'
        )

    @classmethod
    def from_json(cls, text: str, source: str = "<string>") -> Graph:
        """Parse the file text; every problem is a TrainschedError that starts with ``source``."""
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            hint = " (the text ends early: truncated?)" if exc.pos >= len(text.rstrip()) else ""
            raise TrainschedError(
                f"{source}: malformed JSON at line {exc.lineno}, column {exc.colno}: "
                f"{exc.msg}{hint}"
            ) from None
        if not isinstance(doc, dict):
            raise TrainschedError(f"{source}: expected a JSON object, got {_kind_of(doc)}")
        if "format" not in doc:
            raise TrainschedError(f"{source}: no 'format' field; this reader supports {FORMAT!r}")
        if doc["format"] != FORMAT:
            raise TrainschedError(
                f"{source}: unsupported format {doc['format']!r}; this reader supports {FORMAT!r}"
            )
        _check_keys(doc, {"format", "meta", "ops", "edges"}, {"ops", "edges"}, source, "")
        meta = doc.get("meta", {})
        if not isinstance(meta, dict):
            raise TrainschedError(f"{source}: meta: expected an object, got {_show(meta)}")
        ops = [_read_record(Op, _OP_SPECS, item, source, f"ops[{i}]")
               for i, item in enumerate(_list(doc, "ops", source))]  # fmt: skip
        edges = [_read_record(Edge, _EDGE_SPECS, item, source, f"edges[{i}]")
                 for i, item in enumerate(_list(doc, "edges", source))]  # fmt: skip
        try:
            return cls(ops, edges, meta)
        except TrainschedError as exc:
            raise TrainschedError(f"{source}: {exc}") from None

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the JSON file atomically (see :func:`atomic_write_text`)."""
        atomic_write_text(path, self.to_json())

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Graph:
        """Read a graph file written by :meth:`save` (or by hand, see docs/graph-format.md)."""
        return cls.from_json(read_text_file(path, "graph"), source=str(path))


def read_text_file(path: str | os.PathLike[str], what: str) -> str:
    """A UTF-8 file's text; a missing, unreadable or non-UTF-8 file is a user error."""
    path = Path(path)
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TrainschedError(f"{path}: no such {what} file") from None
    except UnicodeDecodeError as exc:
        raise TrainschedError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise TrainschedError(f"{path}: cannot read: {exc.strerror}") from None


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically (see :func:`atomic_write_bytes`)."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` via a temp file in the same directory and a rename.

    A failure never leaves a partial file: readers see the old file or the new one.
    """
    path = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        raise TrainschedError(f"{path}: cannot write: {exc.strerror}") from None
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.chmod(tmp, path.stat().st_mode & 0o777 if path.exists() else 0o644)
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise TrainschedError(f"{path}: cannot write: {exc.strerror}") from None
        raise


_dump = json.JSONEncoder(sort_keys=True, separators=(", ", ": "), allow_nan=False).encode


def _lines(items: list[str]) -> str:
    return "".join(f"\n  {item}" + ("," if k < len(items) - 1 else "\n")
                   for k, item in enumerate(items))  # fmt: skip


def _show(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _kind_of(value: Any) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}
    return "null" if value is None else names.get(type(value), "a number")


def _list(doc: dict[str, Any], key: str, source: str) -> list[Any]:
    if not isinstance(doc[key], list):
        raise TrainschedError(f"{source}: {key}: expected a list, got {_kind_of(doc[key])}")
    return doc[key]


def _check_keys(
    record: dict[str, Any], known: Iterable[str], required: Iterable[str], source: str, where: str
) -> None:
    """Missing required and unknown fields, named (with a close match when there is one)."""
    prefix = f"{source}: {where}: " if where else f"{source}: "
    missing = [k for k in required if k not in record]
    if missing:
        raise TrainschedError(f"{prefix}missing required field {', '.join(map(repr, missing))}")
    unknown = [k for k in record if k not in known]
    if unknown:
        close = [m for k in unknown for m in difflib.get_close_matches(k, known, n=1)]
        hint = f" (did you mean {', '.join(map(repr, close))}?)" if close else ""
        raise TrainschedError(f"{prefix}unknown field {', '.join(map(repr, unknown))}{hint}")


def _read_record(cls: type, specs: dict[str, tuple[str, bool]], item: Any, source: str,
                 where: str) -> Any:  # fmt: skip
    """Build an Op or Edge from one JSON object, with type errors like ``ops[3].compute_s``."""
    if not isinstance(item, dict):
        raise TrainschedError(f"{source}: {where}: expected an object, got {_kind_of(item)}")
    _check_keys(item, specs, _REQUIRED[cls], source, where)
    values = {}
    for key, value in item.items():
        base, optional = specs[key]
        if type(value) is _JSON_TYPES[base] or (value is None and optional):
            values[key] = value  # the common case, kept fast
        else:
            values[key] = _json_value(value, base, optional, f"{source}: {where}.{key}")
    try:
        return cls(**values)
    except TrainschedError as exc:
        raise TrainschedError(f"{source}: {where}: {exc}") from None


_REQUIRED = {
    cls: [f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING]
    for cls in (Op, Edge)
}
# JSON types read as they are; "strs" (a list) always goes through _json_value to become a tuple.
_JSON_TYPES = {"str": str, "float": float, "int": int, "strs": None}
_EXPECTED = {"str": "a string", "float": "a number", "int": "an integer", "strs": "a list of names"}


def _json_value(value: Any, base: str, optional: bool, where: str) -> Any:
    """``value`` converted to the field's Python type, or an error saying what was expected.

    Bounds (negative, NaN, ...) are left to the Op and Edge checks.
    """
    kind = type(value)
    if kind is list and base == "strs" and all(type(v) is str for v in value):
        return tuple(value)
    if kind is int and base == "float":
        with contextlib.suppress(OverflowError):
            return float(value)
    if kind is float and base == "int" and value.is_integer():
        return int(value)
    expected = _EXPECTED[base] + (" or null" if optional else "")
    raise TrainschedError(f"{where}: expected {expected}, got {_show(value)}")
