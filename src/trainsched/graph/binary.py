"""The ``trainsched.graph/3`` file: a graph by columns in binary, read straight into arrays.

Layout (every number little-endian):

1. the magic line ``trainsched.graph/3\\n``;
2. a header: one line of JSON (keys sorted, as :func:`~trainsched.graph.io.dump_json` writes
   it) with ``meta``, ``ops`` and ``edges`` (their counts) and ``columns``, a list of
   ``[name, dtype, length]`` in the order the columns follow;
3. zero bytes up to a multiple of 8 from the start of the file, then each column's raw values
   (``length`` values of ``dtype``), each column padded with zero bytes to a multiple of 8.

The column types are fixed by the format (the header states them so that a reader can check
them): ``<f8`` for float fields, ``<i8`` for int fields, ``<i4`` for indices into the strings
table or into the ops, ``<u4`` for counts and string lengths, ``|u1`` for bytes and null masks.
The strings table is ``strings.text`` (the UTF-8 bytes of every string, each followed by a
newline) and ``strings.length`` (each string's length in characters, without that newline: a
string may hold newlines of its own); its first ``ops`` strings are the op names, in op
order. ``kind``, ``module_path`` and ``target`` are string indices; ``group``,
``forward_op`` and an edge's ``tensor`` are string indices or -1 (null; for a tensor, the
producer's output); ``members`` and ``tied_to`` are a flat column of string
indices and a ``.count`` column (how many per op); an optional number field has a ``.null``
mask (1: null, its value 0). A column whose every value is the field's default is left out
(and a ``.null`` mask with no null), as in the compact JSON file; so equal graphs give
byte-identical files.

Reading checks each column with a few array operations and builds the ops and edges from the
decoded columns the way the compact reader does (:mod:`trainsched.graph.compact`). Every
problem is one TrainschedError naming the file and the column (``g.tsg: ops.compute_s[3]:
expected a finite number >= 0, got nan``).
"""

from __future__ import annotations

import itertools
import json
import operator
import os
from typing import Any, BinaryIO

import numpy

from trainsched.errors import TrainschedError
from trainsched.graph.compact import _build_edges, _build_ops
from trainsched.graph.core import Edge, Graph, Op, _EdgesToMake, _OpsToMake
from trainsched.graph.fields import _OP_SPECS, OP_KINDS
from trainsched.graph.io import dump_json

__all__ = ["BINARY_FORMAT", "BINARY_SUFFIX", "MAGIC", "graph_from_binary", "graph_to_binary",
           "is_binary"]

BINARY_FORMAT = "trainsched.graph/3"
#: ``Graph.save`` writes this format to a path with this suffix.
BINARY_SUFFIX = ".tsg"
MAGIC = (BINARY_FORMAT + "\n").encode("ascii")

_DTYPES = {"<f8": numpy.dtype("<f8"), "<i8": numpy.dtype("<i8"), "<i4": numpy.dtype("<i4"),
           "<u4": numpy.dtype("<u4"), "|u1": numpy.dtype("|u1")}
_NUMBER_DTYPE = {"float": "<f8", "int": "<i8"}
_INDEXED = ("kind", "module_path", "target")  # string indices, never null
_NAMED = ("group", "forward_op")  # string indices or -1
_DEFAULTS = {field: Op.__dataclass_fields__[field].default for field in _OP_SPECS}
_I8_MAX = 2**63 - 1
_MAX_FLOAT = 1.7976931348623157e308


#: Every column a file may have (a missing one is found when it is read).
_COLUMNS = frozenset({"strings.text", "strings.length", "edges.src", "edges.dst",
                      "edges.size_bytes", "edges.tensor",
                      *(f"ops.{f}" for f in _OP_SPECS if f != "name"),
                      *(f"ops.{f}.count" for f, (base, _) in _OP_SPECS.items() if base == "strs"),
                      *(f"ops.{f}.null" for f, (base, optional) in _OP_SPECS.items()
                        if optional and base != "str")})


def _pad(size: int) -> int:
    return -size % 8


# --- writing ------------------------------------------------------------------------------------


def graph_to_binary(graph: Graph) -> bytes:
    """The ``trainsched.graph/3`` bytes of ``graph``. A meta JSON cannot hold, or an int field
    beyond 64 bits, is a TrainschedError (the latter says to save JSON)."""
    try:
        meta_text = dump_json(graph.meta)
    except (TypeError, ValueError) as exc:
        raise TrainschedError(f"graph meta is not JSON-serialisable: {exc}") from None
    ops, edges = graph.ops, graph.edges
    n = len(ops)
    strings: dict[str, int] = dict(zip(map(operator.attrgetter("name"), ops), range(n),
                                       strict=True))

    def indices(values: list[str | None]) -> list[int]:
        """Each value's index in ``strings`` (-1 for None), new ones added in order of first
        use: a loop over the distinct values only, the lookups in C."""
        for value in dict.fromkeys(values):
            if value is not None and value not in strings:
                strings[value] = len(strings)
        return list(map(strings.get, values, itertools.repeat(-1)))

    columns: list[tuple[str, str, Any]] = []
    for field in sorted(_OP_SPECS):
        if field == "name":
            continue
        base, optional = _OP_SPECS[field]
        values = list(map(operator.attrgetter(field), ops))
        if values.count(_DEFAULTS[field]) == n:
            continue  # every op has the default
        where = f"ops.{field}"
        if field in _INDEXED or field in _NAMED:  # (only these may be None: -1)
            columns.append((where, "<i4", indices(values)))
        elif base == "strs":
            columns.append((where, "<i4", indices([s for v in values for s in v])))
            columns.append((where + ".count", "<u4", list(map(len, values))))
        else:
            nulls = [v is None for v in values]
            plain = [0 if v is None else v for v in values]
            if base == "int" and plain and max(plain) > _I8_MAX:
                k = next(k for k, v in enumerate(plain) if v > _I8_MAX)
                raise TrainschedError(f"op {ops[k].name!r}: {field} {plain[k]} does not fit in "
                                      f"the binary file's 64 bits: save the graph as .json")
            columns.append((where, _NUMBER_DTYPE[base], plain))
            if optional and any(nulls):
                columns.append((where + ".null", "|u1", nulls))
    src, dst = graph.edge_ends()
    sizes = list(map(operator.attrgetter("size_bytes"), edges))
    if sizes and max(sizes) > _I8_MAX:
        k = next(k for k, v in enumerate(sizes) if v > _I8_MAX)
        raise TrainschedError(f"edges[{k}]: size_bytes {sizes[k]} does not fit in the binary "
                              f"file's 64 bits: save the graph as .json")
    columns += [("edges.dst", "<i4", dst), ("edges.size_bytes", "<i8", sizes),
                ("edges.src", "<i4", src)]
    tensors = list(map(operator.attrgetter("tensor"), edges))
    own = list(map(operator.eq, tensors, map(operator.attrgetter("src"), edges)))
    if not all(own):  # -1: the producer's output
        columns.append(("edges.tensor", "<i4", indices([None if o else t for o, t in
                                                        zip(own, tensors, strict=True)])))
    text = list(strings)
    encoded = "".join(s + "\n" for s in text).encode("utf-8")
    columns[:0] = [("strings.length", "<u4", list(map(len, text))),
                   ("strings.text", "|u1", encoded)]
    header = (f'{{"columns": {dump_json([[c, t, len(v)] for c, t, v in columns])}, '
              f'"edges": {len(edges)}, "meta": {meta_text}, "ops": {n}}}\n')
    head = MAGIC + header.encode("utf-8")
    parts = [head, bytes(_pad(len(head)))]
    for _, dtype, values in columns:
        data = values if isinstance(values, bytes) else numpy.array(
            values, dtype=_DTYPES[dtype]).tobytes()
        parts += [data, bytes(_pad(len(data)))]
    return b"".join(parts)


# --- reading ------------------------------------------------------------------------------------


def is_binary(path: str | os.PathLike[str]) -> bool:
    """Whether the file at ``path`` starts with the binary format's magic line."""
    try:
        with open(path, "rb") as file:
            return file.read(len(MAGIC)) == MAGIC
    except OSError:
        return False


def graph_from_binary(path: str | os.PathLike[str]) -> Graph:
    """The graph in the ``trainsched.graph/3`` file ``path``; every problem is a
    TrainschedError starting with the path."""
    source = str(path)
    try:
        with open(path, "rb") as file:
            return _Reader(source, file).graph()
    except OSError as exc:
        raise TrainschedError(f"{source}: cannot read: {exc.strerror}") from None


class _Reader:
    """Reads one file: the header, then each column on demand (see the module docstring)."""

    def __init__(self, source: str, file: BinaryIO) -> None:
        self.source = source
        self.file = file
        self.size = os.fstat(file.fileno()).st_size

    def fail(self, where: str, message: str) -> TrainschedError:
        return TrainschedError(f"{self.source}: {where}: {message}")

    def header(self) -> dict[str, Any]:
        if self.file.read(len(MAGIC)) != MAGIC:
            raise self.fail("header", f"not a {BINARY_FORMAT} file (no magic line)")
        line = self.file.readline()
        if not line.endswith(b"\n"):
            raise self.fail("header", "truncated: the header line has no end")
        try:
            head = json.loads(line)
        except (ValueError, RecursionError):
            raise self.fail("header", "malformed JSON") from None
        if type(head) is not dict or set(head) != {"columns", "edges", "meta", "ops"}:
            raise self.fail("header", "expected an object with columns, edges, meta and ops")
        for key in ("ops", "edges"):
            if type(head[key]) is not int or not 0 <= head[key] < 2**31:
                raise self.fail(f"header.{key}", f"expected a count, got {head[key]!r}")
        if type(head["meta"]) is not dict:
            raise self.fail("header.meta", "expected an object")
        columns = head["columns"]
        if type(columns) is not list or not all(
                type(c) is list and len(c) == 3 and type(c[0]) is str and type(c[1]) is str
                and type(c[2]) is int and c[2] >= 0 for c in columns):
            raise self.fail("header.columns", "expected a list of [name, dtype, length]")
        return head

    def graph(self) -> Graph:
        head = self.header()
        n, m = head["ops"], head["edges"]
        self.counts = {"ops": n, "edges": m}
        self.offsets: dict[str, tuple[int, numpy.dtype, int]] = {}
        at = self.file.tell()
        at += _pad(at)
        for name, dtype, length in head["columns"]:
            if dtype not in _DTYPES:
                raise self.fail(name, f"unknown dtype {dtype!r}; expected one of "
                                f"{', '.join(_DTYPES)}")
            if name in self.offsets:
                raise self.fail(name, "a second column of this name")
            self.offsets[name] = (at, _DTYPES[dtype], length)
            size = length * _DTYPES[dtype].itemsize
            at += size + _pad(size)
        if at != self.size:
            what = "truncated" if at > self.size else "has bytes after its last column"
            raise self.fail("columns", f"{what}: the header's columns end at byte {at}, the "
                            f"file has {self.size} bytes")
        for name in self.offsets:
            if name not in _COLUMNS:
                raise self.fail(name, "unknown column")
        strings = self.strings()
        if len(strings) < n:
            raise self.fail("strings.length", f"{len(strings)} strings, but the first "
                            f"{n} must be the ops' names")
        names = strings[:n]
        if not all(names):
            k = names.index("")
            raise self.fail(f"strings[{k}]", f"the name of op {k} is empty; every op needs a "
                            "non-empty name")
        # strings looked up by index arrays in numpy (a table of the string objects)
        table = numpy.array([*strings, None], dtype=object)
        decoded, sums_fit = self.op_columns(n, table)
        ops = _OpsToMake(n, {"name": names, **decoded}, _build_ops)
        del decoded
        src = self.indices("edges.src", m, n, "ops")
        dst = self.indices("edges.dst", m, n, "ops")
        sizes = self.numbers("edges.size_bytes", m, "<i8")
        tensors = src
        if "edges.tensor" in self.offsets:
            at = self.indices("edges.tensor", m, len(strings), "strings", nullable=True)
            # null, or an empty key (hand-written): the producer's output, whose name is the
            # string at the producer's index (the names are the first strings)
            tensors = numpy.where((at < 0) | (self.lengths[at] == 0), src, at)
        edges = _Edges(table, src, dst, sizes, tensors)
        try:
            return Graph._with_ends(ops, edges, head["meta"], src, dst, sums_fit=sums_fit)
        except TrainschedError as exc:
            raise TrainschedError(f"{self.source}: {exc}") from None

    def array(self, name: str, length: int | None, dtype: str, what: str = ""
              ) -> numpy.ndarray:
        """Column ``name``: ``length`` values (None: any; ``what`` says why so many) of
        ``dtype``."""
        if name not in self.offsets:
            raise self.fail(name, "missing required column")
        at, have, count = self.offsets[name]
        if have != _DTYPES[dtype]:
            raise self.fail(name, f"dtype {have.str!r} is not the column's {dtype!r}")
        if length is not None and count != length:
            raise self.fail(name, f"{count} values, but {what}")
        self.file.seek(at)
        values = numpy.fromfile(self.file, dtype=have, count=count)
        if len(values) != count:
            raise self.fail(name, "truncated")
        return values

    def strings(self) -> list[str]:
        """The strings table: split at its newlines in one call when no string holds one (the
        usual case: the lengths agree), else cut by the lengths."""
        lengths = self.array("strings.length", None, "<u4")
        raw = self.array("strings.text", None, "|u1").tobytes()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise self.fail("strings.text", f"not UTF-8 (byte {exc.start})") from None
        self.lengths = lengths
        parts = text.split("\n")
        last = parts.pop()
        if not last and len(parts) == len(lengths) and numpy.array_equal(
                numpy.fromiter(map(len, parts), dtype=numpy.int64, count=len(parts)), lengths):
            return parts
        ends = numpy.cumsum(lengths.astype(numpy.int64) + 1)  # each with its newline
        total = int(ends[-1]) if len(ends) else 0
        if total != len(text):
            raise self.fail("strings.length", f"the lengths add up to {total} characters with "
                            f"their newlines, but strings.text has {len(text)}")
        ends = ends.tolist()
        for k, end in enumerate(ends):
            if text[end - 1] != "\n":
                raise self.fail("strings.text", f"string {k} does not end with a newline "
                                f"where strings.length says it ends")
        return [text[a:b - 1] for a, b in zip([0, *ends], ends, strict=False)]

    def indices(self, name: str, length: int, count: int, into: str, *,
                nullable: bool = False, what: str = "") -> numpy.ndarray:
        """An ``<i4`` column of indices into ``count`` things (or -1, if ``nullable``)."""
        values = self.array(name, length, "<i4", what or self._what(name))
        low = -1 if nullable else 0
        bad = (values < low) | (values >= count)
        if bad.any():
            k = int(numpy.argmax(bad))
            span = f"0..{count - 1}" if count else "none: it is empty"
            extra = " or -1" if nullable else ""
            raise self.fail(f"{name}[{k}]", f"expected an index into {into} ({span}){extra}, "
                            f"got {int(values[k])}")
        return values

    def numbers(self, name: str, length: int, dtype: str) -> numpy.ndarray:
        """A number column: every value finite and >= 0."""
        values = self.array(name, length, dtype, self._what(name))
        bad = ~(values >= 0) if dtype == "<i8" else ~((values >= 0) & numpy.isfinite(values))
        if bad.any():
            k = int(numpy.argmax(bad))
            kind = "an integer" if dtype == "<i8" else "a finite number"
            raise self.fail(f"{name}[{k}]", f"expected {kind} >= 0, got {values[k].item()!r}")
        return values

    def _what(self, name: str) -> str:
        """Why column ``name`` has as many values as it must."""
        part = "ops" if name.startswith("ops.") else "edges"
        return (f"the header says {self.counts[part]} {part} (one value per "
                f"{part[:-1]})")

    def op_columns(self, n: int, table: numpy.ndarray) -> tuple[dict[str, Any], bool]:
        """The decoded op columns present (field -> list of values), and whether their summed
        costs are finite; ``table`` holds the strings and then None."""
        decoded: dict[str, Any] = {}
        sums_fit = True
        kinds = set(OP_KINDS)
        count = len(table) - 1
        for field, (base, optional) in _OP_SPECS.items():
            name = f"ops.{field}"
            if field == "name" or name not in self.offsets:
                if f"{name}.null" in self.offsets or f"{name}.count" in self.offsets:
                    raise self.fail(name, "missing, but its companion column is there")
                continue
            if field in _INDEXED or field in _NAMED:
                at = self.indices(name, n, count, "strings", nullable=field in _NAMED)
                values = table[at].tolist()  # -1: the None at the end
                if field == "kind" and not set(values) <= kinds:
                    k = next(k for k, v in enumerate(values) if v not in kinds)
                    raise self.fail(f"{name}[{k}]", f"unknown kind {values[k]!r}; expected "
                                    f"one of {', '.join(OP_KINDS)}")
            elif base == "strs":
                counts = self.array(f"{name}.count", n, "<u4", self._what(name))
                total = int(counts.sum(dtype=numpy.int64))
                flat = table[self.indices(name, total, count, "strings",
                                          what=f"{name}.count adds up to {total}")].tolist()
                values, k = [], 0
                for c in counts.tolist():
                    values.append(tuple(flat[k:k + c]))
                    k += c
            else:
                column = self.numbers(name, n, _NUMBER_DTYPE[base])
                if base == "float" and not float(column.sum()) <= _MAX_FLOAT / 2:
                    sums_fit = False  # near the limit: the graph adds them up exactly
                if optional and f"{name}.null" in self.offsets:
                    mask = self.array(f"{name}.null", n, "|u1", self._what(name))
                    if (mask > 1).any():
                        k = int(numpy.argmax(mask > 1))
                        raise self.fail(f"{name}.null[{k}]", f"expected 0 or 1, got {mask[k]}")
                    column = column.astype(object)  # Python numbers, made in C
                    column[mask.astype(bool)] = None
                values = column.tolist()
            decoded[field] = values
        return decoded, sums_fit


class _Edges(_EdgesToMake):
    """A file's edges, checked, made into Edge records when the graph's edges are first read:
    the strings table and, per edge, the string indices of its source, destination and tensor
    key, and its size."""

    __slots__ = ("dst", "sizes", "src", "table", "tensors")

    def __init__(self, table: numpy.ndarray, src: numpy.ndarray, dst: numpy.ndarray,
                 sizes: numpy.ndarray, tensors: numpy.ndarray) -> None:
        self.table, self.src, self.dst, self.sizes, self.tensors = table, src, dst, sizes, tensors

    def __len__(self) -> int:
        return len(self.src)

    def size_bytes(self) -> int:
        return sum(self.sizes.tolist())  # Python's ints: no 64-bit overflow

    def make(self) -> list[Edge]:
        table = self.table
        srcs = table[self.src].tolist()
        tensors = srcs if self.tensors is self.src else table[self.tensors].tolist()
        return _build_edges(srcs, table[self.dst].tolist(), self.sizes.tolist(), tensors)
