"""The straggler detector: which ranks are slow now, from their local step times.

Under BSP every rank's wall step time is the same (they all wait for the slowest), so the
detector reads each rank's *local* time: compute until its gradients are ready (plus, if the
runtime measures one, a link probe). It is a pure state machine, fed one observation (one local
time per rank) every few steps:

* each rank keeps an exponentially weighted moving average (EWMA) of its local time, the newest
  observation weighted ``ewma``;
* its **ratio** is its EWMA over the median EWMA of the *other* ranks (so two ranks suffice:
  each is compared with the other);
* a rank turns **slow** after ``observations_on`` observations in a row with ratio
  ``>= theta_on`` (1.3 by default) and is **cleared** after ``observations_off`` in a row with
  ratio ``<= theta_off`` (1.1): the gap between the two thresholds is the hysteresis, the
  persistence counts keep one noisy observation from flipping it;
* a state lasts at least ``min_dwell`` observations before it may change again.

A rank noisy by ±10 % around the others' time never reaches 1.3 (1.1 / 0.9 < 1.22), so a fair
run raises no event. :class:`StragglerPolicy` holds the thresholds and the decider's settings
(:mod:`trainsched.sync.switching`); it is part of a sync policy and has a text form,
``straggler(exclude,on=1.5)`` (only the settings that differ from the defaults are written).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace

from trainsched.errors import TrainschedError
from trainsched.units import is_int

__all__ = [
    "STRAGGLER_ACTIONS",
    "DetectorState",
    "StragglerEvent",
    "StragglerPolicy",
    "detect",
    "format_straggler_policy",
    "initial_state",
    "parse_straggler_policy",
]

#: What the decider may do about a slow rank: ``exclude`` it (BSP among the fast ranks),
#: ``relax`` to ASP while it lasts (a round trip), or ``ignore`` it.
STRAGGLER_ACTIONS = ("exclude", "relax", "ignore")


@dataclass(frozen=True, kw_only=True)
class StragglerPolicy:
    """The online straggler policy: detector thresholds and the decider's action and margin.

    ``prior_episode_s`` is the episode length the decider expects before it has seen any
    (D̂ = max(prior, time already slow)); ``margin`` scales the cost side of the rule
    ``D̂·(1 − r_now/r_alt) > margin·2·C_switch``.
    """

    action: str = "exclude"
    theta_on: float = 1.3
    observations_on: int = 3
    theta_off: float = 1.1
    observations_off: int = 3
    min_dwell: int = 3
    ewma: float = 0.5
    margin: float = 1.0
    prior_episode_s: float = 0.0

    def __post_init__(self) -> None:
        if self.action not in STRAGGLER_ACTIONS:
            raise TrainschedError(f"straggler policy: action must be one of "
                                  f"{', '.join(STRAGGLER_ACTIONS)}, got {self.action!r}")
        for name in ("observations_on", "observations_off"):
            value = getattr(self, name)
            if not (is_int(value) and value >= 1):
                raise TrainschedError(f"straggler policy: {name} must be a whole number >= 1, "
                                      f"got {value!r}")
        if not (is_int(self.min_dwell) and self.min_dwell >= 0):
            raise TrainschedError(f"straggler policy: min_dwell must be a whole number >= 0, "
                                  f"got {self.min_dwell!r}")
        for name in ("theta_on", "theta_off", "ewma", "margin", "prior_episode_s"):
            value = getattr(self, name)
            if not (_real(value) and math.isfinite(value) and value >= 0):
                raise TrainschedError(f"straggler policy: {name} must be a finite number >= 0, "
                                      f"got {value!r}")
        if not 0 < self.ewma <= 1:
            raise TrainschedError(f"straggler policy: ewma (the newest observation's weight) "
                                  f"must be in (0, 1], got {self.ewma!r}")
        if not 1 <= self.theta_off < self.theta_on:
            raise TrainschedError(
                f"straggler policy: need 1 <= theta_off < theta_on (the hysteresis band), got "
                f"theta_off={self.theta_off!r}, theta_on={self.theta_on!r}")


def _real(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


# --- text form ---------------------------------------------------------------------------------

#: Short key in the text form -> field of :class:`StragglerPolicy`.
_KEYS = {"on": "theta_on", "p_on": "observations_on", "off": "theta_off",
         "p_off": "observations_off", "dwell": "min_dwell", "ewma": "ewma", "margin": "margin",
         "prior": "prior_episode_s"}
_DEFAULTS = StragglerPolicy()


def format_straggler_policy(policy: StragglerPolicy) -> str:
    """``straggler(ACTION[,key=value...])``: the action, then the settings that differ from the
    defaults in a fixed order (floats as Python writes them, so the text round-trips)."""
    parts = [policy.action]
    for key, name in _KEYS.items():
        value = getattr(policy, name)
        if value != getattr(_DEFAULTS, name):
            parts.append(f"{key}={value!r}")
    return f"straggler({','.join(parts)})"


def parse_straggler_policy(text: str, *, column: int = 1) -> StragglerPolicy:
    """The policy written ``straggler``, ``straggler(relax)`` or
    ``straggler(exclude,on=1.5,p_on=4,...)`` (the inverse of :func:`format_straggler_policy`).
    ``column`` is where ``text`` starts in a longer text, for the error messages."""
    keys = ", ".join(f"{k}=" for k in _KEYS)
    body = text.strip()
    if body == "straggler":
        return StragglerPolicy()
    if not (body.startswith("straggler(") and body.endswith(")")):
        raise TrainschedError(f"straggler policy {text!r}, column {column}: expected "
                              f"straggler(ACTION[,key=value...]) with ACTION one of "
                              f"{', '.join(STRAGGLER_ACTIONS)} and keys {keys}")
    inner_at = column + text.index("(") + 1
    values: dict[str, object] = {}
    offset = 0
    for k, item in enumerate(body[len("straggler("):-1].split(",")):
        at = inner_at + offset
        offset += len(item) + 1
        item = item.strip()
        if k == 0 and "=" not in item:
            if item not in STRAGGLER_ACTIONS:
                raise TrainschedError(f"straggler policy {text!r}, column {at}: unknown action "
                                      f"{item!r}; use one of {', '.join(STRAGGLER_ACTIONS)}")
            values["action"] = item
            continue
        key, eq, raw = item.partition("=")
        if not eq or key.strip() not in _KEYS:
            raise TrainschedError(f"straggler policy {text!r}, column {at}: cannot read "
                                  f"{item!r}; write key=value with a key among {keys}")
        name = _KEYS[key.strip()]
        kind = int if is_int(getattr(_DEFAULTS, name)) else float
        try:
            values[name] = kind(raw.strip())
        except ValueError:
            raise TrainschedError(f"straggler policy {text!r}, column {at}: {key.strip()} "
                                  f"needs {'a whole number' if kind is int else 'a number'}, "
                                  f"got {raw.strip()!r}") from None
    try:
        return StragglerPolicy(**values)  # type: ignore[arg-type]
    except TrainschedError as exc:
        raise TrainschedError(f"straggler policy {text!r}, column {column}: "
                              f"{str(exc).removeprefix('straggler policy: ')}") from None


# --- the detector ------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class StragglerEvent:
    """Rank ``rank`` turned slow (``kind="slow"``) or was cleared (``"recovered"``) at
    observation ``observation`` (0-based) with EWMA ratio ``ratio``."""

    kind: str
    rank: int
    observation: int
    ratio: float


@dataclass(frozen=True, kw_only=True)
class DetectorState:
    """Everything the detector remembers (a checkpoint keeps it): per rank the EWMA of its
    local time (``nan`` before the first observation), whether it is slow, the current run of
    observations past the threshold, and the observations since its state last changed."""

    observations: int
    ewma_s: tuple[float, ...]
    slow: tuple[bool, ...]
    streak: tuple[int, ...]
    dwell: tuple[int, ...]

    @property
    def slow_ranks(self) -> tuple[int, ...]:
        return tuple(r for r, s in enumerate(self.slow) if s)


def initial_state(ranks: int, policy: StragglerPolicy | None = None) -> DetectorState:
    """The detector before any observation: no rank slow, every rank free to change at once."""
    if not (is_int(ranks) and ranks >= 2):
        raise TrainschedError(f"the straggler detector compares ranks with each other and needs "
                              f"at least 2, got {ranks!r}")
    dwell = (policy or _DEFAULTS).min_dwell
    return DetectorState(observations=0, ewma_s=(math.nan,) * ranks, slow=(False,) * ranks,
                         streak=(0,) * ranks, dwell=(dwell,) * ranks)


def detect(state: DetectorState, local_s: Sequence[float],
           policy: StragglerPolicy | None = None) -> tuple[DetectorState, tuple[StragglerEvent,
                                                                                   ...]]:
    """Feed one observation (each rank's local time, seconds) to the detector: the new state and
    the events it raises (by rank)."""
    policy = policy or _DEFAULTS
    ranks = len(state.ewma_s)
    if len(local_s) != ranks or not all(_real(t) and math.isfinite(t) and t > 0
                                        for t in local_s):
        raise TrainschedError(f"the straggler detector needs one finite local time > 0 per rank "
                              f"({ranks}), got {list(local_s)!r}")
    a = policy.ewma
    ewma = tuple(float(t) if math.isnan(e) else a * t + (1 - a) * e
                 for e, t in zip(state.ewma_s, local_s, strict=True))
    slow, streak, dwell = list(state.slow), list(state.streak), [d + 1 for d in state.dwell]
    events = []
    for r in range(ranks):
        ratio = ewma[r] / statistics.median(ewma[:r] + ewma[r + 1:])
        past = ratio <= policy.theta_off if slow[r] else ratio >= policy.theta_on
        streak[r] = streak[r] + 1 if past else 0
        need = policy.observations_off if slow[r] else policy.observations_on
        if streak[r] >= need and dwell[r] > policy.min_dwell:
            slow[r] = not slow[r]
            streak[r], dwell[r] = 0, 0
            events.append(StragglerEvent(kind="slow" if slow[r] else "recovered", rank=r,
                                         observation=state.observations, ratio=ratio))
    new = replace(state, observations=state.observations + 1, ewma_s=ewma, slow=tuple(slow),
                  streak=tuple(streak), dwell=tuple(dwell))
    return new, tuple(events)


assert {f.name for f in fields(StragglerPolicy)} == {"action", *_KEYS.values()}
