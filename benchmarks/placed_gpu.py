"""PlacedModule on a real device: measured training steps next to the simulator's prediction.

For each model (ResNet-50, Inception-V3 by default) and each placement, the script

1. captures the forward graph with measured costs on the device at hand and builds the training
   graph (SGD with momentum, the optimizer the run uses);
2. predicts one step with ``trainsched.sim.simulate_placed`` on a cluster of ``--devices``
   logical devices of the GPU's kind (``cluster.DEVICE_KINDS``);
3. runs the step for real with :class:`trainsched.runtime.PlacedModule`, every logical device on
   ``cuda:0`` (one compute stream each, copies on side streams, CUDA events between them), and
   records the median step time (CUDA events) and ``torch.cuda.max_memory_allocated``.

All logical devices share one GPU, so a transfer between them moves nothing: it is an event the
consumer's stream waits on. The cluster models that link as the GPU's memory bandwidth with a
5 µs latency. The logical devices also share the GPU's compute, which the simulator (one device
each) does not model: on a chain-like model that costs little, since a chain runs one segment
at a time. The eager (unplaced) model's step is measured too, for the runtime's overhead.

Placements: ``single`` (one device), ``contiguous-compute`` and ``m-sct`` from
``trainsched.placement.place`` on the training graph (restricted to forward ops, which is what
PlacedModule reads; backward ops follow their forward op), and ``round-robin`` (op i on device
i mod n), a stress case with a transfer at almost every op.

Without CUDA the same runs on the CPU with a small batch (and says so): every logical device is
the CPU, the prediction uses a ``cpu`` cluster, and peak memory is not measured. Results: a table
on stdout and ``benchmarks/results/placed_gpu.json``.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import os
import platform
import statistics
import sys
import time
from typing import Any

import torch

from _common import cpu_model, write_results
from trainsched.capture import capture, zoo
from trainsched.cluster import DEVICE_KINDS, Cluster, cluster_from_flags
from trainsched.graph import Graph, to_training
from trainsched.plan import Placement
from trainsched.runtime import PlacedModule
from trainsched.sim import predict_placement, simulate_placed

LINK_LATENCY = "5us"
MOMENTUM = 0.9


def gpu_kind(name: str) -> tuple[str, str]:
    """The catalogue kind closest to a CUDA device name, and a note when it is a stand-in."""
    for key, kind in (("H100", "H100-80GB"), ("A100", "A100-80GB"), ("V100", "V100-16GB"),
                      ("2080", "RTX2080-8GB"), ("K80", "K80-12GB")):
        if key in name:
            return kind, ""
    return "H100-80GB", f"{name} is not in the device catalogue; the H100's figures stand in"


def make_cluster(kind: str, devices: int) -> Cluster:
    bandwidth = DEVICE_KINDS[kind].memory_bandwidth_bytes_per_s
    return cluster_from_flags(devices=devices, memory=None, bandwidth=f"{bandwidth:.0f}B/s",
                              latency=LINK_LATENCY, device_kind=kind, comm="sequential",
                              name=f"{devices}x {kind} (one device)")


def forward_placement(train: Graph, device_of: dict[str, int], n: int) -> Placement:
    return Placement(device_of={op.name: device_of[op.name] for op in train.ops
                                if op.kind == "forward"}, num_devices=n)


def expand(train: Graph, placement: Placement) -> dict[str, int]:
    """Backward and optimizer ops on their forward op's device."""
    return {op.name: placement.device_of[op.forward_op or op.name] for op in train.ops}


def placements(forward: Graph, train: Graph, cluster: Cluster) -> dict[str, Any]:
    n = cluster.num_devices
    order = forward.topological_order()
    found: dict[str, Any] = {"single": Placement.single(forward, num_devices=n)}
    try:
        from trainsched.placement import place

        for algorithm in ("contiguous-compute", "m-sct"):
            result = place(train, cluster, algorithm, predict=predict_placement)
            found[algorithm] = forward_placement(train, dict(result.placement.device_of), n)
    except Exception as exc:  # the placers are young; the runtime check goes on without them
        found["placer-error"] = f"{type(exc).__name__}: {exc}"
    first: dict[str, int] = {}
    device_of = {}
    for i, name in enumerate(order):
        group = forward.op(name).group
        device_of[name] = first.setdefault(group, i % n) if group else i % n
    found["round-robin"] = Placement(device_of=device_of, num_devices=n)
    return found


def eager_step_s(model: torch.nn.Module, args: tuple, device: torch.device, repeats: int,
                 warmup: int) -> float:
    """Median time of the unplaced model's training step (forward, backward, SGD step)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=MOMENTUM)
    times = []
    for i in range(warmup + repeats):
        opt.zero_grad(set_to_none=True)
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        began = time.perf_counter()
        model(*args).sum().backward()
        opt.step()
        if device.type == "cuda":
            end.record()
            torch.cuda.synchronize(device)
            elapsed = start.elapsed_time(end) / 1e3
        else:
            elapsed = time.perf_counter() - began
        if i >= warmup:
            times.append(elapsed)
    return statistics.median(times)


def run_model(name: str, batch: int, device: torch.device, kind: str, devices: int,
              repeats: int, warmup: int) -> list[dict[str, Any]]:
    z = zoo.build(name, batch_size=batch)
    model = z.model.train()
    began = time.perf_counter()
    forward = capture(model, z.args, costs="measured", device=device, name=name)
    capture_s = time.perf_counter() - began
    args = tuple(a.to(device) for a in z.args)
    model.to(device)
    train = to_training(forward, optimizer="momentum")
    cluster = make_cluster(kind, devices)
    rows: list[dict[str, Any]] = []
    eager = eager_step_s(copy.deepcopy(model), args, device, repeats, warmup)
    rows.append({"model": name, "batch": batch, "placement": "eager (unplaced)",
                 "measured_step_s": eager})
    print(f"  {name}: captured {len(forward)} ops in {capture_s:.1f} s; eager step "
          f"{eager * 1e3:.1f} ms", flush=True)
    for label, placement in placements(forward, train, cluster).items():
        if isinstance(placement, str):
            rows.append({"model": name, "batch": batch, "placement": label, "error": placement})
            print(f"  {label}: {placement}", flush=True)
            continue
        predicted = simulate_placed(train, cluster, expand(train, placement))
        copied = copy.deepcopy(model)
        placed = PlacedModule(copied, placement, [device] * devices, example_args=args)
        opt = torch.optim.SGD(placed.parameters(), lr=0.01, momentum=MOMENTUM)
        timing = placed.measure_step(*args, optimizer=opt, repeats=repeats, warmup=warmup)
        summary = placed.summary()
        peaks = dict(predicted.peak_memory_bytes)
        measured_peak = (sum(timing.peak_memory_bytes.values()) if timing.peak_memory_bytes
                         else None)
        row = {
            "model": name, "batch": batch, "placement": label,
            "devices_used": len(set(placement.device_of.values())),
            "ops_per_device": summary["ops_per_device"], "segments": summary["segments"],
            "transfers": timing.stats.transfers, "bytes_moved": timing.stats.bytes_moved,
            "predicted_step_s": predicted.step_time_s,
            "measured_step_s": timing.median_step_s,
            "measured_steps_s": list(timing.step_s),
            "ratio_measured_to_predicted": timing.median_step_s / predicted.step_time_s,
            "overhead_vs_eager": timing.median_step_s / eager,
            "predicted_peak_bytes": peaks,
            "predicted_peak_sum_bytes": sum(peaks.values()),
            "measured_peak_bytes": measured_peak,
            "forward_busy_s": list(timing.forward_busy_s) if timing.forward_busy_s else None,
        }
        rows.append(row)
        print(f"  {label}: predicted {predicted.step_time_s * 1e3:.1f} ms, measured "
              f"{timing.median_step_s * 1e3:.1f} ms, {timing.stats.transfers} transfers",
              flush=True)
        del placed, copied, opt
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    head = (f"{'model':<13} {'placement':<19} {'dev':>3} {'segs':>5} {'xfers':>5} "
            f"{'pred ms':>9} {'meas ms':>9} {'meas/pred':>9} {'pred peak':>10} "
            f"{'meas peak':>10}")
    lines = [head, "-" * len(head)]
    mib = 2**20
    for r in rows:
        if "error" in r:
            lines.append(f"{r['model']:<13} {r['placement']:<19} {r['error']}")
            continue
        if "predicted_step_s" not in r:
            lines.append(f"{r['model']:<13} {r['placement']:<19} {'':>3} {'':>5} {'':>5} "
                         f"{'':>9} {r['measured_step_s'] * 1e3:>9.1f}")
            continue
        peak = (f"{r['measured_peak_bytes'] / mib:>8.0f}Mi" if r["measured_peak_bytes"]
                else f"{'-':>10}")
        lines.append(
            f"{r['model']:<13} {r['placement']:<19} {r['devices_used']:>3} {r['segments']:>5} "
            f"{r['transfers']:>5} {r['predicted_step_s'] * 1e3:>9.1f} "
            f"{r['measured_step_s'] * 1e3:>9.1f} {r['ratio_measured_to_predicted']:>9.2f} "
            f"{r['predicted_peak_sum_bytes'] / mib:>8.0f}Mi {peak}")
    return "\n".join(lines)


def main() -> int:
    cuda = torch.cuda.is_available()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="resnet50,inception_v3")
    parser.add_argument("--batch", type=int, default=32 if cuda else 2)
    parser.add_argument("--devices", type=int, default=4, help="logical devices")
    parser.add_argument("--repeats", type=int, default=10 if cuda else 2)
    parser.add_argument("--warmup", type=int, default=3 if cuda else 1)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results",
                                                      "placed_gpu.json"))
    args = parser.parse_args()
    device = torch.device("cuda:0" if cuda else "cpu")
    if cuda:
        name = torch.cuda.get_device_name(device)
        kind, note = gpu_kind(name)
    else:
        name, kind = cpu_model(), "cpu"
        note = (f"no CUDA device: ran on the CPU at batch {args.batch}, every logical device "
                f"the CPU ({torch.get_num_threads()} thread(s)), so split placements run one "
                "segment at a time, which the simulator (a device each) does not model; peak "
                "memory not measured")
    print(f"device: {name} (kind {kind}); {args.devices} logical devices"
          + (f"; {note}" if note else ""), flush=True)
    rows: list[dict[str, Any]] = []
    for model in args.models.split(","):
        rows.extend(run_model(model, args.batch, device, kind, args.devices, args.repeats,
                              args.warmup))
    print(table(rows))
    write_results(args.out, {
        "benchmark": "placed_gpu",
        "date": datetime.date.today().isoformat(),
        "machine": {"device": name, "kind": kind, "cuda": cuda, "cpu": cpu_model(),
                    "python": platform.python_version(), "torch": torch.__version__,
                    "threads": torch.get_num_threads()},
        "note": note,
        "settings": {"batch": args.batch, "logical_devices": args.devices,
                     "repeats": args.repeats, "warmup": args.warmup,
                     "link": f"device memory bandwidth, {LINK_LATENCY} latency",
                     "optimizer": f"SGD momentum {MOMENTUM}", "capture": "measured"},
        "rows": rows,
    })
    return 0


if __name__ == "__main__":
    sys.exit(main())
