"""The catalogue: device kinds (:data:`DEVICE_KINDS`, :func:`device_kind`) and cluster presets of
published setups (:data:`PRESETS`, :func:`cluster_preset`), each citing where its numbers come
from (``docs/cluster.md``).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from statistics import NormalDist
from types import MappingProxyType

from trainsched.cluster.spec import Cluster, DeviceSpec, Link, _require
from trainsched.units import (
    is_int,
)

if sys.version_info >= (3, 11):
    pass
else:  # pragma: no cover
    pass

# ---------------------------------------------------------------------------------------------
# Device catalogue

#: The kernel length that fits beside another on a catalogue GPU.
GPU_STREAM_FIT_S = 100e-6


#: The rate compute keeps on a catalogue NVLink GPU (V100, A100, H100) while an NCCL collective
#: runs beside it: about a fifth slower (``docs/cluster.md`` cites the measurements).
GPU_COMPUTE_RATE_WITH_COMM = 0.8


#: The performance variation measured among V100s of one cluster (Sinha et al., SC 2022: 8% on
#: average over the clusters and applications), as the span between Tukey's fences,
#: Q1 − 1.5·IQR to Q3 + 1.5·IQR, over the median (``docs/cluster.md`` cites the measurements).
V100_FENCE_SPAN = 0.08

#: Tukey's fences of a normal span 4 IQR, and its IQR is 2·z(0.75) standard deviations.
FENCE_SPAN_SIGMAS = 8 * NormalDist().inv_cdf(0.75)

#: The V100's ``device_cv``: the coefficient of variation that gives that span, 0.0148.
V100_DEVICE_CV = V100_FENCE_SPAN / FENCE_SPAN_SIGMAS


def _gpu(kind: str, memory_gib: int, flops: dict[str, float], bandwidth: float,
         compute_rate_with_comm: float = 1.0, device_cv: float = 0.0) -> DeviceSpec:
    return DeviceSpec(kind=kind, memory_bytes=memory_gib * 2**30, peak_flops_per_s=flops,
                      memory_bandwidth_bytes_per_s=bandwidth, launch_overhead_s=5e-6,
                      stream_fit_s=GPU_STREAM_FIT_S,
                      compute_rate_with_comm=compute_rate_with_comm, device_cv=device_cv)


DEVICE_KINDS: Mapping[str, DeviceSpec] = MappingProxyType({
    d.kind: d for d in (
        _gpu("RTX2080-8GB", 8, {"fp32": 10.07e12, "fp16": 40.3e12}, 448e9),
        _gpu("V100-16GB", 16, {"fp32": 15.7e12, "fp16": 125e12}, 900e9,
             GPU_COMPUTE_RATE_WITH_COMM, V100_DEVICE_CV),
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
