"""Simulated communication scheduling on the setups ByteScheduler published.

For VGG-16, ResNet-50 (batch 32 per GPU, 224x224) and a Transformer (BERT-base, batch 8 x 128
tokens), captured with roofline costs for a V100, one data-parallel step is simulated on 8 to
64 V100 (8 per node, NVLink inside a node) with 10, 25 and 100 Gbit/s between nodes, by ring
all-reduce and by parameter servers (one per node, on the node's network), for:

* ``fifo``: one collective per gradient in ready order, optimizer after all of them;
* ``ddp``: PyTorch DDP's buckets (25 MiB, 1 MiB first), launched in order, then the optimizer;
* ``bytescheduler``: layer priority, 4 MiB partitions, 16 MiB credit (overdraft), each layer's
  update as soon as its gradients are reduced (crossing the barrier);
* ``bytescheduler-best``: the same with the best (partition, credit) of a small grid.

``ideal`` is max(compute, communication): the single-GPU step and the time the policy's
collectives occupy the wire back to back. The table gives each step time, the speedups of
ByteScheduler over FIFO and DDP, and ByteScheduler's step over the ideal. Results: a table on
stdout and ``benchmarks/results/comm_sim.json``.

    python benchmarks/comm_sim.py            # about a minute on 2 cores
"""

from __future__ import annotations

import argparse
import dataclasses
import platform
import time
from typing import Any

from _common import cpu_model, write_results
from trainsched.cluster import Link, resolve_cluster
from trainsched.comm import DdpBucketPolicy, FifoPolicy, PriorityPolicy, graph_gradients
from trainsched.sim import collective_s, simulate_data_parallel, simulate_single

MiB = 1 << 20
MODELS = [("vgg16", 32, None), ("resnet50", 32, None), ("bert-base", 8, 128)]
GPUS = [8, 16, 32, 64]
GBITS = [10, 25, 100]
ALGORITHMS = ["ring", "ps"]
GRID = [(p * MiB, c * MiB) for p in (1, 4, 16) for c in (4, 16, 64)]


def capture_graph(name: str, batch: int, seq: int | None) -> Any:
    from trainsched.capture import build, capture
    from trainsched.training import to_training

    zoo = build(name, batch_size=batch, seq_len=seq)
    graph = capture(zoo.model, zoo.args, example_kwargs=zoo.kwargs, costs="roofline",
                    device_kind="V100", name=name)
    return to_training(graph, optimizer="momentum")


def cluster(gpus: int, gbit: float, algorithm: str) -> Any:
    base = resolve_cluster(f"v100-tcp-25g:{gpus // 8}")
    nic = Link(bandwidth_bytes_per_s=gbit * 1e9 / 8, latency_s=base.inter_node.latency_s)
    out = dataclasses.replace(base, name=f"{gpus}xV100-{gbit:g}g", inter_node=nic)
    if algorithm == "ps":
        out = dataclasses.replace(out, parameter_servers=gpus // 8, ps_link=nic)
    return out


def bytescheduler(partition: int = 4 * MiB, credit: int = 16 * MiB) -> PriorityPolicy:
    return PriorityPolicy(partition_bytes=partition, credit_bytes=credit,
                          credit_mode="overdraft", cross_barrier=True)


def scenario(graph: Any, compute_s: float, gpus: int, gbit: float,
             algorithm: str) -> dict[str, Any]:
    c = cluster(gpus, gbit, algorithm)

    def step(policy: Any) -> float:
        return simulate_data_parallel(graph, c, ranks=gpus, policy=policy,
                                      algorithm=algorithm).step_time_s

    fifo = step(FifoPolicy())
    ddp = step(DdpBucketPolicy())
    bs = step(bytescheduler())
    grid = {(p, cr): step(bytescheduler(p, cr)) for p, cr in GRID}
    (best_p, best_c), best = min(grid.items(), key=lambda kv: (kv[1], kv[0]))
    plan = bytescheduler(best_p, best_c).plan(graph_gradients(graph))
    comm = sum(collective_s(x.size_bytes, gpus, c, algorithm) for x in plan)
    ideal = max(compute_s, comm)
    return {"gpus": gpus, "gbit": gbit, "algorithm": algorithm, "fifo_s": fifo, "ddp_s": ddp,
            "bytescheduler_s": bs, "best_s": best, "best_partition": best_p,
            "best_credit": best_c, "compute_s": compute_s, "comm_s": comm, "ideal_s": ideal,
            "speedup_vs_fifo": fifo / best, "speedup_vs_ddp": ddp / best,
            "best_over_ideal": best / ideal}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="benchmarks/results/comm_sim.json")
    args = ap.parse_args()
    began = time.perf_counter()
    rows = []
    header = (f"{'model':<10} {'GPUs':>4} {'Gb/s':>4} {'algo':>4} {'fifo ms':>8} {'ddp ms':>8} "
              f"{'bs ms':>8} {'best ms':>8} {'p/c MiB':>7} {'ideal ms':>8} {'xFIFO':>6} "
              f"{'xDDP':>5} {'/ideal':>6}")
    print(header)
    for name, batch, seq in MODELS:
        graph = capture_graph(name, batch, seq)
        compute_s = simulate_single(graph).step_time_s
        for algorithm in ALGORITHMS:
            for gbit in GBITS:
                for gpus in GPUS:
                    r = {"model": name, **scenario(graph, compute_s, gpus, gbit, algorithm)}
                    rows.append(r)
                    print(f"{name:<10} {gpus:>4} {gbit:>4g} {algorithm:>4} "
                          f"{r['fifo_s'] * 1e3:>8.1f} {r['ddp_s'] * 1e3:>8.1f} "
                          f"{r['bytescheduler_s'] * 1e3:>8.1f} {r['best_s'] * 1e3:>8.1f} "
                          f"{r['best_partition'] // MiB:>3}/{r['best_credit'] // MiB:<3} "
                          f"{r['ideal_s'] * 1e3:>8.1f} {r['speedup_vs_fifo']:>6.2f} "
                          f"{r['speedup_vs_ddp']:>5.2f} {r['best_over_ideal']:>6.3f}",
                          flush=True)
    import torch

    write_results(args.out, {"benchmark": "comm_sim", "machine": cpu_model(),
                             "python": platform.python_version(), "torch": torch.__version__,
                             "rows": rows, "wall_s": time.perf_counter() - began})


if __name__ == "__main__":
    main()
