"""The simulator's predictions beside published training throughputs.

Each row captures a zoo model with roofline costs for the cluster's device kind at the size and
precision the published run used, simulates the strategy it used, and prints the prediction, the
published figure (a range where sources differ), its source, and prediction / published (the
midpoint of a range). Roofline costs assume 75 % of the dtype's peak and no fused kernels, so
they are a first estimate: the table says how far that estimate is from what people measure.

Usage: ``PYTHONPATH=src python benchmarks/public_figures.py [--out FILE] [--step-cv CV]
[--device-cv CV]``. No torch compute runs (fake tensors only); the whole table takes about a
minute. ``--step-cv`` is a what-if: every cluster's device as if each rank's step compute time
varied by CV (coefficient of variation; ``DeviceSpec.step_cv``), which the catalogue has no
measurement for. ``--device-cv`` replaces the spread of speed across devices
(``DeviceSpec.device_cv``; the catalogue's V100: 0.0148, from published measurements) on every
cluster's device, to show how the predictions move with it.
"""

from __future__ import annotations

import argparse
import datetime
from dataclasses import dataclass, replace

from _common import write_results
from trainsched.capture import build, capture
from trainsched.cluster import resolve_cluster
from trainsched.compare import compare
from trainsched.graph import to_training
from trainsched.strategies import Options


@dataclass(frozen=True)
class Figure:
    what: str
    model: str
    batch: int              # per GPU
    seq_len: int | None
    cluster: str
    precision: str
    optimizer: str
    strategy: str
    unit: str               # "tokens/s", "images/s" or "x" (speedup over one GPU)
    low: float
    high: float
    source: str


FIGURES = (
    Figure(what="GPT-2 124M, 8x A100-80GB, bf16", model="gpt2", batch=64, seq_len=1024,
           cluster="dgx-a100", precision="bf16", optimizer="adam", strategy="data-ddp",
           unit="tokens/s", low=1.85e6, high=1.85e6,
           source="llm.c GPT-2 (124M) reproduction: 10B tokens in about 90 min on one "
           "8x A100-80GB node"),
    Figure(what="ResNet-50, 1x V100, fp32", model="resnet50", batch=256, seq_len=None,
           cluster="p3.16xlarge", precision="fp32", optimizer="momentum", strategy="single",
           unit="images/s", low=350, high=400,
           source="NVIDIA DeepLearningExamples / MLPerf-era V100 fp32 training throughput"),
    Figure(what="ResNet-50, 1x V100, mixed precision", model="resnet50", batch=256,
           seq_len=None, cluster="p3.16xlarge", precision="amp-fp16", optimizer="momentum",
           strategy="single", unit="images/s", low=1000, high=1400,
           source="NVIDIA DeepLearningExamples ResNet-50 v1.5, V100 AMP"),
    Figure(what="ResNet-50, 8x V100 NVLink, fp32 DDP scaling", model="resnet50", batch=64,
           seq_len=None, cluster="p3.16xlarge", precision="fp32", optimizer="momentum",
           strategy="data-ddp", unit="x", low=7.3, high=7.8,
           source="published PyTorch DDP runs on one 8x V100 NVLink node (PyTorch DDP paper, "
           "VLDB 2020, and vendor benchmarks)"),
    Figure(what="ResNet-50, 8x V100 NVLink, fp32 ByteScheduler scaling", model="resnet50",
           batch=64, seq_len=None, cluster="p3.16xlarge", precision="fp32",
           optimizer="momentum", strategy="data-bytescheduler", unit="x", low=7.3, high=7.8,
           source="ByteScheduler README: a single 8-GPU machine shows no gain over the "
           "baseline, so the DDP range above"),
)


def predict(fig: Figure, step_cv: float = 0.0,
            device_cv: float | None = None) -> tuple[float, float]:
    """The predicted figure and the step's exposed communication (seconds); ``step_cv`` and
    ``device_cv`` (None: the catalogue's) replace the device's (what-if)."""
    zoo = build(fig.model, batch_size=fig.batch, seq_len=fig.seq_len)
    cluster = resolve_cluster(fig.cluster)
    if step_cv:
        cluster = replace(cluster, device=replace(cluster.device, step_cv=step_cv))
    if device_cv is not None:
        cluster = replace(cluster, device=replace(cluster.device, device_cv=device_cv))
    meta = {"batch_size": zoo.batch_size, **({"seq_len": zoo.seq_len} if zoo.seq_len else {})}
    graph = capture(zoo.model, zoo.args, example_kwargs=zoo.kwargs, costs="roofline",
                    device_kind=cluster.device, name=zoo.name, meta=meta,
                    precision=fig.precision)
    graph = to_training(graph, optimizer=fig.optimizer)
    options = Options(ranks=cluster.num_devices, microbatches=1, batch_size=fig.batch)
    rows, _ = compare(graph, cluster, options, names=[fig.strategy])
    (row,) = rows
    if fig.unit == "x":
        return row.speedup, row.exposed_comm_s
    return row.samples_per_s * (fig.seq_len or 1), row.exposed_comm_s


def _fmt(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results/public_figures.json")
    parser.add_argument("--step-cv", type=float, default=0.0,
                        help="what-if: each rank's step compute time varies by this "
                             "coefficient of variation (default: the catalogue's, 0)")
    parser.add_argument("--device-cv", type=float, default=None,
                        help="what-if: devices of a kind differ in speed by this coefficient "
                             "of variation (default: the catalogue's; V100 0.0148, others 0)")
    args = parser.parse_args()
    rows = []
    print(f"{'figure':<56}{'published':>22}{'predicted':>12}{'pred/pub':>10}"
          f"{'exposed comm':>14}")
    for fig in FIGURES:
        value, exposed = predict(fig, args.step_cv, args.device_cv)
        mid = (fig.low + fig.high) / 2
        published = (_fmt(fig.low) if fig.low == fig.high
                     else f"{_fmt(fig.low)}-{_fmt(fig.high)}")
        print(f"{fig.what:<56}{published + ' ' + fig.unit:>22}{_fmt(value):>12}"
              f"{value / mid:>9.2f}x{exposed * 1e3:>11.2f} ms")
        rows.append({**fig.__dict__, "predicted": value, "ratio_to_midpoint": value / mid,
                     "within_range": fig.low <= value <= fig.high,
                     "exposed_comm_s": exposed})
    write_results(args.out, {"date": datetime.date.today().isoformat(),
                             **({"step_cv": args.step_cv} if args.step_cv else {}),
                             **({"device_cv": args.device_cv}
                                if args.device_cv is not None else {}),
                             "rows": rows})


if __name__ == "__main__":
    main()
