"""A VGG-16-shaped network whose compute is sleep, for ``benchmarks/comm_sleep.py``.

Each layer owns one parameter of VGG-16's layer size (times ``SCALE``) and sleeps in forward and
backward for times proportional to that layer's FLOPs, so the two ranks' cores stay free for
gloo: what the benchmark measures is the scheduling of communication, not CPU contention. The
backward of a layer returns an all-zero weight gradient (a real allocation and fill of the
parameter's size, as a real weight gradient is).

``build`` is the model for ``trainsched.runtime.train`` (``benchmarks/_sleepnet.py:build``);
``PROFILE`` is what the simulator is given. Run as a script (``python _sleepnet.py CONFIG``) it
is a worker of the all-reduce measurement: CONFIG is a JSON object with ``rank``, ``port``,
``sizes``, ``repeats`` and ``out``.
"""

from __future__ import annotations

import json
import sys
import time

#: VGG-16's layers: (name, parameters in millions, forward GFLOP per 224x224 image).
VGG16 = [
    ("conv1_1", 0.0018, 0.09), ("conv1_2", 0.037, 1.85), ("conv2_1", 0.074, 0.92),
    ("conv2_2", 0.148, 1.85), ("conv3_1", 0.295, 0.92), ("conv3_2", 0.59, 1.85),
    ("conv3_3", 0.59, 1.85), ("conv4_1", 1.18, 0.92), ("conv4_2", 2.36, 1.85),
    ("conv4_3", 2.36, 1.85), ("conv5_1", 2.36, 0.46), ("conv5_2", 2.36, 0.46),
    ("conv5_3", 2.36, 0.46), ("fc6", 102.8, 0.10), ("fc7", 16.8, 0.017), ("fc8", 4.1, 0.004),
]
SCALE = 0.25  # parameters: a quarter of VGG-16's (138 MB of fp32 gradients)
FORWARD_S = 0.040  # the whole forward pass; backward sleeps twice as long (dX and dW)
TOTAL_GFLOP = sum(f for _, _, f in VGG16)
#: (name, parameter elements, forward s, backward-input s, backward-weight s) per layer.
PROFILE = [(name, max(1, round(m * 1e6 * SCALE)), FORWARD_S * f / TOTAL_GFLOP,
            FORWARD_S * f / TOTAL_GFLOP, FORWARD_S * f / TOTAL_GFLOP)
           for name, m, f in VGG16]  # fmt: skip
WIDTH = 64  # activations: batch x WIDTH floats, passed through every layer


def build(batch_size: int | None = None):  # -> (model, args)
    import torch
    from torch import nn

    class SleepLayer(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, weight, forward_s, input_s, weight_s):
            ctx.times = (input_s, weight_s)
            ctx.shape = weight.shape
            time.sleep(forward_s)
            return x.clone()

        @staticmethod
        def backward(ctx, grad):
            input_s, weight_s = ctx.times
            time.sleep(input_s + weight_s)
            return grad.clone(), torch.zeros(ctx.shape), None, None, None

    class Layer(nn.Module):
        def __init__(self, elements: int, times: tuple[float, float, float]) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.zeros(elements))
            self.times = times

        def forward(self, x):
            return SleepLayer.apply(x, self.weight, *self.times)

    class SleepNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.Sequential(*[Layer(n, (f, i, w)) for _, n, f, i, w in PROFILE])

        def forward(self, x):
            return self.layers(x)

    batch = 4 if batch_size is None else batch_size
    return SleepNet(), (torch.randn(batch, WIDTH, requires_grad=False),)


def _measure(cfg: dict) -> None:  # pragma: no cover - a spawned worker
    """All-reduce times on a 2-rank gloo group with one worker thread (the runtime's
    ``comm_threads=1``), and this host's zero-fill bandwidth."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    rank = cfg["rank"]
    store = dist.TCPStore("127.0.0.1", cfg["port"], 2, rank == 0, timedelta(seconds=60))
    gloo = dist.ProcessGroupGloo
    options = gloo._Options()
    options._threads = 1
    options._timeout = timedelta(seconds=60)
    options._devices = [gloo.create_default_device()]
    group = gloo(store, rank, 2, options)
    rows = []
    for size in cfg["sizes"]:
        buffer = torch.zeros(size // 4)
        group.allreduce([buffer]).wait()
        times = []
        for _ in range(cfg["repeats"]):
            group.barrier().wait()
            t0 = time.perf_counter()
            group.allreduce([buffer]).wait()
            times.append(time.perf_counter() - t0)
        rows.append([size, sorted(times)[len(times) // 2]])
    fill = []
    for _ in range(5):
        t0 = time.perf_counter()
        torch.zeros(64 << 18)  # 64 MiB
        fill.append(time.perf_counter() - t0)
    param, grad = torch.zeros(64 << 18), torch.ones(64 << 18)
    update = []
    for _ in range(5):
        t0 = time.perf_counter()
        param.add_(grad, alpha=-0.01)  # SGD: read the parameter and gradient, write back
        update.append(time.perf_counter() - t0)
    if rank == 0:
        with open(cfg["out"], "w") as fh:
            json.dump({"allreduce": rows,
                       "zero_fill_bytes_per_s": (64 << 20) / sorted(fill)[2],
                       "update_bytes_per_s": 3 * (64 << 20) / sorted(update)[2]}, fh)


if __name__ == "__main__":  # pragma: no cover
    _measure(json.loads(sys.argv[1]))
