"""The fields of an op and an edge, by type, and their checks: what Op and Edge validate.

:data:`_OP_SPECS` and :data:`_EDGE_SPECS` (field -> (type, optional)) drive the validation
here and the JSON readers (:mod:`trainsched.graph.io`, :mod:`trainsched.graph.fastread`).
:func:`_check_op` validates and normalises an op's values; an op whose values are all of their
field's exact type and in range, the common case, is recognised by the combination of its
value types (:func:`_plain_values`), looked at once per combination, so that checking a
million ops costs a few calls in C each. :func:`_check_sums` refuses a graph whose summed
costs or sizes overflow.
"""

from __future__ import annotations

import math
import numbers
import operator
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from trainsched.errors import TrainschedError

if TYPE_CHECKING:
    from trainsched.graph.core import Edge, Op

OP_KINDS = ("forward", "backward_input", "backward_weight", "optimizer")

# Op fields by type; drives validation and the JSON reader (trainsched.graph.io).
_FIELD_TYPES: dict[str, str] = {
    "name": "str", "kind": "str", "module_path": "str", "target": "str",
    "group": "opt_str", "forward_op": "opt_str", "members": "strs", "tied_to": "strs",
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
_op_values = operator.attrgetter(*_OP_SPECS)  # an Op's values in _OP_SPECS order, as a tuple


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
    values = _op_values(op)
    if _plain_values(values):
        return  # every value of its exact type and in range: nothing to check or convert
    for field, (base, optional), value in zip(_OP_SPECS, _OP_SPECS.values(), values,
                                              strict=True):
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


def _numbers_of(signature: tuple[type, ...], strs: type) -> tuple[Any, Any] | None:
    """For the value types of an op's fields (in ``_OP_SPECS`` order; lists of names of type
    ``strs``): getters of its numbers (to check their range) and of its lists of names, or
    None when a type is not exactly the field's own."""
    own = {"str": str, "float": float, "int": int, "strs": strs}
    numbers, names = [], []
    for k, (kind, (base, optional)) in enumerate(zip(signature, _OP_SPECS.values(),
                                                     strict=True)):
        if kind is type(None) and optional:
            continue
        if kind is not own[base]:
            return None
        if base in ("float", "int"):
            numbers.append(k)
        elif base == "strs":
            names.append(k)
    # (a getter of one item returns it bare: the first is repeated to keep a tuple)
    return operator.itemgetter(*numbers, numbers[0]), operator.itemgetter(*names, names[0])


def _plain_numbers(values: tuple[Any, ...], getters: tuple[Any, Any]) -> bool:
    """Whether the numbers among an op's values (``getters`` from :func:`_numbers_of`) are
    all finite and >= 0."""
    numbers = getters[0](values)
    try:
        # NaN and infinities make the sum NaN or infinite; a sum over the largest float (two
        # huge but valid values) is left to the field-by-field check.
        return min(numbers) >= 0 and math.fsum(numbers) <= _MAX_FLOAT
    except OverflowError:  # an integer too large for a float
        return False


def _plain_values(values: tuple[Any, ...]) -> bool:
    """Whether an op's field values (``_OP_SPECS`` order) need no check: each of the field's
    exact type, numbers finite and >= 0, lists of names empty. Each combination of types is
    looked at once (remembered), so this costs a few calls in C per op; False leaves the
    question to the field-by-field check."""
    signature = tuple(map(type, values))
    getters = _OP_SIGNATURES.get(signature, False)
    if getters is False:
        getters = _OP_SIGNATURES[signature] = _numbers_of(signature, tuple)
    return (getters is not None and _plain_numbers(values, getters)
            and not any(getters[1](values)))


_OP_SIGNATURES: dict[Any, Any] = {}


#: The cost and size fields whose sums over a graph (step times, memory) must be finite.
_SUMMED = tuple(f for f, (base, _) in _OP_SPECS.items() if base in ("int", "float")
                and not f.endswith(("_p10_s", "_p90_s")) and f != "layer_index")


def _sums_fit(columns: Mapping[str, Sequence[Any]], sizes: Sequence[Any]) -> bool:
    """Whether :func:`_check_sums` passes for ops whose fields are ``columns`` (a field left
    out: its default, which adds nothing) and edges of ``sizes``: the same sums, taken over
    the columns rather than the ops."""
    for field in _SUMMED:
        values = columns.get(field)
        if values is None:
            continue
        total = sum(values) if _OP_SPECS[field][1] is False else sum(filter(None, values))
        if total > _MAX_FLOAT:
            return False
    return sum(sizes) <= _MAX_FLOAT


def _check_sums(ops: tuple[Op, ...], edges: tuple[Edge, ...]) -> None:
    """Each cost and size summed over the graph must be a finite float: one op may hold up to
    1.8e308, but two such would make every step time infinite."""
    for field in _SUMMED:
        values = map(operator.attrgetter(field), ops)
        total = sum(values) if _OP_SPECS[field][1] is False else sum(filter(None, values))
        if total > _MAX_FLOAT:
            worst = max(ops, key=lambda op: getattr(op, field) or 0)
            raise TrainschedError(f"the ops' {field} add up to more than the largest number "
                                  f"({_MAX_FLOAT:.3g}; the largest is op {worst.name!r} with "
                                  f"{getattr(worst, field):.3g}): give costs in the field's "
                                  f"units (seconds, FLOPs, bytes)")
    if sum(map(operator.attrgetter("size_bytes"), edges)) > _MAX_FLOAT:
        raise TrainschedError(f"the edges' size_bytes add up to more than the largest number "
                              f"({_MAX_FLOAT:.3g}): give sizes in bytes")


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
