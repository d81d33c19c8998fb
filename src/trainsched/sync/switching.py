"""The switch decider: act on a slow rank only when the predicted saving beats the switch cost.

A switch away from BSP because of a straggler and the switch back cost ``2·C_switch`` (C_switch
measured by the runtime, or a setting in the simulator). While the straggler lasts, the
alternative runs at sample rate ``r_alt`` instead of ``r_now``; over an episode of D seconds it
saves ``D·(1 − r_now/r_alt)``. The episode's length is unknown when the detector fires, so the
decider expects

    D̂ = max(prior_episode_s, time the rank has been slow so far)

(an episode that has lasted t tends to last about t more) and acts only if

    D̂·(1 − r_now/r_alt) > margin·2·C_switch.

A blip shorter than that break-even is declined; a long episode is acted on once D̂ passes it.
Actions (:data:`~trainsched.sync.straggler.STRAGGLER_ACTIONS`): ``exclude`` (BSP among the fast
ranks, LR for their smaller batch, the slow rank re-synced when it rejoins), ``relax`` (ASP while
it lasts, back to BSP after: Sync-Switch's policy 1), ``ignore``. Work done while relaxed never
counts toward the BSP quota.

:class:`StragglerController` joins the detector and the decider in one pure state machine the
runtime and the simulator both drive: feed it each observation, it answers with the switch
events to carry out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from trainsched.errors import TrainschedError
from trainsched.sync.straggler import (
    DetectorState,
    StragglerEvent,
    StragglerPolicy,
    detect,
    initial_state,
)

__all__ = [
    "StragglerController",
    "SwitchDecision",
    "SwitchEvent",
    "alternative_rate",
    "bsp_rate",
    "decide",
]


def bsp_rate(local_s: Sequence[float], *, sync_s: float = 0.0,
             ranks: Sequence[int] | None = None) -> float:
    """Steps' worth of rank-batches per second under BSP among ``ranks`` (default all): each
    step takes the slowest of them plus ``sync_s`` and applies one batch per rank."""
    chosen = range(len(local_s)) if ranks is None else ranks
    times = [local_s[r] for r in chosen]
    return len(times) / (max(times) + sync_s)


def alternative_rate(action: str, local_s: Sequence[float], slow: Sequence[int], *,
                     sync_s: float = 0.0) -> float:
    """The rate (rank-batches per second) of ``action`` with ranks ``slow`` slow: ``exclude``
    is BSP among the others; ``relax`` is ASP, the sum of every rank's own rate; ``ignore``
    stays BSP."""
    if action == "exclude":
        fast = [r for r in range(len(local_s)) if r not in set(slow)]
        return bsp_rate(local_s, sync_s=sync_s, ranks=fast) if fast else 0.0
    if action == "relax":
        return sum(1.0 / t for t in local_s)
    return bsp_rate(local_s, sync_s=sync_s)


@dataclass(frozen=True, kw_only=True)
class SwitchDecision:
    """Whether to act (``act``), the predicted saving ``saving_s`` = D̂·(1 − r_now/r_alt), the
    threshold ``cost_s`` = margin·2·C_switch and the expected episode ``episode_s`` = D̂."""

    act: bool
    action: str
    saving_s: float
    cost_s: float
    episode_s: float


def decide(policy: StragglerPolicy, *, slow_for_s: float, rate_now: float, rate_alt: float,
           switch_s: float) -> SwitchDecision:
    """The decider's rule (module docstring) for one slow episode seen for ``slow_for_s``."""
    for name, value in (("slow_for_s", slow_for_s), ("rate_now", rate_now),
                        ("rate_alt", rate_alt), ("switch_s", switch_s)):
        if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
            raise TrainschedError(f"switch decider: {name} must be a finite number >= 0, got "
                                  f"{value!r}")
    episode = max(policy.prior_episode_s, slow_for_s)
    gain = 1.0 - rate_now / rate_alt if rate_alt > 0 else -math.inf
    saving = episode * gain if gain > -math.inf else -math.inf
    cost = policy.margin * 2 * switch_s
    act = policy.action != "ignore" and saving > cost
    return SwitchDecision(act=act, action=policy.action, saving_s=saving, cost_s=cost,
                          episode_s=episode)


@dataclass(frozen=True, kw_only=True)
class SwitchEvent:
    """A switch to carry out: ``kind`` ``"out"`` (leave BSP by ``action`` because of ranks
    ``ranks``) or ``"back"`` (return to BSP), at observation ``observation``; ``decision``
    is the rule's figures for ``"out"``."""

    kind: str
    action: str
    ranks: tuple[int, ...]
    observation: int
    decision: SwitchDecision | None = None


class StragglerController:
    """Detector + decider, fed one observation at a time (:meth:`observe`).

    ``switch_s`` is the cost of one switch (seconds; :meth:`set_switch_s` updates it when the
    runtime measures one); ``sync_s`` the synchronisation time a BSP step adds to its slowest
    rank. The controller is out of BSP (``switched``) from an ``"out"`` event until every rank
    it switched for has recovered, when it emits ``"back"``. ``declined`` counts the
    observations where a slow rank was seen and the rule said no.
    """

    def __init__(self, ranks: int, policy: StragglerPolicy | None = None, *,
                 switch_s: float, sync_s: float = 0.0) -> None:
        self.policy = policy or StragglerPolicy()
        self.state: DetectorState = initial_state(ranks, self.policy)
        self.switch_s = switch_s
        self.sync_s = sync_s
        self.switched: tuple[int, ...] = ()
        self.slow_for_s = 0.0
        self.declined = 0
        self.detector_events: list[StragglerEvent] = []

    def set_switch_s(self, switch_s: float) -> None:
        self.switch_s = switch_s

    def observe(self, local_s: Sequence[float], elapsed_s: float) -> tuple[SwitchEvent, ...]:
        """One observation: every rank's local time and the wall time since the previous
        observation. Returns the switches to make now (none, one ``out`` or one ``back``)."""
        self.state, events = detect(self.state, local_s, self.policy)
        self.detector_events.extend(events)
        slow = self.state.slow_ranks
        self.slow_for_s = self.slow_for_s + elapsed_s if slow else 0.0
        at = self.state.observations - 1
        if self.switched:
            if any(r in slow for r in self.switched):
                return ()
            ranks, self.switched = self.switched, ()
            return (SwitchEvent(kind="back", action=self.policy.action, ranks=ranks,
                                observation=at),)
        if not slow or self.policy.action == "ignore":
            return ()
        decision = decide(self.policy, slow_for_s=self.slow_for_s,
                          rate_now=bsp_rate(local_s, sync_s=self.sync_s),
                          rate_alt=alternative_rate(self.policy.action, local_s, slow,
                                                    sync_s=self.sync_s),
                          switch_s=self.switch_s)
        if not decision.act:
            self.declined += 1
            return ()
        self.switched = slow
        return (SwitchEvent(kind="out", action=self.policy.action, ranks=slow, observation=at,
                            decision=decision),)
