"""How fast the data-parallel simulator predicts one step at 8 to 8,192 ranks.

The workload is a ResNet-50-sized training graph built without torch: torchvision's ResNet-50
layer by layer (stem, 16 bottleneck blocks, fc: 174 forward ops, 107 of them with parameters,
25,557,032 parameters in fp32), batch 32 per rank; convolutions and fc cost their FLOPs at
10 TFLOP/s, the other ops their bytes at 720 GB/s; SGD with momentum. The training transform
turns it into about 560 ops. The cluster is ``p3.16xlarge`` (8 V100 per node, NVLink inside,
25 Gbit/s between nodes) with as many nodes as the ranks need; gradients go in PyTorch DDP's
buckets over a ring.

Cases: collapsed (one representative, every rank identical) at 8, 64, 1,024 and 8,192 ranks;
1,024 ranks with one straggler (two representatives); expanded (every rank simulated) at 8
and 64. Each is timed end to end (``simulate_data_parallel``: lowering, replay, results),
median of ``--repeats``. Target (``specs/simulator.md`` §2.7): 1,024 ranks collapsed < 2 s.
Results: a table on stdout and a JSON file (``--out``), quoted in benchmarks/RESULTS.md with
the machine.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import statistics
import sys
import time

from _common import cpu_model, write_results
from trainsched.cluster import cluster_preset
from trainsched.graph import Edge, Graph, Op, to_training
from trainsched.sim import simulate_data_parallel

TARGET_1024_S = 2.0
RESNET50_PARAMS = 25_557_032
CONV_FLOPS_PER_S = 10e12
MEMORY_BYTES_PER_S = 720e9
LAUNCH_S = 5e-6
FP32 = 4


class _Builder:
    """Forward ops of a CNN, costed by FLOPs (conv, fc) or bytes (everything else)."""

    def __init__(self, batch: int) -> None:
        self.batch = batch
        self.ops: list[Op] = []
        self.edges: list[Edge] = []
        self.out: dict[str, int] = {}
        self.layers = 0

    def _add(self, name: str, inputs: list[str], *, out_elems: int, params: int = 0,
             buffers: int = 0, flops: float = 0.0, compute_s: float) -> str:
        out_bytes = out_elems * self.batch * FP32
        layer = None
        if params:
            layer, self.layers = self.layers, self.layers + 1
        self.ops.append(Op(name=name, compute_s=compute_s + LAUNCH_S, flops=flops,
                           param_bytes=params * FP32, buffer_bytes=buffers * FP32,
                           output_bytes=out_bytes, saved_bytes=out_bytes, layer_index=layer))
        self.edges += [Edge(src=x, dst=name, size_bytes=self.out[x]) for x in inputs if x]
        self.out[name] = out_bytes
        return name

    def _memory_s(self, elems: int) -> float:
        return elems * self.batch * FP32 / MEMORY_BYTES_PER_S

    def conv(self, name: str, x: str, cin: int, cout: int, k: int, stride: int,
             hw: int) -> tuple[str, int]:
        hw_out = hw // stride
        params = k * k * cin * cout
        flops = 2.0 * params * hw_out * hw_out * self.batch
        return self._add(name, [x], out_elems=cout * hw_out * hw_out, params=params,
                         flops=flops, compute_s=flops / CONV_FLOPS_PER_S), hw_out

    def bn(self, name: str, x: str, c: int, hw: int) -> str:
        elems = c * hw * hw
        return self._add(name, [x], out_elems=elems, params=2 * c, buffers=2 * c,
                         compute_s=self._memory_s(2 * elems))

    def elementwise(self, name: str, inputs: list[str], elems: int) -> str:
        return self._add(name, inputs, out_elems=elems,
                         compute_s=self._memory_s((len(inputs) + 1) * elems))

    def fc(self, name: str, x: str, cin: int, cout: int) -> str:
        flops = 2.0 * cin * cout * self.batch
        return self._add(name, [x], out_elems=cout, params=cin * cout + cout, flops=flops,
                         compute_s=flops / CONV_FLOPS_PER_S)


def resnet50_forward(batch: int = 32) -> Graph:
    """torchvision's ResNet-50 (v1.5: stride in the 3x3 conv), one op per layer."""
    b = _Builder(batch)
    x, hw = b.conv("conv1", "", 3, 64, 7, 2, 224)  # "": the input image, not an op
    x = b.elementwise("relu", [b.bn("bn1", x, 64, hw)], 64 * hw * hw)
    hw //= 2
    x = b.elementwise("maxpool", [x], 64 * hw * hw)
    cin = 64
    for stage, (blocks, width, stride) in enumerate([(3, 64, 1), (4, 128, 2), (6, 256, 2),
                                                     (3, 512, 2)], start=1):
        cout = 4 * width
        for block in range(blocks):
            p = f"layer{stage}.{block}"
            s = stride if block == 0 else 1
            a, _ = b.conv(f"{p}.conv1", x, cin, width, 1, 1, hw)
            a = b.elementwise(f"{p}.relu1", [b.bn(f"{p}.bn1", a, width, hw)], width * hw * hw)
            a, hw2 = b.conv(f"{p}.conv2", a, width, width, 3, s, hw)
            a = b.elementwise(f"{p}.relu2", [b.bn(f"{p}.bn2", a, width, hw2)],
                              width * hw2 * hw2)
            a, _ = b.conv(f"{p}.conv3", a, width, cout, 1, 1, hw2)
            a = b.bn(f"{p}.bn3", a, cout, hw2)
            shortcut = x
            if block == 0:
                d, _ = b.conv(f"{p}.downsample.0", x, cin, cout, 1, s, hw)
                shortcut = b.bn(f"{p}.downsample.1", d, cout, hw2)
            added = b.elementwise(f"{p}.add", [a, shortcut], cout * hw2 * hw2)
            x = b.elementwise(f"{p}.relu3", [added], cout * hw2 * hw2)
            cin, hw = cout, hw2
    x = b.elementwise("avgpool", [x], cin)
    b.fc("fc", x, cin, 1000)
    graph = Graph(b.ops, b.edges)
    params = sum(op.param_bytes for op in graph.ops) // FP32
    assert params == RESNET50_PARAMS, params
    return graph


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--policy", default="ddp")
    parser.add_argument("--out", default="benchmarks/results/sim_scale.json")
    args = parser.parse_args()
    forward = resnet50_forward()
    train = to_training(forward, optimizer="momentum", memory_bandwidth_bytes_per_s=900e9)
    cases = [(f"collapsed_{n}", n, None, False) for n in (8, 64, 1024, 8192)]
    cases += [("straggler_1024", 1024, {517: 1.5}, False)]
    cases += [(f"expanded_{n}", n, None, True) for n in (8, 64)]
    rows = {}
    for name, ranks, stragglers, expand in cases:
        cluster = cluster_preset("p3.16xlarge", nodes=max(1, -(-ranks // 8)))
        times = []
        result = None
        for _ in range(args.repeats):
            began = time.perf_counter()
            result = simulate_data_parallel(train, cluster, ranks=ranks, policy=args.policy,
                                            stragglers=stragglers, expand=expand)
            times.append(time.perf_counter() - began)
        assert result is not None
        median = statistics.median(times)
        rows[name] = {
            "ranks": ranks, "expanded": expand, "representatives": len(result.devices),
            "tasks": len(result.tasks), "step_time_s": result.step_time_s,
            "exposed_comm_s": result.exposed_comm_s, "median_s": median,
            "min_s": min(times), "max_s": max(times), "ranks_per_s": ranks / median,
        }
    print(f"{'case':<16} {'ranks':>6} {'reps':>5} {'tasks':>7} {'step ms':>9} "
          f"{'median s':>9} {'ranks/s':>11}")
    for name, row in rows.items():
        print(f"{name:<16} {row['ranks']:>6} {row['representatives']:>5} {row['tasks']:>7} "
              f"{row['step_time_s'] * 1e3:>9.2f} {row['median_s']:>9.4f} "
              f"{row['ranks_per_s']:>11,.0f}")
    results = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpu": cpu_model(), "python": platform.python_version(),
                    "platform": platform.platform()},
        "repeats": args.repeats,
        "policy": args.policy,
        "workload": {"model": "resnet50-synthetic", "batch_per_rank": 32,
                     "forward_ops": len(forward), "training_ops": len(train),
                     "parameters": RESNET50_PARAMS, "cluster": "p3.16xlarge"},
        "target_1024_collapsed_s": TARGET_1024_S,
        "cases": rows,
    }
    write_results(args.out, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
