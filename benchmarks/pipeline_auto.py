"""What ``simulate --parallelism pipeline --schedule auto`` picks on GPUs, and what each op's
launch overhead does to the pick (simulated; no GPU needed).

A roofline graph costs every op ``max(FLOPs / peak, bytes / bandwidth) + launch``. A pipeline
micro-batch of 1/m of the batch divides the first part by m, but each op still launches once
per micro-batch. Until 2026-11-29 the simulator divided the launch too, so more micro-batches
always looked faster and ``auto`` took the largest count that fits. Per setup this prints the
choice both ways: ``launch whole`` (the simulator now) and ``launch divided`` (the same graph
with ``meta["launch_overhead_s"] = 0``, the old arithmetic), with the step each predicts for
the other's pick.

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/pipeline_auto.py    # about 2 minutes
"""

from __future__ import annotations

import argparse
import datetime
import platform
import sys
import time
from dataclasses import dataclass
from typing import Any

from _common import cpu_model, write_results
from trainsched.capture import build, capture
from trainsched.cluster import resolve_cluster
from trainsched.graph import Graph, to_training
from trainsched.sim.pipeline_choice import choose_pipeline


@dataclass(frozen=True)
class Setup:
    model: str
    batch: int
    device: str
    cluster: str
    ranks: int
    seq_len: int | None = None
    image_size: int | None = None


SETUPS = (
    Setup("gpt2", 32, "H100", "dgx-h100", 4, seq_len=128),
    Setup("gpt2", 32, "H100", "dgx-h100", 8, seq_len=128),
    Setup("resnet50", 64, "V100", "p3.16xlarge", 4, image_size=224),
)


def roofline_graph(setup: Setup) -> Graph:
    zoo = build(setup.model, batch_size=setup.batch, seq_len=setup.seq_len,
                image_size=setup.image_size)
    meta = {"batch_size": zoo.batch_size}
    if zoo.seq_len is not None:
        meta["seq_len"] = zoo.seq_len
    graph = capture(zoo.model, zoo.args, example_kwargs=zoo.kwargs, costs="roofline",
                    device_kind=setup.device, name=setup.model, meta=meta)
    return to_training(graph)


def row(setup: Setup, graph: Graph) -> dict[str, Any]:
    cluster = resolve_cluster(setup.cluster)
    divided = Graph(graph.ops, graph.edges, {**graph.meta, "launch_overhead_s": 0.0})
    began = time.perf_counter()
    whole = choose_pipeline(graph, cluster, setup.ranks)
    old = choose_pipeline(divided, cluster, setup.ranks)
    step = {(c.schedule, c.num_microbatches): c.step_time_s for c in whole.candidates}
    return {"model": setup.model, "batch": setup.batch, "seq_len": setup.seq_len,
            "image_size": setup.image_size, "cluster": setup.cluster, "ranks": setup.ranks,
            "launch_s": graph.meta["launch_overhead_s"], "ops": len(graph),
            "whole": whole.to_dict() | {"step_time_s": whole.result.step_time_s},
            "divided": old.to_dict() | {"step_time_s": old.result.step_time_s},
            "divided_pick_with_launch_whole_s": step[old.schedule_name, old.num_microbatches],
            "wall_s": time.perf_counter() - began}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results/pipeline_auto.json")
    args = parser.parse_args()
    began = time.time()
    rows = []
    graphs: dict[tuple[Any, ...], Graph] = {}
    print(f"{'model':<9}{'cluster':>13}{'ranks':>6}  {'launch whole: pick':<24}{'step':>9}  "
          f"{'launch divided: pick':<24}{'predicted':>10}{'with launch':>12}")
    for setup in SETUPS:
        key = (setup.model, setup.batch, setup.device, setup.seq_len, setup.image_size)
        if key not in graphs:
            graphs[key] = roofline_graph(setup)
        r = row(setup, graphs[key])
        rows.append(r)
        w, d = r["whole"], r["divided"]
        print(f"{setup.model:<9}{setup.cluster:>13}{setup.ranks:>6}  "
              f"{w['schedule'] + ' m=' + str(w['microbatches']):<24}"
              f"{w['step_time_s'] * 1e3:>7.1f}ms  "
              f"{d['schedule'] + ' m=' + str(d['microbatches']):<24}"
              f"{d['step_time_s'] * 1e3:>8.1f}ms"
              f"{r['divided_pick_with_launch_whole_s'] * 1e3:>10.1f}ms", flush=True)
    write_results(args.out, {
        "benchmark": "pipeline_auto",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpu": cpu_model(), "platform": platform.platform(),
                    "python": platform.python_version()},
        "wall_s": time.time() - began, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
