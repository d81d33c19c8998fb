"""Clusters from files and flags: :func:`load_cluster_file` (TOML or JSON, ``docs/cluster.md``),
:func:`cluster_from_flags`, and :func:`resolve_cluster`, which reads a preset name or a file.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import re
import sys
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Any

from trainsched.cluster.catalogue import (
    DEVICE_KINDS,
    PRESETS,
    _find_kind,
    _find_preset,
    cluster_preset,
)
from trainsched.cluster.spec import (
    _COLLECTIVE_DEFAULTS,
    _COLLECTIVE_KEYS,
    COMM_MODES,
    DTYPES,
    FORMAT,
    STREAM_SLOWDOWN_DEFAULT,
    Cluster,
    DeviceSpec,
    Link,
    _require,
)
from trainsched.errors import TrainschedError
from trainsched.graph.io import nesting_guard, read_text_file
from trainsched.units import (
    is_int,
    parse_bandwidth,
    parse_duration,
    parse_flops_rate,
    parse_size,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

# ---------------------------------------------------------------------------------------------
# Files and flags

def load_cluster_file(path: str | Path) -> Cluster:
    """Read a cluster from a ``.toml`` or ``.json`` file (format in ``docs/cluster.md``)."""
    path = Path(path)
    suffix = path.suffix.lower()
    _require(suffix in (".toml", ".json"),
             f"cluster file {str(path)!r}: expected a .toml or .json file")
    _require(path.exists(), f"cluster file {str(path)!r} not found")
    text = read_text_file(path, "cluster")
    with nesting_guard(str(path), suffix[1:].upper()):
        try:
            data = tomllib.loads(text) if suffix == ".toml" else json.loads(text)
        except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
            raise TrainschedError(f"{path}: invalid {suffix[1:].upper()}: {exc}") from None
        _require(isinstance(data, dict), f"{path}: expected a table/object at the top level")
        return cluster_from_dict({"name": path.stem, **data}, str(path))


class _Table:
    """One table of a cluster file; every error names the source, the table and the field."""

    def __init__(self, data: Any, source: str, section: str, allowed: tuple[str, ...]) -> None:
        where = f"{source}: [{section}]" if section else source
        self.data, self.where = data, where
        self.field_prefix = f"{where} " if section else f"{source}: "
        _require(isinstance(data, Mapping), f"{where}: expected a table, got {data!r}")
        for key in data:
            if key not in allowed:
                close = difflib.get_close_matches(str(key), allowed, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise TrainschedError(f"{where}: unknown field {key!r}{hint}; "
                                      f"allowed: {', '.join(allowed)}")

    def get(self, key: str, parse: Callable[[Any], Any], default: Any = ...) -> Any:
        if key not in self.data:
            _require(default is not ..., f"{self.where}: missing required field {key!r}")
            return default
        try:
            return parse(self.data[key])
        except TrainschedError as exc:
            raise TrainschedError(f"{self.field_prefix}{key}: {exc}") from None


def _string(value: Any) -> str:
    _require(isinstance(value, str), f"expected a string, got {value!r}")
    return value


def _count(value: Any, minimum: int = 1) -> int:
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    _require(is_int(value) and value >= minimum,
             f"expected an integer >= {minimum}, got {value!r}")
    return value


def _number_parser(meaning: str) -> Callable[[Any], float]:
    """A parser of one plain number; ``meaning`` says what it is in the error."""

    def parse(value: Any) -> float:
        _require(isinstance(value, int | float) and not isinstance(value, bool),
                 f"expected a number ({meaning}), got {value!r}")
        return float(value)

    return parse


_share = _number_parser("seconds of compute lost per second of communication")
_slowdown = _number_parser("how much slower each of two kernels sharing the device runs")
_rate = _number_parser("the rate, 1 = full speed, while the other side runs")
_fraction = _number_parser("in [0, 1]")
_cv = _number_parser("the coefficient of variation: 0.01 for 1%")
_stretch = _number_parser("how many times longer an action runs inside a pipeline than alone: "
                          "1.1 for 10%")


def _comm(value: Any) -> str:
    _require(value in COMM_MODES, f"expected 'sequential' or 'parallel', got {value!r}")
    return value


def _peak_flops(value: Any) -> dict[str, float]:
    """One rate (fp32) or a table by dtype; also ``"fp32=10TFLOP/s,fp16=40TFLOP/s"`` text."""
    if isinstance(value, str) and "=" in value:
        pairs = [part.partition("=") for part in value.split(",")]
        _require(all(sep for _, sep, _ in pairs),
                 f"expected one rate or DTYPE=RATE pairs separated by commas, got {value!r}")
        value = {dtype: rate for dtype, _, rate in pairs}
    if not isinstance(value, Mapping):
        return {"fp32": parse_flops_rate(value)}
    rates = {str(k).strip(): parse_flops_rate(v) for k, v in value.items()}
    unknown = sorted(set(rates) - set(DTYPES))
    _require(not unknown, f"unknown dtype(s) {', '.join(map(repr, unknown))}; "
                          f"accepted: {', '.join(DTYPES)}")
    _require("fp32" in rates, "a table of rates must include fp32")
    return rates


def _device(kind: str | None, values: dict[str, Any], where: str,
            label: Callable[[str], str]) -> DeviceSpec:
    """A catalogue kind with overrides, or a custom device given in full."""
    base = _find_kind(kind) if kind else None
    if base is None:
        missing = [label(k) for k in ("memory", "peak_flops", "memory_bandwidth")
                   if values.get(k) is None]
        known = ", ".join(DEVICE_KINDS)
        _require(not (kind and missing), f"{where}: unknown device kind {kind!r} (known: "
                                         f"{known}); give a known kind or all of "
                                         f"{', '.join(missing)}")
        _require(not missing, f"{where}: missing {', '.join(missing)}; give them or a device "
                              f"kind from the catalogue ({known})")

    def pick(key: str, default_attr: str, fallback: Any = None) -> Any:
        value = values.get(key)
        return value if value is not None else getattr(base, default_attr, fallback)

    try:
        return DeviceSpec(
            kind=base.kind if base else (kind or "custom"),
            memory_bytes=pick("memory", "memory_bytes"),
            peak_flops_per_s=pick("peak_flops", "peak_flops_per_s"),
            memory_bandwidth_bytes_per_s=pick("memory_bandwidth", "memory_bandwidth_bytes_per_s"),
            launch_overhead_s=pick("launch_overhead", "launch_overhead_s", 0.0),
            comm_compute_share=pick("comm_compute_share", "comm_compute_share", 0.0),
            stream_slowdown=pick("stream_slowdown", "stream_slowdown", STREAM_SLOWDOWN_DEFAULT),
            stream_fit_s=pick("stream_fit", "stream_fit_s", 0.0),
            microbatch_overhead_s=pick("microbatch_overhead", "microbatch_overhead_s", 0.0),
            microbatch_stretch=pick("microbatch_stretch", "microbatch_stretch", 1.0),
            message_host_s=pick("message_host", "message_host_s", 0.0),
            collective_overhead_s=pick("collective_overhead", "collective_overhead_s", 0.0),
            **{key: pick(key, key, _COLLECTIVE_DEFAULTS[key]) for key in _COLLECTIVE_KEYS},
            step_cv=pick("step_cv", "step_cv", 0.0),
            device_cv=pick("device_cv", "device_cv", 0.0),
            buffer_sync_s=pick("buffer_sync", "buffer_sync_s", 0.0),
            collective_after_compute_s=pick("collective_after_compute",
                                            "collective_after_compute_s", 0.0),
            collective_host_s=pick("collective_host", "collective_host_s", 0.0),
        )
    except TrainschedError as exc:
        raise TrainschedError(f"{where}: {exc}") from None


_LINK_KEYS = ("bandwidth", "latency")


def _link(table: _Table) -> Link:
    return Link(bandwidth_bytes_per_s=table.get("bandwidth", parse_bandwidth),
                latency_s=table.get("latency", parse_duration))


def cluster_from_dict(data: Mapping[str, Any], source: str) -> Cluster:
    top = _Table(data, source, "", ("format", "name", "description", "comm", "nodes", "device",
                                "intra_node", "collectives", "inter_node",
                                "parameter_servers"))
    fmt = top.get("format", _string, FORMAT)
    _require(fmt == FORMAT, f"{source}: format: unsupported format {fmt!r}; this version "
                            f"reads {FORMAT!r}")

    def table(key: str, allowed: tuple[str, ...], required: bool = True) -> _Table | None:
        _require(not required or key in data, f"{source}: missing required table [{key}]")
        return _Table(data[key], source, key, allowed) if key in data else None

    dev = table("device", ("kind", "count", "memory", "peak_flops", "memory_bandwidth",
                           "launch_overhead", "comm_compute_share", "stream_slowdown",
                           "stream_fit", "microbatch_overhead", "microbatch_stretch",
                           "message_host",
                           "collective_overhead", *_COLLECTIVE_KEYS, "step_cv",
                           "device_cv", "buffer_sync", "collective_after_compute",
                           "collective_host"))
    intra = table("intra_node", _LINK_KEYS)
    inter = table("inter_node", _LINK_KEYS, required=False)
    collectives = table("collectives", _LINK_KEYS, required=False)
    servers = table("parameter_servers", ("count", *_LINK_KEYS), required=False)
    assert dev is not None and intra is not None
    values = {
        "memory": dev.get("memory", parse_size, None),
        "peak_flops": dev.get("peak_flops", _peak_flops, None),
        "memory_bandwidth": dev.get("memory_bandwidth", parse_bandwidth, None),
        "launch_overhead": dev.get("launch_overhead", parse_duration, None),
        "comm_compute_share": dev.get("comm_compute_share", _share, None),
        "stream_slowdown": dev.get("stream_slowdown", _slowdown, None),
        "stream_fit": dev.get("stream_fit", parse_duration, None),
        "microbatch_overhead": dev.get("microbatch_overhead", parse_duration, None),
        "microbatch_stretch": dev.get("microbatch_stretch", _stretch, None),
        "message_host": dev.get("message_host", parse_duration, None),
        "collective_overhead": dev.get("collective_overhead", parse_duration, None),
        "compute_rate_with_comm": dev.get("compute_rate_with_comm", _rate, None),
        "comm_rate_with_compute": dev.get("comm_rate_with_compute", _rate, None),
        "collective_slots": dev.get("collective_slots", _count, None),
        "collective_contention": dev.get("collective_contention", _fraction, None),
        "step_cv": dev.get("step_cv", _cv, None),
        "device_cv": dev.get("device_cv", _cv, None),
        "buffer_sync": dev.get("buffer_sync", parse_duration, None),
        "collective_after_compute": dev.get("collective_after_compute", parse_duration, None),
        "collective_host": dev.get("collective_host", parse_duration, None),
    }
    device = _device(dev.get("kind", _string, None), values, f"{source}: [device]", str)
    try:
        return Cluster(
            name=top.get("name", _string, "custom"),
            description=top.get("description", _string, ""),
            comm=top.get("comm", _comm, "parallel"),
            num_nodes=top.get("nodes", _count, 1),
            device=device,
            devices_per_node=dev.get("count", _count),
            intra_node=_link(intra),
            collectives=_link(collectives) if collectives else None,
            inter_node=_link(inter) if inter else None,
            parameter_servers=servers.get("count", partial(_count, minimum=0)) if servers else 0,
            ps_link=_link(servers) if servers else None,
        )
    except TrainschedError as exc:
        if str(exc).startswith(source):
            raise
        raise TrainschedError(f"{source}: {exc}") from None


def _flag(name: str, parse: Callable[[Any], Any], value: Any) -> Any:
    if value is None:
        return None
    try:
        return parse(value)
    except TrainschedError as exc:
        raise TrainschedError(f"{name}: {exc}") from None


#: The catalogue kind whose speed figures a flag-built cluster takes when none are given.
DEFAULT_FLAG_KIND = "V100-16GB"


def cluster_from_flags(
    *,
    devices: int | str,
    memory: str | None,
    bandwidth: str,
    latency: str,
    nodes: int | str = 1,
    comm: str = "parallel",
    device_kind: str | None = None,
    inter_bandwidth: str | None = None,
    inter_latency: str | None = None,
    peak_flops: str | None = None,
    memory_bandwidth: str | None = None,
    name: str = "custom",
) -> Cluster:
    """A cluster from command-line values (``devices=4, memory="8GiB", bandwidth="5.7GB/s",
    latency="134us"``); with ``device_kind`` the catalogue kind's numbers are the defaults.

    Errors name the flag (``--memory: invalid size '12XB' ...``).
    """
    def flag(field: str) -> str:
        return "--" + field.replace("_", "-")

    values = {
        "memory": _flag("--memory", parse_size, memory),
        "peak_flops": _flag("--peak-flops", _peak_flops, peak_flops),
        "memory_bandwidth": _flag("--memory-bandwidth", parse_bandwidth, memory_bandwidth),
    }
    speed_defaulted = device_kind is None and (peak_flops is None or memory_bandwidth is None)
    if speed_defaulted:
        # The placement and simulation of measured graphs need only memory and links; the speed
        # figures matter for roofline costs. Without them, the V100's stand in, and say so.
        device_kind = DEFAULT_FLAG_KIND
    device = _device(device_kind, values, "--device-kind" if device_kind else "device flags",
                     flag)
    if speed_defaulted:
        device = dataclasses.replace(device, kind=f"custom ({device.kind} speed)")
    num_nodes = _flag("--nodes", _count, nodes)
    _require((inter_bandwidth is None) == (inter_latency is None),
             "--inter-bandwidth and --inter-latency go together; give both or neither")
    _require(num_nodes == 1 or inter_bandwidth is not None,
             f"--nodes {num_nodes} needs --inter-bandwidth and --inter-latency "
             "(the network between nodes)")
    inter = None
    if inter_bandwidth is not None:
        inter = Link(bandwidth_bytes_per_s=_flag("--inter-bandwidth", parse_bandwidth,
                                                 inter_bandwidth),
                     latency_s=_flag("--inter-latency", parse_duration, inter_latency))
    return Cluster(
        name=name,
        device=device,
        devices_per_node=_flag("--devices", _count, devices),
        num_nodes=num_nodes,
        intra_node=Link(bandwidth_bytes_per_s=_flag("--bandwidth", parse_bandwidth, bandwidth),
                        latency_s=_flag("--latency", parse_duration, latency)),
        inter_node=inter,
        comm=_flag("--comm", _comm, comm),
    )


def resolve_cluster(spec: str, *, nodes: int | None = None) -> Cluster:
    """A cluster from a preset name, ``NAME:N`` (N nodes), or a ``.toml``/``.json`` file path.

    ``NAME:N`` works for files too (``lab.toml:2``); ``nodes`` is the same as the ``:N`` suffix.
    The cluster keeps the preset's (or file's) name; its :attr:`Cluster.label` adds the nodes.
    """
    if not isinstance(spec, str):
        raise TrainschedError(f"resolve_cluster takes a preset name, 'NAME:N' or a cluster file "
                              f"path (a str), got {type(spec).__name__} {spec!r}")
    if nodes is not None and not (is_int(nodes) and nodes > 0):
        raise TrainschedError(f"nodes must be a positive integer, got {nodes!r}")
    match = re.fullmatch(r"(.+):(\d+)", spec.strip())
    base, suffix_nodes = (match[1], int(match[2])) if match else (spec.strip(), None)
    _require(suffix_nodes is None or nodes is None or suffix_nodes == nodes,
             f"cluster {spec!r} asks for {suffix_nodes} nodes but nodes={nodes} was also given")
    count = suffix_nodes if suffix_nodes is not None else nodes
    _require(count is None or count > 0, f"cluster {spec!r}: the number of nodes must be >= 1")
    if base.lower().endswith((".toml", ".json")):
        cluster = load_cluster_file(base)
        return cluster if count is None else cluster.with_nodes(count)
    if _find_preset(base) is None:
        raise TrainschedError(f"unknown cluster {base!r}: give a preset ({', '.join(PRESETS)}), "
                              "optionally NAME:N for N nodes, or a .toml/.json file")
    return cluster_preset(base, count)
