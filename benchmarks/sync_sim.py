"""Simulated synchronisation protocols and policies (issue 15): what the spread of step times,
stragglers and switch costs do to BSP, ASP, SSP, k-of-N, local SGD and BSP→ASP hybrids.

A synthetic workload shaped like Sync-Switch's setup (8 workers; 100 ms local steps with 5 %
spread; 20 ms all-reduce; 10 ms push and pull; 5 ms of server work per gradient), three tables:

1. **Protocols** under no straggler, one rank 3x slower throughout, and one rank +30 ms: time
   per BSP-equivalent step (8 x 32 samples) and mean/max staleness (``sim.sync``).
2. **Time to target** on the noisy quadratic (``sim.quadratic``; 16 coordinates, condition 1000,
   noise 0.3, lr 1 at BSP's batch): BSP-first and ASP-first hybrids at f = 1/2 .. 1/16, with
   one rank 3x slower; the median over 5 seeds of the time to reach 3x and 1.25x the BSP run's
   final loss (an easy and a hard target; a run that never reaches one counts as infinite), and
   the final loss (mean of the last 10 % of updates).
3. **Online straggler policy** (``sim.sync_online``): rank 3 three times slower for its steps
   200..399 of 1000; ``exclude`` and ``relax`` against ``ignore`` as the switch cost drops from
   150 s to 10 ms, with the break-even the decider's rule predicts for this episode.

    python benchmarks/sync_sim.py      # about a minute on 2 cores
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from _common import cpu_model, write_results
from trainsched.sim.quadratic import NoisyQuadratic, replay_loss
from trainsched.sim.sync import SyncWorkload, simulate_sync
from trainsched.sim.sync_online import simulate_online
from trainsched.sync import Straggler, StragglerPolicy, parse_policy

RANKS, BATCH = 8, 32
BASE = {"ranks": RANKS, "batch_per_rank": BATCH, "compute_s": 0.1, "noise_cv": 0.05,
        "allreduce_s": 0.02, "push_s": 0.01, "pull_s": 0.01, "server_s": 0.005}
PROTOCOLS = ["bsp", "asp", "ssp(s=2)", "ssp(s=8)", "k-of-n(k=7)", "local(h=4)"]
SCENARIOS = {"none": (), "rank 3 at 3x": (Straggler(rank=3, factor=3.0),),
             "rank 3 +30 ms": (Straggler(rank=3, delay_s=0.03),)}


def protocols_table() -> list[dict]:
    rows = []
    for name, stragglers in SCENARIOS.items():
        workload = SyncWorkload(**BASE, stragglers=stragglers)
        for text in PROTOCOLS:
            run = simulate_sync(parse_policy(text), workload, total_samples=2000 * RANKS * BATCH,
                                seed=1)
            rows.append({"stragglers": name, "protocol": text, "step_time_s": run.step_time_s,
                         "mean_staleness": run.mean_staleness,
                         "max_staleness": max(run.update_staleness)})
    return rows


def time_to_target_table(seeds: int = 5) -> list[dict]:
    workload = SyncWorkload(**BASE, stragglers=(Straggler(rank=3, factor=3.0),))
    model = NoisyQuadratic(dims=16, condition=1000.0, noise=0.3, lr=1.0)
    total = 1000 * RANKS * BATCH
    policies = ["bsp", "asp"] + [f"bsp:{f!r},asp:{1 - f!r}" for f in (0.5, 0.25, 0.125, 0.0625)]
    policies += [f"asp:{1 - f!r},bsp:{f!r}" for f in (0.5, 0.25, 0.125, 0.0625)]
    runs = {p: [] for p in policies}
    for seed in range(seeds):
        for text in policies:
            run = simulate_sync(parse_policy(text), workload, total_samples=total, seed=seed)
            runs[text].append((run, replay_loss(run, model, seed=100 + seed)))
    def tail(curve):
        n = max(1, len(curve.loss) // 10)
        return statistics.fmean(curve.loss[-n:])
    floor = statistics.median(tail(c) for _, c in runs["bsp"])
    rows = []
    for text in policies:
        row = {"policy": text, "time_s": statistics.median(r.time_s for r, _ in runs[text]),
               "seeds": seeds, "final_loss": statistics.median(tail(c) for _, c in runs[text])}
        for name, factor in (("easy", 3.0), ("hard", 1.25)):
            reach = [c.time_to(factor * floor) for _, c in runs[text]]
            row[f"{name}_target_loss"] = factor * floor
            row[f"{name}_time_s"] = statistics.median(
                t if t is not None else float("inf") for t in reach)
            row[f"{name}_reached"] = sum(t is not None for t in reach)
        rows.append(row)
    return rows


def online_table() -> list[dict]:
    workload = SyncWorkload(**{**BASE, "noise_cv": 0.0},
                            stragglers=(Straggler(rank=3, factor=3.0, from_step=200,
                                                  to_step=400),))
    total = 1000 * RANKS * BATCH
    ignore = simulate_online(workload, total_samples=total,
                             policy=StragglerPolicy(action="ignore"), switch_s=0.0)
    # The episode: 200 BSP steps at 3 x 0.1 s + 0.02 s; excluding rank 3 runs 7 ranks at 0.12 s.
    slow_step = 3 * 0.1 + 0.02
    episode = 200 * slow_step
    gain = 1 - (RANKS / slow_step) / ((RANKS - 1) / (0.1 + 0.02))
    rows = []
    for switch_s in (150.0, 60.0, 20.0, 10.0, 1.0, 0.1, 0.01):
        for action in ("exclude", "relax"):
            run = simulate_online(workload, total_samples=total,
                                  policy=StragglerPolicy(action=action), switch_s=switch_s)
            rows.append({"switch_s": switch_s, "action": action, "time_s": run.time_s,
                         "vs_ignore": ignore.time_s / run.time_s,
                         "switches": len(run.events), "relaxed_samples": run.relaxed_samples,
                         "out_at_step": run.events[0][1].observation if run.events else None})
    return [{"ignore_time_s": ignore.time_s, "episode_s": episode, "exclude_gain": gain,
             "predicted_break_even_switch_s": episode * gain / 2}, *rows]


def main() -> None:
    start = time.perf_counter()
    protocols = protocols_table()
    print(f"{'stragglers':<16}{'protocol':<14}{'per step':>10}{'staleness':>12}")
    for r in protocols:
        print(f"{r['stragglers']:<16}{r['protocol']:<14}{1e3 * r['step_time_s']:>8.1f}ms"
              f"{r['mean_staleness']:>7.1f}/{r['max_staleness']:<4}")
    targets = time_to_target_table()
    print(f"\n{'policy':<26}{'time':>8}{'to 3x floor':>17}{'to 1.25x floor':>17}"
          f"{'final loss':>12}")
    for r in targets:
        print(f"{r['policy']:<26}{r['time_s']:>7.1f}s"
              f"{r['easy_time_s']:>11.1f}s ({r['easy_reached']}/{r['seeds']})"
              f"{r['hard_time_s']:>11.1f}s ({r['hard_reached']}/{r['seeds']})"
              f"{r['final_loss']:>12.2e}")
    online = online_table()
    head, rows = online[0], online[1:]
    print(f"\nonline: ignore {head['ignore_time_s']:.1f} s; predicted break-even switch "
          f"{head['predicted_break_even_switch_s']:.1f} s")
    print(f"{'switch':>8}{'action':>9}{'time':>9}{'vs ignore':>11}{'switches':>10}{'out at':>8}")
    for r in rows:
        print(f"{r['switch_s']:>7}s{r['action']:>9}{r['time_s']:>8.1f}s{r['vs_ignore']:>10.2f}x"
              f"{r['switches']:>10}{r['out_at_step'] if r['out_at_step'] is not None else '-':>8}")
    wall = time.perf_counter() - start
    print(f"\n{wall:.1f} s")
    write_results(Path(__file__).parent / "results" / "sync_sim.json",
                  {"machine": cpu_model(), "wall_s": wall, "workload": BASE,
                   "protocols": protocols, "time_to_target": targets, "online": online})


if __name__ == "__main__":
    main()
