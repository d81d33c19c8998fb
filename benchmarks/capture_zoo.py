"""Capture time and graph size of every zoo model; with --measured, two CLI runs end to end.

For each model at its default size (vision: batch 32; text: batch 8 x 128 tokens) the static tier
captures at op and module granularity, ``--repeats`` times each; the median capture time is kept
(building the model is timed once, apart). ``--measured`` also runs ``trainsched profile`` on
ResNet-50 (batch 32) and GPT-2 in a subprocess, timing the whole command against the 2-minute
goal. Results: a table on stdout and a JSON file (``--out``). Quoted in benchmarks/RESULTS.md.
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
import time
from pathlib import Path

import torch

from trainsched.capture import build, capture
from trainsched.capture.zoo import MODELS

CLI_RUNS = (("resnet50", "--batch-size", "32"), ("gpt2",))
GOAL_S = 120.0
MIB = 2**20


def cpu_model() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.exists() else []
    return next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")),
                platform.processor())


def capture_row(name: str, repeats: int) -> dict:
    start = time.perf_counter()
    zoo = build(name)
    row = {"model": name, "batch_size": zoo.batch_size, "seq_len": zoo.seq_len,
           "build_s": time.perf_counter() - start}
    for granularity in ("op", "module"):
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            graph = capture(zoo.model, zoo.args, example_kwargs=zoo.kwargs,
                            granularity=granularity, costs="static", name=name)
            times.append(time.perf_counter() - start)
        totals = graph.totals()
        row |= {f"{granularity}_capture_s": statistics.median(times),
                f"{granularity}_ops": totals.num_ops, f"{granularity}_edges": totals.num_edges}
    row |= {"gflop": totals.flops / 1e9, "gflop_per_example": totals.flops / 1e9 / zoo.batch_size,
            "param_mib": totals.param_bytes / MIB, "saved_mib": totals.saved_bytes / MIB}
    return row


def cli_row(cli_args: tuple[str, ...], repeats: int) -> dict:
    exe = Path(sys.executable).with_name("trainsched")
    walls, reports = [], []
    with tempfile.TemporaryDirectory() as tmp:
        command = [str(exe), "profile", *cli_args, "-o", f"{tmp}/graph.json", "--json"]
        for _ in range(repeats):
            start = time.perf_counter()
            done = subprocess.run(command, capture_output=True, text=True, check=True)
            walls.append(time.perf_counter() - start)
            reports.append(json.loads(done.stdout))
    wall = statistics.median(walls)
    return {"command": " ".join(["trainsched", "profile", *cli_args, "-o", "graph.json"]),
            "wall_s": wall, "wall_runs_s": walls,
            "capture_s": statistics.median(r["capture_s"] for r in reports),
            "ops": reports[0]["ops"], "goal_s": GOAL_S, "within_goal": wall < GOAL_S}


COLUMNS = (  # header, key, width, format
    ("model", "model", 18, ""), ("batch", "batch_size", 5, ""), ("build s", "build_s", 7, ".2f"),
    ("op s", "op_capture_s", 6, ".2f"), ("module s", "module_capture_s", 8, ".2f"),
    ("op ops", "op_ops", 6, ""), ("op edges", "op_edges", 8, ""),
    ("mod ops", "module_ops", 7, ""), ("mod edges", "module_edges", 9, ""),
    ("GFLOP", "gflop", 8, ".2f"), ("GFLOP/ex", "gflop_per_example", 8, ".3f"),
    ("param MiB", "param_mib", 9, ".1f"), ("saved MiB", "saved_mib", 9, ".1f"),
)


def table(rows: list[dict]) -> str:
    def line(cells: list[str]) -> str:
        return " ".join(f"{c:{'<' if i == 0 else '>'}{w}}"
                        for i, (c, (_, _, w, _)) in enumerate(zip(cells, COLUMNS, strict=True)))

    return "\n".join([line([h for h, *_ in COLUMNS]),
                      *(line([format(r[k], f) for _, k, _, f in COLUMNS]) for r in rows)])


def cli_table(rows: list[dict]) -> str:
    lines = [f"{'command':<58} {'wall s':>7} {'capture s':>9} {'ops':>5} {'< 120 s':>7}"]
    lines += [f"{r['command']:<58} {r['wall_s']:>7.1f} {r['capture_s']:>9.1f} {r['ops']:>5} "
              f"{'yes' if r['within_goal'] else 'NO':>7}" for r in rows]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    parser.add_argument("--repeats", type=int, default=None,
                        help="captures per model and granularity (default 3); CLI runs (default 1)")
    parser.add_argument("--out", default="benchmarks/results/capture_zoo.json")
    parser.add_argument("--measured", action="store_true",
                        help="also time `trainsched profile` (measured costs) on resnet50, gpt2")
    args = parser.parse_args()

    machine = {"platform": platform.platform(), "processor": cpu_model(),
               "cpu_count": os.cpu_count(), "python": platform.python_version(),
               "torch": torch.__version__, "threads": torch.get_num_threads()}
    print(f"machine: {machine}", flush=True)
    repeats = args.repeats or 3
    rows = []
    for name in args.models:
        rows.append(capture_row(name, repeats))
        print(f"  {name}: done", file=sys.stderr, flush=True)
    print(f"\nstatic capture, median of {repeats}\n{table(rows)}", flush=True)
    results = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "machine": machine, "repeats": repeats, "capture": rows}
    if args.measured:
        cli_rows = [cli_row(run, args.repeats or 1) for run in CLI_RUNS]
        print(f"\nCLI, measured costs, wall time of the whole command\n{cli_table(cli_rows)}")
        results["cli"] = cli_rows
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
