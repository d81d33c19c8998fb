"""Side by side: every strategy trainsched knows, simulated on one training graph and cluster.

Strategies differ in how many samples one step processes (data parallel replicates the batch on
every rank; a pipeline splits one batch into micro-batches), so rows are ranked by throughput,
samples per second, and the speedup is throughput over the single-device baseline. Later
techniques (placement, communication scheduling, out-of-order backprop, synchronisation) add
their rows to :data:`STRATEGIES`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from trainsched.backprop.schedules import build_schedule
from trainsched.backprop.stages import stage_costs_from_graph
from trainsched.cluster import Cluster
from trainsched.comm import comm_policy
from trainsched.errors import TrainschedError
from trainsched.graph import Graph
from trainsched.placement import place
from trainsched.sim import (
    SimResult,
    bubble_fraction,
    simulate_data_parallel,
    simulate_pipeline,
    simulate_placed,
    simulate_single,
)


@dataclass(frozen=True, kw_only=True)
class Options:
    """How wide the parallel strategies are: ranks (or stages) and micro-batches."""

    ranks: int
    microbatches: int
    batch_size: int


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


Strategy = Callable[[Graph, Cluster, Options], tuple[SimResult, int, int, str]]


def _single(graph: Graph, cluster: Cluster, o: Options) -> tuple[SimResult, int, int, str]:
    return simulate_single(graph, cluster), 1, o.batch_size, "all ops on one device"


def _data(policy: str, steps: int = 1) -> Strategy:
    """Data parallelism with a registered comm policy; ``steps`` > 1: the steady step of that
    many (a policy crossing the barrier gains only there; with the barrier it is the same)."""
    def run(graph: Graph, cluster: Cluster, o: Options) -> tuple[SimResult, int, int, str]:
        result = simulate_data_parallel(graph, cluster, ranks=o.ranks, policy=comm_policy(policy),
                                        steps=steps)
        steady = f", steady step of {steps}" if steps > 1 else ""
        return result, o.ranks, o.ranks * o.batch_size, (
            f"{o.ranks} replicas, ring all-reduce, {policy} gradient communication{steady}")
    return run


def _data_tuned(graph: Graph, cluster: Cluster, o: Options) -> tuple[SimResult, int, int, str]:
    """ByteScheduler at the partition and credit the tuner picks on the simulator (15 trials,
    seed 0, the steady step of 3), the way ``simulate --autotune`` picks them."""
    from trainsched.comm import ByteSchedulerPolicy
    from trainsched.comm.tune import simulated_objective, tune, tuned_policy
    from trainsched.units import format_size

    best = tune(simulated_objective(graph, cluster, o.ranks, steps=3))
    policy = tuned_policy(ByteSchedulerPolicy(), best.partition_bytes, best.credit_bytes)
    result = simulate_data_parallel(graph, cluster, ranks=o.ranks, policy=policy, steps=3)
    return result, o.ranks, o.ranks * o.batch_size, (
        f"{o.ranks} replicas, ring all-reduce, bytescheduler tuned on the simulator: partition "
        f"{format_size(best.partition_bytes)}, credit {format_size(best.credit_bytes)}, steady "
        f"step of 3")


def _pipeline(schedule: str) -> Strategy:
    def run(graph: Graph, cluster: Cluster, o: Options) -> tuple[SimResult, int, int, str]:
        stages = stage_costs_from_graph(graph, o.ranks, o.microbatches)
        result = simulate_pipeline(stages, build_schedule(schedule, o.ranks, o.microbatches),
                                   cluster)
        return result, o.ranks, o.batch_size, (
            f"{o.ranks} stages balanced by compute, {o.microbatches} micro-batches")
    return run


def _placed(algorithm: str) -> Strategy:
    """Model parallelism: ops placed on ``o.ranks`` devices by trainsched.placement."""
    def run(graph: Graph, cluster: Cluster, o: Options) -> tuple[SimResult, int, int, str]:
        per_node = min(o.ranks, cluster.devices_per_node)
        devices = replace(cluster, devices_per_node=per_node,
                          num_nodes=-(-o.ranks // per_node))
        chosen = place(graph, devices, algorithm)
        result = simulate_placed(graph, devices, chosen.placement)
        used = len(set(chosen.placement.device_of.values()))
        return result, used, o.batch_size, (
            f"{chosen.placer} placement on {used} of {devices.num_devices} devices")
    return run


#: name -> strategy; the first is the baseline every speedup is measured against.
STRATEGIES: dict[str, Strategy] = {
    "single": _single,
    "data-fifo": _data("fifo"),
    "data-ddp": _data("ddp"),
    "data-bytescheduler": _data("bytescheduler", steps=3),
    "data-bytescheduler-tuned": _data_tuned,
    "pipeline-gpipe": _pipeline("gpipe"),
    "pipeline-1f1b": _pipeline("1f1b"),
    "placed-auto": _placed("auto"),
}


def compare(graph: Graph, cluster: Cluster, options: Options,
            strategies: list[str] | None = None) -> tuple[list[Row], dict[str, SimResult]]:
    """Simulate each strategy; rows ranked by throughput (then name), and the raw results."""
    names = strategies or list(STRATEGIES)
    unknown = [n for n in names if n not in STRATEGIES]
    if unknown:
        raise TrainschedError(f"unknown strategy {unknown[0]!r}; known: {', '.join(STRATEGIES)}")
    if options.ranks > cluster.num_devices:
        raise TrainschedError(f"--ranks {options.ranks} is more than the cluster's "
                              f"{cluster.num_devices} devices")
    baseline_name = "single"
    results: dict[str, SimResult] = {}
    raw: list[tuple[str, SimResult, int, int, str]] = []
    for name in dict.fromkeys([baseline_name, *names]):
        result, devices, samples, description = STRATEGIES[name](graph, cluster, options)
        results[name] = result
        raw.append((name, result, devices, samples, description))
    base = results[baseline_name]
    base_rate = options.batch_size / base.step_time_s if base.step_time_s else 0.0
    rows = []
    for name, result, devices, samples, description in raw:
        if name not in names:
            continue
        rate = samples / result.step_time_s if result.step_time_s else 0.0
        rows.append(Row(
            strategy=name, description=description, devices=devices,
            samples_per_step=samples, step_time_s=result.step_time_s, samples_per_s=rate,
            speedup=rate / base_rate if base_rate else 0.0,
            peak_memory_bytes=max(result.peak_memory_bytes.values(), default=0),
            oom=any(result.oom.values()), idle_fraction=bubble_fraction(result),
            exposed_comm_s=result.exposed_comm_s))
    rows.sort(key=lambda r: (-r.samples_per_s, r.strategy))
    return rows, {n: results[n] for n in names}


def write_chart(path: str, rows: list[Row], title: str) -> None:
    """A bar chart of throughput speedup per strategy, as PNG (needs matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise TrainschedError("writing the chart needs matplotlib (pip install matplotlib)") \
            from exc
    import io

    from trainsched.graph import atomic_write_bytes

    fig, ax = plt.subplots(figsize=(7, 0.5 * len(rows) + 1.5), dpi=100)
    names = [r.strategy for r in rows][::-1]
    values = [r.speedup for r in rows][::-1]
    colors = ["#c0392b" if r.oom else "#2e86c1" for r in rows][::-1]
    ax.barh(names, values, color=colors)
    ax.axvline(1.0, color="black", linewidth=0.8)
    for y, v in enumerate(values):
        ax.text(v, y, f" {v:.2f}x", va="center", fontsize=9)
    ax.set_xlim(0, 1.15 * max(values, default=1.0))  # room for the longest bar's label
    ax.set_xlabel("throughput speedup over one device (red: out of memory)")
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", metadata={"Software": None})
    plt.close(fig)
    atomic_write_bytes(path, buffer.getvalue())
