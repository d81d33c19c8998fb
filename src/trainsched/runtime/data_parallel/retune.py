"""Switching the policy mid-run (``specs/comm.md`` §7): by hand (``retune``) or online.

Rank 0 changes the policy (partition, credit, ...) from a later step on every rank: at the
first gradient of each step rank 0 publishes the policy of the next step (empty: unchanged)
for step s+1, and every other rank reads step s's at the first gradient of step s. Rank 0
wrote it before it issued any collective of step s-1, and a rank cannot start step s before
all of step s-1's collectives completed, so the read never waits. Step s's policy is the
store key ``cfg/<s mod 2>``: rank 0 overwrites it for step s+2 only at the first gradient
of step s+1, after every rank issued step s's collectives and so read it; two keys written in
turn cost one store write per step, none deleted. At the
switch every rank finishes the last step's updates, folds the per-part optimizer state back
into whole parameters and rebuilds its collectives, so all ranks change at one step.

- :class:`Roles`: who may switch (rank 0 of a coordinated group, or a lone rank) and who
  publishes or reads the switch.
- :class:`SwitchPlan` (training thread): what ``retune`` checks and rank 0's planned policies.
- :class:`PolicyChannel` (dispatcher thread): the policy in force, the switches made, and the
  ``cfg/<s>`` keys.
- :class:`TunerFeed` (training thread, rank 0): an
  :class:`~trainsched.comm.tune.OnlineTuner` fed with step times (a step: from one forward
  after a backward pass to the next), whose answers become retunes.

:mod:`trainsched.comm.tune` is imported only when a tuner is given.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from trainsched.comm.dispatch import check_sizes
from trainsched.comm.policy import CommPolicy
from trainsched.errors import TrainschedError
from trainsched.runtime.data_parallel.group import Peers
from trainsched.runtime.data_parallel.trace import clock

if TYPE_CHECKING:
    from trainsched.comm.tune import OnlineTuner

__all__ = ["PolicyChannel", "Roles", "SwitchPlan", "TunerFeed", "check_tuner", "config_key",
           "policy_fields"]


def policy_fields(policy: CommPolicy) -> dict[str, Any]:
    """A policy's fields by name (what ``cfg/<s>`` carries and the ``SWITCH`` span shows)."""
    return {f.name: getattr(policy, f.name) for f in dataclasses.fields(policy)}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Roles:
    """``decides``: may switch the policy; ``publishes``: writes ``cfg/<s>`` for the others;
    ``reads``: follows ``cfg/<s>``."""

    decides: bool
    publishes: bool
    reads: bool

    @classmethod
    def of(cls, coordinated: bool, rank: int, world_size: int) -> Roles:
        return cls(decides=rank == 0 and (coordinated or world_size == 1),
                   publishes=coordinated and rank == 0 and world_size > 1,
                   reads=coordinated and rank != 0)


def check_tuner(tuner: Any, policy: CommPolicy, coordinated: bool, world_size: int) -> None:
    """A tuner must be an ``OnlineTuner``, the policy must have sizes to tune, and the ranks
    must follow one order (else no rank can tell the others when to switch)."""
    from trainsched.comm.tune import OnlineTuner, tuned_policy

    if not isinstance(tuner, OnlineTuner):
        raise TrainschedError(f"tuner must be an OnlineTuner, got {type(tuner).__name__}")
    tuned_policy(policy, 4096, 4096)  # a policy without sizes to tune fails here
    if not coordinated and world_size > 1:
        raise TrainschedError("online tuning switches every rank at rank 0's word: it "
                              "needs order='leader' or order='static'")


def config_key(step: int) -> str:
    """The store key of step ``step``'s policy (module docstring: two keys, in turn)."""
    return f"cfg/{step % 2}"


class PolicyChannel:
    """The policy in force and the switches made (dispatcher thread; the training thread
    reads them); rank 0's retunes waiting to be published; ``cfg/<s>`` through ``store``."""

    def __init__(self, policy: CommPolicy, roles: Roles, peers: Peers, store: Any) -> None:
        self.policy = policy
        self.switches: list[tuple[int, CommPolicy]] = []
        self._roles = roles
        self._peers = peers
        self._store = store
        self._pending: dict[int, CommPolicy] = {}  # rank 0: retunes not yet published
        self._switch_at: dict[int, CommPolicy] = {}  # the policy to switch to at a step

    def request(self, step: int, policy: CommPolicy, current_step: int) -> None:
        """Rank 0 asked for ``policy`` from ``step`` (the dispatcher is at ``current_step``)."""
        if step <= current_step + 1:
            raise TrainschedError(f"internal: a retune for step {step} arrived at step "
                                  f"{current_step}")
        self._pending[step] = policy

    def incoming(self, step: int) -> CommPolicy | None:
        """At the first gradient of ``step``: the policy to switch to, if it changes."""
        policy = self._switch_at.pop(step, None)
        if self._roles.reads and step >= 1:
            text = self._peers.get(self._store, config_key(step),
                                   f"rank 0's policy for step {step}")
            if text:
                policy = type(self.policy)(**json.loads(text))
        return policy

    def announce(self, step: int) -> None:
        """Rank 0, at the first gradient of ``step``: fix (and publish) the next step's
        policy."""
        if not self._roles.decides:
            return
        upcoming = self._pending.pop(step + 1, None)
        if upcoming is not None:
            self._switch_at[step + 1] = upcoming
        if self._roles.publishes:
            text = "" if upcoming is None else json.dumps(policy_fields(upcoming))
            self._store.set(config_key(step + 1), text)

    def switched(self, step: int, policy: CommPolicy) -> None:
        """``policy`` is in force from ``step``."""
        self.policy = policy
        self.switches.append((step, policy))


class SwitchPlan:
    """Rank 0's planned policies by first step (training thread); elsewhere the switches
    ``channel`` made. ``check`` rejects a policy this model cannot run (partition
    alignment)."""

    def __init__(self, policy: CommPolicy, roles: Roles, channel: PolicyChannel,
                 check: Callable[[CommPolicy], None]) -> None:
        self.roles = roles
        self.planned: list[tuple[int, CommPolicy]] = [(0, policy)]
        self._channel = channel
        self._check = check

    def policy_at(self, step: int) -> CommPolicy:
        """The policy planned for ``step`` (rank 0; elsewhere: the last one switched to)."""
        planned = (self.planned if self.roles.decides
                   else [(0, self._channel.policy), *self._channel.switches])
        return next(policy for first, policy in reversed(planned) if first <= step)

    def plan(self, policy: CommPolicy | None, at_step: int | None, changes: dict[str, Any],
             earliest: int) -> tuple[int, CommPolicy]:
        """Check a retune (``policy``, or the planned one with ``changes``, from ``at_step``,
        by default ``earliest``) and plan it; returns (step, policy)."""
        step = earliest if at_step is None else at_step
        if not (isinstance(step, int) and not isinstance(step, bool) and step >= earliest):
            raise TrainschedError(f"at_step must be an integer >= {earliest} (the next backward "
                                  f"pass that can still switch), got {at_step!r}")
        planned = self.policy_at(step)
        if policy is None:
            try:
                policy = dataclasses.replace(planned, **changes)
            except TypeError as exc:
                raise TrainschedError(f"retune: {type(planned).__name__} has no such field "
                                      f"({exc})") from None
        elif changes:
            raise TrainschedError("retune takes a policy or field changes, not both")
        if type(policy) is not type(planned) or not dataclasses.is_dataclass(policy):
            raise TrainschedError(f"retune keeps the policy's kind: {type(planned).__name__}, "
                                  f"got {type(policy).__name__}")
        check_sizes(policy)
        self._check(policy)
        json.dumps(policy_fields(policy))  # what the other ranks will read
        self.planned = [(s, p) for s, p in self.planned if s < step] + [(step, policy)]
        return step, policy


class TunerFeed:
    """Rank 0's tuner: started at ``policy``'s sizes, fed the time of every step, its switches
    handed to ``apply(step, policy)``; ``policy_at`` gives the policy a switch modifies."""

    def __init__(self, tuner: OnlineTuner, policy: Any,
                 policy_at: Callable[[int], CommPolicy],
                 apply: Callable[[int, CommPolicy], Any]) -> None:
        tuner.begin(policy.partition_bytes, policy.credit_bytes)
        self._tuner = tuner
        self._policy_at = policy_at
        self._apply = apply
        self._forward_step = -1  # the step whose first forward ran last
        self._step_start = 0.0

    def forward(self, step: int) -> None:
        """A forward of ``step`` (backward passes done so far) begins."""
        if step == self._forward_step:
            return  # a second forward in one step (evaluation): not a new step
        now = clock()
        if step >= 1 and self._forward_step == step - 1:
            switch = self._tuner.observe(step - 1, now - self._step_start)
            if switch is not None:
                from trainsched.comm.tune import tuned_policy

                at, (partition, credit) = switch
                self._apply(at, tuned_policy(self._policy_at(at), partition, credit))
        self._forward_step = step
        self._step_start = now
