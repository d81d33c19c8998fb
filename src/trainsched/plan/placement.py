"""Placement: which device runs each op, and in what order, the part of a placed plan.

A :class:`Placement` maps every op of a graph to a device index and may carry the order the
placer ran them in (``order``: every op once, a topological order; a device runs its ops in
that order). The simulator replays that order and the runtime runs it, so the placer, the
prediction and the run agree on one schedule. A placement without an order (files written
before orders were stored, hand-written ones) runs the graph's own topological order
(:meth:`Placement.order_for`). It round-trips exactly through the ``trainsched.placement/1``
JSON file (``docs/plans.md``).
"""


from __future__ import annotations

import copy
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from trainsched.errors import TrainschedError
from trainsched.graph import (
    Graph,
    atomic_write_text,
    check_keys,
    dump_json,
    kind_of,
    nesting_guard,
    parse_json,
    read_text_file,
    show_value,
)
from trainsched.units import is_int

if TYPE_CHECKING:
    from trainsched.cluster import Cluster

PLACEMENT_FORMAT = "trainsched.placement/1"




def _names(names: Sequence[str], limit: int = 10) -> str:
    shown = ", ".join(repr(n) for n in names[:limit])
    return shown + (f", ... ({len(names) - limit} more)" if len(names) > limit else "")


# --- Placement ---------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, repr=False)
class Placement:
    """Which device runs each op: ``device_of[op name]`` is a device index below ``num_devices``.

    ``order`` (optional) lists every op of ``device_of`` once, in the order the placer started
    them: a device runs its ops in this order, each as soon as its inputs are there and the
    device's previous op has ended (``docs/placement.md``, "One order"). None: the graph's
    topological order (:meth:`order_for`).

    Checked when built (non-empty names, integer indices in range, ``order`` a permutation of
    the ops); :meth:`validate` checks it against a graph (the order must be topological) and
    optionally a cluster. ``device_of`` and ``meta`` are stored read-only, ``device_of`` sorted
    by name, so equal placements print and save identically.
    """

    device_of: Mapping[str, int]
    num_devices: int
    meta: Mapping[str, Any] = field(default_factory=dict)
    order: Sequence[str] | None = None

    __hash__ = None  # type: ignore[assignment]  # the mappings are not hashable

    def __post_init__(self) -> None:
        n = self.num_devices
        if not is_int(n) or n < 1:
            raise TrainschedError(f"placement: num_devices must be an integer >= 1, got {n!r}")
        if not isinstance(self.device_of, Mapping):
            raise TrainschedError(
                f"placement: device_of must map op names to device indices, "
                f"got {type(self.device_of).__name__}"
            )
        for name, device in self.device_of.items():
            if not isinstance(name, str) or not name:
                raise TrainschedError(
                    f"placement: op names must be non-empty strings, got {name!r}"
                )
            if not is_int(device) or not 0 <= device < n:
                raise TrainschedError(
                    f"placement: op {name!r} is on device {device!r}, outside 0..{n - 1}; "
                    f"use an index below num_devices={n} or raise num_devices"
                )
        if not isinstance(self.meta, Mapping):
            raise TrainschedError(f"placement: meta must be a mapping, got {self.meta!r}")
        device_of = dict(sorted(self.device_of.items()))
        if self.order is not None:
            object.__setattr__(self, "order", _checked_order(self.order, device_of))
        object.__setattr__(self, "device_of", MappingProxyType(device_of))
        object.__setattr__(self, "meta", MappingProxyType(copy.deepcopy(dict(self.meta))))

    def __repr__(self) -> str:
        ordered = ", ordered" if self.order is not None else ""
        return f"<Placement: {len(self.device_of)} ops on {self.num_devices} devices{ordered}>"

    def order_for(self, graph: Graph) -> tuple[str, ...]:
        """The order ``graph``'s ops run in: the stored :attr:`order`, or without one the
        graph's topological order (``Graph.topological_order``: program order for a captured
        graph, which is also the order a placement without one has always run in)."""
        if self.order is not None:
            return tuple(self.order)
        return graph.topological_order()

    def device_orders(self, graph: Graph | None = None) -> tuple[tuple[str, ...], ...]:
        """Per device, its ops in the order it runs them (:meth:`order_for`; without an order
        or a graph, by name)."""
        if self.order is not None:
            names: Sequence[str] = self.order
        elif graph is not None:
            names = graph.topological_order()
        else:
            names = tuple(self.device_of)
        orders: list[list[str]] = [[] for _ in range(self.num_devices)]
        for name in names:
            device = self.device_of.get(name)
            if device is not None:
                orders[device].append(name)
        return tuple(tuple(ops) for ops in orders)

    @classmethod
    def single(cls, graph: Graph, device: int = 0, *, num_devices: int | None = None) -> Placement:
        """Every op of ``graph`` on ``device``: the baseline placements are measured against.

        ``num_devices`` defaults to ``device + 1``.
        """
        if not is_int(device) or device < 0:
            raise TrainschedError(f"device must be an integer >= 0, got {device!r}")
        return cls(
            device_of=dict.fromkeys(graph.topological_order(), device),
            num_devices=device + 1 if num_devices is None else num_devices,
            meta={"policy": "single"},
        )

    def validate(self, graph: Graph, cluster: Cluster | None = None) -> None:
        """Check that this places ``graph`` (and fits ``cluster``); raise naming the ops if not.

        Every op of the graph has a device, no other names appear, the ops of one co-location
        group (``Op.group``) share a device, and the cluster has ``num_devices`` devices or more.
        """
        missing = [name for name in graph.topological_order() if name not in self.device_of]
        if missing:
            raise TrainschedError(
                f"placement leaves {len(missing)} op(s) of the graph without a device: "
                f"{_names(missing)}; give every op a device"
            )
        unknown = [name for name in self.device_of if name not in graph]
        if unknown:
            raise TrainschedError(
                f"placement names {len(unknown)} op(s) that are not in the graph: "
                f"{_names(unknown)}; remove them, or validate against the graph they come from"
            )
        groups: dict[str, list[str]] = {}
        for op in graph.ops:
            if op.group is not None:
                groups.setdefault(op.group, []).append(op.name)
        for group, members in groups.items():
            devices = sorted({self.device_of[name] for name in members})
            if len(devices) > 1:
                where = ", ".join(f"{name!r} on {self.device_of[name]}" for name in members[:10])
                raise TrainschedError(
                    f"co-location group {group!r} is split across devices {devices}: {where}; "
                    "put all ops of a group on one device"
                )
        if self.order is not None:
            position = {name: k for k, name in enumerate(self.order)}
            for e in graph.edges:
                if position[e.src] > position[e.dst]:
                    raise TrainschedError(
                        f"the placement's order runs {e.dst!r} before {e.src!r}, whose output it "
                        "reads; list the ops in a topological order (or drop 'order' to run the "
                        "graph's own)")
        if cluster is not None and self.num_devices > cluster.num_devices:
            raise TrainschedError(
                f"placement uses {self.num_devices} devices but cluster {cluster.name!r} has "
                f"{cluster.num_devices}; place on fewer devices or use a larger cluster"
            )

    def ops_on(self, device: int, graph: Graph | None = None) -> tuple[str, ...]:
        """Names of the ops on ``device`` in the order it runs them (:meth:`device_orders`)."""
        if not is_int(device) or not 0 <= device < self.num_devices:
            raise TrainschedError(
                f"device {device!r} is outside 0..{self.num_devices - 1} of this placement"
            )
        return self.device_orders(graph)[device]

    # --- JSON ----------------------------------------------------------------------------------

    def to_json(self) -> str:
        """The file text (``trainsched.placement/1``): byte-identical for equal placements."""
        try:
            meta = dump_json(dict(self.meta))
        except (TypeError, ValueError) as exc:
            raise TrainschedError(f"placement meta is not JSON-serialisable: {exc}") from None
        entries = ",".join(f"\n  {dump_json(name)}: {d}" for name, d in self.device_of.items())
        device_of = f"{{{entries}\n}}" if entries else "{}"
        order = ""
        if self.order is not None:
            listed = ",".join(f"\n  {dump_json(name)}" for name in self.order)
            order = f',\n"order": [{listed}\n]' if listed else ',\n"order": []'
        return (
            f'{{"format": {dump_json(PLACEMENT_FORMAT)},\n"num_devices": {self.num_devices},\n'
            f'"meta": {meta},\n"device_of": {device_of}{order}}}\n'
        )

    @classmethod
    def from_json(cls, text: str, source: str = "<string>") -> Placement:
        """Parse the file text; every problem is a TrainschedError that starts with ``source``."""
        with nesting_guard(source):
            return cls._from_doc(_read_json(text, source), source)

    @classmethod
    def _from_doc(cls, doc: Any, source: str) -> Placement:
        if not isinstance(doc, dict):
            raise TrainschedError(f"{source}: expected a JSON object, got {kind_of(doc)}")
        if doc.get("format") != PLACEMENT_FORMAT:
            found = f"format {doc['format']!r}" if "format" in doc else "no 'format' field"
            raise TrainschedError(
                f"{source}: {found}; this reader supports {PLACEMENT_FORMAT!r} "
                "(is this a placement file?)"
            )
        fields = ("format", "num_devices", "meta", "device_of", "order")
        check_keys(doc, fields, ("num_devices", "device_of"), source, "")
        if not is_int(doc["num_devices"]):
            raise TrainschedError(
                f"{source}: num_devices: expected an integer, got {show_value(doc['num_devices'])}"
            )
        device_of = doc["device_of"]
        if not isinstance(device_of, dict):
            raise TrainschedError(
                f"{source}: device_of: expected an object mapping op names to device indices, "
                f"got {kind_of(device_of)}"
            )
        for name, device in device_of.items():
            if not is_int(device):
                raise TrainschedError(
                    f"{source}: device_of[{name!r}]: expected an integer device index, "
                    f"got {show_value(device)}"
                )
        meta = doc.get("meta", {})
        if not isinstance(meta, dict):
            raise TrainschedError(f"{source}: meta: expected an object, got {kind_of(meta)}")
        order = doc.get("order")
        if order is not None and not (isinstance(order, list)
                                      and all(isinstance(name, str) for name in order)):
            raise TrainschedError(f"{source}: order: expected a list of op names, got "
                                  f"{show_value(order)}")
        try:
            return cls(device_of=device_of, num_devices=doc["num_devices"], meta=meta,
                       order=order)
        except TrainschedError as exc:
            raise TrainschedError(f"{source}: {exc}") from None

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the JSON file atomically (a failure leaves the old file, never a partial one)."""
        atomic_write_text(path, self.to_json())

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Placement:
        """Read a placement file written by :meth:`save` or by hand (docs/plans.md)."""
        return cls.from_json(read_text_file(path, "placement"), source=str(path))


def _checked_order(order: Any, device_of: Mapping[str, int]) -> tuple[str, ...]:
    """``order`` as a tuple, checked to list every placed op exactly once."""
    if isinstance(order, str) or not isinstance(order, Sequence):
        raise TrainschedError(f"placement: order must be a sequence of op names, got "
                              f"{type(order).__name__}")
    order = tuple(order)
    seen: set[str] = set()
    twice: set[str] = set()
    for name in order:
        (twice if name in seen else seen).add(name)
    if twice:
        raise TrainschedError(f"placement: order lists {_names(sorted(set(twice)))} more than "
                              "once; list every op exactly once")
    unknown = [name for name in order if name not in device_of]
    if unknown:
        raise TrainschedError(f"placement: order names {len(unknown)} op(s) without a device: "
                              f"{_names(unknown)}; order only the placed ops")
    missing = [name for name in device_of if name not in seen]
    if missing:
        raise TrainschedError(f"placement: order leaves out {len(missing)} placed op(s): "
                              f"{_names(missing)}; list every op exactly once")
    return order


def _read_json(text: str, source: str) -> Any:
    """``json.loads`` with errors naming ``source``; a key twice in one object is an error."""

    def unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        obj: dict[str, Any] = {}
        for key, value in pairs:
            if key in obj:
                raise TrainschedError(
                    f"{source}: key {key!r} appears twice in one object; keep one "
                    "(an op is placed exactly once)"
                )
            obj[key] = value
        return obj

    return parse_json(text, source, object_pairs_hook=unique)


