"""Huge pages for large buffers: what ``THP_MEM_ALLOC_ENABLE=1`` (PyTorch's CPU allocator
advising the kernel to back buffers of 2 MiB or more with 2 MiB pages; trainsched's ranks run
with the launching environment's value) does to training on this host.

Three parts, each comparing the setting off (``0``) and on (``1``):

1. **One weight gradient into new memory.** The shape of VGG-16's first classifier layer
   (a 4 x 4096 output gradient times a 4 x 25088 input: a 411 MB result), computed
   into a new tensor, as autograd does each step, and into one already written, in a new
   process per setting (PyTorch reads it once, at a process's first allocation): the median
   of ``--repeats`` and the page faults of one.
2. **Training.** Per model, stock DDP and a ByteScheduler plan (``--partition-mib``,
   ``--credit-mib``, fusion up to one partition: the tuned plan ``comm_auto`` ran on VGG-16)
   interleaved in one 2-rank job; jobs with the setting off and on alternate, ``--rounds``
   of each. Per configuration the median of its jobs' medians off and on, and ``on/off``: the
   median over rounds of the off job's median over the next on job's (> 1: faster with huge
   pages); per setting the plan's speed over DDP's in the same job (``DDP/plan``).
3. **One process, training steps.** Per model of ``--alone`` (``name:batch[:image]``), a
   process per setting runs forward, backward and SGD, alternating off and on ``--rounds``
   times: the median step and the page faults of a step.

The kernel's transparent huge pages must be in ``madvise`` (or ``always``) mode for the
setting to do anything: the mode is printed and written.

    python benchmarks/huge_pages.py                  # ~12 min
    python benchmarks/huge_pages.py --models vgg16 --rounds 2
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
import time
from pathlib import Path
from typing import Any

from _common import cpu_model, run_rounds, write_results
from trainsched.runtime.launch import HUGE_PAGES_ENV
from trainsched.runtime.train import Segment

MiB = 1 << 20
MODELS = {"vgg16": {"batch_size": 4, "image_size": 32}, "resnet50": {"batch_size": 4,
                                                                    "image_size": 32}}
DDP = "ddp-25MB"
PLAN = "bytescheduler"

ONE_GRADIENT = """
import json, resource, statistics, sys, time
import torch
torch.set_num_threads(1)
repeats = int(sys.argv[1])
gy, x = torch.randn(4, 4096), torch.randn(4, 25088)
out = torch.empty(4096, 25088)
times = {"new": [], "written": []}
faults = {}
for _ in range(repeats + 1):  # the first of each is a warm-up
    for how in ("new", "written"):
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        t0 = time.perf_counter()
        if how == "new":
            grad = torch.mm(gy.t(), x)
        else:
            grad = torch.mm(gy.t(), x, out=out)
        times[how].append(time.perf_counter() - t0)
        faults[how] = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
        del grad
print(json.dumps({h: {"median_s": statistics.median(t[1:]), "faults": faults[h]}
                  for h, t in times.items()}))
"""


ALONE = """
import json, resource, statistics, sys, time
sys.path.insert(0, sys.argv[4])
import torch
torch.set_num_threads(1)
from trainsched.capture import build
from trainsched.runtime.stage_modules import loss_of
name, batch, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[5])
image = int(sys.argv[3]) if sys.argv[3] != "-" else None
zoo = build(name, batch_size=batch, image_size=image, seed=0)
model = zoo.model.train()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
times, faults = [], []
for _ in range(steps + 3):  # 3 warm-up steps
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    t0 = time.perf_counter()
    loss_of(model(*zoo.args, **zoo.kwargs)).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    times.append(time.perf_counter() - t0)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
print(json.dumps({"median_s": statistics.median(times[3:]),
                  "faults": statistics.median(faults[3:])}))
"""


def kernel_mode() -> str:
    try:
        text = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return "unknown"
    return text.split("[", 1)[1].split("]", 1)[0] if "[" in text else text.strip()


def one_gradient(setting: str, repeats: int) -> dict[str, Any]:
    env = {**os.environ, HUGE_PAGES_ENV: setting, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", ONE_GRADIENT, str(repeats)], env=env,
                         capture_output=True, text=True, check=True, timeout=600)
    return json.loads(out.stdout.strip().splitlines()[-1])


def alone(spec: str, setting: str, steps: int) -> dict[str, Any]:
    name, batch, *image = spec.split(":")
    env = {**os.environ, HUGE_PAGES_ENV: setting, "OMP_NUM_THREADS": "1"}
    src = str(Path(__file__).resolve().parents[1] / "src")
    out = subprocess.run([sys.executable, "-c", ALONE, name, batch, image[0] if image else "-",
                          src, str(steps)], env=env, capture_output=True, text=True,
                         check=True, timeout=1800)
    return json.loads(out.stdout.strip().splitlines()[-1])


def alone_rounds(spec: str, rounds: int, steps: int) -> dict[str, Any]:
    """Processes off, on, on, off, ...: each setting's median step (ms) and faults per step."""
    runs: dict[str, list[dict[str, Any]]] = {"0": [], "1": []}
    for r in range(rounds):
        for setting in ("0", "1") if r % 2 == 0 else ("1", "0"):
            runs[setting].append(alone(spec, setting, steps))
    out: dict[str, Any] = {"runs": runs}
    for s in ("0", "1"):
        out[f"median_s_{s}"] = statistics.median(x["median_s"] for x in runs[s])
        out[f"faults_{s}"] = statistics.median(x["faults"] for x in runs[s])
    out["on_over_off"] = out["median_s_0"] / out["median_s_1"]
    return out


def configs(args: argparse.Namespace) -> list[Segment]:
    part = int(args.partition_mib * MiB)
    return [Segment(label=DDP, kind="ddp", steps=args.steps, warmup=args.warmup),
            Segment(label=PLAN, kind="sdp", policy="bytescheduler", partition_bytes=part,
                    credit_bytes=int(args.credit_mib * MiB), fusion_bytes=part,
                    steps=args.steps, warmup=args.warmup)]


def training(args: argparse.Namespace, name: str) -> dict[str, Any]:
    """Jobs off, on, off, on, ... of ``name``; each its DDP and plan interleaved."""
    spec = MODELS[name]
    jobs: dict[str, list[dict[str, Any]]] = {"0": [], "1": []}
    for r in range(args.rounds):
        for setting in ("0", "1") if r % 2 == 0 else ("1", "0"):
            os.environ[HUGE_PAGES_ENV] = setting
            load = os.getloadavg()[0]
            _, summary, _ = run_rounds(name, configs(args), repeats=args.repeats,
                                       batch_size=spec["batch_size"],
                                       image_size=spec["image_size"])
            jobs[setting].append({"load_before": load,
                                  **{label: s["median_s"] for label, s in summary.items()},
                                  "ddp_over_plan": summary[PLAN]["paired_ddp_ratio"]})
            print(f"  {name} round {r + 1} huge pages {'on ' if setting == '1' else 'off'}: "
                  f"DDP {summary[DDP]['median_s'] * 1e3:.1f} ms, plan "
                  f"{summary[PLAN]['median_s'] * 1e3:.1f} ms (load {load:.2f} before)",
                  flush=True)
    out: dict[str, Any] = {"jobs": jobs}
    for label in (DDP, PLAN):
        off = [j[label] for j in jobs["0"]]
        on = [j[label] for j in jobs["1"]]
        out[label] = {"off_s": statistics.median(off), "on_s": statistics.median(on),
                      "on_over_off": statistics.median(a / b for a, b in zip(off, on,
                                                                              strict=True))}
    for setting in ("0", "1"):
        out[f"ddp_over_plan_{setting}"] = statistics.median(j["ddp_over_plan"]
                                                            for j in jobs[setting])
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="vgg16,resnet50")
    parser.add_argument("--rounds", type=int, default=2, help="jobs per setting")
    parser.add_argument("--repeats", type=int, default=3, help="rounds inside each job")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--partition-mib", type=float, default=76.0)
    parser.add_argument("--credit-mib", type=float, default=203.0)
    parser.add_argument("--gradient-repeats", type=int, default=5)
    parser.add_argument("--alone", default="small-cnn:32,mobilenet_v3_large:8:64,"
                        "resnet50:4:224,vgg16:4:32",
                        help="models trained in one process, name:batch[:image size]")
    parser.add_argument("--alone-steps", type=int, default=10)
    parser.add_argument("--out", default="benchmarks/results/huge_pages.json")
    args = parser.parse_args()
    names = [m for m in args.models.split(",") if m]
    unknown = sorted(set(names) - set(MODELS))
    if unknown:
        parser.error(f"unknown model {unknown[0]!r}; choose from {', '.join(MODELS)}")
    began, before = time.time(), os.environ.get(HUGE_PAGES_ENV)
    mode = kernel_mode()
    print(f"kernel transparent huge pages: {mode}; load {os.getloadavg()[0]:.2f}", flush=True)
    gradient = {s: one_gradient(s, args.gradient_repeats) for s in ("0", "1")}
    print("one 411 MB weight gradient (VGG-16's fc6 shape), median ms (page faults):")
    for how in ("new", "written"):
        print(f"  into {how + ' memory':<16}" + "".join(
            f"  huge pages {'on ' if s == '1' else 'off'} {gradient[s][how]['median_s'] * 1e3:7.1f}"
            f" ({gradient[s][how]['faults']})" for s in ("0", "1")), flush=True)
    print("one process, training steps (forward, backward, SGD), median ms (faults per step):",
          flush=True)
    lone = {}
    for spec in [s for s in args.alone.split(",") if s]:
        lone[spec] = r = alone_rounds(spec, args.rounds, args.alone_steps)
        print(f"  {spec:<26} off {r['median_s_0'] * 1e3:8.1f} ({r['faults_0']:.0f})  on "
              f"{r['median_s_1'] * 1e3:8.1f} ({r['faults_1']:.0f})  on/off "
              f"{r['on_over_off']:.3f}x", flush=True)
    results = {}
    try:
        for name in names:
            results[name] = training(args, name)
    finally:
        if before is None:
            os.environ.pop(HUGE_PAGES_ENV, None)
        else:
            os.environ[HUGE_PAGES_ENV] = before
    print(f"\n{'model':<9} {'configuration':<14} {'off ms':>8} {'on ms':>8} {'on/off':>7}")
    for name, r in results.items():
        for label in (DDP, PLAN):
            print(f"{name:<9} {label:<14} {r[label]['off_s'] * 1e3:>8.1f} "
                  f"{r[label]['on_s'] * 1e3:>8.1f} {r[label]['on_over_off']:>6.3f}x")
        print(f"{name:<9} DDP/plan: off {r['ddp_over_plan_0']:.3f}x, on "
              f"{r['ddp_over_plan_1']:.3f}x")
    write_results(args.out, {
        "benchmark": "huge_pages", "date": datetime.date.today().isoformat(),
        "kernel_mode": mode, "settings": {k: v for k, v in vars(args).items()},
        "one_gradient": gradient, "alone": lone, "training": results, "wall_s": time.time() - began,
        "machine": {"cpu": cpu_model(), "cpu_count": os.cpu_count(),
                    "python": platform.python_version()}})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
