"""How fast and how well trainsched's placers place real and synthetic graphs.

Every placer (m-SCT, m-ETF, m-TOPO, the contiguous splits, one device) and ``auto`` places:

- zoo models' training graphs (SGD with momentum), captured with roofline costs for the RTX 2080
  at op and at module granularity, on ``baechi-4x2080`` (4 × 8 GiB, one shared PCIe channel per
  device, Baechi's TensorFlow copy-time fit);
- ResNet-50 at batch 128, whose training step does not fit one 8 GiB device (memory-constrained);
- synthetic layered DAGs (width 20, 1-3 inputs from the previous two layers, log-normal compute
  around 0.3 ms, 64 KiB-1 MiB tensors): 2,000 and 20,000 forward ops, placed with the default
  reductions and with none (so the placers see all 2,000 / 20,000 ops), and a ~15,000-op training
  graph built from 4,000 of them.

Per case: placement time (``wall`` and ``cpu`` seconds: reduction, placer and scheduling its
placement, for ``auto`` also its scoring simulations; ``placer``: the algorithm alone), ops
before/after reduction, the simulator's step time on the full graph (replaying the order the
placement stores), the lower bound max(critical path, total compute / devices) and their ratio,
``rep/pl``: the simulator's step over the placer's own makespan for the same placement (1.000
when the replay reproduces the placer's schedule; below 1 when fused ops, expanded, start
sooner; not shown for forward-only placements, whose placer never scheduled the backward
ops), devices used, the largest peak memory and whether a device runs out. Results: a table on
stdout and a JSON file (``--out``), quoted in benchmarks/RESULTS.md with the machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import platform
import random
import sys
import time

import scipy

from _common import cpu_model, write_results
from trainsched.cluster import cluster_preset
from trainsched.errors import TrainschedError
from trainsched.graph import Edge, Graph, Op, to_training
from trainsched.placement import PLACERS, place
from trainsched.sim import predict_placement, simulate_placed

ALGORITHMS = (*PLACERS, "auto")
ZOO = (("resnet50", {"batch_size": 32}), ("inception_v3", {"batch_size": 32}),
       ("gpt2", {"batch_size": 8}), ("bert-base", {"batch_size": 8}))
CLUSTER = "baechi-4x2080"
GIB = 2**30


def layered_dag(n: int, *, width: int = 20, seed: int = 0) -> Graph:
    rng = random.Random(seed)
    ops: list[Op] = []
    edges: list[Edge] = []
    layers = [list(range(i, min(n, i + width))) for i in range(0, n, width)]
    for k, layer in enumerate(layers):
        earlier = (layers[k - 1] + (layers[k - 2] if k > 1 else [])) if k else []
        for i in layer:
            out = rng.choice([2**16, 2**18, 2**20])
            ops.append(Op(name=f"op{i:05d}", compute_s=rng.lognormvariate(-8.5, 1.0),
                          param_bytes=rng.choice([0, 0, 2**16, 2**18]), output_bytes=out,
                          saved_bytes=out))
            for src in sorted({rng.choice(earlier) for _ in range(rng.choice([1, 1, 2, 3]))}
                              if earlier else ()):
                edges.append(Edge(src=f"op{src:05d}", dst=f"op{i:05d}",
                                  size_bytes=ops[src].output_bytes))
    return Graph(ops, edges, {"model": f"layered-{n}"})


def zoo_graph(name: str, granularity: str, **size) -> Graph:
    from trainsched.capture import build, capture

    zoo = build(name, **size)
    graph = capture(zoo.model, zoo.args, example_kwargs=zoo.kwargs, granularity=granularity,
                    costs="roofline", device_kind="RTX2080-8GB", name=name,
                    meta={"batch_size": zoo.batch_size})
    return to_training(graph, optimizer="momentum")


def run_case(name: str, graph: Graph, algorithms: tuple[str, ...], **options) -> list[dict]:
    cluster = cluster_preset(CLUSTER)
    rows = []
    for algorithm in algorithms:
        began, cpu = time.perf_counter(), time.process_time()
        row = {"case": name, "algorithm": algorithm, "ops": len(graph)}
        try:
            # Timed without the final simulation (auto's scoring simulations are part of it).
            r = place(graph, cluster, algorithm,
                      predict=predict_placement if algorithm == "auto" else None, **options)
            cpu = time.process_time() - cpu
        except TrainschedError as exc:
            row |= {"error": str(exc), "wall_s": time.perf_counter() - began}
            rows.append(row)
            continue
        if r.predicted_step_s is None:
            # the graphs placed here are forward graphs, predicted as their forward pass
            simulated = simulate_placed(graph, cluster, r.placement, allow_forward_only=True)
            names = cluster.device_names()
            r = dataclasses.replace(
                r, predicted_step_s=simulated.step_time_s,
                simulated_peak_bytes=tuple(simulated.peak_memory_bytes.get(d, 0) for d in names))
        peaks = r.simulated_peak_bytes or r.peak_bytes
        row |= {
            "placer": r.placer, "wall_s": r.wall_s, "cpu_s": cpu, "reduce_s": r.reduce_s,
            "placer_s": r.placer_s, "ops_after": r.ops_after,
            "step_s": r.predicted_step_s, "lower_bound_s": r.lower_bound_s,
            "ratio": r.predicted_step_s / r.lower_bound_s if r.lower_bound_s else None,
            "placer_makespan_s": r.makespan_s, "lp_value_s": r.lp_value_s,
            "order_from": r.placement.meta["order_from"],
            "replay_over_placer": (r.predicted_step_s / r.makespan_s
                                   if r.placement.meta["order_from"] == "placer"
                                   and r.makespan_s else None),
            "devices_used": len(set(r.placement.device_of.values())),
            "peak_gib": max(peaks) / GIB,
            "oom": any(b > c for b, c in zip(peaks, r.machine.capacity, strict=True)),
        }
        rows.append(row)
    return rows


def print_rows(rows: list[dict]) -> None:
    print(f"{'case':<30}{'algorithm':<22}{'ops':>6}{'after':>6}{'wall s':>8}{'cpu s':>8}"
          f"{'placer s':>9}"
          f"{'step ms':>10}{'LB ms':>9}{'ratio':>7}{'rep/pl':>8}{'dev':>4}{'peak GiB':>10}")
    for row in rows:
        if "error" in row:
            print(f"{row['case']:<30}{row['algorithm']:<22}{row['ops']:>6}  "
                  f"infeasible: {row['error'][:70]}")
            continue
        print(f"{row['case']:<30}{row['algorithm']:<22}{row['ops']:>6}{row['ops_after']:>6}"
              f"{row['wall_s']:>8.3f}{row['cpu_s']:>8.3f}{row['placer_s']:>9.4f}"
              f"{row['step_s'] * 1e3:>10.2f}"
              f"{row['lower_bound_s'] * 1e3:>9.2f}{row['ratio']:>7.3f}"
              f"{_ratio(row['replay_over_placer']):>8}{row['devices_used']:>4}"
              f"{row['peak_gib']:>9.2f}{'!' if row['oom'] else ' '}")
    sys.stdout.flush()


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results/placement.json")
    parser.add_argument("--skip-zoo", action="store_true", help="synthetic graphs only")
    args = parser.parse_args()
    rows: list[dict] = []
    if not args.skip_zoo:
        for model, size in ZOO:
            for granularity in ("op", "module"):
                graph = zoo_graph(model, granularity, **size)
                new = run_case(f"{model}-{granularity}", graph, ALGORITHMS)
                print_rows(new)
                rows += new
        graph = zoo_graph("resnet50", "op", batch_size=128)
        new = run_case("resnet50-op-b128 (no fit)", graph, ALGORITHMS)
        print_rows(new)
        rows += new
    for n in (2000, 20000):
        graph = layered_dag(n)
        new = run_case(f"layered-{n}", graph, ALGORITHMS)
        new += run_case(f"layered-{n} unreduced", graph, ("m-sct", "m-etf", "m-topo"),
                        coplacement=False, fusion=False)
        print_rows(new)
        rows += new
    train = to_training(layered_dag(4000, seed=1), optimizer="momentum")
    new = run_case(f"layered-4000 training ({len(train)})", train, ALGORITHMS)
    print_rows(new)
    rows += new
    results = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpu": cpu_model(), "python": platform.python_version(),
                    "scipy": scipy.__version__, "platform": platform.platform()},
        "cluster": CLUSTER,
        "rows": rows,
    }
    write_results(args.out, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
