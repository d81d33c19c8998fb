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

from trainsched.cluster.catalogue import (
    DEVICE_KINDS,
    GPU_STREAM_FIT_S,
    PRESETS,
    Preset,
    cluster_preset,
    device_kind,
)
from trainsched.cluster.files import cluster_from_flags, load_cluster_file, resolve_cluster
from trainsched.cluster.spec import (
    COMM_MODES,
    DTYPES,
    FORMAT,
    INTERFERENCE_MODELS,
    STREAM_SLOWDOWN_DEFAULT,
    Cluster,
    DeviceSpec,
    Link,
)

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
