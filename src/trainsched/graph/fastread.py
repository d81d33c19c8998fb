"""``Graph.load``; and a ``trainsched.graph/1`` file in its writer's layout, read one line at a
time, fast and lean.

:func:`trainsched.graph.io.graph_to_json` (asked for ``trainsched.graph/1``, as trainsched wrote
every graph before the compact ``trainsched.graph/2``) writes one op or edge per line with every
field in sorted order. A file in that layout (every file trainsched wrote before, and hand-
written files that keep it) is read here line by line: no copy of the whole text and no list of
parsed records is ever held, so memory grows with the graph, not with the file; each record
becomes an Op or Edge through a straight-line check of its fields (no dataclass ``__init__`` per
op), and repeated strings (targets, module paths, names an edge or a derived op refers to) are
shared rather than held once per op. A graph of a million ops is read in seconds instead of a
minute.

Nothing here decides what a file means or words an error: anything unusual (another layout, a
malformed line, a field of the wrong type, a graph the constructor refuses) makes
:func:`read_layout` return ``None``, and the caller reads the file the ordinary way
(:func:`trainsched.graph.io.graph_from_json`), which gives the same graph or the precise error.
Records that are valid but not in the writer's exact types (an integer where a float is
expected) go through the ordinary record reader one by one.
"""

from __future__ import annotations

import json
import operator
import os
from collections.abc import Callable, Iterator
from typing import Any

from trainsched.errors import TrainschedError
from trainsched.graph.binary import graph_from_binary, is_binary
from trainsched.graph.compact import read_lines
from trainsched.graph.core import Edge, Graph, Op, gc_paused
from trainsched.graph.fields import _EDGE_SPECS, _OP_SPECS, OP_KINDS, _numbers_of, _plain_numbers
from trainsched.graph.io import _graph_from_doc, _read_record, graph_from_json, read_text_file

__all__ = ["Progress", "load_graph", "read_layout"]

#: ``progress(done, total, item)``: bytes of the file read so far, of ``total``.
Progress = Callable[[int, int, str], None]

_HEAD = '{"format": "trainsched.graph/1",\n'
_EVERY = 1 << 15  # lines between progress reports
_OP_KEYS = frozenset(_OP_SPECS)
_EDGE_KEYS = frozenset(_EDGE_SPECS)


def _builder_source() -> str:
    """The text of ``build(values, names, strings)``: the Op whose fields, in ``_OP_SPECS``
    order, are ``values`` (numbers already checked by :func:`_numbers_of`), or ``None`` when a
    name, kind or list of names is not what the writer writes (the ordinary reader then
    handles the record). Strings repeated across ops are shared through ``names`` (op names)
    and ``strings`` (the rest)."""
    fields = list(_OP_SPECS)
    lines = ["def build(values, names, strings):",
             f"    ({', '.join(f'v{k}' for k in range(len(fields)))},) = values",
             "    op = new(Op)"]
    for k, (field, (base, optional)) in enumerate(_OP_SPECS.items()):
        v = f"v{k}"
        if base == "strs":
            lines += [f"    if {v}:",
                      f"        if not all(type(x) is str for x in {v}): return None",
                      f"        {v} = tuple({v})",
                      f"    else: {v} = ()"]
        elif field == "name":
            lines += [f"    if not {v}: return None", f"    name = {v}"]
        elif field == "kind":
            lines += [f"    {v} = KINDS.get({v})", f"    if {v} is None: return None"]
        elif base == "str" and optional:  # a name of an op: group, forward_op
            lines += [f"    if {v} is not None: {v} = name if {v} == name else "
                      f"names.get({v}, {v})"]
        elif base == "str":
            lines.append(f"    {v} = strings.setdefault({v}, {v})")
        lines.append(f"    S{k}(op, {v})")
    lines.append("    return op")
    return "\n".join(lines) + "\n"


def _make_builder() -> Callable[[tuple[Any, ...], dict[str, str], dict[str, str]], Op | None]:
    scope: dict[str, Any] = {
        "new": object.__new__, "Op": Op, "KINDS": {kind: kind for kind in OP_KINDS},
        **{f"S{k}": getattr(Op, field).__set__ for k, field in enumerate(_OP_SPECS)},
    }
    exec(_builder_source(), scope)  # our own text, built from the field table
    return scope["build"]


_build_op = _make_builder()
_op_values = operator.itemgetter(*_OP_SPECS)
def _op_from(item: dict[str, Any], names: dict[str, str], strings: dict[str, str],
             signatures: dict[tuple[type, ...], Any]) -> Op | None:
    """The Op of a record with every field, when its values are of the writer's types and in
    range (numbers finite and >= 0); else None. Raises KeyError for a field it does not know."""
    values = _op_values(item)
    signature = tuple(map(type, values))
    getters = signatures.get(signature, False)
    if getters is False:
        getters = signatures[signature] = _numbers_of(signature, list)
    if getters is None or not _plain_numbers(values, getters):
        return None
    return _build_op(values, names, strings)


_set_src, _set_dst = Edge.src.__set__, Edge.dst.__set__  # type: ignore[attr-defined]
_set_size, _set_tensor = Edge.size_bytes.__set__, Edge.tensor.__set__  # type: ignore[attr-defined]


_edge_values = operator.itemgetter("src", "dst", "size_bytes", "tensor")
_EDGE_TYPES = (str, str, int, str)
_new = object.__new__


def _build_edge(d: dict[str, Any], names: dict[str, str]) -> Edge | None:
    """The Edge record ``d`` describes (known keys only), or None when a field is not of the
    writer's type or in range."""
    src, dst, size = d.get("src"), d.get("dst"), d.get("size_bytes")
    tensor = d.get("tensor", "")
    if (type(src) is not str or type(dst) is not str or type(size) is not int or size < 0
            or type(tensor) is not str):
        return None
    e = object.__new__(Edge)
    src = names.get(src, src)
    _set_src(e, src)
    _set_dst(e, names.get(dst, dst))
    _set_size(e, size)
    _set_tensor(e, src if not tensor or tensor == src else tensor)
    return e


class _Lines:
    """The lines of a file, with how many bytes have been read, for progress reports."""

    def __init__(self, file: Any, total: int, progress: Progress | None) -> None:
        self.file = file
        self.total = total
        self.progress = progress

    def report(self) -> None:
        if self.progress is not None:
            self.progress(min(self.file.buffer.tell(), self.total), self.total, "")


def _read_list(lines: _Lines, it: Iterator[str], add: Callable[[Any], bool]) -> str | None:
    """Read the items of a list whose opening line was read, one per line with ``,`` after all
    but the last, handing each to ``add`` (False: give up); the line after the list, or None
    on a layout problem."""
    scan = _SCAN
    for count, line in enumerate(it, 1):
        if not count % _EVERY:
            lines.report()
        if not line.startswith("  {"):
            return None
        try:
            item, end = scan(line, 2)
        except StopIteration:
            return None
        rest = len(line) - end
        if rest == 2 and line.endswith(",\n"):
            if not add(item):
                return None
        elif rest == 1 and line.endswith("\n"):
            return next(it, "") if add(item) else None
        else:
            return None
    return None


_SCAN = json.JSONDecoder().scan_once


def _read(lines: _Lines, source: str) -> Graph | None:
    it = iter(lines.file)
    if next(it, "") != _HEAD:
        return None
    line = next(it, "")
    if not (line.startswith('"meta": ') and line.endswith(",\n")):
        return None
    meta = json.loads(line[8:-2])
    if not isinstance(meta, dict):
        return None
    names: dict[str, str] = {}
    strings: dict[str, str] = {}
    signatures: dict[tuple[type, ...], Any] = {}
    ops: list[Op] = []
    edges: list[Edge] = []

    def add_op(item: Any) -> bool:
        if type(item) is not dict:
            return False
        if len(item) == len(_OP_SPECS):  # every field: read them in one go
            try:
                op = _op_from(item, names, strings, signatures)
            except KeyError:  # as many fields, but one of them unknown
                return False
        elif item.keys() <= _OP_KEYS:
            op = None
        else:
            return False
        if op is None:  # valid in other types, or an error: the ordinary record reader
            op = _read_record(Op, _OP_SPECS, item, source, f"ops[{len(ops)}]")
        names[op.name] = op.name
        ops.append(op)
        return True

    def add_edge(item: Any) -> bool:
        if type(item) is not dict:
            return False
        if len(item) == len(_EDGE_SPECS):  # every field, as the writer writes: the fast way
            try:
                values = _edge_values(item)
            except KeyError:  # as many fields, but one of them unknown
                return False
            if tuple(map(type, values)) == _EDGE_TYPES and values[2] >= 0:
                src, dst, size, tensor = values
                e = _new(Edge)
                src = names.get(src, src)
                _set_src(e, src)
                _set_dst(e, names.get(dst, dst))
                _set_size(e, size)
                _set_tensor(e, src if not tensor or tensor == src else tensor)
                edges.append(e)
                return True
        elif not item.keys() <= _EDGE_KEYS:
            return False
        e = _build_edge(item, names)
        if e is None:
            e = _read_record(Edge, _EDGE_SPECS, item, source, f"edges[{len(edges)}]")
        edges.append(e)
        return True

    line = next(it, "")
    if line == '"ops": [],\n':
        tail = next(it, "")
    elif line == '"ops": [\n':
        if _read_list(lines, it, add_op) != "],\n":
            return None
        tail = next(it, "")
    else:
        return None
    if tail == '"edges": [\n':
        if _read_list(lines, it, add_edge) != "]}\n":
            return None
    elif tail != '"edges": []}\n':
        return None
    if any(line.strip() for line in it):
        return None
    lines.report()
    names.clear()  # their strings live on in the ops; the tables are not needed any more
    strings.clear()
    return Graph(ops, edges, meta)


def read_layout(path: str | os.PathLike[str], progress: Progress | None = None
                ) -> Graph | None:
    """The graph in file ``path`` if the file is in the writer's layout and valid, else None
    (module docstring). ``progress(done, total, "")`` hears how many bytes are read."""
    source = str(path)
    try:
        total = os.path.getsize(path)
        with gc_paused(), open(path, encoding="utf-8-sig", newline="\n") as file:
            return _read(_Lines(file, total, progress), source)
    except (OSError, ValueError, ArithmeticError, TrainschedError, RecursionError):
        # unreadable, not UTF-8, malformed JSON, a refused record or graph: the ordinary
        # reader says which
        return None


def _compact_lines(path: str | os.PathLike[str], progress: Progress | None
                   ) -> dict[str, Any] | None:
    """A compact file's document read line by line (:func:`trainsched.graph.compact.read_lines`),
    or None (another layout, or anything wrong: the whole text says what)."""
    report = None if progress is None else (lambda done, total: progress(done, total, ""))
    try:
        with open(path, encoding="utf-8-sig", newline="\n") as file:
            return read_lines(file, report)
    except (OSError, ValueError, RecursionError):
        return None


def load_graph(path: str | os.PathLike[str], progress: Progress | None = None) -> Graph:
    """Read graph file ``path``: a file in its writer's layout line by line (a
    ``trainsched.graph/1`` file by :func:`read_layout`, a compact ``trainsched.graph/2`` one a
    column per line); any other (a hand-written file), or to word an error, the whole text at
    once; a binary ``trainsched.graph/3`` file (told by its first bytes) by columns
    (:mod:`trainsched.graph.binary`). ``progress`` as for :func:`read_layout`."""
    if is_binary(path):
        with gc_paused():
            graph = graph_from_binary(path)
        if progress is not None:
            size = os.path.getsize(path)
            progress(size, size, "")
        return graph
    graph = read_layout(path, progress)
    if graph is not None:
        return graph
    with gc_paused():
        doc = _compact_lines(path, progress)
        if doc is not None:  # the same document the whole text gives, so the same errors
            return _graph_from_doc(doc, str(path))
        graph = graph_from_json(read_text_file(path, "graph"), source=str(path))
    if progress is not None:
        size = os.path.getsize(path)
        progress(size, size, "")
    return graph
