"""Simulated communication scheduling on the setups ByteScheduler published.

VGG-16 and ResNet-50 (batch 32 per GPU, 224x224) and a Transformer (BERT-base, batch 8 x 128
tokens), captured with roofline costs for a V100; one data-parallel step on 8 to 64 V100s (8 per
node on NVLink) with 10 and 25 Gbit/s TCP (50 us) or 100 Gbit/s RDMA (5 us) between nodes, by
ring all-reduce and by parameter servers with local aggregation (``ps-local``: one server per
node on its own link of the network's speed). Every policy is simulated over 3 steps and its
steady step is reported (``simulate_data_parallel(steps=3)``):

* ``fifo``: one collective per gradient in ready order, the optimizer after all of them;
* ``ddp``: PyTorch DDP's buckets (25 MiB, 1 MiB first) with their copies, then the optimizer;
* ``bs``: ByteSchedulerPolicy at its defaults (4 MiB partitions, 16 MiB overdraft credit,
  1 MiB fusion, crossing the barrier);
* ``tuned``: ByteSchedulerPolicy at the point ``comm.tune`` picks in 15 trials (10 random,
  5 guided, seed 0; partition 1-128 MiB, credit 1-256 MiB; small tensors fused up to a
  partition), next to ``grid``, the best of 8 partitions x 5 credits (powers of 2 and 4).

``ideal`` is max(compute, communication): the single-GPU step (the linear-scaling ceiling) and
one all-reduce of every gradient at once. ``bound`` is the larger of ``ideal`` and
``sim.crossing_bound_s``: the loop of the gradient that no policy can hide (its forward, the
chain to its weight gradient, its all-reduce alone, its update), which no schedule beats.

Parameter-server pushes and pulls are separate messages, so several in flight overlap one's
start-up latency with another's transfer (``startup_overlap=True`` on the ``ps-local`` rows,
for every policy, where the device runs its collectives on a FIFO wire; the catalogue's V100
runs them by rate beside compute, which has no such rule, so there they are off); a ring on
one NCCL stream runs its collectives one after another, so the ring rows pay every
collective's start-up in full. Results: a table on stdout and
``benchmarks/results/comm_sim.json``.

    python benchmarks/comm_sim.py            # 4 to 6 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import dataclasses
import platform
import time
from typing import Any

from _common import cpu_model, write_results
from trainsched.cluster import Link, resolve_cluster
from trainsched.comm import ByteSchedulerPolicy, DdpBucketPolicy, FifoPolicy, graph_gradients
from trainsched.comm.tune import grid_search, tune
from trainsched.sim import (
    collective_s,
    crossing_bound_s,
    simulate_data_parallel,
    simulate_single,
)
from trainsched.sim.tune import simulated_objective

MiB = 1 << 20
MODELS = [("vgg16", 32, None), ("resnet50", 32, None), ("bert-base", 8, 128)]
GPUS = [8, 16, 32, 64]
GBITS = [10, 25, 100]
ALGORITHMS = ["ring", "ps-local"]
GRID_PARTITIONS = [p * MiB for p in (1, 2, 4, 8, 16, 32, 64, 128)]
GRID_CREDITS = [c * MiB for c in (1, 4, 16, 64, 256)]
STEPS = 3
# ByteScheduler's README, MXNet PS over 100 Gb/s RoCE, 8 V100 per server: speedup over vanilla
# at 16, 32 and 64 GPUs (chart readings, specs/comm.md §10); no gain on one machine.
PUBLISHED = {"vgg16": (2.2, 2.0, 2.0), "resnet50": (1.16, 1.11, 1.05),
             "bert-base": (2.7, 1.7, 1.34)}
# What-if: VGG-16 on 16 GPUs at 100 Gbit/s with its compute times scaled down (faster kernels,
# mixed precision), to see how the gain grows as compute shrinks towards communication.
WHAT_IF_SCALES = [1.0, 0.5, 1 / 3, 0.25]


def capture_graph(name: str, batch: int, seq: int | None) -> Any:
    from trainsched.capture import build, capture
    from trainsched.graph import to_training

    zoo = build(name, batch_size=batch, seq_len=seq)
    graph = capture(zoo.model, zoo.args, example_kwargs=zoo.kwargs, costs="roofline",
                    device_kind="V100", name=name)
    return to_training(graph, optimizer="momentum")


def cluster(gpus: int, gbit: float, algorithm: str) -> Any:
    preset = "v100-rdma-100g" if gbit >= 100 else "v100-tcp-25g"
    base = resolve_cluster(f"{preset}:{gpus // 8}")
    nic = Link(bandwidth_bytes_per_s=gbit * 1e9 / 8, latency_s=base.inter_node.latency_s)
    out = dataclasses.replace(base, name=f"{gpus}xV100-{gbit:g}g", inter_node=nic)
    if algorithm.startswith("ps"):
        out = dataclasses.replace(out, parameter_servers=gpus // 8, ps_link=nic)
    return out


def scenario(graph: Any, compute_s: float, gpus: int, gbit: float,
             algorithm: str) -> dict[str, Any]:
    c = cluster(gpus, gbit, algorithm)
    # start-up overlap is a rule of the FIFO wire; a device whose collectives run by rate
    # (the catalogue's V100: NCCL shares the SMs) shares the wire by rate instead
    overlap = algorithm.startswith("ps") and not c.device.comm_by_rate

    def step(policy: Any) -> float:
        return simulate_data_parallel(graph, c, ranks=gpus, policy=policy, algorithm=algorithm,
                                      steps=STEPS, startup_overlap=overlap).step_time_s

    fifo = step(FifoPolicy())
    ddp = step(DdpBucketPolicy())
    bs = step(ByteSchedulerPolicy())
    objective = simulated_objective(graph, c, gpus, algorithm, steps=STEPS,
                                    startup_overlap=overlap)
    tuned = tune(objective, seed=0)
    grid = grid_search(objective, GRID_PARTITIONS, GRID_CREDITS)
    total = sum(g.size_bytes for g in graph_gradients(graph))
    comm = collective_s(total, gpus, c, algorithm)
    ideal = max(compute_s, comm)
    chain, binding = crossing_bound_s(graph, c, ranks=gpus, algorithm=algorithm)
    bound = max(ideal, chain)
    return {"gpus": gpus, "gbit": gbit, "algorithm": algorithm, "fifo_s": fifo, "ddp_s": ddp,
            "bytescheduler_s": bs, "tuned_s": tuned.step_time_s,
            "tuned_partition": tuned.partition_bytes, "tuned_credit": tuned.credit_bytes,
            "tuned_trials": len(tuned.trials), "grid_s": grid.step_time_s,
            "grid_partition": grid.partition_bytes, "grid_credit": grid.credit_bytes,
            "compute_s": compute_s, "comm_s": comm, "ideal_s": ideal,
            "startup_overlap": overlap, "bound_s": bound, "crossing_bound_s": chain,
            "bound_gradient": binding if chain > ideal else None,
            "tuned_over_bound": tuned.step_time_s / bound,
            "tuned_vs_fifo": fifo / tuned.step_time_s, "tuned_vs_ddp": ddp / tuned.step_time_s,
            "bs_vs_fifo": fifo / bs, "bs_vs_ddp": ddp / bs,
            "tuned_over_ideal": tuned.step_time_s / ideal, "bs_over_ideal": bs / ideal,
            "fifo_over_ideal": fifo / ideal, "ddp_over_ideal": ddp / ideal,
            "tuned_over_grid": tuned.step_time_s / grid.step_time_s}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="benchmarks/results/comm_sim.json")
    ap.add_argument("--models", nargs="*", default=[m[0] for m in MODELS])
    ap.add_argument("--no-what-if", action="store_true",
                    help="skip the VGG-16 table with scaled compute")
    args = ap.parse_args()
    began = time.perf_counter()
    rows = []
    header = (f"{'model':<9} {'GPUs':>4} {'Gb/s':>4} {'algo':>8} {'ideal':>7} {'bound':>7} "
              f"{'fifo':>7} {'ddp':>7} {'bs':>7} {'tuned':>7} {'p/c MiB':>9} {'grid':>7} "
              f"{'xFIFO':>5} {'xDDP':>5} {'bs/id':>5} {'tu/id':>5} {'tu/bd':>5} {'tu/gr':>5}")
    print("step times in ms; x: tuned ByteScheduler's speedup; /id: over the ideal; /bd: over "
          "the bound; tu/gr: tuned over the grid's best")
    print(header)
    for name, batch, seq in MODELS:
        if name not in args.models:
            continue
        graph = capture_graph(name, batch, seq)
        compute_s = simulate_single(graph).step_time_s
        for algorithm in ALGORITHMS:
            for gbit in GBITS:
                for gpus in GPUS:
                    r = {"model": name, **scenario(graph, compute_s, gpus, gbit, algorithm)}
                    rows.append(r)
                    pc = f"{r['tuned_partition'] / MiB:.0f}/{r['tuned_credit'] / MiB:.0f}"
                    print(f"{name:<9} {gpus:>4} {gbit:>4g} {algorithm:>8} "
                          f"{r['ideal_s'] * 1e3:>7.1f} {r['bound_s'] * 1e3:>7.1f} "
                          f"{r['fifo_s'] * 1e3:>7.1f} "
                          f"{r['ddp_s'] * 1e3:>7.1f} {r['bytescheduler_s'] * 1e3:>7.1f} "
                          f"{r['tuned_s'] * 1e3:>7.1f} {pc:>9} {r['grid_s'] * 1e3:>7.1f} "
                          f"{r['tuned_vs_fifo']:>5.2f} {r['tuned_vs_ddp']:>5.2f} "
                          f"{r['bs_over_ideal']:>5.2f} {r['tuned_over_ideal']:>5.2f} "
                          f"{r['tuned_over_bound']:>5.2f} {r['tuned_over_grid']:>5.2f}",
                          flush=True)
    what_if = []
    if "vgg16" in args.models and not args.no_what_if:
        graph = capture_graph(*MODELS[0])
        print("\nWhat-if: VGG-16, 16 GPUs, 100 Gbit/s, every compute time scaled:")
        print(f"{'scale':>6} {'algo':>8} {'compute':>8} {'comm':>7} {'fifo':>7} {'ddp':>7} "
              f"{'tuned':>7} {'xFIFO':>5} {'xDDP':>5} {'tu/bd':>5}")
        for algorithm in ALGORITHMS:
            for scale in WHAT_IF_SCALES:
                scaled = graph.replace_ops([dataclasses.replace(op, compute_s=op.compute_s * scale)
                                            for op in graph.ops])  # fmt: skip
                compute_s = simulate_single(scaled).step_time_s
                r = {"model": "vgg16", "scale": scale,
                     **scenario(scaled, compute_s, 16, 100, algorithm)}
                what_if.append(r)
                print(f"{scale:>6.2f} {algorithm:>8} {compute_s * 1e3:>8.1f} "
                      f"{r['comm_s'] * 1e3:>7.1f} {r['fifo_s'] * 1e3:>7.1f} "
                      f"{r['ddp_s'] * 1e3:>7.1f} {r['tuned_s'] * 1e3:>7.1f} "
                      f"{r['tuned_vs_fifo']:>5.2f} {r['tuned_vs_ddp']:>5.2f} "
                      f"{r['tuned_over_bound']:>5.2f}", flush=True)
    print("\nByteScheduler's published shape (MXNet PS, 100 Gb/s RoCE; speedup over vanilla) "
          "next to tuned over FIFO here, ps-local at 100 Gbit/s:")
    for name, published in PUBLISHED.items():
        ours = {r["gpus"]: r["tuned_vs_fifo"] for r in rows
                if r["model"] == name and r["algorithm"] == "ps-local" and r["gbit"] == 100}
        if ours:
            cells = "  ".join(f"{g} GPUs {p:.2f}x / {ours[g]:.2f}x"
                              for g, p in zip((16, 32, 64), published, strict=True))
            print(f"  {name:<9} 8 GPUs -/{ours[8]:.2f}x  {cells}")
    import torch

    write_results(args.out, {"benchmark": "comm_sim", "machine": cpu_model(),
                             "python": platform.python_version(), "torch": torch.__version__,
                             "steps": STEPS, "published": PUBLISHED, "rows": rows,
                             "what_if": what_if,
                             "wall_s": time.perf_counter() - began})


if __name__ == "__main__":
    main()
