"""Synchronisation of data-parallel replicas (plain Python, no torch): the protocols (BSP, ASP,
SSP, k-of-N, local SGD), sync policies that switch between them, and the controllers that choose
when. The runtime's parameter server and local-SGD averaging live in ``trainsched.runtime``."""

from trainsched.sync.protocols import (
    PROTOCOLS,
    Asp,
    Bsp,
    KOfN,
    LocalSgd,
    Ssp,
    SyncProtocol,
    format_protocol,
    parse_protocol,
)

__all__ = [
    "PROTOCOLS",
    "Asp",
    "Bsp",
    "KOfN",
    "LocalSgd",
    "Ssp",
    "SyncProtocol",
    "format_protocol",
    "parse_protocol",
]
