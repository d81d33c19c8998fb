"""Wall time of the pipeline executor (``trainsched.sim.simulate_pipeline``), end to end.

Cases (1F1B unless named otherwise, uniform stages, 8 MB of activations per boundary and
micro-batch, 64 MB saved per micro-batch, on 8-GPU nodes with 100 GB/s NVLink and 25 GB/s
between nodes, parallel channels):

- ``1f1b_64x256``: 64 stages on 64 GPUs (8 nodes), 256 micro-batches: 32,768 actions,
  32,256 transfers (about 65,000 events). Target: <= 2 s (median of the repeats);
- ``1f1b_64x256_split``: the same with I and W split (49,152 actions);
- ``1f1b_8x32``: 8 stages on one node, 32 micro-batches;
- ``gpipe_8x32``: GPipe on the same.

Each case is timed end to end (validation of the schedule, lowering, replay, critical path,
memory, result), ``--repeats`` times; the schedule and the stage costs are built once, outside
the timing. The validation alone (``Schedule.validate``) is timed too, to show its share. An
event is a task's end. Results: a table on stdout and a JSON file (``--out``), quoted in
benchmarks/RESULTS.md with the machine.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import statistics
import sys
import time
from collections.abc import Callable

from _common import cpu_model, write_results
from trainsched.backprop.schedules import gpipe, one_f_one_b
from trainsched.backprop.stages import uniform_stages
from trainsched.cluster import cluster_from_flags
from trainsched.plan import Schedule
from trainsched.sim import simulate_pipeline

TARGET_S = 2.0  # the 64 x 256 1F1B step
MIB = 1 << 20


def case(build: Callable[..., Schedule], stages: int, microbatches: int,
         split: bool = False) -> dict:
    nodes = max(1, stages // 8)
    cluster = cluster_from_flags(devices=min(stages, 8), nodes=nodes, memory="80GiB",
                                 bandwidth="100GB/s", latency="5us", inter_bandwidth="25GB/s",
                                 inter_latency="10us", device_kind="h100")  # fmt: skip
    costs = uniform_stages(stages, 2e-3, 2e-3, 2e-3, activation_bytes=8 * MIB,
                           saved_bytes=64 * MIB, param_bytes=512 * MIB)  # fmt: skip
    return {"schedule": build(stages, microbatches, split), "stages": costs, "cluster": cluster}


def measure(spec: dict, repeats: int) -> dict:
    times, validate = [], []
    result = None
    for _ in range(repeats):
        began = time.perf_counter()
        spec["schedule"].validate()
        validate.append(time.perf_counter() - began)
        began = time.perf_counter()
        result = simulate_pipeline(spec["stages"], spec["schedule"], spec["cluster"])
        times.append(time.perf_counter() - began)
    assert result is not None
    median = statistics.median(times)
    schedule = spec["schedule"]
    return {"stages": schedule.num_stages, "microbatches": schedule.num_microbatches,
            "actions": sum(len(schedule.compute_actions(r)) for r in range(schedule.num_ranks)),
            "events": result.events, "median_s": median, "min_s": min(times),
            "max_s": max(times), "events_per_s": result.events / median,
            "validate_median_s": statistics.median(validate),
            "step_time_s": result.step_time_s, "bubble_fraction": result.bubble_fraction,
            "peak_memory_gpu0_bytes": result.peak_memory_bytes[result.devices[0]]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default="benchmarks/results/sim_pipeline.json")
    args = parser.parse_args()
    cases = {
        "1f1b_64x256": case(one_f_one_b, 64, 256),
        "1f1b_64x256_split": case(one_f_one_b, 64, 256, split=True),
        "1f1b_8x32": case(one_f_one_b, 8, 32),
        "gpipe_8x32": case(gpipe, 8, 32),
    }
    rows = {}
    for name, spec in cases.items():
        rows[name] = measure(spec, args.repeats)
    print(f"{'case':<18} {'actions':>8} {'events':>8} {'median s':>9} {'validate s':>10} "
          f"{'events/s':>10} {'bubble':>7}")
    for name, row in rows.items():
        print(f"{name:<18} {row['actions']:>8} {row['events']:>8} {row['median_s']:>9.3f} "
              f"{row['validate_median_s']:>10.3f} {row['events_per_s']:>10,.0f} "
              f"{row['bubble_fraction']:>7.4f}")
    results = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpu": cpu_model(), "python": platform.python_version(),
                    "platform": platform.platform()},
        "repeats": args.repeats,
        "target_s": {"1f1b_64x256": TARGET_S},
        "cases": rows,
    }
    met = rows["1f1b_64x256"]["median_s"] <= TARGET_S
    print(f"1f1b_64x256 target <= {TARGET_S} s: {'met' if met else 'MISSED'}")
    write_results(args.out, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
