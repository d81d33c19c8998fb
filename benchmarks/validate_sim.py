"""Validation: the simulator's predicted step times against real gloo training on this machine.

Two sweeps, each run for real with 2 processes and predicted by the simulator from costs
captured on the same machine:

* **DDP**: ``torch.nn.parallel.DistributedDataParallel`` on gloo, 2 ranks, for several zoo
  models and bucket caps (DDP's default 25 MiB with its 1 MiB first bucket, and explicit
  caps), plus the flat no-overlap baseline (no DDP: after backward every gradient is copied
  into one buffer, all-reduced once and copied back), and further models swept over the batch
  per rank at the default buckets (a transformer encoder, the zoo MLP, VGG-16 and the small
  CNN; ``DDP_BATCH_SWEEPS``). Predicted by ``simulate_data_parallel`` with the matching
  ``DdpBucketPolicy`` (flat: one bucket holding every gradient), under both interference models
  the calibration fits: by rate (the calibrated cluster's default) and take turns (γ); the
  table shows each configuration's error under each.
* **Pipeline**: a model cut into 2 stages run by ``torch.distributed.pipelining``
  (``ScheduleGPipe``, ``Schedule1F1B``) at several micro-batch counts. Predicted by
  ``simulate_pipeline`` on ``build_schedule(...)`` with each stage captured at the micro-batch
  size.

Communication comes from ``trainsched.runtime.calibrate`` (real gloo processes, alpha-beta fits)
run first in the same invocation; compute from ``capture(..., costs="measured", threads=1)``
(each op timed alone), for the DDP sweep run in both worker processes at once, so that the costs
include the other rank computing beside them as in the real runs (the pipeline sweep's stages
are captured in this process alone). Every process runs one intra-op thread (2 ranks on 2
cores).

Measurement: configurations of a sweep are interleaved (A B C A B C ...), ``--rounds`` rounds of
``--steps`` timed steps after ``--warmup`` untimed ones; the measured step time of a
configuration is the trimmed mean over all its timed steps (the lowest and highest tenth left
out, as ``calibrate`` sums up each message size): a run lasts the sum of its steps, and on this
host a small model's steps are bimodal (about one 4 ms scheduler tick apart), where a median
jumps between the modes. The median and its error are reported beside it, with the IQR. Error is
``(predicted - measured) / measured``; ranking agreement is Kendall's tau-b over each sweep.
Both are reported per sweep, pooled, and per model (every configuration of one model: its
bucket caps and batch sizes, or its pipeline schedules), so that a model the simulator gets
wrong shows even where the pooled figure looks fine.

    python benchmarks/validate_sim.py            # full run, about 20 minutes on 2 cores
    python benchmarks/validate_sim.py --quick    # smoke run: small models, few steps
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import cpu_model, write_results
from trainsched.runtime.launch import trimmed_mean

MiB = 1 << 20
HERE = Path(__file__).resolve().parent

# name, zoo model, batch per rank, image size (None: the model's own input)
DDP_MODELS = {
    "full": [("resnet50", 8, 32), ("mobilenet_v3_large", 8, 64)],
    "quick": [("small-cnn", 8, None), ("mlp", 64, None)],
}
# DDP bucket caps in MiB; None is DDP's default (25 MiB, first bucket 1 MiB); "flat": no DDP,
# one all-reduce of every gradient after backward
BUCKETS = [None, 5, 1, "flat"]
FLAT_BYTES = 1 << 40  # a bucket cap no model reaches: one bucket
# the pipeline: a model, its global batch, image size, and where stage 1 starts
PIPE_MODEL = {
    "full": ("resnet50", 16, 32, "layer4.1"),  # parameters split about 14.5M / 11M
    "quick": ("small-cnn", 8, None, "conv2"),
}
MICROBATCHES = {"full": [2, 4, 8], "quick": [2, 4]}
SCHEDULES = ["gpipe", "1f1b"]
# Further DDP models and sweeps over the batch per rank, at DDP's default buckets, so that the
# error is not measured on the configurations the model was tuned on alone:
# (label, zoo model or file.py:function, batches per rank, image size)
ENCODER = str(HERE / "_encoder.py")
DDP_BATCH_SWEEPS = {
    "full": [("encoder 4x256", f"{ENCODER}:validation_encoder", [2, 4, 8, 16], None),
             ("mlp", "mlp", [16, 64, 256], None),
             ("vgg16", "vgg16", [2, 4], 32),
             ("small-cnn", "small-cnn", [8, 32], None)],
    "quick": [("encoder 2x64", f"{ENCODER}:tiny_encoder", [2, 4], None),
              ("mlp", "mlp", [16, 256], None)],
}


# --------------------------------------------------------------------------- models and stages

def _zoo(name: str, batch: int, image: int | None) -> Any:
    from trainsched.capture import build

    return build(name, batch_size=batch, image_size=image, seed=0)


def _units(model: Any) -> list[tuple[str, Any]]:
    """The model's children in order, nn.Sequential children opened into their own children
    (``layer4.1``), with a Flatten before a classifier head (torchvision's forward flattens)."""
    from torch import nn

    units: list[tuple[str, Any]] = []
    for name, child in model.named_children():
        if name in ("fc", "classifier", "head"):
            units.append((f"{name}.flatten", nn.Flatten(1)))
        if isinstance(child, nn.Sequential) and name not in ("classifier",):
            units += [(f"{name}.{k}", m) for k, m in child.named_children()]
        else:
            units.append((name, child))
    return units


def _stage_modules(name: str, split: str) -> tuple[Any, Any]:
    """The model cut before unit ``split`` (see :func:`_units`): (stage 0, stage 1)."""
    from torch import nn

    model = _zoo(name, 1, None).model
    if name == "small-cnn":  # its forward is not a chain of children: rebuild it as one
        return _small_cnn_stages(model)
    units = _units(model)
    names = [n for n, _ in units]
    if split not in names:
        raise SystemExit(f"{name} has no unit {split!r}; units: {names}")
    cut = names.index(split)
    return (nn.Sequential(*(m for _, m in units[:cut])),
            nn.Sequential(*(m for _, m in units[cut:])))


def _small_cnn_stages(model: Any) -> tuple[Any, Any]:
    from torch import nn

    class Head(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1, self.bn1, self.relu = model.conv1, model.bn1, nn.ReLU()

        def forward(self, x: Any) -> Any:
            return self.relu(self.bn1(self.conv1(x)))

    class Tail(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv2, self.bn2, self.relu = model.conv2, model.bn2, nn.ReLU()
            self.pool, self.fc = model.pool, model.fc

        def forward(self, y: Any) -> Any:
            y = self.relu(self.bn2(self.conv2(y)) + y)
            return self.fc(self.pool(y).flatten(1))

    return Head(), Tail()


# --------------------------------------------------------------------------- real runs

def run_pair(job: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """Run ``job`` on 2 worker processes (this file, given its JSON config); rank 0's results."""
    from trainsched.runtime.launch import WorkerFailure, free_port, run_workers

    with tempfile.TemporaryDirectory() as tmp:
        out_path = Path(tmp, "out.json")
        port = free_port()
        configs = [dict(job, rank=r, world_size=2, port=port, out=str(out_path))
                   for r in range(2)]
        try:
            run_workers(__file__, configs, workdir=Path(tmp), timeout_s=timeout_s)
        except WorkerFailure as exc:
            raise SystemExit(f"{job['kind']} sweep failed: {exc}\n{exc.log_tail}") from None
        return json.loads(out_path.read_text())


def _worker(cfg: dict[str, Any]) -> None:
    import datetime

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{cfg['port']}",
                            rank=cfg["rank"], world_size=cfg["world_size"],
                            timeout=datetime.timedelta(seconds=300))
    work = {"ddp": _ddp_worker, "pipeline": _pipeline_worker}[cfg["kind"]]
    times = work(cfg)
    dist.destroy_process_group()
    if cfg["rank"] == 0:
        Path(cfg["out"]).write_text(json.dumps(times))


def _graph_key(cfg: dict[str, Any]) -> str:
    return f"{cfg['model']} b{cfg['batch']} {cfg['image']}"  # one graph per model and batch


def _ddp_worker(job: dict[str, Any]) -> dict[str, list[float]]:
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    runs = {}
    for cfg in job["configs"]:
        zoo = _zoo(cfg["model"], cfg["batch"], cfg["image"])
        cap = cfg["bucket_mib"]
        if cap == "flat":
            runs[cfg["name"]] = _flat_step(zoo)
            continue
        ddp = DDP(zoo.model) if cap is None else DDP(zoo.model, bucket_cap_mb=cap)
        opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)

        def step(ddp: Any = ddp, opt: Any = opt, zoo: Any = zoo) -> None:
            out = ddp(*zoo.args, **zoo.kwargs)
            out.float().sum().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        runs[cfg["name"]] = step
    return _interleave(runs, job)


def _flat_step(zoo: Any) -> Any:
    """The flat no-overlap baseline: backward, then every gradient copied into one buffer,
    one all-reduce, the average copied back, an SGD step. The buffer is allocated once, as a
    fusion buffer or DDP's buckets are (and the scheduled runtime's): a fresh 97 MiB buffer
    every step (``torch.cat`` without ``out=``) took ResNet-50's copy 35 ms where the copy
    into a kept buffer takes 6 ms, the rest the first touch of pages the allocator had
    returned to the system."""
    import torch
    import torch.distributed as dist

    params = [p for p in zoo.model.parameters() if p.requires_grad]
    opt = torch.optim.SGD(params, lr=1e-3)
    dist.broadcast(torch.nn.utils.parameters_to_vector(params), 0)
    flat = torch.empty(sum(p.numel() for p in params), dtype=params[0].dtype)

    def step() -> None:
        out = zoo.model(*zoo.args, **zoo.kwargs)
        out.float().sum().backward()
        torch.cat([p.grad.reshape(-1) for p in params], out=flat)
        dist.all_reduce(flat)
        flat.div_(dist.get_world_size())
        offset = 0
        for p in params:
            n = p.grad.numel()
            p.grad.copy_(flat[offset:offset + n].view_as(p.grad))
            offset += n
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def _pipeline_worker(job: dict[str, Any]) -> dict[str, list[float]]:
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    rank = job["rank"]
    model, batch, image, split = job["model"]
    modules = _stage_modules(model, split)
    zoo = _zoo(model, batch, image)
    x = zoo.args[0]
    with torch.no_grad():
        y = modules[1](modules[0](x))
    target = torch.zeros_like(y)

    def loss_fn(out: Any, tgt: Any) -> Any:
        return torch.nn.functional.mse_loss(out, tgt)

    runs = {}
    for cfg in job["configs"]:
        stage = PipelineStage(modules[rank], rank, 2, torch.device("cpu"))
        kind = ScheduleGPipe if cfg["schedule"] == "gpipe" else Schedule1F1B
        schedule = kind(stage, n_microbatches=cfg["microbatches"], loss_fn=loss_fn)

        def step(schedule: Any = schedule) -> None:
            if rank == 0:
                schedule.step(x)
            else:
                schedule.step(target=target)

        runs[cfg["name"]] = step

    def timed(fn: Any) -> Any:
        def run() -> float:
            dist.barrier()
            start = time.perf_counter()
            fn()
            took = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
            dist.all_reduce(took, op=dist.ReduceOp.MAX)  # the step ends on its last rank
            for m in modules:
                m.zero_grad(set_to_none=True)
            return float(took)
        return run

    return _interleave({k: timed(v) for k, v in runs.items()}, job, returns_time=True)


def _interleave(runs: dict[str, Any], job: dict[str, Any], *,
                returns_time: bool = False) -> dict[str, list[float]]:
    """``rounds`` x (each config: ``warmup`` untimed steps, ``steps`` timed steps)."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(job["rounds"]):
        for name, step in runs.items():
            for _ in range(job["warmup"]):
                step()
            for _ in range(job["steps"]):
                if returns_time:
                    times[name].append(step())
                else:
                    start = time.perf_counter()
                    step()
                    times[name].append(time.perf_counter() - start)
    return times


# --------------------------------------------------------------------------- predictions

def _captured(model: Any, args: tuple, kwargs: dict | None = None) -> Any:
    from trainsched.capture import capture
    from trainsched.graph import to_training

    graph = capture(model, args, example_kwargs=kwargs or {}, costs="measured", threads=1)
    return to_training(graph, optimizer="sgd")


def predict_ddp(cfg: dict[str, Any], cluster: Any, graphs: dict[str, Any]) -> float:
    from trainsched.comm import DdpBucketPolicy
    from trainsched.sim import simulate_data_parallel

    cap = cfg["bucket_mib"]
    if cap is None:
        policy = DdpBucketPolicy()
    else:
        cap_bytes = FLAT_BYTES if cap == "flat" else cap * MiB
        # the flat baseline runs no DDP: no buffer broadcast before its forward
        policy = DdpBucketPolicy(bucket_bytes=cap_bytes, first_bucket_bytes=cap_bytes,
                                 buffer_sync=cap != "flat")
    return simulate_data_parallel(graphs[_graph_key(cfg)], cluster, ranks=2,
                                  policy=policy).step_time_s


def captured_on_both_ranks(configs: list[dict[str, Any]]) -> dict[str, Any]:
    """The training graphs of ``configs``, each captured as ``train --comm-policy auto``
    captures: on 2 processes at once (:func:`trainsched.runtime.host.capture_beside`), so that
    each op is timed while the other process computes on the host's other core, as in the
    real runs."""
    from trainsched.graph import to_training
    from trainsched.runtime.host import HOST_PASSES, capture_beside

    wanted = {_graph_key(c): (c["model"], c["batch"], c["image"]) for c in configs}
    return {key: to_training(capture_beside(model, ranks=2, batch_size=batch,
                                            image_size=image, passes=HOST_PASSES),
                             optimizer="sgd")
            for key, (model, batch, image) in wanted.items()}


def predict_pipeline(job: dict[str, Any], cfg: dict[str, Any], cluster: Any,
                     stage_graphs: dict[int, Any]) -> float:
    import torch

    from trainsched.backprop.schedules import build_schedule
    from trainsched.backprop.stages import StageCosts, stage_costs_from_graph
    from trainsched.sim import simulate_pipeline

    model, batch, image, split = job["model"]
    m = cfg["microbatches"]
    if m not in stage_graphs:
        modules = _stage_modules(model, split)
        x = _zoo(model, batch // m, image).args[0]
        with torch.no_grad():
            mid = modules[0](x)
        stage_graphs[m] = (_captured(modules[0], (x,)), _captured(modules[1], (mid,)),
                           mid.numel() * mid.element_size())
    g0, g1, act_bytes = stage_graphs[m]
    per = [stage_costs_from_graph(g, 1, 1) for g in (g0, g1)]

    def both(field: str) -> tuple:
        return tuple(getattr(p, field)[0] for p in per)

    stages = StageCosts(
        forward_s=both("forward_s"), backward_input_s=both("backward_input_s"),
        backward_weight_s=both("backward_weight_s"), activation_bytes=(act_bytes, 0),
        saved_bytes=both("saved_bytes"), param_bytes=both("param_bytes"),
        grad_bytes=both("grad_bytes"), optimizer_state_bytes=both("optimizer_state_bytes"))
    schedule = build_schedule(cfg["schedule"], 2, m)
    return simulate_pipeline(stages, schedule, cluster).step_time_s


def batch_sweep_configs(size: str, taken: set[str]) -> list[dict[str, Any]]:
    """The DDP configurations of :data:`DDP_BATCH_SWEEPS` (default buckets), named as the
    bucket sweep names its own and grouped by their label; a name in ``taken`` is left out
    (that configuration is in the bucket sweep already)."""
    out = []
    for label, model, batches, image in DDP_BATCH_SWEEPS[size]:
        for b in batches:
            name = f"{label} b{b}{f' {image}px' if image else ''} default buckets"
            if name not in taken:
                out.append({"name": name, "model": model, "batch": b, "image": image,
                            "bucket_mib": None, "group": label})
    return out


# --------------------------------------------------------------------------- report

def kendall_tau(a: list[float], b: list[float]) -> float:
    from scipy.stats import kendalltau

    if len(a) < 2:
        return float("nan")
    return float(kendalltau(a, b).statistic)


def summarise(rows: list[dict[str, Any]], suffix: str = "") -> dict[str, Any]:
    """Median and max |error| and Kendall's tau of ``rows`` (``suffix`` "_turns": of the
    take-turns predictions)."""
    rows = [r for r in rows if f"predicted{suffix}_s" in r]
    if not rows:
        return {"configs": 0}
    errors = [abs(r[f"error{suffix}"]) for r in rows]
    return {"configs": len(rows), "median_abs_error": statistics.median(errors),
            "max_abs_error": max(errors),
            "kendall_tau": kendall_tau([r["measured_s"] for r in rows],
                                       [r[f"predicted{suffix}_s"] for r in rows])}


def _row(name: str, times: list[float], predicted: float,
         turns: float | None = None) -> dict[str, Any]:
    q = statistics.quantiles(times, n=4)
    measured, median = trimmed_mean(times), statistics.median(times)
    row = {"config": name, "measured_s": measured, "median_s": median, "iqr_s": [q[0], q[2]],
           "steps": len(times), "times_s": list(times), "predicted_s": predicted,
           "error": (predicted - measured) / measured,
           "error_median": (predicted - median) / median}
    if turns is not None:
        row |= {"predicted_turns_s": turns, "error_turns": (turns - measured) / measured}
    return row


def per_model(sweeps: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """:func:`summarise` per model (each row's ``model``: its group, with `` pipeline`` for
    the pipeline sweep's), models in the order they first appear."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for rows in sweeps.values():
        for r in rows:
            groups.setdefault(r["model"], []).append(r)
    out = {}
    for model, rows in groups.items():
        out[model] = summarise(rows)
        turns = summarise(rows, "_turns")
        if turns["configs"]:
            out[f"{model} (take turns)"] = turns
    return out


def print_per_model(summaries: dict[str, dict[str, Any]]) -> None:
    print("\nper model (2 gloo ranks)")
    print(f"{'model':<24} {'configs':>7} {'median |error|':>15} {'max |error|':>12} "
          f"{'Kendall tau':>12}")
    for model, s in summaries.items():
        print(f"{model:<24} {s['configs']:>7} {s['median_abs_error']:>15.1%} "
              f"{s['max_abs_error']:>12.1%} {s['kendall_tau']:>12.2f}")


def print_table(title: str, rows: list[dict[str, Any]], summary: dict[str, Any]) -> None:
    print(f"\n{title}")
    turns = any("predicted_turns_s" in r for r in rows)
    print(f"{'config':<38} {'mean ms':>8} {'median ms':>10} {'IQR ms':>15} {'predicted ms':>13} "
          f"{'error':>8} {'vs median':>9}" + (f" {'turns ms':>9} {'error':>8}" if turns else ""))
    for r in rows:
        lo, hi = r["iqr_s"]
        line = (f"{r['config']:<38} {r['measured_s'] * 1e3:>8.1f} {r['median_s'] * 1e3:>10.1f} "
                f"{lo * 1e3:>7.1f}-{hi * 1e3:<7.1f} {r['predicted_s'] * 1e3:>13.1f} "
                f"{r['error']:>+8.1%} {r['error_median']:>+9.1%}")
        if "predicted_turns_s" in r:
            line += f" {r['predicted_turns_s'] * 1e3:>9.1f} {r['error_turns']:>+8.1%}"
        print(line)
    print(f"median |error| {summary['median_abs_error']:.1%}, max {summary['max_abs_error']:.1%}, "
          f"Kendall tau {summary['kendall_tau']:.2f} over {summary['configs']} configurations "
          f"(against the trimmed mean; against the median: median |error| "
          f"{statistics.median(abs(r['error_median']) for r in rows):.1%})")
    other = summarise(rows, "_turns")
    if other["configs"]:
        print(f"take turns (gamma): median |error| {other['median_abs_error']:.1%}, max "
              f"{other['max_abs_error']:.1%}, Kendall tau {other['kendall_tau']:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small models, few steps (smoke run)")
    ap.add_argument("--steps", type=int, default=None, help="timed steps per config and round")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps before each round")
    ap.add_argument("--out", default=str(HERE / "results" / "validate_sim.json"))
    ap.add_argument("--ddp-only", action="store_true", help="skip the pipeline sweep")
    args = ap.parse_args()
    size = "quick" if args.quick else "full"
    steps = args.steps or (5 if args.quick else 15)
    common = {"steps": steps, "rounds": args.rounds, "warmup": args.warmup}
    os.environ["OMP_NUM_THREADS"] = "1"

    import torch

    from trainsched.runtime.calibrate import calibrate

    torch.set_num_threads(1)
    began = time.perf_counter()
    load_before = os.getloadavg()
    print(f"load average {load_before[0]:.1f} {load_before[1]:.1f} {load_before[2]:.1f}")
    print("calibrating gloo (2 processes) ...", flush=True)
    cal = calibrate(world_size=2, repeats=30 if not args.quick else 5)
    print(cal.table())
    p2p_cluster = cal.to_cluster("calibrated-p2p")
    ar_cluster = dataclasses.replace(p2p_cluster, name="calibrated-allreduce",
                                     intra_node=cal.allreduce)
    turns_cluster = dataclasses.replace(cal.to_cluster("calibrated-turns", comm_model="turns"),
                                        intra_node=cal.allreduce)

    def label(cap: Any) -> str:
        return ("default buckets" if cap is None else "flat, after backward" if cap == "flat"
                else f"{cap} MiB buckets")

    ddp_configs = [{"name": f"{m} b{b}{f' {i}px' if i else ''} {label(c)}",
                    "model": m, "batch": b, "image": i, "bucket_mib": c}
                   for m, b, i in DDP_MODELS[size] for c in BUCKETS]
    ddp_configs += batch_sweep_configs(size, {c["name"] for c in ddp_configs})
    print(f"\nDDP sweep: {len(ddp_configs)} configurations, real runs ...", flush=True)
    ddp_times = run_pair({"kind": "ddp", "configs": ddp_configs, **common}, timeout_s=1800)
    print("capturing on both ranks at once, then simulating ...", flush=True)
    graphs = captured_on_both_ranks(ddp_configs)
    ddp_rows = [_row(c["name"], ddp_times[c["name"]], predict_ddp(c, ar_cluster, graphs),
                     predict_ddp(c, turns_cluster, graphs))
                for c in ddp_configs]
    for row, c in zip(ddp_rows, ddp_configs, strict=True):
        row["model"] = c.get("group", c["model"])
    if args.ddp_only:
        summary = {"ddp": summarise(ddp_rows), "ddp_turns": summarise(ddp_rows, "_turns"),
                   "per_model": per_model({"ddp": ddp_rows})}
        print_table("ddp sweep (2 gloo ranks)", ddp_rows, summary["ddp"])
        print_per_model(summary["per_model"])
        write_results(args.out, {
            "benchmark": "validate_sim", "size": size, "machine": cpu_model(),
            "cores": os.cpu_count(), "python": platform.python_version(),
            "torch": torch.__version__, "threads_per_rank": 1, **common,
            "load_before": load_before, "load_after": os.getloadavg(),
            "calibration": cal.to_dict(), "sweeps": {"ddp": ddp_rows}, "summary": summary,
            "wall_s": time.perf_counter() - began})
        return

    pipe_job = {"kind": "pipeline", "model": list(PIPE_MODEL[size]), **common}
    pipe_job["configs"] = [{"name": f"{PIPE_MODEL[size][0]} 2 stages {s} m={m}",
                            "schedule": s, "microbatches": m}
                           for m in MICROBATCHES[size] for s in SCHEDULES]
    print(f"\npipeline sweep: {len(pipe_job['configs'])} configurations, real runs ...",
          flush=True)
    pipe_times = run_pair(pipe_job, timeout_s=1800)
    stage_graphs: dict[int, Any] = {}
    print("capturing and simulating ...", flush=True)
    pipe_rows = [_row(c["name"], pipe_times[c["name"]],
                      predict_pipeline(pipe_job, c, p2p_cluster, stage_graphs))
                 for c in pipe_job["configs"]]
    for row in pipe_rows:
        row["model"] = f"{PIPE_MODEL[size][0]} pipeline"

    sweeps = {"ddp": ddp_rows, "pipeline": pipe_rows}
    summaries = {k: summarise(v) for k, v in sweeps.items()}
    summaries["all"] = summarise(ddp_rows + pipe_rows)
    summaries["ddp_turns"] = summarise(ddp_rows, "_turns")
    summaries["per_model"] = per_model(sweeps)
    for key, rows in sweeps.items():
        print_table(f"{key} sweep (2 gloo ranks)", rows, summaries[key])
    print_per_model(summaries["per_model"])
    s = summaries["all"]
    print(f"\nall: median |error| {s['median_abs_error']:.1%}, max {s['max_abs_error']:.1%}")
    write_results(args.out, {
        "benchmark": "validate_sim", "size": size, "machine": cpu_model(),
        "cores": os.cpu_count(), "python": platform.python_version(),
        "torch": torch.__version__, "threads_per_rank": 1, **common,
        "load_before": load_before, "load_after": os.getloadavg(),
        "calibration": cal.to_dict(), "sweeps": sweeps, "summary": summaries,
        "wall_s": time.perf_counter() - began})


if __name__ == "__main__":
    if len(sys.argv) == 2 and sys.argv[1].startswith("{"):  # a worker started by run_pair
        _worker(json.loads(sys.argv[1]))
    else:
        main()
