"""The scheduler never makes a user slower than DDP: ``train --comm-policy auto`` against stock
DDP, paired and interleaved, per model.

For each model, ``auto`` makes its choice as ``trainsched train --comm-policy auto`` does:
the model's training graph with costs measured on this host (one thread per rank), the
host's cluster (``--calibration FILE``, else this host's gloo calibrated once, on 2 ranks,
for every model), every data-parallel strategy simulated, and
:func:`trainsched.compare.choose_comm` picks (stock DDP unless another is predicted more than
its margin faster); when one is, the (up to 3) strategies predicted beyond the margin are
then timed against stock DDP in a short interleaved trial
(:func:`trainsched.runtime.run.interleaved_trial`, ``--trial-steps`` per round, as ``train
--auto-trial``) and the one that measured fastest runs, stock DDP unless another beat it
(:func:`trainsched.compare.confirm_choice`).
The plan auto ends with then runs on the same runtime path as ``train --plan``
(:func:`trainsched.runtime.run.data_parallel_segment`), in one 2-rank gloo job beside stock
DDP, interleaved A B A B ... for ``repeats`` rounds of ``steps`` timed steps after
``--warmup``. Per model: what auto picked and why, every candidate's prediction, the medians,
and ``paired``: the median over rounds of DDP's round median over auto's (>1: auto faster).

Targets (issue 16): auto >= 0.98x DDP on ResNet-50 (32 x 32, batch 4 per rank) and the zoo
MLP (batch 64), >= 1.1x on VGG-16 (32 x 32, batch 4 per rank).

    python benchmarks/comm_auto.py                      # all three models, quiet machine
    python benchmarks/comm_auto.py --calibration c.json # reuse a calibration
    python benchmarks/comm_auto.py --quick              # mlp only, 1 round of 3 steps
"""

from __future__ import annotations

import argparse
import datetime
import platform
import sys
import time
from typing import Any

from _common import DDP_LABEL, cpu_model, print_rounds, run_rounds, write_results
from trainsched.runtime.run import data_parallel_segment
from trainsched.runtime.train import Segment

MODELS = {"resnet50": {"batch_size": 4, "image_size": 32, "steps": 10, "repeats": 5,
                       "target": 0.98},
          # a 3 ms step whose round medians move by a scheduler tick: more rounds
          "mlp": {"batch_size": 64, "image_size": None, "steps": 200, "repeats": 15,
                  "target": 0.98},
          "vgg16": {"batch_size": 4, "image_size": 32, "steps": 10, "repeats": 5,
                    "target": 1.10}}
RANKS = 2


def host_cluster(calibration: str | None) -> Any:
    """The cluster every model's choice is simulated on: the file, else calibrated now."""
    if calibration is not None:
        from trainsched.cluster import resolve_cluster

        return resolve_cluster(calibration)
    from trainsched.runtime.calibrate import calibrate

    print(f"calibrating this host's gloo on {RANKS} ranks", flush=True)
    return calibrate(world_size=RANKS).to_cluster()


def choose(name: str, spec: dict[str, Any], calibration: Any, trial_steps: int) -> Any:
    """What ``train NAME --comm-policy auto --auto-trial TRIAL_STEPS`` chooses on the cluster
    ``calibration``: the simulator's pick, checked against stock DDP in a paired trial."""
    from trainsched.compare import (
        AUTO_BASELINE,
        TRIAL_ROUNDS,
        Options,
        choose_comm,
        confirm_choice,
    )
    from trainsched.compare import trial_steps as trial_steps_for
    from trainsched.runtime.host import host_model
    from trainsched.runtime.run import interleaved_trial

    graph, cluster = host_model(name, ranks=RANKS, batch_size=spec["batch_size"],
                                image_size=spec["image_size"], calibration=calibration)
    choice = choose_comm(graph, cluster, Options(ranks=RANKS, microbatches=1,
                                                 batch_size=graph.meta["batch_size"]))
    if choice.strategy == AUTO_BASELINE or trial_steps == 0:
        return choice
    measured = interleaved_trial(name, {n: p.plan for n, p in choice.shortlist.items()},
                                 rounds=TRIAL_ROUNDS,
                                 steps=trial_steps_for(choice, trial_steps),
                                 batch_size=spec["batch_size"], image_size=spec["image_size"])
    return confirm_choice(choice, measured)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--trial-steps", type=int, default=3,
                        help="steps per round of auto's paired trial (0: no trial, the "
                        "simulator's pick as is)")
    parser.add_argument("--calibration", default=None,
                        help="a cluster file from trainsched calibrate (default: calibrate now)")
    parser.add_argument("--quick", action="store_true", help="mlp only, 1 round of 3 steps")
    parser.add_argument("--out", default="benchmarks/results/comm_auto.json")
    args = parser.parse_args()
    began = time.time()
    names = ["mlp"] if args.quick else [m.strip() for m in args.models.split(",")]
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        parser.error(f"unknown model {unknown[0]!r}; known: {', '.join(MODELS)}")
    # calibrated once (as train --comm-policy auto calibrates, in memory) for every model
    calibration = host_cluster(args.calibration)
    results: dict[str, Any] = {
        "benchmark": "comm_auto",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "calibration": args.calibration or "calibrated at the start of this run",
        "models": {}}
    host: dict[str, Any] = {}
    verdicts = []
    for name in names:
        spec = dict(MODELS[name])
        if args.quick:
            spec.update(steps=3, repeats=1)
        choice = choose(name, spec, calibration, args.trial_steps)
        common = {"steps": spec["steps"], "warmup": args.warmup}
        auto_label = f"auto: {choice.strategy}"
        configs = [Segment(label=DDP_LABEL, kind="ddp", **common),
                   data_parallel_segment(choice.planned.plan, label=auto_label, **common)]
        rows, summary, host = run_rounds(name, configs, repeats=spec["repeats"],
                                         batch_size=spec["batch_size"],
                                         image_size=spec["image_size"])
        ratio = summary[auto_label]["paired_ddp_ratio"]
        size = f" {spec['image_size']}x{spec['image_size']}" if spec["image_size"] else ""
        print(f"{name}: auto picked {choice.strategy} ({choice.reason})")
        print(f"  plan: {choice.planned.description}")
        print("  predicted: " + ", ".join(f"{n} {1e3 * s:.2f} ms"
                                          for n, s in sorted(choice.predicted_s.items(),
                                                             key=lambda kv: (kv[1], kv[0]))))
        print_rounds(f"{name}{size}, batch {spec['batch_size']} per rank, {RANKS} gloo ranks; "
                     f"medians of {spec['repeats']} rounds x {spec['steps']} steps", summary)
        met = ratio >= spec["target"]
        verdicts.append(f"{name}: auto {ratio:.3f}x DDP paired (target >= {spec['target']}x): "
                        f"{'met' if met else 'NOT met'}")
        results["models"][name] = {
            "settings": {**spec, "warmup": args.warmup, "nproc": RANKS, "optimizer": "sgd"},
            "auto": {"strategy": choice.strategy, "reason": choice.reason,
                     "predicted_s": choice.predicted_s, "label": auto_label,
                     "plan": choice.planned.description, "trial": choice.trial},
            "paired_auto_over_ddp": ratio, "target": spec["target"], "met": met,
            "summary": summary, "raw": rows}
    print("\n".join(verdicts))
    results["wall_s"] = time.time() - began
    results["machine"] = {"cpu": cpu_model(), "platform": platform.platform(),
                          "python": platform.python_version(), **host}
    write_results(args.out, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
