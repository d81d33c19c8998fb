"""What starting ranks costs: workers forked from the fork server against new interpreters.

Each round runs, for each way of starting workers (``TRAINSCHED_WORKER_START``: ``forkserver``
and ``fresh``, interleaved, the order alternating between rounds), one new Python process that
runs the same plans of the zoo MLP one after another with ``trainsched.runtime.run`` (1 warm-up
and 2 timed steps each; a single-device plan on 1 rank, stock DDP on 2, GPipe on 2) and times
each ``run`` call from outside: the first call of a process includes starting the fork server.
Printed: per method the median over rounds of the first job, of the later jobs, and of the
whole sequence; and the ratio fresh / forkserver of the sequence, paired by round. Results go
to ``--out`` (JSON), quoted in benchmarks/RESULTS.md with the machine and its load.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import cpu_model, write_results

METHODS = ("forkserver", "fresh")
STRATEGIES = ("single", "data-ddp", "pipeline-gpipe")

# One process: make the plans with compare (no --run), then time runtime.run on each.
CHILD = """
import json, sys, time
from pathlib import Path
from trainsched.cli import main
from trainsched.plan import load_plan
from trainsched.runtime import run
out, jobs = Path(sys.argv[1]), json.loads(sys.argv[2])
times = []
for name in jobs:
    plan = load_plan(out / f"{name}.plan.json")
    start = time.perf_counter()
    run(plan, steps=2, warmup=1, timeout_s=600)
    times.append(time.perf_counter() - start)
print(json.dumps(times))
"""


def make_plans(out: Path) -> None:
    """The MLP's plans, predicted on the cpu preset (no calibration run)."""
    code = ("from trainsched.cli import main; import sys; sys.exit(main(['compare', 'mlp', "
            "'--batch-size', '8', '--cluster', 'cpu', '--costs', 'roofline', '--out-dir', "
            f"{str(out)!r}]))")
    subprocess.run([sys.executable, "-c", code], check=True, stdout=subprocess.DEVNULL)


def time_sequence(out: Path, method: str, jobs: list[str]) -> list[float]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TRAINSCHED_WORKER_START": method}
    done = subprocess.run([sys.executable, "-c", CHILD, str(out), json.dumps(jobs)], env=env,
                          check=True, capture_output=True, text=True, timeout=3600)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=2,
                        help="times each plan runs in one process (default 2)")
    parser.add_argument("--out", default="benchmarks/results/launch.json")
    args = parser.parse_args()
    jobs = [name for _ in range(args.repeat) for name in STRATEGIES]
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="launch-bench-") as tmp:
        out = Path(tmp)
        make_plans(out)
        runs: dict[str, list[list[float]]] = {m: [] for m in METHODS}
        for r in range(args.rounds):
            for method in (METHODS if r % 2 == 0 else METHODS[::-1]):
                runs[method].append(time_sequence(out, method, jobs))
                print(f"round {r + 1} {method}: " + " ".join(f"{t:.2f}" for t in runs[method][-1]),
                      flush=True)
    summary = {}
    print(f"\n{len(jobs)} jobs per process ({', '.join(STRATEGIES)} x {args.repeat}), "
          f"medians over {args.rounds} rounds")
    print(f"{'method':12} {'first job':>10} {'later jobs':>11} {'sequence':>10}")
    for method in METHODS:
        firsts = [t[0] for t in runs[method]]
        later = [statistics.median(t[1:]) for t in runs[method]]
        totals = [sum(t) for t in runs[method]]
        summary[method] = {"first_s": statistics.median(firsts),
                           "later_median_s": statistics.median(later),
                           "sequence_s": statistics.median(totals), "rounds_s": runs[method]}
        print(f"{method:12} {summary[method]['first_s']:>9.2f}s "
              f"{summary[method]['later_median_s']:>10.2f}s {summary[method]['sequence_s']:>9.2f}s")
    paired = statistics.median(sum(f) / sum(k) for f, k in zip(runs["fresh"], runs["forkserver"],
                                                                strict=True))
    print(f"fresh / forkserver, whole sequence, paired by round: {paired:.2f}x")
    write_results(args.out, {
        "benchmark": "launch", "when": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "machine": {"cpu": cpu_model(), "cores": os.cpu_count(),
                    "python": platform.python_version()},
        "load_before": load_before, "load_after": os.getloadavg()[0], "jobs": jobs,
        "summary": summary, "paired_fresh_over_forkserver": paired})


if __name__ == "__main__":
    main()
