"""Devices, links and clusters as values: :class:`DeviceSpec`, :class:`Link`, :class:`Cluster`.

The package docstring (:mod:`trainsched.cluster`) describes the model; this module holds the
value types with their checks and their TOML/JSON writers.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import partial
from types import MappingProxyType
from typing import Any

from trainsched.errors import TrainschedError
from trainsched.units import (
    format_bandwidth,
    format_duration,
    format_flops_rate,
    format_size,
    is_int,
)

if sys.version_info >= (3, 11):
    pass
else:  # pragma: no cover
    pass


FORMAT = "trainsched.cluster/1"
DTYPES = ("fp32", "tf32", "fp16", "bf16")
COMM_MODES = ("sequential", "parallel")
#: How a calibrated host's compute and communication interfere (``DeviceSpec``): share by rate,
#: or take turns (γ).
INTERFERENCE_MODELS = ("rates", "turns")
#: The default ε of two compute streams (:class:`DeviceSpec`).
STREAM_SLOWDOWN_DEFAULT = 0.1
#: The largest ``step_cv`` (and ``device_cv``) accepted: above it, a normal step time about 3
#: standard deviations below its mean (not rare among many ranks) would be negative.
STEP_CV_MAX = 0.3


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
    a receive before them) between stages on different devices. A third, proportional:
    ``microbatch_stretch`` (at least 1, default 1), how many times longer an action's ops run
    inside a running pipeline than the same stage timed alone (on a shared CPU host the
    ranks' threads, the transfers and the held activations slow each action by about 10%).
    ``benchmarks/pipeline_real.py`` measures the stretch and the per-message time on this host.

    What collectives cost beyond their bytes over the link (``docs/cluster.md`` cites the
    catalogue's values; all default to "nothing"):

    - ``collective_overhead_s``: a fixed time per collective on the wire (the launch of the
      communication kernel and the framework's per-bucket work), added to every collective
      but the first of a step, which pays ``collective_after_compute_s`` instead (below);
      ``trainsched calibrate`` measures it as a step of many collectives pays it;
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

    ``buffer_sync_s``: the host time a DDP step spends before its forward broadcasting the
    model's buffers (batch norm's running statistics) from rank 0, a blocking collective
    (``broadcast_buffers``, DDP's default): its fixed part, start-up and DDP's own pre-forward
    work; the data-parallel simulator adds the buffers' bytes over the collective link and
    charges it at the start of every step of a model that has buffers, under a policy that
    syncs them (``DdpBucketPolicy.buffer_sync``). ``trainsched calibrate`` measures it; default
    0 (nothing charged).

    ``collective_after_compute_s``: how much longer the first collective of a step takes than
    its α–β cost when it starts as the ranks' compute ends, as in training, rather than from a
    barrier, as a collective alone is timed (the ranks arrive apart and the communication
    threads wake; on this project's 2-core gloo host 0-3 ms). The data-parallel simulator adds
    it to the first collective of every step on two or more ranks, in place of
    ``collective_overhead_s`` (set the two alike to charge every collective the same).
    ``trainsched calibrate`` measures it; default 0.

    ``collective_host_s``: the processor time each collective takes from its rank's compute
    (gloo drives its collectives with host threads: the dispatch, the transport's loop, the
    completion; a rank with one core loses that time from its ops), beyond the time per byte the
    rates above charge. The data-parallel simulator puts a task of this length on every rank's
    compute stream when each collective starts; ``trainsched calibrate`` measures it as the
    processor time a step of many collectives takes beyond one of the same bytes. Default 0
    (a GPU's collectives take no host time from its kernels).

    ``step_cv``: the coefficient of variation of one rank's compute time per step (clocks,
    heat, host jitter), each rank's draw independent of the others'. A synchronous step waits
    for the slowest of its N ranks, so the data-parallel simulator stretches every rank's
    compute by ``1 + step_cv · E[max of N standard normals]`` (``costs.slowest_rank_factor``);
    0 (the default) leaves it alone, as on one rank.

    ``device_cv``: the coefficient of variation of compute speed across devices of this kind, a
    fixed property of each device (manufacturing spread and its power management), not a
    step-to-step draw. The N devices of a job are N draws from that spread, and a synchronous
    step waits for the slowest, so in expectation it stretches compute the way ``step_cv``
    does. Both together: each rank's step time is its device's draw plus its step's draw, a
    normal of coefficient of variation :attr:`slowest_rank_cv` = √(device_cv² + step_cv²).
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
    microbatch_stretch: float = 1.0
    message_host_s: float = 0.0
    collective_overhead_s: float = 0.0
    compute_rate_with_comm: float = 1.0
    comm_rate_with_compute: float = 1.0
    collective_slots: int = 1
    collective_contention: float = 1.0
    step_cv: float = 0.0
    device_cv: float = 0.0
    buffer_sync_s: float = 0.0
    collective_after_compute_s: float = 0.0
    collective_host_s: float = 0.0

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
        for name in ("microbatch_overhead_s", "message_host_s", "buffer_sync_s",
                     "collective_after_compute_s", "collective_host_s"):
            value = getattr(self, name)
            _require(_finite(value) and value >= 0,
                     f"{where}: {name} must be a duration >= 0 s, got {value!r}")
            object.__setattr__(self, name, float(value))
        _require(_finite(self.microbatch_stretch) and 1 <= self.microbatch_stretch <= 4,
                 f"{where}: microbatch_stretch must be a number in [1, 4] (how many times "
                 f"longer a pipeline action runs than its stage alone), got "
                 f"{self.microbatch_stretch!r}")
        object.__setattr__(self, "microbatch_stretch", float(self.microbatch_stretch))
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
        _require(_finite(self.step_cv) and 0 <= self.step_cv <= STEP_CV_MAX,
                 f"{where}: step_cv must be a number in [0, {STEP_CV_MAX}] (the coefficient "
                 f"of variation of one rank's compute time per step: 0.01 for 1%), got "
                 f"{self.step_cv!r}")
        object.__setattr__(self, "step_cv", float(self.step_cv))
        _require(_finite(self.device_cv) and 0 <= self.device_cv <= STEP_CV_MAX,
                 f"{where}: device_cv must be a number in [0, {STEP_CV_MAX}] (the coefficient "
                 f"of variation of compute speed across devices of the kind: 0.015 for 1.5%), "
                 f"got {self.device_cv!r}")
        object.__setattr__(self, "device_cv", float(self.device_cv))
        object.__setattr__(self, "collective_overhead_s", float(self.collective_overhead_s))
        object.__setattr__(self, "collective_contention", float(self.collective_contention))
        ordered = {d: float(flops[d]) for d in DTYPES if d in flops}
        object.__setattr__(self, "peak_flops_per_s", MappingProxyType(ordered))
        object.__setattr__(self, "memory_bandwidth_bytes_per_s", float(bandwidth))
        object.__setattr__(self, "launch_overhead_s", float(self.launch_overhead_s))
        object.__setattr__(self, "comm_compute_share", float(self.comm_compute_share))

    @property
    def slowest_rank_cv(self) -> float:
        """The coefficient of variation of one rank's step compute time, device and step draws
        together: √(device_cv² + step_cv²) (exactly the other when one is 0)."""
        return math.hypot(self.device_cv, self.step_cv)

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
                     self.microbatch_overhead_s, self.microbatch_stretch, self.message_host_s,
                     self.collective_overhead_s, self.compute_rate_with_comm,
                     self.comm_rate_with_compute, self.collective_slots,
                     self.collective_contention, self.step_cv, self.device_cv,
                     self.buffer_sync_s, self.collective_after_compute_s,
                     self.collective_host_s))

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
                **({"microbatch_stretch": dev.microbatch_stretch}
                   if dev.microbatch_stretch != 1 else {}),
                **({"message_host": dev.message_host_s} if dev.message_host_s else {}),
                **({"collective_overhead": dev.collective_overhead_s}
                   if dev.collective_overhead_s else {}),
                **{key: getattr(dev, key) for key in _COLLECTIVE_KEYS
                   if getattr(dev, key) != _COLLECTIVE_DEFAULTS[key]},
                **({"step_cv": dev.step_cv} if dev.step_cv else {}),
                **({"device_cv": dev.device_cv} if dev.device_cv else {}),
                **({"buffer_sync": dev.buffer_sync_s} if dev.buffer_sync_s else {}),
                **({"collective_after_compute": dev.collective_after_compute_s}
                   if dev.collective_after_compute_s else {}),
                **({"collective_host": dev.collective_host_s} if dev.collective_host_s else {}),
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
        from trainsched.cluster.files import cluster_from_dict

        return cluster_from_dict(data, source)

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
               if dev.microbatch_overhead_s or dev.message_host_s else "")
            + (f", pipeline actions {dev.microbatch_stretch:.3g}x their stage alone"
               if dev.microbatch_stretch != 1 else ""),
            *([f"  overlap     compute at {dev.compute_rate_with_comm:.2f} of its rate while "
               f"a collective runs, collectives at {dev.comm_rate_with_compute:.2f} while "
               f"compute runs; {dev.collective_slots} collective(s) at once (contention "
               f"{dev.collective_contention:.2f}), "
               f"{format_duration(dev.collective_overhead_s)} overhead each"]
              if dev.collective_overhead_s or dev.comm_by_rate else []),
            *([f"  step jitter each rank's step compute varies by {100 * dev.step_cv:.2f}% "
               f"(coefficient of variation); a synchronous step waits for the slowest rank"]
              if dev.step_cv else []),
            *([f"  spread      devices of the kind differ in compute speed by "
               f"{100 * dev.device_cv:.2f}% (coefficient of variation); a synchronous step "
               f"waits for the slowest device"] if dev.device_cv else []),
            *([f"  buffer sync DDP broadcasts the buffers before each forward: "
               f"{format_duration(dev.buffer_sync_s)} plus their bytes over the collective link"]
              if dev.buffer_sync_s else []),
            *([f"  first coll. the first collective of each step takes "
               f"{format_duration(dev.collective_after_compute_s)} longer (it starts as "
               f"compute ends)"] if dev.collective_after_compute_s else []),
            *([f"  coll. host  each collective takes {format_duration(dev.collective_host_s)} "
               f"of its rank's compute (processor time driving it)"]
              if dev.collective_host_s else []),
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
