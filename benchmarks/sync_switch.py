"""What an in-process switch of sync protocol costs, in step times: 2 gloo worker ranks plus the
parameter-server rank on this machine, the built-in teacher-student task.

Sync-Switch switched protocol by checkpoint, kill and restart (100-200 s per switch). trainsched
switches at a step boundary: the server drains, a barrier, the state digest check or average,
one broadcast of parameters and momentum, the next learning rate (``specs/sync.md`` §2.5).
The goal is a switch within 2 step times.

One run per student width walks BSP and every relaxed protocol in turn (``bsp, asp, bsp,
ssp(s=2), bsp, local(h=4), bsp, k-of-n(k=1), bsp``), each phase ``--steps`` BSP steps' worth
of samples; ``--repeats`` runs per width. A switch's cost is worker 0's time from its last batch
of the old phase to the new phase ready; the unit is the BSP step time of the same run (worker
0's mean batch time over the BSP phases). For comparison, ``restart_s`` is what starting the
same job afresh costs here (the run's time outside training: process start, torch import,
process groups, data), the price a restart-based switch pays at least.

    python benchmarks/sync_switch.py            # widths 64 and 512, 3 repeats, about 2 minutes
    python benchmarks/sync_switch.py --quick    # width 64, 1 repeat
    python benchmarks/sync_switch.py --comm ddp # BSP phases on the scheduled runtime (stock DDP)

With ``--comm`` the BSP phases reduce on the scheduled data-parallel runtime with that policy,
and a switch into BSP includes building its wrapper.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import time

from _common import cpu_model, write_results
from trainsched.runtime.sync import run_sync
from trainsched.runtime.tasks import TeacherStudent

PROTOCOLS = ["bsp", "asp", "bsp", "ssp(s=2)", "bsp", "local(h=4)", "bsp", "k-of-n(k=1)", "bsp"]
RANKS = 2


def one_run(width: int, batch: int, steps: int, comm: str | None) -> tuple[dict, float]:
    task = TeacherStudent(student_hidden=width, train_samples=8192)
    phases = [(p, steps * RANKS * batch) for p in PROTOCOLS]
    began = time.perf_counter()
    result = run_sync(task, phases, ranks=RANKS, batch_per_rank=batch, lr=0.02, momentum=0.9,
                      timeout_s=120, deadline_s=1200, comm=comm)
    total = time.perf_counter() - began
    bsp = [p for p in result.phases if p.protocol == "bsp"]
    step_s = sum(p.wall_s for p in bsp) / sum(p.batches for p in bsp)
    switches = [{"from": s.from_protocol, "to": s.to_protocol, "cost_s": s.cost_s,
                 "cost_steps": s.cost_s / step_s} for s in result.switches]
    phase_steps = {p.protocol: p.step_s for p in result.phases}
    return {"bsp_step_s": step_s, "phase_step_s": phase_steps, "switches": switches,
            "restart_s": total - result.wall_s, "final_loss": result.final_loss}, total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--widths", default="64,512")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=40, help="BSP steps' worth per phase")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="width 64, 1 repeat")
    parser.add_argument("--comm", default=None,
                        help="the BSP phases' comm policy (default: the flat all-reduce)")
    parser.add_argument("--out", default="benchmarks/results/sync_switch.json")
    args = parser.parse_args()
    widths = [64] if args.quick else [int(w) for w in args.widths.split(",")]
    repeats = 1 if args.quick else args.repeats
    load_before = os.getloadavg()
    results = {"benchmark": "sync_switch",
               "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "host": {"cpu": cpu_model(), "cpu_count": os.cpu_count(),
                        "python": platform.python_version(), "loadavg_before": load_before},
               "ranks": RANKS, "batch_per_rank": args.batch, "steps_per_phase": args.steps,
               "comm": args.comm,
               "widths": {}}
    print(f"{RANKS} workers + 1 server rank, batch {args.batch} per rank, {args.steps} BSP steps "
          f"per phase; load before: {load_before[0]:.2f}")
    print(f"{'width':>6} {'switch':<22} {'cost ms':>9} {'BSP step ms':>12} {'steps':>7}")
    for width in widths:
        runs = [one_run(width, args.batch, args.steps, args.comm)[0] for _ in range(repeats)]
        by_switch: dict[str, list[dict]] = {}
        for run in runs:
            for s in run["switches"]:
                by_switch.setdefault(f"{s['from']} -> {s['to']}", []).append(s)
        rows = []
        step_ms = statistics.median(r["bsp_step_s"] for r in runs) * 1e3
        for name, items in by_switch.items():
            cost_ms = statistics.median(s["cost_s"] for s in items) * 1e3
            steps = statistics.median(s["cost_steps"] for s in items)
            rows.append({"switch": name, "cost_ms": cost_ms, "cost_steps": steps,
                         "cost_steps_max": max(s["cost_steps"] for s in items)})
            print(f"{width:>6} {name:<22} {cost_ms:>9.2f} {step_ms:>12.2f} {steps:>7.2f}")
        every = [s["cost_steps"] for r in runs for s in r["switches"]]
        restart = statistics.median(r["restart_s"] for r in runs)
        print(f"{width:>6} {'all switches (median)':<22} {'':>9} {'':>12} "
              f"{statistics.median(every):>7.2f}   restart: {restart:.1f} s = "
              f"{restart * 1e3 / step_ms:.0f} steps")
        results["widths"][str(width)] = {
            "bsp_step_ms": step_ms, "switches": rows,
            "median_cost_steps": statistics.median(every), "max_cost_steps": max(every),
            "within_2_steps": sum(c <= 2 for c in every), "switches_measured": len(every),
            "restart_s": restart, "runs": runs}
    results["host"]["loadavg_after"] = os.getloadavg()
    write_results(args.out, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
