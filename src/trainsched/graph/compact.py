"""The ``trainsched.graph/2`` file: a graph by columns, small and fast to read.

One JSON object, one value per line: ``format``, ``meta``, ``strings`` (every kind, module
path, target and tensor key, once each), then ``ops`` and ``edges``, each an object of columns
(one list per field, one entry per op or edge). A column whose every value is the field's
default is left out. Strings that repeat from op to op are written once: ``kind``,
``module_path``, ``target`` and an edge's ``tensor`` are indices into ``strings`` (a tensor
``null``: the producer's output); ``group`` and ``forward_op`` are op indices (or, for a name
that is no op of the graph, the name; ``null``: none); an edge's ``src`` and ``dst`` are op
indices. The text is deterministic: keys sorted, ``strings`` in order of first use, floats in
Python's shortest round-trip form, so equal graphs give byte-identical files. The fields are
documented in ``docs/graph-format.md``.

Reading checks whole columns at once (types, ranges, indices: a few calls in C each) and then
builds every Op and Edge without a per-record ``__init__``; a column with anything unusual (a
number of another JSON type, a value out of range) sends the ops through the ordinary Op checks
one by one, which name the op and the field (``g.json: ops.compute_s[3]: expected a number,
got "fast"``; ``g.json: ops[0]: op 'a': compute_s must be >= 0, got -1.0``).
"""

from __future__ import annotations

import itertools
import json
import math
import operator
import os
from collections.abc import Callable, Sequence
from typing import Any

from trainsched.errors import TrainschedError
from trainsched.graph.core import Edge, Graph, Op
from trainsched.graph.fields import _OP_SPECS, OP_KINDS, _sums_fit
from trainsched.graph.io import (
    _JSON_TYPES,
    FORMAT,
    _json_value,
    check_keys,
    dump_json,
    kind_of,
    show_value,
)

__all__ = ["compact_from_doc", "compact_to_json", "read_lines"]

_MAX_FLOAT = 1.7976931348623157e308
#: Fields written as indices into ``strings``; fields written as op indices (or names).
_TABLED = ("kind", "module_path", "target")
_OP_NAMES = ("group", "forward_op")
_DEFAULTS = {field: Op.__dataclass_fields__[field].default for field in _OP_SPECS
             if field != "name"}  # fmt: skip
_EDGE_COLUMNS = ("dst", "size_bytes", "src", "tensor")
_EDGE_FIELDS = ("src", "dst", "size_bytes", "tensor")


# --- writing ------------------------------------------------------------------------------------


def compact_to_json(graph: Graph, meta_text: str) -> str:
    """The ``trainsched.graph/2`` text of ``graph``; ``meta_text`` is its meta as JSON text."""
    ops, edges = graph.ops, graph.edges
    strings: dict[str, int] = {}
    index = {op.name: i for i, op in enumerate(ops)}

    def tabled(values: Sequence[str]) -> list[int]:
        return [strings.setdefault(s, len(strings)) for s in values]

    op_columns: dict[str, list[Any]] = {}
    for field in sorted(_OP_SPECS):
        values = list(map(operator.attrgetter(field), ops))
        # (an Op holds each field in its own type: equal to the default is the default)
        if field != "name" and values.count(_DEFAULTS[field]) == len(values):
            continue  # every op has the default: the column is left out
        if field in _TABLED:
            values = tabled(values)
        elif field in _OP_NAMES:
            values = [None if v is None else index.get(v, v) for v in values]
        elif _OP_SPECS[field][0] == "strs":
            values = list(map(list, values))
        op_columns[field] = values
    src, dst = graph.edge_ends()
    edge_columns: dict[str, list[Any]] = {
        "dst": dst,
        "size_bytes": list(map(operator.attrgetter("size_bytes"), edges)),
        "src": src,
    }
    tensors = list(map(operator.attrgetter("tensor"), edges))
    if any(map(operator.ne, tensors, map(operator.attrgetter("src"), edges))):
        edge_columns["tensor"] = [None if t == e.src else strings.setdefault(t, len(strings))
                                  for t, e in zip(tensors, edges, strict=True)]
    return (f'{{"format": {dump_json(FORMAT)},\n"meta": {meta_text},\n'
            f'"strings": {dump_json(list(strings))},\n'
            f'"ops": {_columns(op_columns)},\n'
            f'"edges": {_columns(edge_columns)}}}\n')


def _columns(columns: dict[str, list[Any]]) -> str:
    """An object of columns, one per line, keys sorted."""
    lines = [f"{dump_json(field)}: {dump_json(values)}"
             for field, values in sorted(columns.items())]
    return "{\n" + ",\n".join(lines) + "\n}" if lines else "{}"


# --- reading ------------------------------------------------------------------------------------

_HEAD = '{"format": "trainsched.graph/2",\n'
_PARTS = {'"ops": {\n': "ops", '"edges": {\n': "edges"}


def read_lines(file: Any, progress: Callable[[int, int], None] | None = None
               ) -> dict[str, Any] | None:
    """The document of a file in the writer's layout (one key per line), parsed line by line
    so that the whole text is never held: at most one line (one column) is. None when the
    layout is another (or the JSON is malformed): the caller parses the whole text, which
    gives the same document or words the error. ``progress(done, total)`` hears the bytes
    read after each line (``file`` is a text file over a binary one)."""
    if file.readline() != _HEAD:
        return None
    doc: dict[str, Any] = {"format": FORMAT}
    part: dict[str, Any] | None = None
    total = os.fstat(file.fileno()).st_size
    for line in file:
        if progress is not None:
            progress(min(file.buffer.tell(), total), total)
        if part is None and line in _PARTS:
            part = doc[_PARTS[line]] = {}
            continue
        if part is not None and line in ("},\n", "}}\n"):
            part = None
            if line == "}}\n":
                break
            continue
        if not line.endswith(",\n" if part is None else "\n"):
            return None
        body = line[:-2] if line.endswith(",\n") else line[:-1]
        pair = json.loads("{" + body + "}")
        if len(pair) != 1:
            return None
        (doc if part is None else part).update(pair)
    else:
        return None  # no closing line: truncated
    if any(line.strip() for line in file):
        return None
    return doc


def compact_from_doc(doc: dict[str, Any], source: str, meta: dict[str, Any]) -> Graph:
    """The graph of a parsed ``trainsched.graph/2`` document whose top-level keys and meta are
    checked; every problem is a TrainschedError starting with ``source``. The document's
    ``ops`` and ``edges`` are emptied as their columns are read."""
    strings = doc.get("strings", [])
    if type(strings) is not list:
        raise TrainschedError(f"{source}: strings: expected a list, got {kind_of(strings)}")
    if not all(type(s) is str for s in strings):
        k = next(k for k, s in enumerate(strings) if type(s) is not str)
        raise TrainschedError(f"{source}: strings[{k}]: expected a string, got "
                              f"{kind_of(strings[k])}")
    for part in ("ops", "edges"):
        if type(doc[part]) is not dict:
            raise TrainschedError(f"{source}: {part}: expected an object of columns (one list "
                                  f"per field), got {kind_of(doc[part])}")
    ops_doc, edges_doc = doc["ops"], doc["edges"]
    check_keys(ops_doc, _OP_SPECS, ("name",), source, "ops")
    check_keys(edges_doc, _EDGE_COLUMNS, ("src", "dst", "size_bytes"), source, "edges")
    reader = _Columns(source, strings)
    names = reader.column(ops_doc, "ops", "name", None)
    n = len(names)
    columns = {field: reader.column(ops_doc, "ops", field, n) for field in ops_doc}
    m = len(reader.column(edges_doc, "edges", "src", None))
    edge_cols = {field: reader.column(edges_doc, "edges", field, m) for field in edges_doc}
    # The document is consumed: each column goes once it is read (on a large graph, the lists
    # would hold hundreds of MB beside the ops).
    ops_doc.clear()
    edges_doc.clear()
    ops = reader.ops(columns, names)
    src, dst = edge_cols["src"], edge_cols["dst"]
    edges = reader.edges(edge_cols, names)
    try:  # the ends' indices are checked: the graph need not look the names up again
        return Graph._with_ends(ops, edges, meta, src, dst, sums_fit=reader.sums_fit)
    except TrainschedError as exc:
        raise TrainschedError(f"{source}: {exc}") from None


class _Columns:
    """Checks and decodes the columns of one document (see :func:`compact_from_doc`)."""

    def __init__(self, source: str, strings: list[str]) -> None:
        self.source = source
        self.strings = strings
        #: Whether the ops' and edges' summed costs and sizes are known to be finite (the
        #: graph need not add them up again from the records).
        self.sums_fit = False

    def fail(self, where: str, message: str) -> TrainschedError:
        return TrainschedError(f"{self.source}: {where}: {message}")

    def column(self, doc: dict[str, Any], part: str, field: str, length: int | None
               ) -> list[Any]:
        """Column ``field`` of ``doc`` (``ops`` or ``edges``): a list of ``length`` values (the
        first column read fixes the length)."""
        values = doc[field]
        if type(values) is not list:
            raise self.fail(f"{part}.{field}", f"expected a list, got {kind_of(values)}")
        if length is not None and len(values) != length:
            first = "name" if part == "ops" else "src"
            raise self.fail(f"{part}.{field}", f"{len(values)} values, but {part}.{first} has "
                            f"{length} (one value per {part[:-1]})")
        return values

    def indices(self, values: list[Any], where: str, count: int, what: str,
                allowed: tuple[type, ...] = ()) -> None:
        """Every value an int in ``0..count-1`` (or of a type in ``allowed``)."""
        kinds = set(map(type, values))
        if kinds <= {int, *allowed}:
            numbers = [v for v in values if type(v) is int] if allowed else values
            if not numbers or (min(numbers) >= 0 and max(numbers) < count):
                return
        for k, v in enumerate(values):
            if type(v) in allowed:
                continue
            if type(v) is not int or not 0 <= v < count:
                extra = "".join(f" or {_TYPE_WORDS[t]}" for t in allowed)
                span = f"0..{count - 1}" if count else "none: it is empty"
                raise self.fail(f"{where}[{k}]", f"expected an index into {what} ({span})"
                                f"{extra}, got {show_value(v)}")

    def ops(self, columns: dict[str, list[Any]], names: list[Any]) -> list[Op]:
        """The Op of each row: decoded, checked column by column, built in one go."""
        n = len(names)
        strings = self.strings
        decoded: dict[str, Any] = {}
        plain = True  # every column of its writer's type and in range: no per-op check
        for field in list(columns):
            values = columns.pop(field)  # the raw column goes once decoded
            where = f"ops.{field}"
            if field in _TABLED:
                self.indices(values, where, len(strings), "strings")
                values = list(map(strings.__getitem__, values))
            elif field in _OP_NAMES:
                self.indices(values, where, n, "ops", (str, type(None)))
                shared = names if set(map(type, names)) == {str} else [None] * n
                values = [shared[v] if type(v) is int else v for v in values]
            elif field != "name":
                plain = _plain_column(values, *_OP_SPECS[field]) and plain
            decoded[field] = values
        plain = plain and _plain_column(names, "str", False) and all(names)
        kinds = decoded.get("kind")
        if kinds is not None and not set(kinds) <= _KINDS:
            plain = False
        if plain:
            self.sums_fit = _sums_fit(decoded, ())
            return _build_ops(n, decoded)
        return [self.op(k, {f: values[k] for f, values in decoded.items()}) for k in range(n)]

    def op(self, k: int, row: dict[str, Any]) -> Op:
        """Row ``k`` through the ordinary checks: a type error names the column and row, a
        value the Op refuses names the op."""
        values = {}
        for field, value in row.items():
            base, optional = _OP_SPECS[field]
            if type(value) is _JSON_TYPES[base] or (value is None and optional):
                values[field] = value
            else:
                values[field] = _json_value(value, base, optional,
                                            f"{self.source}: ops.{field}[{k}]")
        try:
            return Op(**values)
        except TrainschedError as exc:
            raise self.fail(f"ops[{k}]", str(exc)) from None

    def edges(self, columns: dict[str, list[Any]], names: list[str]) -> list[Edge]:
        """The Edge of each row (its ops' indices checked; sizes through the Edge checks when
        not plain)."""
        n, strings = len(names), self.strings
        src, dst, sizes = columns.pop("src"), columns.pop("dst"), columns.pop("size_bytes")
        self.indices(src, "edges.src", n, "ops")
        self.indices(dst, "edges.dst", n, "ops")
        srcs = list(map(names.__getitem__, src))
        dsts = list(map(names.__getitem__, dst))
        tensors = columns.pop("tensor", None)
        if tensors is None:
            tensors = srcs
        else:
            self.indices(tensors, "edges.tensor", len(strings), "strings", (type(None),))
            # an empty key (hand-written) means the producer's output, as in an Edge
            tensors = [strings[t] or s if t is not None else s
                       for s, t in zip(srcs, tensors, strict=True)]
        if not _plain_column(sizes, "int", False):
            sizes = [v if type(v) is int else
                     _json_value(v, "int", False, f"{self.source}: edges.size_bytes[{k}]")
                     for k, v in enumerate(sizes)]
            for k, (a, b, size) in enumerate(zip(srcs, dsts, sizes, strict=True)):
                if size < 0:
                    raise self.fail(f"edges[{k}]", f"edge {a!r} -> {b!r}: size_bytes must be "
                                    f">= 0, got {size!r}")
        self.sums_fit = self.sums_fit and _sums_fit({}, sizes)
        return _build_edges(srcs, dsts, sizes, tensors)


_KINDS = frozenset(OP_KINDS)
_TYPE_WORDS = {str: "a name", type(None): "null"}
_WRITER_TYPES = {"float": float, "int": int, "str": str}


def _plain_column(values: list[Any], base: str, optional: bool) -> bool:
    """Whether a column needs no per-value check: each value of the writer's type for the field
    (``null`` where optional), numbers finite and >= 0. False leaves it to the Op checks."""
    kinds = set(map(type, values))
    if base == "strs":
        return kinds <= {list} and all(type(s) is str for v in values for s in v)
    wanted = {_WRITER_TYPES[base], *((type(None),) if optional else ())}
    if not kinds <= wanted:
        return False
    if base == "str" or not values:
        return True
    numbers = [v for v in values if v is not None] if optional else values
    try:
        # NaN and infinities make the sum NaN or infinite; a sum over the largest float (two
        # huge but valid values) is left to the per-op checks.
        return not numbers or (min(numbers) >= 0 and math.fsum(numbers) <= _MAX_FLOAT)
    except OverflowError:  # an integer too large for a float
        return False


def _make_builder(cls: type, fields: Sequence[str]) -> Callable[..., list[Any]]:
    """``build(c0, ..., cN)``: the ``cls`` records (a frozen dataclass with slots) whose field
    values (``fields`` order) are the rows of the iterables ``c0..cN``, made without
    ``__init__`` (the columns are checked already).

    Each is filled as an object of a plain class with the same slots (a slot store is the
    fastest way Python has to set a field) and then becomes a ``cls``: the layouts are the
    same, so the class can be swapped, after which the record is frozen like any other."""
    plain = type(f"_Plain{cls.__name__}", (), {"__slots__": cls.__slots__})
    args = ", ".join(f"c{k}" for k in range(len(fields)))
    row = ", ".join(f"v{k}" for k in range(len(fields)))
    lines = [f"def build({args}):", "    out = []", "    add = out.append",
             f"    for {row} in zip({args}):", "        x = Plain()"]
    lines += [f"        x.{field} = v{k}" for k, field in enumerate(fields)]
    lines += ["        x.__class__ = cls", "        add(x)", "    return out"]
    scope: dict[str, Any] = {"Plain": plain, "cls": cls}
    exec("\n".join(lines) + "\n", scope)  # our own text, built from the field names
    return scope["build"]


_build = _make_builder(Op, list(_OP_SPECS))
_build_edges = _make_builder(Edge, _EDGE_FIELDS)
assert set(Op.__slots__) == set(_OP_SPECS) and set(Edge.__slots__) == set(_EDGE_FIELDS)


def _build_ops(n: int, decoded: dict[str, Any]) -> list[Op]:
    """Ops from checked columns; a column left out gives every op the field's default."""
    columns = []
    for field, (base, _) in _OP_SPECS.items():
        values = decoded.get(field)
        if values is None:
            columns.append(itertools.repeat(_DEFAULTS[field], n))
        elif base == "strs":
            columns.append(map(tuple, values))
        else:
            columns.append(values)
    return _build(*columns)
