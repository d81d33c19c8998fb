"""Synchronisation of data-parallel replicas (plain Python, no torch): the protocols (BSP, ASP,
SSP, k-of-N, local SGD), sync policies that switch between them, the offline search for the BSP
fraction, the straggler detector and switch decider, and the fault-injection text they are
tested with. The runtime's parameter server and local-SGD averaging live in
``trainsched.runtime``."""

from trainsched.sync.faults import (
    Straggler,
    format_straggler,
    link_delay_s,
    parse_straggler,
    parse_stragglers,
    slowed_s,
)
from trainsched.sync.policy import SyncPolicy, format_policy, lr_scale, parse_policy
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
from trainsched.sync.straggler import (
    STRAGGLER_ACTIONS,
    DetectorState,
    StragglerEvent,
    StragglerPolicy,
    detect,
    initial_state,
)
from trainsched.sync.switching import (
    StragglerController,
    SwitchDecision,
    SwitchEvent,
    alternative_rate,
    bsp_rate,
    decide,
)

__all__ = [
    "PROTOCOLS",
    "STRAGGLER_ACTIONS",
    "Asp",
    "Bsp",
    "DetectorState",
    "KOfN",
    "LocalSgd",
    "Ssp",
    "Straggler",
    "StragglerController",
    "StragglerEvent",
    "StragglerPolicy",
    "SwitchDecision",
    "SwitchEvent",
    "SyncPolicy",
    "SyncProtocol",
    "alternative_rate",
    "bsp_rate",
    "decide",
    "detect",
    "format_policy",
    "format_protocol",
    "format_straggler",
    "initial_state",
    "link_delay_s",
    "lr_scale",
    "parse_policy",
    "parse_protocol",
    "parse_straggler",
    "parse_stragglers",
    "slowed_s",
]
