"""The online straggler policy, simulated: BSP with the straggler controller in the loop.

:func:`simulate_online` trains ``total_samples`` samples under BSP on a
:class:`~trainsched.sim.sync.SyncWorkload` while a
:class:`~trainsched.sync.StragglerController` watches every step's local times (one observation
per BSP step, the step's wall time as the elapsed time) and switches as it decides:

* ``exclude``: from the next step BSP runs among the fast ranks only: the step waits for the
  slowest of them, applies their batches (LR scale (N − excluded)/N) and the excluded ranks keep
  computing beside them, one step per BSP step, so the detector sees when they recover. Rejoining
  costs a switch (the re-sync).
* ``relax``: Sync-Switch's policy 1: the server loop of ASP runs until the controller says the
  straggler is gone (it observes once per N applied gradients, each rank's latest local time),
  then BSP resumes. Relaxed samples never count toward the BSP quota: they are extra work.
* ``ignore``: plain BSP.

Each switch (out, back) costs ``switch_s``. The result counts BSP and relaxed samples apart and
lists the switch events with their simulated time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from trainsched.errors import TrainschedError
from trainsched.sim.sync import SyncSimResult, SyncWorkload, _Run
from trainsched.sync import StragglerController, StragglerPolicy, SwitchEvent
from trainsched.units import is_int

__all__ = ["OnlineResult", "simulate_online"]


@dataclass(frozen=True, kw_only=True)
class OnlineResult:
    """The run's total ``time_s``, the samples applied under BSP (the quota) and while relaxed,
    the switch events as ``(time_s, event)``, the observations where the decider declined, and
    the update log (:class:`~trainsched.sim.sync.SyncSimResult`, one phase-less record)."""

    time_s: float
    bsp_samples: int
    relaxed_samples: int
    events: tuple[tuple[float, SwitchEvent], ...]
    declined: int
    run: SyncSimResult


def simulate_online(workload: SyncWorkload, *, total_samples: int, policy: StragglerPolicy,
                    switch_s: float, seed: int = 0) -> OnlineResult:
    """BSP for ``total_samples`` samples with the controller of ``policy`` in the loop."""
    if not (is_int(total_samples) and total_samples >= 1):
        raise TrainschedError(f"total_samples must be a whole number >= 1, got "
                              f"{total_samples!r}")
    if not (isinstance(switch_s, int | float) and math.isfinite(switch_s) and switch_s >= 0):
        raise TrainschedError(f"switch_s must be seconds >= 0, got {switch_s!r}")
    w = workload
    run = _Run(w, seed)
    controller = StragglerController(w.ranks, policy, switch_s=switch_s, sync_s=w.allreduce_s)
    events: list[tuple[float, SwitchEvent]] = []
    done = relaxed = 0
    excluded: tuple[int, ...] = ()
    while done + relaxed < total_samples:  # relaxed samples are part of the run's total
        # the controller sees local times; a delayed link holds the all-reduce, not them
        held = [run.link(r, run.clock[r]) for r in range(w.ranks)]
        times = run.step_times(range(w.ranks), sends=False)
        active = [r for r in range(w.ranks) if r not in excluded]
        step = max(times[r] + held[r] for r in active) + w.allreduce_s
        run.now += step
        take = min(len(active) * w.batch_per_rank, total_samples - done - relaxed)
        done += take
        run.log(run.now, take, 0, len(active) / w.ranks)
        for event in controller.observe(times, elapsed_s=step):
            events.append((run.now, event))
            run.now += switch_s
            if event.kind == "back":
                excluded = ()
            elif event.action == "exclude":
                excluded = event.ranks
            else:
                relaxed += _relax(run, controller, events,
                                  quota=total_samples - done - relaxed)
                run.now += switch_s
    result = SyncSimResult(time_s=run.now, samples=done + relaxed, ranks=w.ranks,
                           batch_per_rank=w.batch_per_rank, phases=(),
                           update_end_s=tuple(run.end_s), update_samples=tuple(run.samples),
                           update_staleness=tuple(run.staleness),
                           update_lr_scale=tuple(run.lr))
    return OnlineResult(time_s=run.now, bsp_samples=done, relaxed_samples=relaxed,
                        events=tuple(events), declined=controller.declined, run=result)


def _relax(run: _Run, controller: StragglerController,
           events: list[tuple[float, SwitchEvent]], *, quota: int) -> int:
    """ASP until the controller's ``back`` event or until ``quota`` samples (what is left of the
    run: a straggler that never recovers ends the run relaxed, as the runtime does); returns the
    samples applied meanwhile."""
    ranks = run.w.ranks
    latest = [0.0] * ranks
    seen = [False] * ranks
    count, last = 0, run.now

    def on_apply(rank: int, local_s: float) -> bool:
        nonlocal count, last
        latest[rank], seen[rank] = local_s, True
        count += 1
        if count % ranks or not all(seen):
            return False
        out = controller.observe(latest, elapsed_s=run.now - last)
        last = run.now
        for event in out:
            events.append((run.now, event))
        return any(e.kind == "back" for e in out)

    if quota <= 0:
        return 0
    return run.server(quota, math.inf, on_apply=on_apply)
