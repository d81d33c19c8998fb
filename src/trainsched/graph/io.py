"""The graph JSON files, atomic file writes and the JSON helpers of every format.

Graphs are written in the compact ``trainsched.graph/2`` (by columns,
:mod:`trainsched.graph.compact`); ``trainsched.graph/1`` (one object per op and per edge, every
field written) is still read, and written on request. Either text is deterministic (sorted keys,
fixed separators), so equal graphs give byte-identical files; the reader names the field of every
problem (``g.json: ops[3].compute_s: expected a number, got "fast"``). The fields are documented
in ``docs/graph-format.md``.

The helpers here are shared by trainsched's other file formats (plans, clusters, traces):
:func:`atomic_write_bytes` never leaves a partial file, :func:`read_text_file` turns a missing,
empty, unreadable or non-UTF-8 file (or a directory) into a user error, :func:`parse_json` and
:func:`nesting_guard` do the same for malformed or absurdly nested JSON, and :func:`check_keys`,
:func:`dump_json`, :func:`kind_of` and :func:`show_value` word the errors about a JSON document
the same way in every format.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import json
import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from trainsched.errors import TrainschedError
from trainsched.graph.core import _EDGE_FIELDS, _OP_FIELDS, Edge, Graph, Op
from trainsched.graph.fields import _EDGE_SPECS, _OP_SPECS

__all__ = [
    "FORMAT",
    "FORMATS",
    "FORMAT_V1",
    "atomic_write_bytes",
    "atomic_write_text",
    "check_keys",
    "dump_json",
    "graph_from_json",
    "graph_to_json",
    "kind_of",
    "nesting_guard",
    "parse_json",
    "read_text_file",
    "show_value",
]

#: The format graphs are written in (compact, :mod:`trainsched.graph.compact`), the older one
#: (one object per op and per edge), and every format read.
FORMAT = "trainsched.graph/2"
FORMAT_V1 = "trainsched.graph/1"
FORMATS = (FORMAT_V1, FORMAT)

_ENCODER = json.JSONEncoder(sort_keys=True, separators=(", ", ": "), allow_nan=False)


def dump_json(value: Any) -> str:
    """One JSON value as deterministic text: sorted keys, ``", "`` and ``": "`` separators; NaN
    and infinities refused (ValueError), like anything JSON cannot hold (TypeError)."""
    return _ENCODER.encode(value)


def graph_to_json(graph: Graph, *, format: str = FORMAT) -> str:
    """The file text, byte-identical for equal graphs: in ``format``, the compact
    ``trainsched.graph/2`` (:data:`FORMAT`) unless ``trainsched.graph/1`` (:data:`FORMAT_V1`,
    one object per op and per edge with every field) is asked for."""
    if format == "trainsched.graph/3":
        raise TrainschedError("trainsched.graph/3 is a binary format, not JSON text: "
                              "Graph.save(path) writes it to a path ending in .tsg")
    if format not in FORMATS:
        raise TrainschedError(f"unknown graph format {format!r}; expected one of "
                              f"{', '.join(map(repr, FORMATS))}")
    try:
        meta = dump_json(graph.meta)
    except (TypeError, ValueError) as exc:
        raise TrainschedError(f"graph meta is not JSON-serialisable: {exc}") from None
    if format == FORMAT:
        from trainsched.graph.compact import compact_to_json

        return compact_to_json(graph, meta)
    ops = [dump_json({f: getattr(op, f) for f in _OP_FIELDS} | {"members": list(op.members)})
           for op in graph.ops]  # fmt: skip
    edges = [dump_json({f: getattr(e, f) for f in _EDGE_FIELDS}) for e in graph.edges]
    return (
        f'{{"format": {dump_json(FORMAT_V1)},\n"meta": {meta},\n'
        f'"ops": [{_lines(ops)}],\n"edges": [{_lines(edges)}]}}\n'
    )


def graph_from_json(text: str, source: str = "<string>") -> Graph:
    """Parse the file text; every problem is a TrainschedError that starts with ``source``."""
    with nesting_guard(source):
        return _graph_from_doc(parse_json(text, source), source)


def _graph_from_doc(doc: Any, source: str) -> Graph:
    if not isinstance(doc, dict):
        raise TrainschedError(f"{source}: expected a JSON object, got {kind_of(doc)}")
    supported = " and ".join(map(repr, FORMATS))
    if "format" not in doc:
        raise TrainschedError(f"{source}: no 'format' field; this reader supports {supported}")
    if doc["format"] not in FORMATS:
        raise TrainschedError(
            f"{source}: unsupported format {doc['format']!r}; this reader supports {supported}"
        )
    compact = doc["format"] == FORMAT
    known = {"format", "meta", "ops", "edges", *(("strings",) if compact else ())}
    check_keys(doc, known, {"ops", "edges"}, source, "")
    meta = doc.get("meta", {})
    if not isinstance(meta, dict):
        raise TrainschedError(f"{source}: meta: expected an object, got {show_value(meta)}")
    if compact:
        from trainsched.graph.compact import compact_from_doc

        return compact_from_doc(doc, source, meta)
    ops = [_read_record(Op, _OP_SPECS, item, source, f"ops[{i}]")
           for i, item in enumerate(_list(doc, "ops", source))]  # fmt: skip
    edges = [_read_record(Edge, _EDGE_SPECS, item, source, f"edges[{i}]")
             for i, item in enumerate(_list(doc, "edges", source))]  # fmt: skip
    try:
        return Graph(ops, edges, meta)
    except TrainschedError as exc:
        raise TrainschedError(f"{source}: {exc}") from None


def read_text_file(path: str | os.PathLike[str], what: str) -> str:
    """A UTF-8 file's text, without the byte-order mark some editors put first.

    A missing, empty (nothing but white space), unreadable or non-UTF-8 file, or a directory, is
    a user error naming the path; ``what`` names the kind of file expected ("graph").
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise TrainschedError(f"{path}: no such {what} file") from None
    except IsADirectoryError:
        raise TrainschedError(f"{path}: is a directory, not a {what} file") from None
    except UnicodeDecodeError as exc:
        raise TrainschedError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise TrainschedError(f"{path}: cannot read: {exc.strerror}") from None
    if not text.strip():
        raise TrainschedError(f"{path}: file is empty (expected a {what} file)")
    return text


def parse_json(text: str, source: str, object_pairs_hook: Any = None) -> Any:
    """``json.loads`` whose every failure is a TrainschedError starting with ``source``: the line
    and column of malformed text, or nesting too deep for the parser."""
    try:
        return json.loads(text, object_pairs_hook=object_pairs_hook)
    except json.JSONDecodeError as exc:
        hint = " (the text ends early: truncated?)" if exc.pos >= len(text.rstrip()) else ""
        raise TrainschedError(
            f"{source}: malformed JSON at line {exc.lineno}, column {exc.colno}: "
            f"{exc.msg}{hint}"
        ) from None
    except RecursionError:
        raise _too_deep(source) from None


@contextlib.contextmanager
def nesting_guard(source: str, language: str = "JSON") -> Iterator[None]:
    """Reading a document nested so deeply that Python's recursion limit stops the reader
    (parsing, or printing one of its values in an error) is a user error naming ``source`` and
    the ``language`` it is written in.

    Wrap only the conversion of one document, where recursion depth can come from nothing else.
    """
    try:
        yield
    except RecursionError:
        raise _too_deep(source, language) from None


def _too_deep(source: str, language: str = "JSON") -> TrainschedError:
    """The error for a document nested deeper than the reader can follow."""
    return TrainschedError(f"{source}: {language} nested too deeply (trainsched files nest a "
                           "few levels; is this the right file?)")


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


def _lines(items: list[str]) -> str:
    return "".join(f"\n  {item}" + ("," if k < len(items) - 1 else "\n")
                   for k, item in enumerate(items))  # fmt: skip


def show_value(value: Any) -> str:
    """A JSON value as it appears in an error message: its JSON text, cut to 60 characters."""
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


def kind_of(value: Any) -> str:
    """What a JSON value is, in words for an error message: "an object", "a list", "null", ..."""
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}
    return "null" if value is None else names.get(type(value), "a number")


def _list(doc: dict[str, Any], key: str, source: str) -> list[Any]:
    if not isinstance(doc[key], list):
        raise TrainschedError(f"{source}: {key}: expected a list, got {kind_of(doc[key])}")
    return doc[key]


def check_keys(
    record: dict[str, Any], known: Iterable[str], required: Iterable[str], source: str, where: str
) -> None:
    """Missing required and unknown fields of a JSON object, named (with a close match when
    there is one): a TrainschedError starting ``source: where: `` (``source: `` when ``where`` is
    empty)."""
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
        raise TrainschedError(f"{source}: {where}: expected an object, got {kind_of(item)}")
    check_keys(item, specs, _REQUIRED[cls], source, where)
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
    raise TrainschedError(f"{where}: expected {expected}, got {show_value(value)}")
