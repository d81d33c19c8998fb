"""Measure this host's communication with real ``torch.distributed`` processes.

:func:`calibrate` starts ``world_size`` worker processes (``OMP_NUM_THREADS=1``, by
:mod:`~trainsched.runtime.launch`) on a free loopback port, times point-to-point send/recv
round trips between ranks 0 and 1 and float32 all-reduce across all ranks for each message
size, every size once per round (:func:`measurement_order`), and fits α–β links to their
trimmed means (:func:`~trainsched.runtime.launch.trimmed_mean`: a small gloo collective here
takes about 0.2 ms or about one 4 ms scheduler tick, in shares that change from minute to
minute, so a median jumps between the two while a step's sum of collectives follows the mean).
How the fits are made and every probe below is read into a figure is
:mod:`~trainsched.runtime.calibration` (:func:`~trainsched.runtime.calibration.read_measurements`).

How communication and compute interfere is measured two ways (the probes live in
:mod:`~trainsched.runtime.host_probes`), for the simulator's two models
(:class:`~trainsched.cluster.DeviceSpec`): a matmul loop timed alone (T0) and while a second
thread runs back-to-back 4 MiB all-reduces (T1, the all-reduces taking D1 there against D0
alone; all three timed in each of 7 rounds, medians kept) gives γ = (T1 − T0) / D0 (take
turns: seconds of compute lost per second of communication) and, by rate, compute at
``1 − (T1 − T0) / D1`` while a collective is in flight and collectives at ``D0 / D1`` while
compute runs; two 16 MiB all-reduces issued at once
(taking T2 against d alone) give the contention ``T2 / d − 1`` of the gloo group's worker
threads (:data:`~trainsched.runtime.calibration.GLOO_THREADS` collectives in flight at
once). :meth:`~trainsched.runtime.calibration.Calibration.to_cluster` writes one model or the
other.

An all-reduce timed from a barrier is not the one training runs: the first all-reduce of a step
starts as each rank's compute ends. A small training step (a 3-layer MLP's forward and backward)
is timed alone and followed by a 1 MiB all-reduce, in turn and with no barrier; what the
all-reduce took there beyond the fitted line is ``collective_after_compute_s`` (at least 0),
which the data-parallel simulator adds to the first collective of every step.

A step that issues many collectives pays for each more than the fit says: the data-parallel
runtime's dispatcher hands each to the wire and takes it back, and on a shared host a small
gloo collective waits a scheduler tick in a good share of calls. Two copies of a small model
run on :class:`~trainsched.runtime.data_parallel.ScheduledDataParallel` in turn, one issuing a
collective per gradient (16, one at a time), the other one collective of all of them
(:func:`~trainsched.runtime.host_probes.per_collective`, with gloo); what the first step
takes beyond the second, less what the fitted line says of the difference, per extra
collective, is
``collective_overhead_s``, which the data-parallel simulator
adds to every collective of a step but the first (that one pays ``collective_after_compute_s``,
above; both steps have one, so the difference says nothing of it). The same two steps' processor
time (every thread of the rank: the training thread, the dispatcher, gloo's threads) gives the
processor time per collective beyond the one of the same bytes, ``collective_host_s``: what
each collective takes from its rank's compute when the rank has one core to itself, which the
simulator charges on the compute stream. The interference probe's loss of compute beside N
all-reduces holds N such times already, so γ and compute's rate keep only the rest: the
simulator charges each part once.

With gloo, ranks 0 and 1 also run GPipe over a model whose ops take microseconds on the pipeline
runtime, every action, send and receive timed (:mod:`~trainsched.runtime.pipeline_host`): the
runtime's own host time per action and per message, which the pipeline simulator charges
(``microbatch_overhead_s``, ``message_host_s``).

The parent process never imports torch unless ``backend="nccl"`` (to check for CUDA); workers
do. A rank that dies makes the whole run fail at once with :class:`TrainschedError`; the run as a
whole is bounded by ``timeout_s``.
"""

from __future__ import annotations

import json
import math
import os
import platform
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from trainsched.errors import TrainschedError
from trainsched.runtime.calibration import Calibration, read_measurements
from trainsched.runtime.launch import (
    WorkerFailure,
    free_port,
    run_workers,
    status_text,
    trimmed_mean,
)
from trainsched.units import is_int

__all__ = ["BACKENDS", "DEFAULT_SIZES", "calibrate", "measurement_order"]

DEFAULT_SIZES: tuple[int, ...] = tuple(4**k for k in range(1, 14))  # 4 B .. 64 MiB
BACKENDS = ("gloo", "nccl")


# --- the parent -------------------------------------------------------------------------------

def _check_args(world_size: Any, sizes: Any, repeats: Any, warmup: Any, backend: Any,
                timeout_s: Any) -> list[int]:
    if not (is_int(world_size) and world_size >= 2):
        raise TrainschedError(f"calibrate needs a world size of at least 2 processes, "
                              f"got {world_size!r}")
    if not (is_int(repeats) and repeats >= 1):
        raise TrainschedError(f"repeats must be a positive integer, got {repeats!r}")
    if not (is_int(warmup) and warmup >= 0):
        raise TrainschedError(f"warm-up must be an integer >= 0, got {warmup!r}")
    if backend not in BACKENDS:
        raise TrainschedError(f"unknown backend {backend!r}; use one of {', '.join(BACKENDS)}")
    if not (isinstance(timeout_s, (int, float)) and not isinstance(timeout_s, bool)
            and math.isfinite(timeout_s) and timeout_s > 0):
        raise TrainschedError(f"timeout must be a positive number of seconds, got {timeout_s!r}")
    sizes = list(DEFAULT_SIZES if sizes is None else sizes)
    if not sizes:
        raise TrainschedError("calibrate needs at least one message size")
    bad = [s for s in sizes if not (is_int(s) and s > 0)]
    if bad:
        raise TrainschedError(f"message sizes must be positive integers of bytes, got {bad[0]!r}")
    return sorted(set(sizes))


def _host_info(backend: str) -> dict[str, Any]:
    return {"hostname": platform.node(), "platform": platform.platform(),
            "machine": platform.machine(), "cpu_count": os.cpu_count(),
            "python": platform.python_version(), "backend": backend}


def calibrate(*, world_size: int = 2, sizes_bytes: Sequence[int] | None = None, repeats: int = 30,
              warmup: int = 3, backend: str = "gloo", timeout_s: float = 120,
              _fail_rank: int | None = None) -> Calibration:
    """Measure p2p and all-reduce on ``world_size`` real processes and fit α–β links.

    ``_fail_rank`` (tests only) makes that rank exit at once with status 3.
    """
    sizes = _check_args(world_size, sizes_bytes, repeats, warmup, backend, timeout_s)
    if backend == "nccl":
        import torch

        if not torch.cuda.is_available():
            raise TrainschedError("backend 'nccl' needs CUDA, which is not available here; "
                                  "use backend 'gloo'")
    measured_at = datetime.now(timezone.utc).replace(microsecond=0).isoformat()
    config = {"world_size": world_size, "sizes": sizes, "repeats": repeats, "warmup": warmup,
              "backend": backend, "port": free_port(), "timeout_s": float(timeout_s),
              "fail_rank": _fail_rank}
    with tempfile.TemporaryDirectory(prefix="trainsched-calibrate-") as tmp:
        tmpdir = Path(tmp)
        result_path = tmpdir / "result.json"
        configs = [{**config, "rank": rank, "result": str(result_path)}
                   for rank in range(world_size)]  # fmt: skip
        try:
            run_workers("trainsched.runtime.calibrate:_worker_main", configs, workdir=tmpdir,
                        timeout_s=timeout_s, backend=backend)
        except WorkerFailure as failure:
            if failure.rank is None:
                raise TrainschedError(
                    f"calibration did not finish within {timeout_s:g} s "
                    f"({world_size} {backend} processes, {len(sizes)} sizes up to "
                    f"{max(sizes)} B, {warmup}+{repeats} repeats); raise the timeout or "
                    "measure fewer or smaller sizes") from None
            detail = f"; its output ends:\n{failure.log_tail}" if failure.log_tail else ""
            raise TrainschedError(
                f"calibration failed: rank {failure.rank} of {world_size} exited with status "
                f"{status_text(failure.status)}{detail}") from None
        try:
            data = json.loads(result_path.read_text())
        except (OSError, ValueError) as exc:
            raise TrainschedError(f"calibration finished but rank 0 left no result: {exc}") \
                from exc
    return read_measurements(data, backend=backend, world_size=world_size,
                             measured_at=measured_at, repeats=repeats, warmup=warmup,
                             host=_host_info(backend))


def measurement_order(sizes: Sequence[int], warmup: int,
                      repeats: int) -> list[tuple[int, bool]]:
    """The ``(size, timed)`` measurements of a calibration, in the order the workers run them:
    ``warmup`` untimed rounds, then ``repeats`` timed ones, each round every size once, in
    increasing size.

    Round-robin rather than size after size: on a shared host a small collective is fast
    (about 0.2 ms here) or waits about one scheduler tick (4 ms) for stretches of tens of
    milliseconds at a time, so a size timed in one run of repeats lands in one of the two
    states and its mean is off by the tick; spread over the whole calibration, every size sees
    the slow share at its rate and its mean is what a training step's collectives cost.
    """
    return [(size, r >= warmup) for r in range(warmup + repeats) for size in sorted(sizes)]


# --- the workers ------------------------------------------------------------------------------

def _worker_main() -> None:  # pragma: no cover - runs in the spawned processes
    cfg = json.loads(sys.argv[1])
    rank = int(cfg["rank"])
    if cfg.get("fail_rank") == rank:
        os._exit(3)
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    n = int(cfg["world_size"])
    backend = cfg["backend"]
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{cfg['port']}", rank=rank,
                            world_size=n, timeout=timedelta(seconds=cfg["timeout_s"]))
    device = torch.device("cpu")
    if backend == "nccl":
        device = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(device)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    repeats, warmup = int(cfg["repeats"]), int(cfg["warmup"])
    sizes = [int(size) for size in cfg["sizes"]]
    raw = {size: torch.zeros(size, dtype=torch.uint8, device=device) for size in sizes}
    floats = {size: torch.ones(max(1, math.ceil(size / 4)), dtype=torch.float32, device=device)
              for size in sizes}
    round_trips: dict[int, list[float]] = {size: [] for size in sizes}
    reduces: dict[int, list[float]] = {size: [] for size in sizes}
    dist.barrier()
    for size, timed in measurement_order(sizes, warmup, repeats):
        buf = raw[size]
        if rank == 0:
            sync()
            t0 = time.perf_counter()
            dist.send(buf, 1)
            dist.recv(buf, 1)
            sync()
            if timed:
                round_trips[size].append(time.perf_counter() - t0)
        elif rank == 1:
            dist.recv(buf, 0)
            dist.send(buf, 0)
        dist.barrier()
        sync()
        t0 = time.perf_counter()
        dist.all_reduce(floats[size])
        sync()
        if timed:
            reduces[size].append(time.perf_counter() - t0)
    del raw, floats
    rows = [[size, trimmed_mean(round_trips[size]) / 2, trimmed_mean(reduces[size])]
            for size in sizes] if rank == 0 else []
    from trainsched.runtime import host_probes

    share, rates = host_probes.interference(dist, device, sync, n)
    rates["contention"], rates["contention_alone_s"] = host_probes.contention(dist, device,
                                                                              sync, n)
    memory = host_probes.copy_bandwidth(dist, device, sync, n)
    buffer_sync = host_probes.buffer_sync(dist, device, sync, n)
    after_compute = host_probes.after_compute(dist, device, sync, n)
    per_collective = pipeline = None
    if backend == "gloo":  # the scheduled runtime's and the pipeline runtime's host
        # costs: both run their messages through gloo
        per_collective = host_probes.per_collective(dist, device, sync, n)
        from trainsched.runtime.pipeline_host import pipeline_host_times

        pipeline = pipeline_host_times(rank, n)
    dist.barrier()
    if rank == 0:
        host = {"torch": torch.__version__, "torch_threads": torch.get_num_threads()}
        if device.type == "cuda":
            host["gpu"] = torch.cuda.get_device_name(device)
        tmp = cfg["result"] + ".tmp"
        with open(tmp, "w") as fh:
            json.dump({"rows": rows, "host": host, "comm_compute_share": share,
                       "rates": rates, "memory_bandwidth": memory,
                       "buffer_sync": buffer_sync, "after_compute": after_compute,
                       "per_collective": per_collective,
                       "pipeline_host": pipeline}, fh)
        os.replace(tmp, cfg["result"])
    dist.destroy_process_group()
