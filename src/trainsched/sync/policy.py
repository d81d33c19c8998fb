"""Sync policies: which protocol trains which share of the samples, and the text that says so.

A :class:`SyncPolicy` is an ordered tuple of phases ``(protocol, fraction_of_samples)`` plus an
optional straggler policy (:class:`~trainsched.sync.straggler.StragglerPolicy`). Its text form:

* ``bsp:0.125,asp:0.875`` — BSP for the first eighth of the samples, then ASP;
* ``bsp:0.5,ssp(s=4):0.5``, ``bsp:0.25,local(h=8):0.75``;
* ``asp`` — one protocol alone (``asp:1``);
* ``ssp:4``, ``k-of-n:3``, ``local:8`` — one protocol with its parameter (the short form);
* ``bsp;straggler(exclude)`` — the straggler policy after the phases, behind a ``;``.

**The rule for ``NAME:NUMBER``.** In a policy of one phase, ``NAME:NUMBER`` where NAME's
protocol takes a parameter (``ssp``, ``k-of-n``, ``local``) gives the parameter, not the
fraction: ``ssp:4`` is SSP with staleness bound 4 for all the samples, and ``ssp:1`` is
``ssp(s=1)``, never "ssp for fraction 1". Where the protocol takes no parameter the number is
the fraction as always (``asp:1`` and ``bsp:1`` are ``asp`` and ``bsp``). The parenthesised
form ``ssp(s=4)`` is valid everywhere and is the one a policy of several phases uses
(``bsp:0.5,ssp(s=4):0.5``); there a bare ``ssp`` is refused. A lone ``ssp(s=4):1`` reads too.

:func:`format_policy` writes the canonical text (no spaces, fractions as Python writes floats,
a lone phase without ``:1``, a lone protocol with a parameter in the short form ``ssp:4``,
the parenthesised form among several phases) and :func:`parse_policy` reads it back equal.
A malformed text is refused with the column (1-based) of the character at fault. Fractions lie
in (0, 1] and sum to 1 (within 1e-9).

Samples are the clock: :meth:`SyncPolicy.phase_samples` cuts a run's total sample count into
integer phase quotas that sum to it exactly, and :func:`lr_scale` is the factor the learning
rate schedule is multiplied by under a protocol, ``effective_batch / (N·b)`` — derived from the
protocol in force, never compounded across switches.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from trainsched.errors import TrainschedError
from trainsched.sync.protocols import (
    PROTOCOLS,
    Asp,
    Bsp,
    KOfN,
    Ssp,
    SyncProtocol,
    format_protocol,
    parse_protocol,
)
from trainsched.sync.straggler import (
    StragglerPolicy,
    format_straggler_policy,
    parse_straggler_policy,
)
from trainsched.units import is_int

__all__ = ["SUM_TOLERANCE", "SyncPolicy", "format_policy", "lr_scale", "parse_policy"]

#: How far the phase fractions' sum may be from 1.
SUM_TOLERANCE = 1e-9

_FORM = ("PROTOCOL:FRACTION,... (e.g. bsp:0.125,asp:0.875, bsp:0.5,ssp(s=4):0.5) or one "
         "protocol alone (asp, ssp:4, k-of-n:3, local:8), optionally ;straggler(ACTION)")


@dataclass(frozen=True, kw_only=True)
class SyncPolicy:
    """Phases ``((protocol, fraction), ...)`` run in order, each for its fraction of the
    samples; ``straggler`` the online straggler policy, or ``None`` (no reaction)."""

    phases: tuple[tuple[SyncProtocol, float], ...]
    straggler: StragglerPolicy | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.phases, Sequence) or not self.phases:
            raise TrainschedError(f"sync policy: phases must be a non-empty list of (protocol, "
                                  f"fraction) pairs, got {self.phases!r}")
        phases = []
        for k, phase in enumerate(self.phases):
            if not (isinstance(phase, Sequence) and len(phase) == 2):
                raise TrainschedError(f"sync policy: phase {k} must be a (protocol, fraction) "
                                      f"pair, got {phase!r}")
            protocol, fraction = phase
            if not any(isinstance(protocol, cls) for cls, _ in PROTOCOLS.values()):
                raise TrainschedError(f"sync policy: phase {k}: {protocol!r} is not a sync "
                                      f"protocol; known: {', '.join(PROTOCOLS)}")
            _check_fraction(fraction, f"sync policy: phase {k} ({format_protocol(protocol)})")
            if phases and phases[-1][0] == protocol:
                raise TrainschedError(f"sync policy: phases {k - 1} and {k} are both "
                                      f"{format_protocol(protocol)}; merge them into one phase")
            phases.append((protocol, float(fraction)))
        total = math.fsum(f for _, f in phases)
        if abs(total - 1.0) > SUM_TOLERANCE:
            raise TrainschedError(f"sync policy: the phase fractions sum to {total!r}, not 1; "
                                  f"make them add up to 1")
        if self.straggler is not None and not isinstance(self.straggler, StragglerPolicy):
            raise TrainschedError(f"sync policy: straggler must be a StragglerPolicy or None, "
                                  f"got {self.straggler!r}")
        object.__setattr__(self, "phases", tuple(phases))

    @property
    def protocols(self) -> tuple[SyncProtocol, ...]:
        return tuple(p for p, _ in self.phases)

    @property
    def bsp_fraction(self) -> float:
        """The share of samples trained under BSP (the offline policy's knob f)."""
        return math.fsum(f for p, f in self.phases if isinstance(p, Bsp))

    @property
    def uses_servers(self) -> bool:
        """Whether a run of the policy needs parameter servers: a phase of ASP, SSP or k-of-N,
        or a straggler policy that relaxes to ASP."""
        relax = self.straggler is not None and self.straggler.action == "relax"
        return relax or any(isinstance(p, Asp | Ssp | KOfN) for p in self.protocols)

    @property
    def switches(self) -> int:
        """Planned switches between phases (a straggler policy may add more at run time)."""
        return len(self.phases) - 1

    def phase_samples(self, total: int, *, quantum: int = 1) -> tuple[int, ...]:
        """Each phase's sample quota for a run of ``total`` samples: whole numbers summing
        exactly to ``total``. The boundary after phase k is ``total × (f_0 + … + f_k)`` rounded
        half up to a multiple of ``quantum`` (one BSP step is ``N·b`` samples), computed in
        exact rational arithmetic; the last boundary is ``total``. A short run may leave a
        phase 0 samples."""
        if not (is_int(total) and total >= 0):
            raise TrainschedError(f"total samples must be a whole number >= 0, got {total!r}")
        if not (is_int(quantum) and quantum >= 1):
            raise TrainschedError(f"quantum must be a whole number >= 1, got {quantum!r}")
        bounds, cumulative = [], Fraction(0)
        for _, fraction in self.phases[:-1]:
            cumulative += Fraction(fraction)
            steps = math.floor(total * cumulative / quantum + Fraction(1, 2))
            bounds.append(min(total, max(bounds[-1] if bounds else 0, steps * quantum)))
        bounds.append(total)
        return tuple(b - a for a, b in zip([0, *bounds[:-1]], bounds, strict=True))

    def phase_at(self, samples_done: int, total: int, *, quantum: int = 1) -> int:
        """The index of the phase in force once ``samples_done`` of ``total`` samples are
        applied (a phase with quota 0 is skipped; at the end, the last phase)."""
        end = 0
        quotas = self.phase_samples(total, quantum=quantum)
        for k, quota in enumerate(quotas):
            end += quota
            if samples_done < end:
                return k
        return len(quotas) - 1


def _check_fraction(fraction: object, what: str) -> None:
    real = isinstance(fraction, int | float) and not isinstance(fraction, bool)
    if not (real and 0 < fraction <= 1):
        raise TrainschedError(f"{what}: the fraction of samples must be a number in (0, 1], "
                              f"got {fraction!r}")


def lr_scale(protocol: SyncProtocol, ranks: int, batch_per_rank: int) -> float:
    """The factor on the learning-rate schedule under ``protocol``: its effective batch over
    BSP's, ``effective_batch / (N·b)`` (1 for BSP and local SGD, 1/N for ASP and SSP, k/N for
    k-of-N). Derive it from the protocol in force; never multiply it into an LR in place."""
    return protocol.effective_batch(ranks, batch_per_rank) / (ranks * batch_per_rank)


def format_policy(policy: SyncPolicy) -> str:
    """The canonical text of ``policy`` (module docstring)."""
    if len(policy.phases) == 1 and policy.phases[0][1] == 1.0:
        text = format_protocol(policy.phases[0][0], short=True)
    else:
        text = ",".join(f"{format_protocol(p)}:{f!r}" for p, f in policy.phases)
    if policy.straggler is not None:
        text += ";" + format_straggler_policy(policy.straggler)
    return text


_PROTOCOL = re.compile(r"[A-Za-z][A-Za-z-]*(?:\([^()]*\))?")
_NUMBER = re.compile(r"(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")


class _Reader:
    """A cursor over the policy text; errors name the 1-based column."""

    def __init__(self, text: str) -> None:
        self.text, self.at = text, 0

    def fail(self, message: str, at: int | None = None) -> TrainschedError:
        where = self.at if at is None else at
        rest = self.text[where:]
        near = f" (at {rest[:12]!r})" if rest else " (at the end)"
        return TrainschedError(f"cannot read sync policy {self.text!r}: column {where + 1}"
                               f"{near}: {message}; write {_FORM}")

    def skip_spaces(self) -> None:
        while self.at < len(self.text) and self.text[self.at].isspace():
            self.at += 1

    def match(self, pattern: re.Pattern[str]) -> str | None:
        found = pattern.match(self.text, self.at)
        if found is None:
            return None
        self.at = found.end()
        return found.group(0)

    def peek(self) -> str:
        return self.text[self.at] if self.at < len(self.text) else ""


def parse_policy(text: str) -> SyncPolicy:
    """The policy written ``text`` (the inverse of :func:`format_policy`; spaces between the
    parts are allowed). Errors give the column of the character at fault."""
    if not isinstance(text, str):
        raise TrainschedError(f"a sync policy is text like {_FORM}, got {text!r}")
    r = _Reader(text)
    phases: list[tuple[SyncProtocol | None, float | None, int]] = []
    pending: dict[int, tuple[str, str | None, int]] = {}  # phase -> (name, number, its column)
    straggler = None
    while True:
        r.skip_spaces()
        start = r.at
        token = r.match(_PROTOCOL)
        if token is None:
            raise r.fail("expected a protocol (" + ", ".join(PROTOCOLS) + ")")
        if token.lower().startswith("straggler"):
            raise r.fail("the straggler policy comes after the phases, behind a ';'", start)
        name = token.lower()
        # NAME:NUMBER with a parametrised NAME: the parameter or an error, once the phases
        # are counted (the module docstring's rule)
        bare = name in PROTOCOLS and PROTOCOLS[name][1] is not None
        protocol = None
        if not bare:
            try:
                protocol = parse_protocol(token)
            except TrainschedError as exc:
                raise r.fail(str(exc), start) from None
        r.skip_spaces()
        fraction, number, number_at = None, None, r.at
        if r.peek() == ":":
            r.at += 1
            r.skip_spaces()
            number_at = r.at
            number = r.match(_NUMBER)
            if number is None:
                what = (f"{name}'s parameter (a whole number)" if bare else
                        "the phase's fraction of the samples (a number in (0, 1])")
                raise r.fail(f"expected {what} after ':'")
            if not bare:
                fraction = float(number)
                if not 0 < fraction <= 1:
                    raise r.fail(f"the fraction {number} is not in (0, 1]", number_at)
        if bare:
            pending[len(phases)] = (name, number, number_at)
        phases.append((protocol, fraction, start))
        r.skip_spaces()
        sep = r.peek()
        if sep == ",":
            r.at += 1
            continue
        if sep == ";":
            r.at += 1
            r.skip_spaces()
            if not text[r.at:].lower().startswith("straggler"):
                raise r.fail("expected the straggler policy, straggler(ACTION), after ';'")
            try:
                straggler = parse_straggler_policy(text[r.at:], column=r.at + 1)
            except TrainschedError as exc:
                raise TrainschedError(f"cannot read sync policy {text!r}: {exc}") from None
            break
        if sep:
            raise r.fail("expected ',' before the next phase, ';' before the straggler "
                         "policy, or the end")
        break
    for k, (name, number, number_at) in sorted(pending.items()):
        phases[k] = (_lone_parameter(r, name, number, number_at, phases[k][2], len(phases)),
                     1.0, phases[k][2])
    if len(phases) > 1:
        for protocol, fraction, start in phases:
            assert protocol is not None
            if fraction is None:
                raise r.fail(f"phase {format_protocol(protocol)} needs its fraction "
                             f"({format_protocol(protocol)}:F) when there are several phases",
                             start)
    elif phases[0][1] is None:
        phases[0] = (phases[0][0], 1.0, phases[0][2])
    total = math.fsum(f for _, f, _ in phases if f is not None)
    if abs(total - 1.0) > SUM_TOLERANCE:
        raise TrainschedError(f"sync policy {text!r}: the fractions sum to {total!r}, not 1; "
                              f"make them add up to 1 (e.g. bsp:0.25,asp:0.75)")
    try:
        return SyncPolicy(phases=tuple((p, f) for p, f, _ in phases),  # type: ignore[misc]
                          straggler=straggler)
    except TrainschedError as exc:
        raise TrainschedError(f"sync policy {text!r}: {exc}") from None


def _lone_parameter(r: _Reader, name: str, number: str | None, number_at: int, start: int,
                    count: int) -> SyncProtocol:
    """The protocol ``name`` written bare (``ssp``) or ``name:NUMBER`` (``ssp:4``) as phase
    of ``count``: its parameter when it is the only phase, else an error at ``start``."""
    cls, short = PROTOCOLS[name]
    if count > 1:
        raise r.fail(f"in a policy of several phases write {name}'s parameter in parentheses, "
                     f"{name}({short}=N):F ({name}:N alone is a policy of one phase)", start)
    if number is None:
        raise r.fail(f"sync protocol {name!r} needs its parameter; write {name}:N or "
                     f"{name}({short}=N)", start)
    if not number.isdigit():
        raise r.fail(f"{name}:N alone gives {name}'s parameter {short}, a whole number (the "
                     f"only phase trains all the samples), got {number}", number_at)
    try:
        return cls(int(number))
    except TrainschedError as exc:
        raise r.fail(str(exc), number_at) from None
