"""Side by side: every strategy trainsched knows, simulated on one training graph and cluster.

Strategies differ in how many samples one step processes (data parallel replicates the batch on
every rank; a pipeline splits one batch into micro-batches), so rows are ranked by throughput,
samples per second, and the speedup is throughput over the single-device baseline. The
strategies and their plans come from :mod:`trainsched.strategies` (made from the registries);
each plan is simulated by :func:`trainsched.sim.simulate`, the entry the runtime's twin
:func:`trainsched.runtime.run` mirrors.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from trainsched.cluster import Cluster
from trainsched.errors import TrainschedError
from trainsched.graph import Graph
from trainsched.plan import PipelinePlan
from trainsched.sim import SimResult, bubble_fraction, simulate
from trainsched.strategies import Options, Planned, make_plans, plan_strategies, strategies

__all__ = [
    "AUTO_MARGIN",
    "TRIAL_CANDIDATES",
    "TRIAL_GAIN",
    "TRIAL_MIN_S",
    "TRIAL_ROUNDS",
    "AutoChoice",
    "Options",
    "Row",
    "SyncRow",
    "choose_comm",
    "compare",
    "compare_plans",
    "compare_sync",
    "confirm_choice",
    "pick_comm",
    "plan_strategies",
    "strategies",
    "trial_steps",
]

#: ``auto`` leaves stock DDP only for a strategy predicted at least this much faster: the
#: scheduled runtime's own host work per collective (hooks, a dispatcher thread, partitions) is
#: not in the prediction, and where communication is light it costs more than it saves.
AUTO_MARGIN = 0.05
#: The strategy ``auto`` falls back to: stock DDP, the scheduled runtime's pass-through.
AUTO_BASELINE = "data-ddp"
#: Rounds of ``auto``'s measured check (stock DDP and the shortlist, interleaved in one job).
TRIAL_ROUNDS = 3
#: The least time one trial segment runs: steps are added to a short model's trial until its
#: predicted DDP step times them reach this (3 steps of a 3 ms model measure only noise).
TRIAL_MIN_S = 0.5
#: What the pick must measure above stock DDP in the trial to be run instead of it.
TRIAL_GAIN = 0.02
#: How many strategies predicted beyond the margin ``auto``'s measured check tries beside DDP
#: (the simulator's order among the scheduled policies is less reliable than its verdict that
#: communication can be hidden).
TRIAL_CANDIDATES = 3


@dataclass(frozen=True, kw_only=True)
class Row:
    """One strategy's prediction."""

    strategy: str
    description: str
    devices: int
    samples_per_step: int
    step_time_s: float
    samples_per_s: float
    speedup: float
    peak_memory_bytes: int
    oom: bool
    idle_fraction: float
    exposed_comm_s: float

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def compare_plans(graph: Graph, cluster: Cluster, planned: dict[str, Planned],
                  batch_size: int, microbatch_graph: Graph | None = None,
                  ) -> tuple[list[Row], dict[str, SimResult]]:
    """Simulate each plan (``planned`` must hold ``single``, the baseline; pipelines with
    ``microbatch_graph``'s costs when given, see :class:`Options`); rows ranked by throughput
    (then name), and the results by strategy name."""
    if "single" not in planned:
        raise TrainschedError("compare needs the 'single' strategy: every speedup is measured "
                              "against it")
    results = {name: simulate(p.plan, graph, cluster, microbatch_graph=microbatch_graph
                              if isinstance(p.plan, PipelinePlan) else None)
               for name, p in planned.items()}
    base = results["single"]
    base_rate = batch_size / base.step_time_s if base.step_time_s else 0.0
    rows = []
    for name, p in planned.items():
        result = results[name]
        rate = p.samples_per_step / result.step_time_s if result.step_time_s else 0.0
        rows.append(Row(
            strategy=name, description=p.description, devices=p.plan.devices,
            samples_per_step=p.samples_per_step, step_time_s=result.step_time_s,
            samples_per_s=rate, speedup=rate / base_rate if base_rate else 0.0,
            peak_memory_bytes=max(result.peak_memory_bytes.values(), default=0),
            oom=any(result.oom.values()), idle_fraction=bubble_fraction(result),
            exposed_comm_s=result.exposed_comm_s))
    rows.sort(key=lambda r: (-r.samples_per_s, r.strategy))
    return rows, results


def compare(graph: Graph, cluster: Cluster, options: Options,
            names: list[str] | None = None) -> tuple[list[Row], dict[str, SimResult]]:
    """Plan and simulate each strategy (default: every one :func:`strategies` lists); rows
    ranked by throughput (then name), and the raw results of the strategies asked for."""
    wanted = list(strategies()) if names is None else list(names)
    planned = make_plans(graph, cluster, options, list(dict.fromkeys(["single", *wanted])))
    rows, results = compare_plans(graph, cluster, planned, options.batch_size,
                                  options.microbatch_graph)
    return [r for r in rows if r.strategy in wanted], {n: results[n] for n in wanted}


@dataclass(frozen=True, kw_only=True)
class AutoChoice:
    """What ``--comm-policy auto`` chose: the strategy, its plan, every candidate's predicted
    step time (seconds) and why."""

    strategy: str
    planned: Planned
    predicted_s: dict[str, float]
    reason: str
    #: stock DDP's plan and the strategies predicted beyond the margin (the fastest first, at
    #: most TRIAL_CANDIDATES), by name: what the measured check times
    shortlist: dict[str, Planned] | None = None
    trial: dict[str, Any] | None = None  # the measured check, once run (confirm_choice)


def pick_comm(predicted_s: dict[str, float], margin: float = AUTO_MARGIN) -> tuple[str, str]:
    """The strategy to run among data-parallel candidates predicted at ``predicted_s`` (which
    must hold :data:`AUTO_BASELINE`), and why: the fastest (then by name) if it beats stock DDP
    by more than ``margin``, else stock DDP."""
    if AUTO_BASELINE not in predicted_s:
        raise TrainschedError(f"auto compares every candidate with {AUTO_BASELINE}; it is "
                              f"missing from {', '.join(predicted_s)}")
    best = min(predicted_s, key=lambda n: (predicted_s[n], n))
    base = predicted_s[AUTO_BASELINE]
    if best == AUTO_BASELINE:
        return best, "stock DDP is predicted fastest"
    gain = base / predicted_s[best] - 1 if predicted_s[best] > 0 else 0.0
    if gain > margin:
        return best, (f"predicted {100 * gain:.1f}% faster than stock DDP (more than the "
                      f"{100 * margin:.0f}% margin)")
    return AUTO_BASELINE, (f"{best} is predicted only {100 * gain:.1f}% faster than stock DDP, "
                           f"within the {100 * margin:.0f}% the scheduler's own host work may "
                           f"cost: stock DDP")


def choose_comm(graph: Graph, cluster: Cluster, options: Options,
                margin: float = AUTO_MARGIN) -> AutoChoice:
    """Simulate every data-parallel strategy (stock DDP among them) on ``graph`` and
    ``cluster`` and pick one with :func:`pick_comm`."""
    names = [n for n in strategies() if n.startswith("data-")]
    planned, _ = plan_strategies(graph, cluster, options, ["single", *names])
    predicted = {n: simulate(planned[n].plan, graph, cluster).step_time_s
                 for n in names if n in planned}
    name, reason = pick_comm(predicted, margin)
    base = predicted[AUTO_BASELINE]
    ahead = sorted((n for n in predicted if n != AUTO_BASELINE and predicted[n] > 0
                    and base / predicted[n] - 1 > margin), key=lambda n: (predicted[n], n))
    shortlist = {n: planned[n] for n in [AUTO_BASELINE, *ahead[:TRIAL_CANDIDATES]]}
    return AutoChoice(strategy=name, planned=planned[name], predicted_s=predicted,
                      reason=reason, shortlist=shortlist)


def trial_steps(choice: AutoChoice, steps: int) -> int:
    """Steps per segment of ``choice``'s trial: ``steps``, or more where the predicted DDP step
    is short, so that each segment runs at least :data:`TRIAL_MIN_S`."""
    ddp = choice.predicted_s.get(AUTO_BASELINE, 0.0)
    return max(steps, math.ceil(TRIAL_MIN_S / ddp)) if ddp > 0 else steps


def confirm_choice(choice: AutoChoice, measured_s: Mapping[str, Sequence[float]]) -> AutoChoice:
    """``choice`` checked against measured step times: ``measured_s`` holds, for stock DDP and
    each strategy of the shortlist, its median step per round of one job that ran them
    interleaved. Each strategy's ratio is the median over rounds of DDP's step over its own;
    the strategy with the highest ratio is run if that ratio is above 1 + :data:`TRIAL_GAIN`
    (it measured faster than DDP by more than noise), else stock DDP, whatever the simulator
    predicted. The returned choice records
    the trial."""
    if choice.strategy == AUTO_BASELINE or not choice.shortlist:
        raise TrainschedError("the measured check compares the strategies predicted faster "
                              "than stock DDP with it; this choice has nothing to check")
    names = list(choice.shortlist)
    if sorted(measured_s) != sorted(names):
        raise TrainschedError(f"the trial must measure {', '.join(names)}; got "
                              f"{', '.join(measured_s) or 'nothing'}")
    rounds = {len(measured_s[n]) for n in names}
    if len(rounds) != 1 or 0 in rounds:
        raise TrainschedError("a paired trial needs one step time per round of each strategy, "
                              "the same number of rounds for all")
    if any(not (t > 0) for n in names for t in measured_s[n]):
        raise TrainschedError("a paired trial's step times must be positive")
    ddp = measured_s[AUTO_BASELINE]
    ratios = {n: statistics.median(b / c for b, c in zip(ddp, measured_s[n], strict=True))
              for n in names if n != AUTO_BASELINE}
    best = max(ratios, key=lambda n: (ratios[n], -choice.predicted_s.get(n, 0.0), n))
    trial = {"rounds": rounds.pop(), "measured_s": {n: list(measured_s[n]) for n in names},
             "measured_over_ddp": ratios}
    if ratios[best] > 1.0 + TRIAL_GAIN:
        return replace(choice, strategy=best, planned=choice.shortlist[best], trial=trial,
                       reason=(f"{choice.reason}; in a paired trial {best} measured "
                               f"{ratios[best]:.3f}x stock DDP, the best of "
                               f"{len(ratios)}"))
    return replace(choice, strategy=AUTO_BASELINE, planned=choice.shortlist[AUTO_BASELINE],
                   trial=trial,
                   reason=(f"{choice.strategy} was predicted faster ({choice.reason}), but in a "
                           f"paired trial the best of {len(ratios)} ({best}) measured "
                           f"{ratios[best]:.3f}x stock DDP, not above "
                           f"{1 + TRIAL_GAIN:.2f}x: stock DDP"))


@dataclass(frozen=True, kw_only=True)
class SyncRow:
    """One synchronisation protocol over many steps (``trainsched.sim.sync``): the time per
    BSP step's worth of samples (ranks x batch), throughput, staleness and the speedup over
    BSP."""

    protocol: str
    step_time_s: float
    samples_per_s: float
    mean_staleness: float
    max_staleness: int
    speedup: float

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


#: ``compare``'s protocol rows: BSP steps' worth of samples simulated, and each rank's step-time
#: spread (coefficient of variation): synchronous protocols wait for the slowest of the noise.
SYNC_STEPS = 200
SYNC_NOISE = 0.05


def compare_sync(graph: Graph, cluster: Cluster, *, ranks: int, batch_size: int,
                 bsp_step_s: float, steps: int = SYNC_STEPS, noise_cv: float = SYNC_NOISE,
                 seed: int = 0) -> list[SyncRow]:
    """Every protocol tagged ``compare`` in :data:`trainsched.sync.PROTOCOLS` (at the
    parameter its tag gives for ``ranks``), simulated for ``steps`` BSP steps' worth of
    samples with ``noise_cv`` spread in each rank's step time. BSP's synchronisation time is
    ``bsp_step_s`` (a data-parallel plan's simulated step) minus the one-device step, so the
    BSP row continues the data-parallel rows. Rows keep the registry's order."""
    from trainsched.sim import simulate_single
    from trainsched.sim.sync import simulate_sync, sync_workload
    from trainsched.sync import PROTOCOLS, format_protocol

    if ranks < 2:
        return []
    single = simulate_single(graph, cluster).step_time_s
    workload = sync_workload(graph, cluster, ranks=ranks, batch_per_rank=batch_size,
                             noise_cv=noise_cv, allreduce_s=max(0.0, bsp_step_s - single))
    total = steps * ranks * batch_size
    runs = []
    for name in PROTOCOLS.tagged("compare"):
        protocol = PROTOCOLS.tags(name)["compare"](ranks)
        run = simulate_sync(protocol, workload, total_samples=total, seed=seed)
        runs.append((format_protocol(protocol), run))
    base = next(run.time_s for text, run in runs if text == "bsp")
    return [SyncRow(protocol=text, step_time_s=run.time_s / steps,
                    samples_per_s=total / run.time_s if run.time_s else 0.0,
                    mean_staleness=run.mean_staleness,
                    max_staleness=max(run.update_staleness, default=0),
                    speedup=base / run.time_s if run.time_s else 0.0)
            for text, run in runs]
