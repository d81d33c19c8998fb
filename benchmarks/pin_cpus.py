"""Ranks bound to a CPU each against unbound: stock DDP on 2 gloo ranks, paired jobs.

``TRAINSCHED_PIN_CPUS=1`` has ``trainsched``'s launcher bind rank k to the k-th CPU
(:func:`trainsched.runtime.launch.rank_cpus`), because unbound ranks on a host whose every
CPU runs one sometimes compute one after the other (``benchmarks/rank_skew.py``). Per case
this runs ``--rounds`` pairs of jobs, bound and unbound in alternating order, each
``--steps`` timed DDP steps after 5 untimed ones, and reports the median of each setting's job
medians and ``unbound / bound`` per pair (> 1: the binding is faster).

    python benchmarks/pin_cpus.py
    python benchmarks/pin_cpus.py --cases mlp:256 --rounds 5
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics

from _common import cpu_model, write_results
from trainsched.runtime.launch import PIN_ENV
from trainsched.runtime.train import Segment, run_segments

CASES = {"mlp:64": 40, "mlp:256": 40, "small-cnn:8": 40, "mobilenet_v3_large:8:64": 10,
         "resnet50:8:32": 10}


def job(case: str, steps: int, pin: str) -> float:
    name, batch, *image = case.split(":")
    os.environ[PIN_ENV] = pin
    result = run_segments(name, [Segment(label="ddp", kind="ddp", steps=steps, warmup=5)],
                          batch_size=int(batch), image_size=int(image[0]) if image else None)
    return result.segments[0].median_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", default=list(CASES),
                        help="model:batch[:image] (zoo names)")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=None, help="timed steps per job")
    parser.add_argument("--out", default="benchmarks/results/pin_cpus.json")
    args = parser.parse_args()
    load = os.getloadavg()[0]
    rows = []
    print(f"{'case':16s} {'bound ms':>9s} {'unbound ms':>10s} {'unbound/bound':>14s}  per pair")
    for case in args.cases:
        steps = args.steps or CASES.get(case, 20)
        bound, unbound = [], []
        for r in range(args.rounds):
            for pin in (("1", "0") if r % 2 == 0 else ("0", "1")):
                (bound if pin == "1" else unbound).append(job(case, steps, pin))
        ratios = [u / b for u, b in zip(unbound, bound, strict=True)]
        row = {"case": case, "steps": steps, "bound_s": bound, "unbound_s": unbound,
               "bound_median_s": statistics.median(bound),
               "unbound_median_s": statistics.median(unbound),
               "ratio_median": statistics.median(ratios), "ratios": ratios}
        rows.append(row)
        ms = {k: row[k] * 1e3 for k in ("bound_median_s", "unbound_median_s")}
        print(f"{case:16s} {ms['bound_median_s']:9.2f} {ms['unbound_median_s']:10.2f} "
              f"{row['ratio_median']:13.2f}x  " + " ".join(f"{x:.2f}" for x in ratios),
              flush=True)
    write_results(args.out, {
        "benchmark": "pin_cpus", "machine": cpu_model(), "cpus": len(os.sched_getaffinity(0)),
        "python": platform.python_version(),
        "when": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "load_before": load, "load_after": os.getloadavg()[0], "rounds": args.rounds,
        "rows": rows})


if __name__ == "__main__":
    main()
