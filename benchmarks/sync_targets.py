"""Issue 15's targets for the sync runtime, measured on this host: a slowed worker under BSP,
the online and offline hybrid policies, and the protocol simulator against real runs.

4 gloo workers (plus the parameter-server rank where a policy needs one), batch 32 per worker,
the built-in teacher-student task. The student's forward first sleeps 20 ms, an emulated
accelerator (``benchmarks/_sync_student.py``): a worker's local time is then set by that
sleep rather than by how the host's 2 cores are shared among 5 processes and other jobs, and a
straggler's factor stretches a known time. Training, loss and accuracy are real.

**(a) One worker 3x slower for the whole run** (``Straggler(rank=3, factor=3)``), 32768 samples
(256 BSP steps), SGD with momentum 0.9, lr 0.05, cosine schedule: ``bsp`` against the online
policy ``bsp;straggler(relax)`` and the offline hybrid ``bsp:0.25,asp:0.75``, for ``--seeds``
task seeds (each seed its own teacher, data, student and sample order). Reported per policy:
held-out accuracy, its difference from BSP's on the same seed (points), the held-out loss and
its ratio to BSP's, and the training wall time (``result.wall_s``: worker 0's, from its model
and data being ready to the end; process start-up excluded) over BSP's.
Target: within 0.5 points of BSP's accuracy in at most 0.6x its time.

**(b) Simulated against real time per step**: ``bsp``, ``asp``, ``ssp(s=2)``, ``k-of-n(k=3)``,
``local(h=4)``, each under no straggler, worker 3 at 2x and at 3x, ``--steps`` BSP steps' worth
of samples per run (72: 9216 samples; a multiple of 3 steps, so k-of-n(k=3) updates fit).
Real: worker 0's time in the phase per 4 x 32 samples.
The simulator's workload (:class:`trainsched.sim.sync.SyncWorkload`) is **fitted on the two
no-straggler runs of bsp and asp only**:

* ``compute_s`` = worker 0's mean local time per batch in the bsp run (forward, backward);
* ``allreduce_s`` = the bsp run's step time minus ``compute_s``;
* ``push_s = pull_s`` = half of (the asp run's time per 4 x 32 samples minus ``compute_s``):
  with equal workers an ASP cycle is compute + push + pull (``server_s`` = 0, the server's
  apply is inside the push and pull);
* ``noise_cv`` = 0.

Every other run (13 of 15: the three other protocols without a straggler and all five with
one) is a prediction. Reported: each error ``(predicted - real) / real``, the median |error|
and Kendall's tau-b between predicted and real over the 13 predicted runs (and over all 15).
Targets: median |error| <= 10 %, tau >= 0.8.

    python benchmarks/sync_targets.py            # 3 seeds; about 10 minutes on 2 cores
    python benchmarks/sync_targets.py --quick    # 1 seed, shorter runs
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
# the workers import the emulated student from this folder
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH"))
                                           if p)

from scipy.stats import kendalltau  # noqa: E402

from _common import cpu_model, write_results  # noqa: E402
from _sync_student import ACCELERATOR_S  # noqa: E402
from trainsched.runtime.sync import policy_phases, run_sync  # noqa: E402
from trainsched.runtime.tasks import TeacherStudent  # noqa: E402
from trainsched.sim.sync import SyncWorkload, simulate_sync  # noqa: E402
from trainsched.sync import Straggler, parse_policy  # noqa: E402

RANKS, BATCH = 4, 32
MODEL = "_sync_student:build"
TRAIN = {"ranks": RANKS, "batch_per_rank": BATCH, "lr": 0.05, "momentum": 0.9,
         "lr_schedule": "cosine", "model": MODEL, "timeout_s": 120, "deadline_s": 1200}
POLICIES = ["bsp", "bsp;straggler(relax)", "bsp:0.25,asp:0.75"]
PROTOCOLS = ["bsp", "asp", "ssp(s=2)", "k-of-n(k=3)", "local(h=4)"]
DELAYS = {"none": None, "rank 3 at 2x": 2.0, "rank 3 at 3x": 3.0}
FITTED = {("bsp", "none"), ("asp", "none")}


def load() -> float:
    return os.getloadavg()[0]


def straggler_run(text: str, seed: int, samples: int) -> dict:
    policy = parse_policy(text)
    phases = policy_phases(policy, samples, ranks=RANKS, batch_per_rank=BATCH)
    before = load()
    result = run_sync(TeacherStudent(seed=seed), phases, **TRAIN,
                      stragglers=[Straggler(rank=3, factor=3.0)],
                      straggler_policy=policy.straggler)
    return {"policy": text, "seed": seed, "accuracy": result.final_accuracy,
            "loss": result.final_loss, "wall_s": result.wall_s,
            "bsp_samples": sum(p.samples for p in result.phases if p.protocol == "bsp"),
            "relaxed_samples": result.relaxed_samples,
            "switches": [{"from": s.from_protocol, "to": s.to_protocol, "reason": s.reason,
                          "step": s.step, "samples": s.samples, "cost_s": s.cost_s}
                         for s in result.switches],
            "detector_events": [{"kind": e.kind, "rank": e.rank, "step": e.step}
                                for e in result.detector_events],
            "load_before": before, "load_after": load()}


def part_a(seeds: int, samples: int) -> dict:
    runs = [straggler_run(text, seed, samples) for seed in range(seeds) for text in POLICIES]
    bsp = {r["seed"]: r for r in runs if r["policy"] == "bsp"}
    rows = []
    print(f"\n(a) {RANKS} workers, worker 3 at 3x for the whole run, {samples} samples, "
          f"{seeds} seed(s)")
    print(f"{'policy':<24}{'accuracy %':>11}{'vs BSP pts':>12}{'loss':>8}{'x BSP':>7}"
          f"{'time s':>8}{'x BSP':>7}{'relaxed':>9}")
    for text in POLICIES:
        mine = [r for r in runs if r["policy"] == text]
        gaps = [100 * (r["accuracy"] - bsp[r["seed"]]["accuracy"]) for r in mine]
        ratios = [r["wall_s"] / bsp[r["seed"]]["wall_s"] for r in mine]
        losses = [r["loss"] / bsp[r["seed"]]["loss"] for r in mine]
        row = {"policy": text, "accuracy": statistics.mean(r["accuracy"] for r in mine),
               "gap_points_mean": statistics.mean(gaps), "gap_points_min": min(gaps),
               "loss": statistics.mean(r["loss"] for r in mine),
               "loss_ratio_mean": statistics.mean(losses),
               "wall_s": statistics.mean(r["wall_s"] for r in mine),
               "time_ratio_mean": statistics.mean(ratios), "time_ratio_max": max(ratios),
               "relaxed_samples_mean": statistics.mean(r["relaxed_samples"] for r in mine)}
        row["meets_target"] = row["gap_points_mean"] >= -0.5 and row["time_ratio_mean"] <= 0.6
        rows.append(row)
        print(f"{text:<24}{100 * row['accuracy']:>11.2f}{row['gap_points_mean']:>+12.2f}"
              f"{row['loss']:>8.4f}{row['loss_ratio_mean']:>7.2f}{row['wall_s']:>8.1f}"
              f"{row['time_ratio_mean']:>7.2f}{row['relaxed_samples_mean']:>9.0f}")
    return {"samples": samples, "seeds": seeds, "rows": rows, "runs": runs}


def real_step(text: str, factor: float | None, samples: int) -> dict:
    stragglers = [Straggler(rank=3, factor=factor)] if factor else []
    before = load()
    result = run_sync(TeacherStudent(), [(text, samples)], **TRAIN, stragglers=stragglers)
    (phase,) = result.phases
    return {"step_s": phase.wall_s / (phase.samples / (RANKS * BATCH)),
            "local_s": phase.local_s / phase.batches, "samples": phase.samples,
            "load_before": before, "load_after": load()}


def part_b(samples: int) -> dict:
    real = {(p, d): real_step(p, f, samples) for d, f in DELAYS.items() for p in PROTOCOLS}
    compute = real[("bsp", "none")]["local_s"]
    fit = {"compute_s": compute,
           "allreduce_s": max(0.0, real[("bsp", "none")]["step_s"] - compute),
           "push_s": max(0.0, real[("asp", "none")]["step_s"] - compute) / 2}
    fit["pull_s"] = fit["push_s"]
    rows = []
    print(f"\n(b) simulated vs real time per {RANKS} x {BATCH} samples, {samples} samples per "
          f"run; fitted on bsp and asp without a straggler: compute "
          f"{1e3 * fit['compute_s']:.2f} ms, all-reduce {1e3 * fit['allreduce_s']:.2f} ms, "
          f"push = pull {1e3 * fit['push_s']:.2f} ms")
    print(f"{'protocol':<14}{'stragglers':<15}{'real ms':>9}{'sim ms':>9}{'error':>8}")
    for (text, delay), measured in real.items():
        factor = DELAYS[delay]
        workload = SyncWorkload(ranks=RANKS, batch_per_rank=BATCH, **fit,
                                stragglers=(Straggler(rank=3, factor=factor),) if factor else ())
        sim = simulate_sync(parse_policy(text), workload, total_samples=samples)
        error = (sim.step_time_s - measured["step_s"]) / measured["step_s"]
        fitted = (text, delay) in FITTED
        rows.append({"protocol": text, "stragglers": delay, "real_step_s": measured["step_s"],
                     "sim_step_s": sim.step_time_s, "error": error, "fitted": fitted,
                     "real_local_s": measured["local_s"], "load_before": measured["load_before"],
                     "load_after": measured["load_after"]})
        print(f"{text:<14}{delay:<15}{1e3 * measured['step_s']:>9.2f}"
              f"{1e3 * sim.step_time_s:>9.2f}{100 * error:>+7.1f}%{'  (fitted)' if fitted else ''}")
    summary = {}
    for name, chosen in (("predicted", [r for r in rows if not r["fitted"]]), ("all", rows)):
        tau = kendalltau([r["real_step_s"] for r in chosen], [r["sim_step_s"] for r in chosen])
        summary[name] = {"runs": len(chosen),
                         "median_abs_error": statistics.median(abs(r["error"]) for r in chosen),
                         "max_abs_error": max(abs(r["error"]) for r in chosen),
                         "kendall_tau_b": float(tau.statistic)}
        print(f"{name} runs ({len(chosen)}): median |error| "
              f"{100 * summary[name]['median_abs_error']:.1f} %, max "
              f"{100 * summary[name]['max_abs_error']:.1f} %, Kendall tau-b "
              f"{summary[name]['kendall_tau_b']:.3f}")
    return {"samples": samples, "fit": fit, "rows": rows, "summary": summary}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--samples", type=int, default=32768, help="(a): samples per run")
    parser.add_argument("--steps", type=int, default=72,
                        help="(b): BSP steps' worth per run (a multiple of 3)")
    parser.add_argument("--parts", default="ab")
    parser.add_argument("--quick", action="store_true", help="1 seed, 8192 samples, 24 steps")
    parser.add_argument("--out", default="benchmarks/results/sync_targets.json")
    args = parser.parse_args()
    seeds, samples, steps = (1, 8192, 24) if args.quick else (args.seeds, args.samples,
                                                               args.steps)
    results = {"benchmark": "sync_targets",
               "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "host": {"cpu": cpu_model(), "cpu_count": os.cpu_count(),
                        "python": platform.python_version(), "loadavg_before": os.getloadavg()},
               "ranks": RANKS, "batch_per_rank": BATCH, "accelerator_s": ACCELERATOR_S,
               "train": {k: v for k, v in TRAIN.items() if k not in ("timeout_s", "deadline_s")}}
    print(f"{RANKS} workers x batch {BATCH}, emulated accelerator {1e3 * ACCELERATOR_S:.0f} ms "
          f"per forward; 1-minute load before: {load():.2f}")
    if "a" in args.parts:
        results["a"] = part_a(seeds, samples)
    if "b" in args.parts:
        results["b"] = part_b(steps * RANKS * BATCH)
    results["host"]["loadavg_after"] = os.getloadavg()
    print(f"1-minute load after: {load():.2f}")
    write_results(args.out, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
