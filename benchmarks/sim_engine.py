"""Events per second of the simulator's engine (``trainsched.sim.engine.run_tasks``).

Task graphs, each built once and replayed ``--repeats`` times (median kept; seeded):

- ``chain_100k``: 100,000 tasks in a chain on one compute stream;
- ``wide_dag_100k``: 100,000 tasks on 8 priority streams, each depending on up to three of the
  400 tasks before it (hundreds ready at once);
- ``placed_seq_20k``: 20,000 ops on 8 devices placed at random, up to three dependencies each;
  every dependency across devices goes through a transfer holding the sender's and the
  receiver's channel (sequential communication): about 46,000 tasks, more than half of them
  two-resource transfers, the engine's slowest path;
- ``simulate_placed``: the whole executor (lowering, replay, critical path, memory, result) on a
  12,000-op training graph placed in four contiguous blocks, sequential channels.

Only the replay is timed, except for ``simulate_placed`` (end to end). The target is >= 300,000
events/s (specs/simulator.md §2.7). An event is a task's end. Results: a table on stdout and a
JSON file (``--out``), quoted in benchmarks/RESULTS.md with the machine.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable

from _common import cpu_model, write_results
from trainsched.cluster import cluster_from_flags
from trainsched.graph import Edge, Graph, Op, to_training
from trainsched.sim import TaskGraph, run_tasks, simulate_placed

TARGET_EVENTS_PER_S = 300_000


def chain(n: int) -> TaskGraph:
    tasks = TaskGraph()
    stream = tasks.add_resource("gpu0/compute", device=0, policy="priority")
    previous = -1
    for i in range(n):
        t = tasks.add_task(f"op{i}", 1e-4 * (1 + i % 7), (stream,), priority=i, category="forward")
        if previous >= 0:
            tasks.add_dependency(previous, t)
        previous = t
    return tasks


def wide_dag(n: int, devices: int = 8, seed: int = 0) -> TaskGraph:
    rng = random.Random(seed)
    tasks = TaskGraph()
    streams = [tasks.add_resource(f"gpu{d}/compute", device=d, policy="priority")
               for d in range(devices)]  # fmt: skip
    for i in range(n):
        t = tasks.add_task(f"op{i}", rng.uniform(1e-4, 1e-3), (rng.choice(streams),), priority=i)
        for j in sorted({rng.randrange(max(0, i - 400), i) for _ in range(rng.randint(0, 3))}
                        if i else ()):  # fmt: skip
            tasks.add_dependency(j, t)
    return tasks


def placed_sequential(n: int, devices: int = 8, seed: int = 0) -> TaskGraph:
    rng = random.Random(seed)
    tasks = TaskGraph()
    streams = [tasks.add_resource(f"gpu{d}/compute", device=d, policy="priority")
               for d in range(devices)]  # fmt: skip
    channels = [tasks.add_resource(f"gpu{d}/channel", device=d, kind="channel")
                for d in range(devices)]  # fmt: skip
    device_of = []
    compute = []
    for i in range(n):
        d = rng.randrange(devices)
        t = tasks.add_task(f"op{i}", rng.uniform(1e-4, 1e-3), (streams[d],), priority=i)
        for j in sorted({rng.randrange(max(0, i - 400), i) for _ in range(rng.randint(0, 3))}
                        if i else ()):  # fmt: skip
            if device_of[j] == d:
                tasks.add_dependency(compute[j], t)
                continue
            x = tasks.add_task(f"op{j}->gpu{d}", rng.uniform(1e-5, 2e-4),
                               (channels[device_of[j]], channels[d]), priority=i, category="comm")
            tasks.add_dependency(compute[j], x)
            tasks.add_dependency(x, t)
        device_of.append(d)
        compute.append(t)
    return tasks


def training_case(n: int) -> Callable[[], int]:
    """A 12,000-op training graph of a residual forward chain of ``n`` ops, in 4 blocks."""
    ops = [Op(name=f"op{i}", compute_s=1e-4 * (1 + i % 5), param_bytes=4096 * (i % 2),
              output_bytes=65536, saved_bytes=65536, temp_bytes=1024) for i in range(n)]
    edges = [Edge(src=f"op{i}", dst=f"op{j}", size_bytes=65536)
             for i in range(n) for j in (i + 1, i + 4) if j < n]  # fmt: skip
    train = to_training(Graph(ops, edges), optimizer="adam")
    block = {op.name: 4 * i // n for i, op in enumerate(ops)}
    placement = {op.name: block[op.forward_op or op.name] for op in train.ops}
    cluster = cluster_from_flags(devices=4, memory="16GiB", bandwidth="10GB/s", latency="10us",
                                 comm="sequential")
    return lambda: simulate_placed(train, cluster, placement).events


def measure(run: Callable[[], int], repeats: int) -> dict[str, float]:
    times = []
    events = 0
    for _ in range(repeats):
        began = time.perf_counter()
        events = run()
        times.append(time.perf_counter() - began)
    median = statistics.median(times)
    return {"events": events, "median_s": median, "events_per_s": events / median,
            "min_s": min(times), "max_s": max(times)}


def replay(tasks: TaskGraph) -> Callable[[], int]:
    return lambda: run_tasks(tasks).events


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default="benchmarks/results/sim_engine.json")
    args = parser.parse_args()
    cases = {
        "chain_100k": replay(chain(100_000)),
        "wide_dag_100k": replay(wide_dag(100_000)),
        "placed_seq_20k": replay(placed_sequential(20_000)),
        "simulate_placed": training_case(4_000),
    }
    rows = {name: measure(run, args.repeats) for name, run in cases.items()}
    print(f"{'case':<16} {'events':>8} {'median s':>10} {'events/s':>12}")
    for name, row in rows.items():
        print(f"{name:<16} {row['events']:>8} {row['median_s']:>10.4f} "
              f"{row['events_per_s']:>12,.0f}")
    results = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpu": cpu_model(), "python": platform.python_version(),
                    "platform": platform.platform()},
        "repeats": args.repeats,
        "target_events_per_s": TARGET_EVENTS_PER_S,
        "cases": rows,
    }
    write_results(args.out, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
