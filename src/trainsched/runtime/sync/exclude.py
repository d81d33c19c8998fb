"""The online policy's ``exclude`` action: BSP among the fast workers while a straggler lasts.

When the straggler controller says ``out`` with the action ``exclude`` (spec §2.4), the fast
workers go on with BSP among themselves: their gradients all-reduced over a process group of
just them (made for every possible set of fast workers at the start, :func:`fast_groups`, since
creating a group is a collective of every rank), averaged over their count ``k``, and stepped at
the learning rate for their smaller effective batch (BSP's times ``k / N``). The slow workers
**idle**: they compute no gradient for the model, only one *probe* batch at the start of each
observation window (its gradient discarded) so the detector keeps seeing their local time and
can tell when they recover. Every ``M`` steps of the fast workers all workers still all-gather
one row each (the probe's time for a slow worker), so each feeds its own controller the same
rows, as under plain BSP.

On ``back`` the episode ends at the next step count that makes its samples a whole number of
BSP steps of all ``N`` workers (``k·steps`` a multiple of ``N``), and the slow workers
**rejoin**: the first fast worker broadcasts its parameters and momentum to every worker, the
buffers are reconciled, and the replicas' digests are compared (equal, or an error) before BSP
among all resumes. The episode's samples are kept outside the BSP phase's quota, like a relaxed
episode's (:mod:`.online`): the phase trains its whole quota among all workers after it and the
run's later phases shrink by them, so the run's total is kept. Worker 0 records the detector
events, a ``straggler`` switch from ``bsp`` to ``bsp(fast)`` and back, and the episode.
"""

from __future__ import annotations

import itertools
import math
import time
from typing import Any

import torch.distributed as dist

from trainsched.runtime.sync.wire import guard
from trainsched.sync.protocols import Bsp

__all__ = ["FAST", "exclude_episode", "fast_groups"]

#: The name episodes and switches of the ``exclude`` action give BSP among the fast workers.
FAST = "bsp(fast)"


def fast_groups(workers: int) -> dict[tuple[int, ...], Any]:
    """A process group for every set of 1 .. N-1 workers (every rank of the job must call
    this, in the same order): the fast workers' all-reduce group whichever ranks are slow."""
    groups = {}
    with guard("building the process groups of the fast workers"):
        for size in range(1, workers):
            for ranks in itertools.combinations(range(workers), size):
                groups[ranks] = dist.new_group(list(ranks))
    return groups


def exclude_episode(online: Any, slow: tuple[int, ...], samples: int, left: int) -> int:
    """Run one exclusion episode from ``samples`` applied with the workers ``slow`` idle, for
    at most ``left`` samples; returns the samples it applied (0: no whole number of BSP steps
    fits in ``left``, the controller is told it stayed in BSP)."""
    me, worker = online.me, online.me.worker
    worker.release()  # the scheduled runtime's hooks reduce over every worker
    n, b = me.n, me.b
    fast = tuple(r for r in range(n) if r not in slow)
    k = len(fast)
    period = n // math.gcd(n, k)  # fast steps that add up to whole BSP steps of all workers
    unit = k * b
    most = left // (unit * period) * period
    if most == 0:
        online.controller.switched = ()
        return 0
    group, idle = online.groups[fast], me.rank in slow
    began = time.perf_counter()
    step_before = worker.position
    me.replica.lr_at = me.lr_function(me.lr_of(Bsp()) * k / n)
    grad = me.replica.grad
    steps = since = observations = 0
    end, ended, recovered = most, "run end", False
    probe_s = 0.0
    local_mark = worker.local_sum_s
    online.mark = time.perf_counter()
    while steps < end:
        if idle and since == 0 and not recovered:
            worker.compute()  # the probe: timed, its gradient never used
            probe_s = worker.local_s
        if not idle:
            worker.compute()
            with worker.sending(worker.position - 1), \
                    guard(f"worker {me.rank}'s gradient all-reduce among the fast workers"):
                dist.all_reduce(grad, group=group)
            grad.div_(k)
            me.replica.step(grad, samples=samples + steps * unit)
            worker.on_progress(samples + (steps + 1) * unit)
        steps += 1
        since += 1
        if since == online.every and steps < end and not recovered:
            local = probe_s if idle else (worker.local_sum_s - local_mark) / since
            events = online.observe(since, samples + steps * unit, local_s=local)
            observations += 1
            since = 0
            local_mark = worker.local_sum_s
            if any(e.kind == "back" for e in events):
                recovered, ended = True, "recovered"
                end = min(most, math.ceil(steps / period) * period)
    trained = time.perf_counter()
    _rejoin(me, fast[0])
    back = time.perf_counter()
    me.replica.lr_at = me.lr_function(me.lr_of(Bsp()))
    if me.rank == 0:
        ledger = me.ledger
        online.costs.append(back - trained)
        ledger.straggler_switch("bsp", FAST, ranks=slow, samples=samples, step=step_before,
                                at_s=began - me.t0, cost_s=0.0)
        ledger.episode({
            "protocol": FAST, "start_samples": samples, "samples": steps * unit,
            "updates": steps, "gradients": steps * k, "drained": 0,
            "staleness": [[steps] if r in fast else [] for r in range(n)],
            "start_s": began - me.t0, "wall_s": trained - began, "ranks": list(slow),
            "end": ended})
        ledger.straggler_switch(FAST, "bsp", ranks=slow, samples=samples + steps * unit,
                                step=worker.position, at_s=trained - me.t0,
                                cost_s=back - trained)
    return steps * unit


def _rejoin(me: Any, src: int) -> None:
    """The slow workers take the fast workers' state (parameters and momentum, from worker
    ``src``); buffers reconciled; every replica then checked equal."""
    state = me.replica.state_into()
    with guard(f"worker {me.rank} re-syncing from worker {src} after an exclusion"):
        dist.broadcast(state, src=src, group=me.workers_group)
    if me.rank != src:
        me.replica.load_state(state)
    with guard(f"worker {me.rank} reconciling buffers after an exclusion"):
        me.replica.reconcile_buffers(me.workers_group, me.n)
    me.check_equal("after a straggler rejoined")
