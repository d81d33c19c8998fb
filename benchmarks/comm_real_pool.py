"""The real VGG-16 runs of ``comm_real.py`` pooled: every round of every run, paired with DDP.

One 30-minute run of ``comm_real.py`` ranks configurations that differ by 5-10% no better than
this shared 2-core host's drift (round medians of one configuration span up to 40%). Within a
round, though, every configuration runs a few minutes after DDP's own steps, so DDP's round
median over the configuration's is a paired measurement in which slow drift cancels. This
script reads the results files of several runs, pools those per-round ratios by configuration
(the tuned point of each run counts as ``priority tuned``) and prints, per configuration: the
number of paired rounds, their median, the quartiles, and the share of rounds faster than DDP.
Medians of ratios, not ratios of medians; no new measurement is made.

    python benchmarks/comm_real_pool.py                       # the runs listed in RUNS
    python benchmarks/comm_real_pool.py --runs A=path.json ...
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from _common import write_results

RESULTS = Path(__file__).resolve().parent / "results"
#: The runs in benchmarks/RESULTS.md's comm_real section, by letter.
RUNS = {"A": "comm_real_loaded.json", "B": "comm_real.json", "C": "comm_real_confirm.json",
        "D": "comm_real_full.json", "E": "comm_real_fine.json", "F": "comm_real_run_f.json"}
BASE = "ddp-25MB"


def label_of(label: str) -> str:
    return "priority tuned" if label.startswith("priority tuned") else label


def quartiles(values: list[float]) -> tuple[float, float]:
    if len(values) < 2:
        return values[0], values[0]
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[0], q[2]


def pool(runs: dict[str, Path]) -> dict[str, Any]:
    ratios: dict[str, list[float]] = {}
    used: dict[str, int] = {}
    for name, path in runs.items():
        summary = json.loads(path.read_text())["summary"]
        base = summary[BASE]["round_medians_s"]
        used[name] = len(base)
        for label, s in summary.items():
            if label == "compute-1":  # a separate 1-rank job, not in the rounds
                continue
            ratios.setdefault(label_of(label), []).extend(
                b / m for b, m in zip(base, s["round_medians_s"], strict=False))
    rows = {}
    for label, values in ratios.items():
        lo, hi = quartiles(values)
        rows[label] = {"rounds": len(values), "median": statistics.median(values),
                       "q1": lo, "q3": hi,
                       "faster_share": sum(v > 1 for v in values) / len(values)}
    return {"runs": {k: str(v.name) for k, v in runs.items()}, "rounds_per_run": used,
            "rows": rows}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", nargs="*", default=None, help="NAME=results.json ...")
    parser.add_argument("--out", default="benchmarks/results/comm_real_pool.json")
    args = parser.parse_args()
    if args.runs:
        runs = {k: Path(v) for k, v in (r.split("=", 1) for r in args.runs)}
    else:
        runs = {k: RESULTS / v for k, v in RUNS.items() if (RESULTS / v).exists()}
    data = pool(runs)
    print(f"VGG-16 on 2 gloo ranks: DDP's round median over each configuration's, pooled over "
          f"runs {', '.join(runs)} ({sum(data['rounds_per_run'].values())} rounds)")
    print(f"{'configuration':<54} {'rounds':>6} {'median':>7} {'q1':>6} {'q3':>6} "
          f"{'faster':>7}")
    for label, r in data["rows"].items():
        print(f"{label:<54} {r['rounds']:>6} {r['median']:>6.3f}x {r['q1']:>6.3f} "
              f"{r['q3']:>6.3f} {100 * r['faster_share']:>6.0f}%")
    write_results(args.out, data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
