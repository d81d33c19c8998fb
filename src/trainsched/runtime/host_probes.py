"""What ``trainsched calibrate``'s workers measure besides the α–β lines: how communication
and compute interfere on this host, how collectives in flight together share the wire, the
copy bandwidth, DDP's buffer broadcast before a forward, what a step's first all-reduce
costs beyond the fit when it starts as compute ends, and what the data-parallel runtime pays
per collective when a step issues many (:mod:`~trainsched.runtime.calibration` says
how each is read).

Each probe runs on every rank of an initialised process group at once and returns the same
figure everywhere (the mean over ranks, all-reduced); ``sync`` waits for the device (a no-op
on the CPU).
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Any

from trainsched.runtime.launch import trimmed_mean

__all__ = ["BUSY_S", "PER_COLLECTIVE_LAYERS", "after_compute", "buffer_sync", "contention",
           "copy_bandwidth", "interference", "matmul_loop", "per_collective"]

BUSY_S = 2e-3  # the compute before each timed buffer broadcast
PER_COLLECTIVE_LAYERS = 8  # Linear(128, 128) layers of per_collective's model: 16 gradients


def matmul_loop(device: Any, sync: Any) -> tuple[Any, float]:  # pragma: no cover - workers
    """``(loop, seconds per matmul)``: ``loop(k)`` runs k 256 x 256 matmuls and returns the
    seconds they took, the device done; the rate from a timed sample after a warm-up."""
    import torch

    a = torch.randn(256, 256, device=device)

    def loop(k: int) -> float:
        sync()
        t0 = time.perf_counter()
        for _ in range(k):
            torch.mm(a, a)
        sync()
        return time.perf_counter() - t0

    loop(5)
    return loop, max(loop(20) / 20, 1e-7)


def interference(dist: Any, device: Any, sync: Any, world_size: int,
                  rounds: int = 7) -> tuple[float, dict[str, float]]:  # pragma: no cover
    """How compute and all-reduces interfere when both run at once (each figure the mean
    over ranks of the median over ``rounds``): per round, a fixed matmul loop alone (T0), N
    back-to-back 4 MiB all-reduces alone (D0) and both at once, the all-reduces on a second
    thread (T1 for the loop; the all-reduces take D1 there). Returns the share (T1 - T0) / D0
    and, by rate, compute's rate ``1 - (T1 - T0) / D1`` beside the all-reduces and theirs
    ``D0 / D1`` beside compute, with N (``count``) and the medians of D0 and D1
    (``comm_alone_s``, ``comm_beside_s``), from which the parent takes out the part of the
    loss that is each collective's processor time (N is set so that D0 is about 40% of T0,
    the same on every rank; all-reduces that outlast the loop count the rest at full rate: D1
    is then the overlap, T1). D0 is timed in every round, next to the two it is compared
    with: a small gloo collective on a shared host is slower by a scheduler tick for
    stretches at a time, and one D0 timed once before the rounds moved the rates by up to 3x
    between calibrations."""
    import threading

    import torch

    buf = torch.ones(1 << 20, dtype=torch.float32, device=device)
    matmuls, per_matmul_s = matmul_loop(device, sync)

    def allreduces(k: int) -> float:
        sync()
        t0 = time.perf_counter()
        for _ in range(k):
            dist.all_reduce(buf)
        sync()
        return time.perf_counter() - t0

    k = max(10, int(0.15 / per_matmul_s))  # a loop of about 0.15 s
    dist.barrier()
    allreduces(2)
    d = statistics.median([allreduces(1) for _ in range(5)])
    count = torch.tensor([max(1, round(0.4 * 0.15 / max(d, 1e-6)))], dtype=torch.int64)
    dist.all_reduce(count, op=dist.ReduceOp.MAX)
    n_comm = int(count)
    shares, compute_rates, comm_rates, alones, besides = [], [], [], [], []
    for _ in range(rounds):
        dist.barrier()
        alone = matmuls(k)
        dist.barrier()
        comm_alone = allreduces(n_comm)
        dist.barrier()
        took: list[float] = []
        thread = threading.Thread(target=lambda out=took: out.append(allreduces(n_comm)),
                                  daemon=True)
        thread.start()
        beside = matmuls(k)
        thread.join()
        comm = min(took[0], beside)  # the part of the loop the all-reduces overlapped
        alones.append(comm_alone)
        besides.append(comm)
        shares.append((beside - alone) / comm_alone)
        compute_rates.append(1.0 - (beside - alone) / comm)
        # the all-reduces' work D0: at the rate r beside the loop, at 1 after it ended
        comm_rates.append(max(comm_alone - (took[0] - comm), 0.0) / comm)
    mean = torch.tensor([statistics.median(v) for v in (shares, compute_rates, comm_rates,
                                                        alones, besides)],
                        dtype=torch.float64)
    dist.all_reduce(mean)
    share, compute, comm_rate, alone_s, beside_s = (float(x) / world_size for x in mean)
    return share, {"compute": compute, "comm": comm_rate, "count": n_comm,
                   "comm_alone_s": alone_s, "comm_beside_s": beside_s}


def contention(dist: Any, device: Any, sync: Any, world_size: int,
                rounds: int = 15) -> tuple[float, float]:  # pragma: no cover - workers
    """``(T2 / d - 1, d)`` (the means over ranks of the medians): two 16 MiB all-reduces
    issued at once take T2, one alone d, timed in turn ``rounds`` times. 1: the two share the
    wire (no faster than in a row); 0: they run side by side as fast as one. 16 MiB, not less: on a
    shared 2-core host the figure for 4 MiB moved between 0.05 and 0.78 from run to run (the
    latency's noise is a large part of d there), for 16 MiB between 0.73 and 0.83."""
    import torch

    a = torch.ones(4 << 20, dtype=torch.float32, device=device)
    b = torch.ones(4 << 20, dtype=torch.float32, device=device)

    def timed(tensors: list[Any]) -> float:
        dist.barrier()
        sync()
        t0 = time.perf_counter()
        works = [dist.all_reduce(x, async_op=True) for x in tensors]
        for w in works:
            w.wait()
        sync()
        return time.perf_counter() - t0

    timed([a, b])
    timed([a])
    ones, twos = [], []
    for _ in range(rounds):
        ones.append(timed([a]))
        twos.append(timed([a, b]))
    mean = torch.tensor([statistics.median(twos) / statistics.median(ones) - 1.0,
                         statistics.median(ones)], dtype=torch.float64)
    dist.all_reduce(mean)
    return float(mean[0]) / world_size, float(mean[1]) / world_size


def buffer_sync(dist: Any, device: Any, sync: Any, world_size: int,
                 repeats: int = 15) -> float:  # pragma: no cover - runs in the workers
    """What DDP's forward spends before the module runs when the module has buffers: the
    broadcast of its buffers from rank 0 (``broadcast_buffers``, DDP's default) and DDP's own
    pre-forward work, on a batch norm of 16 features (its float and integer buffers, as in
    every batch-norm model; their bytes are negligible). Timed from the call to the module's
    forward pre-hook, each rank starting as a short compute ends (as in training, where the
    broadcast follows the previous step's compute), with no barrier; the trimmed mean of
    ``repeats`` on each rank, averaged over ranks."""
    import torch
    from torch.nn.parallel import DistributedDataParallel

    module = torch.nn.BatchNorm1d(16).to(device)
    ids = [device.index] if device.type == "cuda" else None
    ddp = DistributedDataParallel(module, device_ids=ids)
    x = torch.randn(4, 16, device=device)
    entered: list[float] = []
    module.register_forward_pre_hook(lambda *_: entered.append(time.perf_counter()))
    busy, per_matmul_s = matmul_loop(device, sync)
    busy_k = max(1, round(BUSY_S / per_matmul_s))
    times = []
    dist.barrier()
    for i in range(3 + repeats):
        busy(busy_k)  # as in training, where the broadcast follows the previous step's compute
        t0 = time.perf_counter()
        ddp(x).sum().backward()
        if i >= 3:
            times.append(entered[-1] - t0)
    mean = torch.tensor([trimmed_mean(times)], dtype=torch.float64)
    dist.all_reduce(mean)
    return float(mean) / world_size


def after_compute(dist: Any, device: Any, sync: Any, world_size: int,
                   repeats: int = 40) -> list[float]:  # pragma: no cover - in the workers
    """``[size, seconds]``: how long a blocking all-reduce of ``size`` bytes takes when it
    starts as a training step's compute ends, as in data-parallel training, not from a
    barrier. A step (forward and backward of a 3-layer MLP, a few ms on a CPU core) and the
    same step followed by the all-reduce are timed in turn, with no barrier anywhere, so each
    rank arrives at the all-reduce when its own compute ends; the trimmed mean of the second
    minus that of the first, on each rank, averaged over ranks."""
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(),
                                torch.nn.Linear(512, 512), torch.nn.ReLU(),
                                torch.nn.Linear(512, 10)).to(device)
    x = torch.randn(32, 256, device=device)
    buf = torch.ones(1 << 18, dtype=torch.float32, device=device)

    def step(reduce: bool) -> float:
        sync()
        t0 = time.perf_counter()
        model.zero_grad()
        model(x).square().mean().backward()
        if reduce:
            dist.all_reduce(buf)
        sync()
        return time.perf_counter() - t0

    for _ in range(5):
        step(False)
        step(True)
    dist.barrier()
    alone, reduced = [], []
    for _ in range(repeats):
        alone.append(step(False))
        reduced.append(step(True))
    mean = torch.tensor([trimmed_mean(reduced) - trimmed_mean(alone)],
                        dtype=torch.float64)
    dist.all_reduce(mean)
    return [buf.numel() * buf.element_size(), float(mean) / world_size]


def copy_bandwidth(dist: Any, device: Any, sync: Any,
                    world_size: int) -> float:  # pragma: no cover - runs in the workers
    """Bytes read and written per second by a 64 MiB copy, every rank copying at once (as in
    training): the median of 7 on each rank, averaged over ranks."""
    import torch

    src = torch.ones(16 << 20, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    times = []
    for _ in range(7):
        dist.barrier()
        sync()
        t0 = time.perf_counter()
        dst.copy_(src)
        sync()
        times.append(time.perf_counter() - t0)
    rate = torch.tensor([2 * src.numel() * src.element_size() / statistics.median(times)],
                        dtype=torch.float64)
    dist.all_reduce(rate)
    return float(rate) / world_size


def per_collective(dist: Any, device: Any, sync: Any, world_size: int,
                   rounds: int = 40, warmup: int = 5) -> list[Any]:  # pragma: no cover - workers
    """``[sizes, seconds, processor seconds]``: what the data-parallel runtime pays for a
    step's gradients as one collective per gradient, issued back to back as each becomes ready
    (``fifo``: 16 all-reduces of 64 KiB and 512 B, one in flight at a time), beyond one
    collective of all of them (``buckets`` with one bucket), and the processor time the same
    16 collectives take when each is issued as soon as its gradient is ready, several in
    flight (``many``: as training issues them; one at a time they take about half as much
    again, each thread waking for each). Three copies of a model of
    :data:`PER_COLLECTIVE_LAYERS` ``Linear(128, 128)`` layers at batch 8 (its forward and
    backward a fraction of a millisecond) are each wrapped in
    :class:`~trainsched.runtime.data_parallel.ScheduledDataParallel`, one per plan, and their
    steps (forward, backward, :meth:`drain`) timed in turn, ``rounds`` times after
    ``warmup``; ``seconds`` is the trimmed mean of the fifo steps minus that of the one-bucket
    steps, averaged over ranks, ``processor seconds`` the same of the process's processor
    time per step (every thread: training, dispatcher, gloo), many against one, and
    ``sizes`` the fifo collectives' bytes. The parent reads the runtime's cost per
    collective beyond the fitted line
    (:func:`~trainsched.runtime.calibration.overhead_from_steps`) and the processor time per
    collective (:func:`~trainsched.runtime.calibration.host_from_steps`) from them."""
    import torch

    from trainsched.comm.policy import FifoPolicy, PriorityPolicy, ReadyBucketPolicy
    from trainsched.runtime.data_parallel import ScheduledDataParallel

    def model() -> Any:
        torch.manual_seed(0)
        return torch.nn.Sequential(*[torch.nn.Linear(128, 128)
                                     for _ in range(PER_COLLECTIVE_LAYERS)]).to(device)

    one = 1 << 40  # a bucket larger than the model: one collective
    plans = {"fifo": FifoPolicy(),
             "many": PriorityPolicy(partition_bytes=one, credit_bytes=math.inf,
                                    cross_barrier=False),
             "one": ReadyBucketPolicy(bucket_bytes=one, first_bucket_bytes=one,
                                      cross_barrier=False)}
    wrappers = {name: ScheduledDataParallel(model(), policy, timeout_s=120.0)
                for name, policy in plans.items()}
    x = torch.randn(8, 128, device=device)
    times: dict[str, list[float]] = {name: [] for name in plans}
    cpu: dict[str, list[float]] = {name: [] for name in plans}
    try:
        for r in range(warmup + rounds):
            for name, wrapper in wrappers.items():
                sync()
                t0, c0 = time.perf_counter(), time.process_time()
                wrapper(x).square().mean().backward()
                wrapper.drain()
                sync()
                if r >= warmup:
                    times[name].append(time.perf_counter() - t0)
                    cpu[name].append(time.process_time() - c0)
    finally:
        for wrapper in wrappers.values():
            wrapper.close()
    sizes = [p.numel() * p.element_size() for p in wrappers["fifo"].module.parameters()]
    mean = torch.tensor([trimmed_mean(times["fifo"]) - trimmed_mean(times["one"]),
                         trimmed_mean(cpu["many"]) - trimmed_mean(cpu["one"])],
                        dtype=torch.float64)
    dist.all_reduce(mean)
    return [sizes, float(mean[0]) / world_size, float(mean[1]) / world_size]
