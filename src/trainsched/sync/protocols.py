"""Synchronisation protocols: how the replicas of a data-parallel job agree on the model.

Each protocol is a frozen value with the two facts every other part needs:

* :meth:`effective_batch` — samples per update of the shared model, which sets the learning
  rate when a policy switches protocol (``lr = schedule(samples) * effective_batch / (N * b)``);
* :meth:`server_rule` — for the parameter-server protocols, the pair ``(k, s)`` of the one
  server loop: average ``k`` fresh gradients per update, and answer a pull at clock ``c`` once
  every worker has finished clock ``c - s``. BSP is ``(N, 0)``, ASP ``(1, inf)``, SSP ``(1, s)``,
  k-of-N ``(k, 0)`` with late gradients dropped.

Local SGD is not a server protocol: replicas step alone and average their parameters every
``period_steps`` steps over the all-reduce group (``server_rule`` is ``None``).

The text form (``bsp``, ``asp``, ``ssp(s=4)``, ``k-of-n(k=3)``, ``local(h=8)``) is written by
:func:`format_protocol` and read back by :func:`parse_protocol`; the two round-trip exactly.
The short form ``NAME:VALUE`` (``ssp:4``, ``k-of-n:3``, ``local:8``; ``format_protocol(p,
short=True)``) says the same for a protocol with a parameter; it is how a sync policy of one
protocol is written (:mod:`trainsched.sync.policy`), where a phase's ``:`` would otherwise
give its fraction of the samples, so inside a policy of several phases the parenthesised form
is the one to use.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, fields
from typing import ClassVar
from typing import Protocol as TypingProtocol

from trainsched.errors import TrainschedError
from trainsched.registry import Registry
from trainsched.units import is_int

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


class SyncProtocol(TypingProtocol):
    name: ClassVar[str]

    def effective_batch(self, ranks: int, batch_per_rank: int) -> int: ...

    def server_rule(self, ranks: int) -> tuple[int, float] | None: ...


def _positive_int(what: str, value: object) -> None:
    if not is_int(value) or value < 1:
        raise TrainschedError(f"{what} must be a whole number >= 1, got {value!r}")


def _check_ranks(ranks: int, batch_per_rank: int = 1) -> None:
    _positive_int("ranks", ranks)
    _positive_int("batch per rank", batch_per_rank)


@dataclass(frozen=True)
class Bsp:
    """Bulk-synchronous: every rank's gradient averaged, one update per step."""

    name: ClassVar[str] = "bsp"

    def effective_batch(self, ranks: int, batch_per_rank: int) -> int:
        _check_ranks(ranks, batch_per_rank)
        return ranks * batch_per_rank

    def server_rule(self, ranks: int) -> tuple[int, float]:
        _check_ranks(ranks)
        return ranks, 0


@dataclass(frozen=True)
class Asp:
    """Asynchronous: the server applies each gradient as it arrives; no rank ever waits."""

    name: ClassVar[str] = "asp"

    def effective_batch(self, ranks: int, batch_per_rank: int) -> int:
        _check_ranks(ranks, batch_per_rank)
        return batch_per_rank

    def server_rule(self, ranks: int) -> tuple[int, float]:
        _check_ranks(ranks)
        return 1, math.inf


@dataclass(frozen=True)
class Ssp:
    """Stale-synchronous: as ASP, but no rank runs more than ``staleness_steps`` clocks ahead
    of the slowest (0 is lockstep)."""

    staleness_steps: int
    name: ClassVar[str] = "ssp"

    def __post_init__(self) -> None:
        if not is_int(self.staleness_steps) or self.staleness_steps < 0:
            raise TrainschedError(f"ssp: the staleness bound s must be a whole number >= 0, "
                                  f"got {self.staleness_steps!r}")

    def effective_batch(self, ranks: int, batch_per_rank: int) -> int:
        _check_ranks(ranks, batch_per_rank)
        return batch_per_rank

    def server_rule(self, ranks: int) -> tuple[int, float]:
        _check_ranks(ranks)
        return 1, self.staleness_steps


@dataclass(frozen=True)
class KOfN:
    """Backup workers: the first ``k`` gradients computed on the current version are averaged
    into one update; later ones are dropped. ``k = N`` is BSP."""

    k: int
    name: ClassVar[str] = "k-of-n"

    def __post_init__(self) -> None:
        _positive_int("k-of-n: k", self.k)

    def effective_batch(self, ranks: int, batch_per_rank: int) -> int:
        self._check_fits(ranks)
        _check_ranks(ranks, batch_per_rank)
        return self.k * batch_per_rank

    def server_rule(self, ranks: int) -> tuple[int, float]:
        self._check_fits(ranks)
        return self.k, 0

    def _check_fits(self, ranks: int) -> None:
        _check_ranks(ranks)
        if self.k > ranks:
            raise TrainschedError(f"k-of-n: k={self.k} is more than the {ranks} ranks; use "
                                  f"k <= {ranks} (k = {ranks} is BSP)")


@dataclass(frozen=True)
class LocalSgd:
    """Local SGD: ranks step alone and average their parameters every ``period_steps`` steps
    (``h = 1`` is BSP for optimizers linear in their state)."""

    period_steps: int
    name: ClassVar[str] = "local"

    def __post_init__(self) -> None:
        _positive_int("local: the averaging period h", self.period_steps)

    def effective_batch(self, ranks: int, batch_per_rank: int) -> int:
        _check_ranks(ranks, batch_per_rank)
        return ranks * batch_per_rank

    def server_rule(self, ranks: int) -> None:
        _check_ranks(ranks)
        return None


#: Protocol name -> (class, its one parameter's short name in the text form, or None). Tag
#: ``compare``: ranks -> the protocol ``trainsched compare`` shows a row of (its parameter).
PROTOCOLS: Registry[tuple[type, str | None]] = Registry("sync protocol", "protocols")
PROTOCOLS.register("bsp", (Bsp, None), compare=lambda ranks: Bsp())
PROTOCOLS.register("asp", (Asp, None), compare=lambda ranks: Asp())
PROTOCOLS.register("ssp", (Ssp, "s"), compare=lambda ranks: Ssp(2))
PROTOCOLS.register("k-of-n", (KOfN, "k"), compare=lambda ranks: KOfN(max(1, ranks - 1)))
PROTOCOLS.register("local", (LocalSgd, "h"), compare=lambda ranks: LocalSgd(4))

_TEXT = re.compile(r"^([a-z][a-z-]*)(?:\((?:([a-z]+)=)?([0-9]+)\))?$")
_SHORT = re.compile(r"^([a-z][a-z-]*)\s*:\s*([0-9]+)$")


def format_protocol(protocol: SyncProtocol, *, short: bool = False) -> str:
    """The text form of ``protocol``: ``bsp``, ``ssp(s=4)``, ``k-of-n(k=3)``, ``local(h=8)``;
    with ``short``, ``ssp:4``, ``k-of-n:3``, ``local:8`` (a protocol without a parameter is its
    name either way)."""
    cls, name = PROTOCOLS.lookup(protocol.name)
    assert isinstance(protocol, cls), protocol
    if name is None:
        return protocol.name
    (value,) = (getattr(protocol, f.name) for f in fields(protocol))
    return f"{protocol.name}:{value}" if short else f"{protocol.name}({name}={value})"


def parse_protocol(text: str) -> SyncProtocol:
    """The protocol written ``text`` (the inverse of :func:`format_protocol`, either form); the
    parameter's name may be left out (``ssp(4)``). Errors name the text and the known forms."""
    forms = "bsp, asp, ssp:S, k-of-n:K, local:H (or ssp(s=S), k-of-n(k=K), local(h=H))"
    lowered = text.strip().lower() if isinstance(text, str) else None
    match = _TEXT.match(lowered) if lowered is not None else None
    short_form = _SHORT.match(lowered) if lowered is not None and match is None else None
    if short_form is not None:
        name, value = short_form.groups()
        if name in PROTOCOLS and PROTOCOLS[name][1] is None:
            raise TrainschedError(f"sync protocol {name!r} takes no parameter; write {name}")
        if name in PROTOCOLS:
            return PROTOCOLS[name][0](int(value))
    if match is None:
        raise TrainschedError(f"cannot read sync protocol {text!r}; write one of {forms}")
    name, short, value = match.groups()
    if name not in PROTOCOLS:
        raise TrainschedError(f"unknown sync protocol {name!r}; known protocols: {forms}")
    cls, expected = PROTOCOLS[name]
    if expected is None:
        if value is not None:
            raise TrainschedError(f"sync protocol {name!r} takes no parameter; write {name}")
        return cls()
    if value is None:
        raise TrainschedError(f"sync protocol {name!r} needs its parameter; write "
                              f"{name}:N or {name}({expected}=N)")
    if short is not None and short != expected:
        raise TrainschedError(f"sync protocol {name!r} has parameter {expected!r}, not "
                              f"{short!r}; write {name}({expected}={value})")
    return cls(int(value))
