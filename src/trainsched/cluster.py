"""Devices, links and clusters: what the placers, the simulator and the runtime schedule onto.

A :class:`Cluster` is ``num_nodes`` identical nodes of ``devices_per_node`` identical devices
(:class:`DeviceSpec`), joined by an intra-node :class:`Link` (per device, per direction) and an
inter-node :class:`Link` (one per node: the node's NIC, shared by its devices), plus optional
parameter servers, each with its own link. ``comm`` says how a device's transfers contend:
``"sequential"`` gives each device one channel that all its sends and receives share (a transfer
occupies the sender's and the receiver's channel, as in Baechi's PCIe setup); ``"parallel"``
gives every directed pair of devices its own channel.

Clusters come from presets of published setups (:data:`PRESETS`, ``"p3.16xlarge:4"`` for four
nodes), from TOML/JSON files (``docs/cluster.md``) or from command-line flags; all three go
through :func:`resolve_cluster` or :func:`cluster_from_flags`. Numbers are in bytes, seconds,
bytes/s and FLOP/s; human units appear only in files, flags and :meth:`Cluster.describe`.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from types import MappingProxyType
from typing import Any

from trainsched.errors import TrainschedError
from trainsched.graph.io import nesting_guard, read_text_file
from trainsched.units import (
    format_bandwidth,
    format_duration,
    format_flops_rate,
    format_size,
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

__all__ = [
    "COMM_MODES",
    "DEVICE_KINDS",
    "DTYPES",
    "FORMAT",
    "GPU_STREAM_FIT_S",
    "INTERFERENCE_MODELS",
    "PRESETS",
    "STREAM_SLOWDOWN_DEFAULT",
    "Cluster",
    "DeviceSpec",
    "Link",
    "Preset",
    "cluster_from_flags",
    "cluster_preset",
    "device_kind",
    "load_cluster_file",
    "resolve_cluster",
]

FORMAT = "trainsched.cluster/1"
DTYPES = ("fp32", "tf32", "fp16", "bf16")
COMM_MODES = ("sequential", "parallel")
#: How a calibrated host's compute and communication interfere (``DeviceSpec``): share by rate,
#: or take turns (γ).
INTERFERENCE_MODELS = ("rates", "turns")


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise TrainschedError(message)


def _finite(value: float) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True, kw_only=True)
class DeviceSpec:
    """One kind of device: memory capacity and the speeds the roofline cost model needs.

    ``peak_flops_per_s`` is keyed by dtype (among :data:`DTYPES`) and must hold ``"fp32"``; it
    is stored read-only, in :data:`DTYPES` order. ``launch_overhead_s`` is the fixed cost of one
    kernel (about 5 µs on a GPU). ``comm_compute_share`` is how many seconds of compute the
    device loses per second of communication it takes part in: 0 where copies and collectives
    run beside the compute (DMA engines, a spare core), about 1 where the process that computes
    also drives the transfers on the cores it computes with (gloo on a CPU host with no spare
    core); ``trainsched calibrate`` measures it.

    Two compute streams (out-of-order backprop on one device, ``sim.streams``): while kernels
    run on both, each runs at ``1/(1 + stream_slowdown)`` of its speed alone when both *fit*
    on the device together (each at most ``stream_fit_s`` long alone: short, launch- or
    latency-bound kernels leave compute units free), else at 1/2 (two kernels that fill the
    device take turns: a + b). Defaults: ε = 0.1 and a fit of 0 s (nothing fits: a second
    stream gains nothing until a profile says otherwise); the catalogue GPUs fit kernels of up
    to 100 µs.

    Two host costs of pipeline runs, charged by the pipeline simulator (both default 0, as on
    a device whose host thread runs ahead of its kernels): ``microbatch_overhead_s``, the time
    each compute action of a micro-batch (``F``, ``I``, ``W``, ``B``) costs beyond its ops (the
    stage's Python dispatch and autograd calls), and ``message_host_s``, the time the compute
    thread spends posting or collecting one point-to-point message (a send after ``F``/``I``,
    a receive before them) between stages on different devices. ``benchmarks/
    pipeline_real.py`` measures both on this host.

    What collectives cost beyond their bytes over the link (``docs/cluster.md`` cites the
    catalogue's values; all default to "nothing"):

    - ``collective_overhead_s``: a fixed time per collective on the wire (the launch of the
      communication kernel and the framework's per-bucket work), added to every collective;
    - ``compute_rate_with_comm``: the rate (work per second, 1 = full speed) compute runs at
      while a collective of its rank is in flight (NCCL kernels take SMs and memory
      bandwidth; gloo threads take the host's cores);
    - ``comm_rate_with_compute``: the rate a collective runs at while its rank computes;
    - ``collective_slots``: how many collectives run at once (gloo: 2 worker threads; NCCL on
      one stream: 1); with more than one, ``collective_contention`` ρ says how they share the
      wire: k in flight each run at ``1 / (1 + ρ(k − 1))`` (1: processor sharing, 0: each as
      fast as alone).

    A rate below 1 or more than one slot makes the data-parallel simulator run collectives by
    rate (``sim.coupling``) instead of one at a time at full speed.
    """

    kind: str
    memory_bytes: int
    peak_flops_per_s: Mapping[str, float]
    memory_bandwidth_bytes_per_s: float
    launch_overhead_s: float = 0.0
    comm_compute_share: float = 0.0
    stream_slowdown: float = 0.1
    stream_fit_s: float = 0.0
    microbatch_overhead_s: float = 0.0
    message_host_s: float = 0.0
    collective_overhead_s: float = 0.0
    compute_rate_with_comm: float = 1.0
    comm_rate_with_compute: float = 1.0
    collective_slots: int = 1
    collective_contention: float = 1.0

    def __post_init__(self) -> None:
        where = f"device {self.kind!r}"
        _require(isinstance(self.kind, str) and self.kind != "", "device kind must be a name")
        _require(is_int(self.memory_bytes) and self.memory_bytes > 0,
                 f"{where}: memory_bytes must be a positive integer, got {self.memory_bytes!r}")
        flops = dict(self.peak_flops_per_s)
        unknown = sorted(set(flops) - set(DTYPES))
        _require(not unknown, f"{where}: unknown dtype(s) {', '.join(map(repr, unknown))} in "
                              f"peak FLOP/s; accepted: {', '.join(DTYPES)}")
        _require("fp32" in flops, f"{where}: peak FLOP/s must include 'fp32'")
        for dtype, rate in flops.items():
            _require(_finite(rate) and rate > 0,
                     f"{where}: peak FLOP/s for {dtype} must be > 0, got {rate!r}")
        bandwidth = self.memory_bandwidth_bytes_per_s
        _require(_finite(bandwidth) and bandwidth > 0,
                 f"{where}: memory bandwidth must be > 0, got {bandwidth!r}")
        _require(_finite(self.launch_overhead_s) and self.launch_overhead_s >= 0,
                 f"{where}: launch overhead must be >= 0, got {self.launch_overhead_s!r}")
        _require(_finite(self.comm_compute_share) and 0 <= self.comm_compute_share <= 4,
                 f"{where}: comm_compute_share must be a number in [0, 4] (seconds of compute "
                 f"lost per second of communication), got {self.comm_compute_share!r}")
        _require(_finite(self.stream_slowdown) and 0 <= self.stream_slowdown <= 1,
                 f"{where}: stream_slowdown must be a number in [0, 1] (each of two kernels "
                 f"that fit together runs 1 + it times slower), got {self.stream_slowdown!r}")
        _require(_finite(self.stream_fit_s) and self.stream_fit_s >= 0,
                 f"{where}: stream_fit_s must be seconds >= 0, got {self.stream_fit_s!r}")
        object.__setattr__(self, "stream_slowdown", float(self.stream_slowdown))
        object.__setattr__(self, "stream_fit_s", float(self.stream_fit_s))
        for name in ("microbatch_overhead_s", "message_host_s"):
            value = getattr(self, name)
            _require(_finite(value) and value >= 0,
                     f"{where}: {name} must be a duration >= 0 s, got {value!r}")
            object.__setattr__(self, name, float(value))
        _require(_finite(self.collective_overhead_s) and self.collective_overhead_s >= 0,
                 f"{where}: collective_overhead_s must be a duration >= 0 s, got "
                 f"{self.collective_overhead_s!r}")
        for name in ("compute_rate_with_comm", "comm_rate_with_compute"):
            value = getattr(self, name)
            _require(_finite(value) and 0 < value <= 1,
                     f"{where}: {name} must be a rate in (0, 1] (1: full speed; 0.8: 20% "
                     f"slower while the other runs), got {value!r}")
            object.__setattr__(self, name, float(value))
        _require(is_int(self.collective_slots) and 1 <= self.collective_slots <= 64,
                 f"{where}: collective_slots must be an integer in 1..64 (collectives in "
                 f"flight at once), got {self.collective_slots!r}")
        _require(_finite(self.collective_contention) and 0 <= self.collective_contention <= 1,
                 f"{where}: collective_contention must be a number in [0, 1] (1: collectives "
                 f"in flight share the wire's rate; 0: each runs as fast as alone), got "
                 f"{self.collective_contention!r}")
        _require(not (self.comm_compute_share and self.comm_by_rate),
                 f"{where}: comm_compute_share (collectives take turns with compute) and the "
                 f"collective rates (they share by rate) are two models of one effect; give "
                 f"one: comm_compute_share 0, or compute_rate_with_comm, comm_rate_with_compute "
                 f"and collective_slots 1")
        object.__setattr__(self, "collective_overhead_s", float(self.collective_overhead_s))
        object.__setattr__(self, "collective_contention", float(self.collective_contention))
        ordered = {d: float(flops[d]) for d in DTYPES if d in flops}
        object.__setattr__(self, "peak_flops_per_s", MappingProxyType(ordered))
        object.__setattr__(self, "memory_bandwidth_bytes_per_s", float(bandwidth))
        object.__setattr__(self, "launch_overhead_s", float(self.launch_overhead_s))
        object.__setattr__(self, "comm_compute_share", float(self.comm_compute_share))

    @property
    def comm_by_rate(self) -> bool:
        """Whether collectives and compute share by rate (a rate below 1, or several slots)."""
        return (self.compute_rate_with_comm < 1 or self.comm_rate_with_compute < 1
                or self.collective_slots > 1)

    def peak_flops(self, dtype: str = "fp32") -> float:
        """Peak FLOP/s for ``dtype``, falling back to fp32 when the device lists no faster path."""
        _require(dtype in DTYPES, f"unknown dtype {dtype!r}; accepted: {', '.join(DTYPES)}")
        return self.peak_flops_per_s.get(dtype, self.peak_flops_per_s["fp32"])

    def __hash__(self) -> int:
        return hash((self.kind, self.memory_bytes, tuple(self.peak_flops_per_s.items()),
                     self.memory_bandwidth_bytes_per_s, self.launch_overhead_s,
                     self.comm_compute_share, self.stream_slowdown, self.stream_fit_s,
                     self.microbatch_overhead_s, self.message_host_s,
                     self.collective_overhead_s, self.compute_rate_with_comm,
                     self.comm_rate_with_compute, self.collective_slots,
                     self.collective_contention))

    def __reduce__(self) -> tuple[Any, ...]:
        # A mappingproxy cannot be pickled; rebuild from a plain dict instead.
        fields = {**self.__dict__, "peak_flops_per_s": dict(self.peak_flops_per_s)}
        return (partial(DeviceSpec, **fields), ())


@dataclass(frozen=True, kw_only=True)
class Link:
    """A channel's speed: a transfer of S bytes takes ``latency_s + S / bandwidth_bytes_per_s``."""

    bandwidth_bytes_per_s: float
    latency_s: float

    def __post_init__(self) -> None:
        _require(_finite(self.bandwidth_bytes_per_s) and self.bandwidth_bytes_per_s > 0,
                 f"link bandwidth must be > 0 bytes/s, got {self.bandwidth_bytes_per_s!r}")
        _require(_finite(self.latency_s) and self.latency_s >= 0,
                 f"link latency must be >= 0 s, got {self.latency_s!r}")
        object.__setattr__(self, "bandwidth_bytes_per_s", float(self.bandwidth_bytes_per_s))
        object.__setattr__(self, "latency_s", float(self.latency_s))

    def describe(self) -> str:
        return f"{format_bandwidth(self.bandwidth_bytes_per_s)}, latency " \
               f"{format_duration(self.latency_s)}"


@dataclass(frozen=True, kw_only=True)
class Cluster:
    """Homogeneous nodes of homogeneous devices, their links and optional parameter servers.

    Devices are numbered globally, node by node: device ``i`` is local device
    ``i % devices_per_node`` of node ``i // devices_per_node``. Names (:meth:`device_names`)
    are ``gpu0, gpu1, ...`` on one node and ``n0.gpu0, ..., n1.gpu0, ...`` on several (``cpu``
    instead of ``gpu`` for a cpu device kind). ``collectives``, when given, is the per-rank link
    collectives within a node run at (read through the ring formula) instead of ``intra_node``:
    a calibrated host's fit of its measured all-reduces, which a point-to-point fit
    misjudges by tens of percent on gloo, or a preset's measured all-reduce bus bandwidth
    (NVLink nodes: NCCL's ring reaches well below the links' peak).
    """

    name: str
    device: DeviceSpec
    devices_per_node: int
    num_nodes: int = 1
    intra_node: Link
    inter_node: Link | None = None
    comm: str = "parallel"
    parameter_servers: int = 0
    ps_link: Link | None = None
    description: str = ""
    collectives: Link | None = None

    def __post_init__(self) -> None:
        where = f"cluster {self.name!r}"
        _require(isinstance(self.name, str) and self.name != "", "a cluster needs a name")
        _require(is_int(self.devices_per_node) and self.devices_per_node > 0,
                 f"{where}: devices per node must be a positive integer, "
                 f"got {self.devices_per_node!r}")
        _require(is_int(self.num_nodes) and self.num_nodes > 0,
                 f"{where}: nodes must be a positive integer, got {self.num_nodes!r}")
        _require(self.comm in COMM_MODES,
                 f"{where}: comm must be 'sequential' or 'parallel', got {self.comm!r}")
        _require(self.num_nodes == 1 or self.inter_node is not None,
                 f"{where}: {self.num_nodes} nodes need an inter-node link "
                 "(give [inter_node] bandwidth and latency)")
        _require(is_int(self.parameter_servers) and self.parameter_servers >= 0,
                 f"{where}: parameter servers must be a count >= 0, "
                 f"got {self.parameter_servers!r}")
        _require(self.parameter_servers == 0 or self.ps_link is not None,
                 f"{where}: {self.parameter_servers} parameter servers need a link "
                 "(give [parameter_servers] bandwidth and latency)")
        _require(self.parameter_servers > 0 or self.ps_link is None,
                 f"{where}: a parameter-server link is given but no parameter servers")

    @property
    def collective_link(self) -> Link:
        """The per-rank link collectives within a node run at: ``collectives`` if given, else
        ``intra_node``."""
        return self.collectives or self.intra_node

    @property
    def num_devices(self) -> int:
        return self.devices_per_node * self.num_nodes

    def device_names(self) -> tuple[str, ...]:
        """Stable names, index order: ``gpu0..`` on one node, ``n0.gpu0..`` on several."""
        prefix = "cpu" if self.device.kind.lower().startswith("cpu") else "gpu"
        if self.num_nodes == 1:
            return tuple(f"{prefix}{i}" for i in range(self.devices_per_node))
        return tuple(f"n{node}.{prefix}{local}" for node in range(self.num_nodes)
                     for local in range(self.devices_per_node))

    def device_index(self, name: str) -> int:
        """The index of the device called ``name`` (see :meth:`device_names`)."""
        names = self.device_names()
        _require(name in names, f"cluster {self.name!r} has no device {name!r}; devices: "
                                f"{', '.join(names[:8])}{', ...' if len(names) > 8 else ''}")
        return names.index(name)

    def _check_index(self, i: int) -> None:
        _require(is_int(i) and 0 <= i < self.num_devices,
                 f"cluster {self.name!r}: device index {i!r} out of range "
                 f"0..{self.num_devices - 1}")

    def node_of(self, i: int) -> int:
        """The node that device ``i`` belongs to."""
        self._check_index(i)
        return i // self.devices_per_node

    def link(self, i: int, j: int) -> Link:
        """The link from device ``i`` to device ``j``: intra-node on one node, else inter-node."""
        self._check_index(i)
        self._check_index(j)
        _require(i != j, f"cluster {self.name!r}: no link from device {i} to itself")
        if self.node_of(i) == self.node_of(j):
            return self.intra_node
        assert self.inter_node is not None
        return self.inter_node

    @property
    def label(self) -> str:
        """The name with the node count where there is more than one node
        (``p3.16xlarge:4``), as ``resolve_cluster`` takes it back: what reports print."""
        return self.name if self.num_nodes == 1 else f"{self.name}:{self.num_nodes}"

    def with_nodes(self, num_nodes: int) -> Cluster:
        """The same cluster with ``num_nodes`` nodes (name and everything else unchanged)."""
        return replace(self, num_nodes=num_nodes)

    def first_devices(self, count: int) -> Cluster:
        """The cluster cut to its first ``count`` devices, whole nodes first (``count`` up to
        one node's devices: one node of ``count``)."""
        if not (isinstance(count, int) and 1 <= count <= self.num_devices):
            raise TrainschedError(f"cluster {self.name!r} has {self.num_devices} devices; cannot "
                                  f"take {count!r} of them")
        per_node = min(count, self.devices_per_node)
        return replace(self, devices_per_node=per_node, num_nodes=-(-count // per_node))

    def to_dict(self) -> dict[str, Any]:
        """The file format (``docs/cluster.md``) with plain numbers in bytes, s, bytes/s, FLOP/s."""
        dev = self.device
        data: dict[str, Any] = {
            "format": FORMAT,
            "name": self.name,
            "description": self.description,
            "comm": self.comm,
            "nodes": self.num_nodes,
            "device": {
                "kind": dev.kind,
                "count": self.devices_per_node,
                "memory": dev.memory_bytes,
                "peak_flops": dict(dev.peak_flops_per_s),
                "memory_bandwidth": dev.memory_bandwidth_bytes_per_s,
                "launch_overhead": dev.launch_overhead_s,
                **({"comm_compute_share": dev.comm_compute_share}
                   if dev.comm_compute_share else {}),
                **({"stream_slowdown": dev.stream_slowdown}
                   if dev.stream_slowdown != STREAM_SLOWDOWN_DEFAULT else {}),
                **({"stream_fit": dev.stream_fit_s} if dev.stream_fit_s else {}),
                **({"microbatch_overhead": dev.microbatch_overhead_s}
                   if dev.microbatch_overhead_s else {}),
                **({"message_host": dev.message_host_s} if dev.message_host_s else {}),
                **({"collective_overhead": dev.collective_overhead_s}
                   if dev.collective_overhead_s else {}),
                **{key: getattr(dev, key) for key in _COLLECTIVE_KEYS
                   if getattr(dev, key) != _COLLECTIVE_DEFAULTS[key]},
            },
            "intra_node": _link_dict(self.intra_node),
        }
        if self.collectives is not None:
            data["collectives"] = _link_dict(self.collectives)
        if self.inter_node is not None:
            data["inter_node"] = _link_dict(self.inter_node)
        if self.ps_link is not None:
            data["parameter_servers"] = {"count": self.parameter_servers,
                                         **_link_dict(self.ps_link)}
        return data

    def to_json(self) -> str:
        """:meth:`to_dict` as JSON, sorted keys: the same cluster always gives the same bytes."""
        return json.dumps(self.to_dict(), sort_keys=True, indent=2) + "\n"

    def to_toml(self) -> str:
        """:meth:`to_dict` as TOML (top-level keys, then one table per section)."""
        data = self.to_dict()
        lines = [f"{k} = {_toml_value(v)}" for k, v in data.items() if not isinstance(v, dict)]
        for key, table in data.items():
            if isinstance(table, dict):
                lines += ["", f"[{key}]", *(f"{k} = {_toml_value(v)}" for k, v in table.items())]
        return "\n".join(lines) + "\n"

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "<dict>") -> Cluster:
        """Read the file format; errors name ``source``, the table and the field."""
        return _cluster_from_dict(data, source)

    def describe(self) -> str:
        """A human-readable summary, one fact per line."""
        dev = self.device
        flops = ", ".join(f"{format_flops_rate(r)} {d}" for d, r in dev.peak_flops_per_s.items())
        nodes = f"{self.num_nodes} node{'s' if self.num_nodes > 1 else ''}"
        modes = {"sequential": "each device's sends and receives share one channel",
                 "parallel": "one channel per directed link"}
        lines = [
            f"cluster {self.name}: {nodes} × {self.devices_per_node} {dev.kind} "
            f"= {self.num_devices} devices",
            f"  device      {dev.kind}: {format_size(dev.memory_bytes)} memory, "
            f"{format_bandwidth(dev.memory_bandwidth_bytes_per_s)} memory bandwidth, "
            f"launch {format_duration(dev.launch_overhead_s)}"
            + (f", communication costs {dev.comm_compute_share:.2f} s of compute per s"
               if dev.comm_compute_share else "")
            + (f", pipeline host time {format_duration(dev.microbatch_overhead_s)} per action"
               f" and {format_duration(dev.message_host_s)} per message"
               if dev.microbatch_overhead_s or dev.message_host_s else ""),
            *([f"  overlap     compute at {dev.compute_rate_with_comm:.2f} of its rate while "
               f"a collective runs, collectives at {dev.comm_rate_with_compute:.2f} while "
               f"compute runs; {dev.collective_slots} collective(s) at once (contention "
               f"{dev.collective_contention:.2f}), "
               f"{format_duration(dev.collective_overhead_s)} overhead each"]
              if dev.collective_overhead_s or dev.comm_by_rate else []),
            f"  peak        {flops}",
            f"  intra-node  {self.intra_node.describe()} (per device, per direction)",
            *([f"  collectives {self.collectives.describe()} (per rank, ring formula; "
               f"fitted to measured all-reduces)"] if self.collectives else []),
            "  inter-node  " + (f"{self.inter_node.describe()} (per node)"
                                if self.inter_node else "none"),
            f"  comm        {self.comm} ({modes[self.comm]})",
            "  servers     " + (f"{self.parameter_servers} parameter servers, each "
                                f"{self.ps_link.describe()}" if self.ps_link else "none"),
        ]
        if self.description:
            lines.insert(1, f"  {self.description}")
        return "\n".join(lines)


#: The file keys of the collective rates (``[device]`` table) and their defaults.
_COLLECTIVE_DEFAULTS: Mapping[str, Any] = MappingProxyType({
    "compute_rate_with_comm": 1.0, "comm_rate_with_compute": 1.0, "collective_slots": 1,
    "collective_contention": 1.0})
_COLLECTIVE_KEYS = tuple(_COLLECTIVE_DEFAULTS)


def _link_dict(link: Link) -> dict[str, float]:
    return {"bandwidth": link.bandwidth_bytes_per_s, "latency": link.latency_s}


def _toml_value(value: Any) -> str:
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + " }"
    if isinstance(value, str):
        return json.dumps(value)  # JSON string escapes are valid TOML basic-string escapes
    return repr(value)


# ---------------------------------------------------------------------------------------------
# Device catalogue

#: The default ε of two compute streams (:class:`DeviceSpec`), and the kernel length that fits
#: beside another on a catalogue GPU.
STREAM_SLOWDOWN_DEFAULT = 0.1
GPU_STREAM_FIT_S = 100e-6


#: The rate compute keeps on a catalogue NVLink GPU (V100, A100, H100) while an NCCL collective
#: runs beside it: about a fifth slower (``docs/cluster.md`` cites the measurements).
GPU_COMPUTE_RATE_WITH_COMM = 0.8


def _gpu(kind: str, memory_gib: int, flops: dict[str, float], bandwidth: float,
         compute_rate_with_comm: float = 1.0) -> DeviceSpec:
    return DeviceSpec(kind=kind, memory_bytes=memory_gib * 2**30, peak_flops_per_s=flops,
                      memory_bandwidth_bytes_per_s=bandwidth, launch_overhead_s=5e-6,
                      stream_fit_s=GPU_STREAM_FIT_S,
                      compute_rate_with_comm=compute_rate_with_comm)


DEVICE_KINDS: Mapping[str, DeviceSpec] = MappingProxyType({
    d.kind: d for d in (
        _gpu("RTX2080-8GB", 8, {"fp32": 10.07e12, "fp16": 40.3e12}, 448e9),
        _gpu("V100-16GB", 16, {"fp32": 15.7e12, "fp16": 125e12}, 900e9,
             GPU_COMPUTE_RATE_WITH_COMM),
        _gpu("K80-12GB", 12, {"fp32": 4.37e12}, 240e9),
        _gpu("A100-80GB", 80, {"fp32": 19.5e12, "tf32": 156e12, "fp16": 312e12,
                               "bf16": 312e12}, 2.039e12, GPU_COMPUTE_RATE_WITH_COMM),
        _gpu("H100-80GB", 80, {"fp32": 67e12, "tf32": 494.7e12, "fp16": 989.4e12,
                               "bf16": 989.4e12}, 3.35e12, GPU_COMPUTE_RATE_WITH_COMM),
        DeviceSpec(kind="cpu", memory_bytes=24 * 2**30, peak_flops_per_s={"fp32": 1e11},
                   memory_bandwidth_bytes_per_s=2e10, launch_overhead_s=2e-6),
    )
})
_KIND_ALIASES = {"rtx2080": "RTX2080-8GB", "2080": "RTX2080-8GB", "v100": "V100-16GB",
                 "k80": "K80-12GB", "a100": "A100-80GB", "h100": "H100-80GB"}


def _key(name: str) -> str:
    return re.sub(r"[\s_-]", "", name.lower())


def _find_kind(name: str) -> DeviceSpec | None:
    canonical = {_key(k): k for k in DEVICE_KINDS} | {_key(a): k for a, k in _KIND_ALIASES.items()}
    found = canonical.get(_key(name))
    return DEVICE_KINDS[found] if found else None


def device_kind(name: str) -> DeviceSpec:
    """A catalogue device by name, case-insensitively, with aliases (``"V100"``, ``"h100"``)."""
    spec = _find_kind(name)
    _require(spec is not None, f"unknown device kind {name!r}; known kinds: "
                               f"{', '.join(DEVICE_KINDS)} (aliases: {', '.join(_KIND_ALIASES)})")
    assert spec is not None
    return spec


# ---------------------------------------------------------------------------------------------
# Presets

def _gbit(gbit_per_s: float, latency_s: float) -> Link:
    return Link(bandwidth_bytes_per_s=gbit_per_s * 1e9 / 8, latency_s=latency_s)


_NVLINK_V100 = Link(bandwidth_bytes_per_s=150e9, latency_s=10e-6)
# What NCCL's ring all-reduce achieves on the whole node (nccl-tests "bus bandwidth", which is
# the B of the ring formula): below the links' peak (docs/cluster.md cites the figures).
_NCCL_V100 = Link(bandwidth_bytes_per_s=130e9, latency_s=10e-6)
_NCCL_A100 = Link(bandwidth_bytes_per_s=200e9, latency_s=10e-6)
_NCCL_H100 = Link(bandwidth_bytes_per_s=370e9, latency_s=10e-6)
_ETH_10G = _gbit(10, 50e-6)
_ETH_25G = _gbit(25, 50e-6)


@dataclass(frozen=True, kw_only=True)
class Preset:
    """A published setup: ``build(num_nodes)`` makes the cluster; ``source`` says where from."""

    name: str
    description: str
    source: str
    build: Callable[[int], Cluster]
    default_nodes: int = 1
    aliases: tuple[str, ...] = ()


def _preset(name: str, description: str, source: str, *, kind: str, per_node: int,
            intra: Link, inter: Link, comm: str = "parallel", default_nodes: int = 1,
            aliases: tuple[str, ...] = (), servers_per_node: int = 0,
            ps_link: Link | None = None, collectives: Link | None = None) -> Preset:
    def build(num_nodes: int) -> Cluster:
        return Cluster(name=name, description=description, device=DEVICE_KINDS[kind],
                       devices_per_node=per_node, num_nodes=num_nodes, intra_node=intra,
                       inter_node=inter, comm=comm,
                       parameter_servers=servers_per_node * num_nodes, ps_link=ps_link,
                       collectives=collectives)
    return Preset(name=name, description=description, source=source, build=build,
                  default_nodes=default_nodes, aliases=aliases)


PRESETS: Mapping[str, Preset] = MappingProxyType({p.name: p for p in (
    _preset("baechi-4x2080", "4× RTX 2080 on shared PCIe, Baechi's TensorFlow copy-time fit",
            "Baechi (SoCC 2020) slides: 0.1754 ns/B + 134 µs", kind="RTX2080-8GB", per_node=4,
            intra=Link(bandwidth_bytes_per_s=1 / 0.1754e-9, latency_s=134e-6), inter=_ETH_10G,
            comm="sequential", aliases=("rtx2080x4", "baechi")),
    _preset("baechi-4x2080-torch", "4× RTX 2080 on shared PCIe, Baechi's PyTorch copy-time fit",
            "Baechi PyTorch port: 0.1788 ns/B + 100 µs × 1.2", kind="RTX2080-8GB", per_node=4,
            intra=Link(bandwidth_bytes_per_s=1 / 0.1788e-9, latency_s=120e-6), inter=_ETH_10G,
            comm="sequential", aliases=("baechi-torch",)),
    _preset("p3.16xlarge", "AWS p3.16xlarge: 8× V100-16GB on NVLink, 25 Gbit/s between nodes",
            "AWS instance page; Out-Of-Order BackProp (EuroSys 2022) ran 10 and 25 Gbit/s",
            kind="V100-16GB", per_node=8, intra=_NVLINK_V100, inter=_ETH_25G, aliases=("p3",),
            collectives=_NCCL_V100),
    _preset("p3.16xlarge-10g", "p3.16xlarge nodes on a 10 Gbit/s network",
            "Out-Of-Order BackProp (EuroSys 2022) data-parallel runs at 10 Gbit/s",
            kind="V100-16GB", per_node=8, intra=_NVLINK_V100, inter=_ETH_10G,
            collectives=_NCCL_V100),
    _preset("v100-rdma-100g", "8× V100 per node on NVLink, 100 Gbit/s RDMA between nodes",
            "ByteScheduler (SOSP 2019) README: 100 Gb/s RoCE, 8 V100 per server",
            kind="V100-16GB", per_node=8, intra=_NVLINK_V100, inter=_gbit(100, 5e-6),
            collectives=_NCCL_V100),
    _preset("v100-tcp-25g", "8× V100 per node on NVLink, 25 Gbit/s TCP between nodes",
            "ByteScheduler (SOSP 2019) paper: TCP runs", kind="V100-16GB", per_node=8,
            intra=_NVLINK_V100, inter=_ETH_25G, collectives=_NCCL_V100),
    _preset("k80-ps", "Sync-Switch: one K80 per worker, 10 Gbit/s, one parameter server per "
            "worker host", "Sync-Switch (ICDCS 2021) README and scripts (num-ps = num-worker, "
            "servers colocated with workers); 8 workers", kind="K80-12GB", per_node=1,
            intra=Link(bandwidth_bytes_per_s=12e9, latency_s=10e-6), inter=_ETH_10G,
            default_nodes=8, servers_per_node=1, ps_link=_ETH_10G, aliases=("sync-switch",)),
    _preset("dgx-a100", "NVIDIA DGX A100: 8× A100-80GB on NVSwitch, 8× 200 Gbit/s HDR IB",
            "NVIDIA DGX A100 datasheet", kind="A100-80GB", per_node=8,
            intra=Link(bandwidth_bytes_per_s=300e9, latency_s=10e-6),
            inter=Link(bandwidth_bytes_per_s=200e9, latency_s=5e-6), aliases=("dgxa100",),
            collectives=_NCCL_A100),
    _preset("dgx-h100", "NVIDIA DGX H100: 8× H100-80GB on NVSwitch, 8× 400 Gbit/s NDR IB",
            "NVIDIA DGX H100 datasheet", kind="H100-80GB", per_node=8,
            intra=Link(bandwidth_bytes_per_s=450e9, latency_s=10e-6),
            inter=Link(bandwidth_bytes_per_s=400e9, latency_s=5e-6), aliases=("dgxh100",),
            collectives=_NCCL_H100),
    _preset("cpu", "this host: 2 cpu devices on a gloo-like loopback, for demos and checks",
            "order-of-magnitude loopback TCP figures", kind="cpu", per_node=2,
            intra=Link(bandwidth_bytes_per_s=1e9, latency_s=500e-6), inter=_ETH_10G,
            aliases=("local",)),
)})


def _find_preset(name: str) -> Preset | None:
    lookup = {_key(p.name): p for p in PRESETS.values()}
    lookup |= {_key(a): p for p in PRESETS.values() for a in p.aliases}
    return lookup.get(_key(name))


def cluster_preset(name: str, nodes: int | None = None) -> Cluster:
    """The preset called ``name`` (case-insensitive, aliases allowed) with ``nodes`` nodes."""
    preset = _find_preset(name)
    _require(preset is not None, f"unknown cluster preset {name!r}; known presets: "
                                 f"{', '.join(PRESETS)}")
    assert preset is not None
    if nodes is not None:
        _require(is_int(nodes) and nodes > 0,
                 f"number of nodes must be a positive integer, got {nodes!r}")
    return preset.build(preset.default_nodes if nodes is None else nodes)


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
        return _cluster_from_dict({"name": path.stem, **data}, str(path))


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


def _share(value: Any) -> float:
    _require(isinstance(value, int | float) and not isinstance(value, bool),
             f"expected a number (seconds of compute lost per second of communication), "
             f"got {value!r}")
    return float(value)


def _slowdown(value: Any) -> float:
    _require(isinstance(value, int | float) and not isinstance(value, bool),
             f"expected a number (how much slower each of two kernels sharing the device runs), "
             f"got {value!r}")
    return float(value)


def _rate(value: Any) -> float:
    _require(isinstance(value, int | float) and not isinstance(value, bool),
             f"expected a number (the rate, 1 = full speed, while the other side runs), got "
             f"{value!r}")
    return float(value)


def _fraction(value: Any) -> float:
    _require(isinstance(value, int | float) and not isinstance(value, bool),
             f"expected a number in [0, 1], got {value!r}")
    return float(value)


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
            message_host_s=pick("message_host", "message_host_s", 0.0),
            collective_overhead_s=pick("collective_overhead", "collective_overhead_s", 0.0),
            **{key: pick(key, key, _COLLECTIVE_DEFAULTS[key]) for key in _COLLECTIVE_KEYS},
        )
    except TrainschedError as exc:
        raise TrainschedError(f"{where}: {exc}") from None


_LINK_KEYS = ("bandwidth", "latency")


def _link(table: _Table) -> Link:
    return Link(bandwidth_bytes_per_s=table.get("bandwidth", parse_bandwidth),
                latency_s=table.get("latency", parse_duration))


def _cluster_from_dict(data: Mapping[str, Any], source: str) -> Cluster:
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
                           "stream_fit", "microbatch_overhead", "message_host",
                           "collective_overhead", *_COLLECTIVE_KEYS))
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
        "message_host": dev.get("message_host", parse_duration, None),
        "collective_overhead": dev.get("collective_overhead", parse_duration, None),
        "compute_rate_with_comm": dev.get("compute_rate_with_comm", _rate, None),
        "comm_rate_with_compute": dev.get("comm_rate_with_compute", _rate, None),
        "collective_slots": dev.get("collective_slots", _count, None),
        "collective_contention": dev.get("collective_contention", _fraction, None),
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
