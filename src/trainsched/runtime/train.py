"""Real data-parallel training on this host, timed: ``trainsched train`` and the benchmarks.

:func:`train` starts ``nproc`` gloo worker processes (:mod:`trainsched.runtime.launch`); each
builds the zoo model (same seed), trains it on a synthetic batch and times every step. Workers
run a list of **segments**, one configuration each, in one process group, so a benchmark can
interleave configurations (A B A B ...) without rebuilding the model:

- ``sdp``: :class:`~trainsched.runtime.data_parallel.ScheduledDataParallel` with a policy
  (``fifo``: whole tensors in ready order with the barrier; ``priority``: partitions, credit,
  crossing the barrier; ``bytescheduler``: the same, with gradients below 1 MiB fused into
  flat buffers), its collective ``order`` (``leader`` or ``static``), or with
  ``enabled=False`` (the scheduler off: its pass-through to stock DDP);
- ``ddp``: ``torch.nn.parallel.DistributedDataParallel`` (``bucket_mb``), the stock baseline;
- ``flat``: backward, then one all-reduce of every gradient packed flat, then the step (no
  overlap at all);
- ``compute``: forward, backward and step with no communication;
- ``allreduce``: one flat all-reduce of the size of all gradients, alone.

A step's time is the interval between the starts of consecutive steps (with crossing, a step's
communication tail overlaps the next step's forward); the last one ends where its backward and
step return, as every other one does, and the drain after it (the last communication tail, paid
once per run, not per step) is not timed (:func:`timed_steps`). Rank 0's
times after ``warmup`` steps are reported: median, p10, p90, and the throughput ``nproc x batch /
median``. The parent process never imports torch.

:func:`run_trial` is the hook for an offline tuner: one (partition, credit) point, its median
step time in a fresh job. A ``priority`` or ``bytescheduler`` segment with ``tune`` options
tunes online instead: an :class:`~trainsched.comm.tune.OnlineTuner` on rank 0 switches every
rank to each trial point within the one job (``trainsched train --autotune``); the segment's
timed steps then run at the best point, after ``tune`` steps and a fresh warm-up.
"""

from __future__ import annotations

import gc
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from trainsched.comm.dispatch import check_sizes
from trainsched.comm.policy import (
    CREDIT_MODES,
    ByteSchedulerPolicy,
    FifoPolicy,
    PriorityPolicy,
    policy_from_json,
)
from trainsched.errors import TrainschedError
from trainsched.runtime.launch import free_port, job, quantile, serve_worker
from trainsched.runtime.optim import OPTIMIZERS, check_optimizer, optimizer_spec

__all__ = [
    "COMMS",
    "KINDS",
    "OPTIMIZERS",
    "ORDERS",
    "Segment",
    "TrainResult",
    "run_segments",
    "run_segments_here",
    "run_trial",
    "segment_for",
    "train",
]

MiB = 1 << 20
COMMS = ("fifo", "ddp", "priority", "bytescheduler")
SCHEDULED = ("priority", "bytescheduler")  # the policies with partition and credit
ORDERS = ("leader", "static")  # ScheduledDataParallel's safe orders ("local" exists to fail)
KINDS = ("sdp", "ddp", "flat", "compute", "allreduce", "placed")


@dataclass(frozen=True, kw_only=True)
class Segment:
    """One configuration to time: ``kind`` (module docstring); for ``sdp`` the policy
    (``policy`` ``fifo`` or ``priority`` with ``partition_bytes``, ``credit_bytes``,
    ``credit_mode``, ``cross_barrier``), ``update``, ``comm_threads``, ``order`` and
    ``enabled`` and ``backprop_k`` (``ScheduledDataParallel``'s: reverse-first-k out-of-order
    backprop, 0 = in order); for ``ddp`` the bucket cap in MB."""

    label: str
    kind: str
    policy: str = "priority"
    partition_bytes: int | None = 4 * MiB
    credit_bytes: float | None = 16 * MiB
    credit_mode: str = "overdraft"
    backfill: bool = False
    cross_barrier: bool = True
    update: str = "auto"
    comm_threads: int | None = None
    order: str = "leader"
    enabled: bool = True
    bucket_mb: float = 25.0
    steps: int = 20
    warmup: int = 3
    timeline_dir: str | None = None
    tune: dict[str, Any] | None = None  # OnlineTuner options: tune online (SCHEDULED only)
    fusion_bytes: int | None = None  # bytescheduler: fuse gradients below this (None: 1 MiB)
    # sdp with any comm policy: "module:QualName" of its class and its constructor fields
    # (what a plan file holds); overrides ``policy`` and the partition/credit fields
    policy_class: str | None = None
    policy_fields: dict[str, Any] | None = None
    placement: dict[str, int] | None = None  # placed: op name -> logical device (on the CPU)
    backprop_k: int = 0  # sdp: the layers nearest the input whose dW run after the last dX
    placement_order: list[str] | None = None  # placed: the order its ops run (None: program's)
    slots: list[str] | None = None  # compute: each split layer's dW slot (runtime/split/slots)

    def tuner(self) -> Any:
        """A fresh :class:`~trainsched.comm.tune.OnlineTuner` from ``tune`` (or ``None``)."""
        if self.tune is None:
            return None
        from trainsched.comm.tune import OnlineTuner

        options = dict(self.tune)
        for key in ("partition_range", "credit_range"):
            if key in options:
                options[key] = tuple(options[key])
        return OnlineTuner(**options)

    def check(self) -> None:
        if self.kind not in KINDS:
            raise TrainschedError(f"segment kind must be one of {', '.join(KINDS)}, got "
                                  f"{self.kind!r}")
        if not (isinstance(self.steps, int) and self.steps >= 1):
            raise TrainschedError(f"steps must be at least 1, got {self.steps!r}")
        if not (isinstance(self.warmup, int) and self.warmup >= 0):
            raise TrainschedError(f"warmup must be at least 0, got {self.warmup!r}")
        if self.kind == "ddp" and not (self.bucket_mb > 0):
            raise TrainschedError(f"the DDP bucket size must be positive, got {self.bucket_mb}")
        if (self.placement is None) != (self.kind != "placed"):
            raise TrainschedError("a placed segment needs a placement, and only it takes one")
        if self.kind == "sdp" and self.policy_class is not None:
            self.policy_object()  # bad fields fail here, not in the workers
        elif self.kind == "sdp":
            if self.policy not in ("fifo", *SCHEDULED):
                raise TrainschedError(f"sdp policy must be fifo, priority or bytescheduler, "
                                      f"got {self.policy!r}")
            if self.credit_mode not in CREDIT_MODES:
                raise TrainschedError(f"credit_mode must be one of "
                                      f"{', '.join(CREDIT_MODES)}, got {self.credit_mode!r}")
            if self.policy in SCHEDULED:
                check_sizes(self.scheduled_policy())
        if self.backfill and (self.kind != "sdp" or self.policy not in SCHEDULED):
            raise TrainschedError("backfill lets a smaller partition use credit the most "
                                  "urgent one cannot: it applies to comm 'priority' or "
                                  "'bytescheduler'")
        if self.order not in ORDERS:
            raise TrainschedError(f"order must be one of {', '.join(ORDERS)}, got "
                                  f"{self.order!r}")
        if self.order != "leader" and self.kind != "sdp":
            raise TrainschedError("order sets the scheduled runtime's collective order; comm "
                                  "'ddp' is stock DDP, which has none")
        if not self.enabled:
            if self.kind != "sdp":
                raise TrainschedError("enabled=False turns the scheduled runtime off; comm "
                                      "'ddp' is stock DDP already")
            for given, what in ((self.order != "leader", f"order={self.order!r}"),
                                (self.timeline_dir is not None, "timeline_dir"),
                                (self.tune is not None, "tune")):
                if given:
                    raise TrainschedError(f"enabled=False reduces with stock DDP, so {what} "
                                          f"has nothing to act on; drop one of them")
        k = self.backprop_k
        if not (isinstance(k, int) and not isinstance(k, bool) and k >= 0):
            raise TrainschedError(f"backprop_k must be an integer >= 0 (0: in-order "
                                  f"backprop), got {k!r}")
        if k and (self.kind != "sdp" or not self.enabled):
            raise TrainschedError("backprop_k (out-of-order backprop) runs on the scheduled "
                                  "runtime: it needs comm other than 'ddp', scheduling on")
        if self.slots is not None and (self.kind != "compute" or not self.slots):
            raise TrainschedError("dW slots run on one device: they apply to a compute "
                                  "segment and need one slot per split layer")
        if self.timeline_dir is not None and self.kind != "sdp":
            raise TrainschedError("timeline_dir records the scheduled runtime; comm 'ddp' is "
                                  "stock DDP, which it cannot record")
        if self.tune is not None:
            if self.kind != "sdp" or self.policy not in SCHEDULED:
                raise TrainschedError("online tuning sets the scheduler's partition and credit: "
                                      "it applies to comm 'priority' or 'bytescheduler'")
            try:
                self.tuner()
            except TypeError as exc:
                raise TrainschedError(f"tuning options: {exc}") from None

    def policy_object(self) -> Any:
        """The comm policy an ``sdp`` segment runs: ``policy_class`` built with
        ``policy_fields`` when given, else ``fifo`` or :meth:`scheduled_policy`."""
        if self.policy_class is not None:
            return policy_from_json({"class": self.policy_class,
                                     "fields": self.policy_fields or {}})
        if self.policy == "fifo":
            return FifoPolicy(cross_barrier=self.cross_barrier)
        return self.scheduled_policy()

    def scheduled_policy(self) -> PriorityPolicy | ByteSchedulerPolicy:
        """The ``priority`` or ``bytescheduler`` policy (the latter fuses gradients below
        ``fusion_bytes``, 1 MiB by default) at this segment's partition and credit."""
        options = {"partition_bytes": self.partition_bytes, "credit_bytes": self.credit_bytes,
                   "credit_mode": self.credit_mode, "cross_barrier": self.cross_barrier,
                   "backfill": self.backfill}
        if self.policy == "bytescheduler":
            return ByteSchedulerPolicy(**options, **({} if self.fusion_bytes is None else
                                                     {"fusion_bytes": self.fusion_bytes}))
        return PriorityPolicy(**options)


def segment_for(comm: str, *, partition_bytes: int | None = 4 * MiB,
                credit_bytes: float | None = 16 * MiB, credit_mode: str = "overdraft",
                steps: int = 20, warmup: int = 3, timeline_dir: str | None = None,
                bucket_mb: float = 25.0, tune: dict[str, Any] | None = None,
                order: str = "leader", enabled: bool = True,
                backfill: bool = False) -> Segment:
    """The segment ``trainsched train --comm-policy COMM`` runs: ``fifo`` (whole tensors in ready
    order, the barrier), ``ddp`` (stock DDP), ``priority`` (partitions, credit, crossing)
    or ``bytescheduler`` (the same, small gradients fused); ``tune``:
    :class:`~trainsched.comm.tune.OnlineTuner` options to tune them online first;
    ``order`` and ``enabled`` go to ``ScheduledDataParallel`` (``--order``,
    ``--no-schedule``)."""
    if comm not in COMMS:
        raise TrainschedError(f"comm must be one of {', '.join(COMMS)}, got {comm!r}")
    kind = "ddp" if comm == "ddp" else "sdp"
    return Segment(label=comm, kind=kind, policy=comm if kind == "sdp" else "priority",
                   partition_bytes=partition_bytes, credit_bytes=credit_bytes,
                   credit_mode=credit_mode, backfill=backfill,
                   cross_barrier=comm in SCHEDULED, bucket_mb=bucket_mb, steps=steps,
                   warmup=warmup, timeline_dir=timeline_dir, tune=tune, order=order,
                   enabled=enabled)


@dataclass(frozen=True)
class SegmentResult:
    """Rank 0's step times (seconds) of one segment, warm-up excluded."""

    label: str
    kind: str
    step_times_s: tuple[float, ...]
    autotune: Mapping[str, Any] | None = None  # online tuning: trials, switches, best point

    @property
    def median_s(self) -> float:
        return statistics.median(self.step_times_s)

    @property
    def mean_s(self) -> float:
        """The timed steps' total time over their count (what a run of them pays a step)."""
        return sum(self.step_times_s) / len(self.step_times_s)

    def quantile_s(self, q: float) -> float:
        return quantile(self.step_times_s, q)

    def to_dict(self) -> dict[str, Any]:
        out = {"label": self.label, "kind": self.kind, "median_s": self.median_s,
               "p10_s": self.quantile_s(0.1), "p90_s": self.quantile_s(0.9),
               "step_times_s": list(self.step_times_s)}
        if self.autotune is not None:
            out["autotune"] = dict(self.autotune)
        return out


@dataclass(frozen=True)
class TrainResult:
    """What :func:`train` measured."""

    model: str
    nproc: int
    batch_size: int
    optimizer: str
    segments: tuple[SegmentResult, ...]
    host: Mapping[str, Any] = field(default_factory=dict)

    @property
    def first(self) -> SegmentResult:
        return self.segments[0]

    def throughput(self, segment: SegmentResult | None = None) -> float:
        """Samples per second: all ranks' batches over the timed steps' total time (what a run
        of them achieves; a median step would miss a bimodal host's slow steps)."""
        return self.nproc * self.batch_size / (segment or self.first).mean_s

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "nproc": self.nproc, "batch_size": self.batch_size,
                "optimizer": self.optimizer, "host": dict(self.host),
                "segments": [{**s.to_dict(), "throughput_samples_per_s": self.throughput(s)}
                             for s in self.segments]}


def _job_config(model: str, segments: Sequence[Segment], *, nproc: int,
                batch_size: int | None, image_size: int | None, seq_len: int | None,
                optimizer: str, lr: float, seed: int, timeout_s: float,
                port: int | None) -> dict[str, Any]:
    """The checked configuration every worker of a job reads (``port`` None: ``env://``)."""
    if not (isinstance(nproc, int) and not isinstance(nproc, bool) and nproc >= 1):
        raise TrainschedError(f"nproc must be a positive integer, got {nproc!r}")
    check_optimizer(optimizer)
    if not segments:
        raise TrainschedError("nothing to run: no segments")
    if batch_size is not None and not (isinstance(batch_size, int) and batch_size >= 1):
        raise TrainschedError(f"batch_size must be an integer of at least 1, got "
                              f"{batch_size!r}")
    if isinstance(lr, bool) or not isinstance(lr, int | float) or not (math.isfinite(lr)
                                                                       and lr > 0):
        raise TrainschedError(f"lr must be a finite number > 0, got {lr!r}")
    for seg in segments:
        seg.check()
        if seg.timeline_dir is not None:
            Path(seg.timeline_dir).mkdir(parents=True, exist_ok=True)
    return {"model": model, "nproc": nproc, "batch_size": batch_size, "image_size": image_size,
            "seq_len": seq_len, "optimizer": optimizer, "lr": lr, "seed": seed, "port": port,
            "timeout_s": float(timeout_s), "segments": [asdict(s) for s in segments]}


def _train_result(data: dict[str, Any], nproc: int, optimizer: str) -> TrainResult:
    return TrainResult(model=data["model"], nproc=nproc, batch_size=data["batch_size"],
                       optimizer=optimizer, host=data["host"],
                       segments=tuple(SegmentResult(label=s["label"], kind=s["kind"],
                                                    step_times_s=tuple(s["step_times_s"]),
                                                    autotune=s.get("autotune"))
                                      for s in data["segments"]))  # fmt: skip


def run_segments(model: str, segments: Sequence[Segment], *, nproc: int = 2,
                 batch_size: int | None = None, image_size: int | None = None,
                 seq_len: int | None = None, optimizer: str = "sgd", lr: float = 0.01,
                 seed: int = 0, timeout_s: float = 1800.0) -> TrainResult:
    """Run ``segments`` in order in one job of ``nproc`` gloo processes (module docstring)."""
    config = _job_config(model, segments, nproc=nproc, batch_size=batch_size,
                         image_size=image_size, seq_len=seq_len, optimizer=optimizer, lr=lr,
                         seed=seed, timeout_s=timeout_s, port=free_port())
    with job("trainsched.runtime.train:_worker_main", config, nproc, timeout_s=timeout_s,
             what="training") as out:
        data = json.loads((out / "rank0.json").read_text())
    return _train_result(data, nproc, optimizer)


def run_segments_here(model: str, segments: Sequence[Segment], *, rank: int, world_size: int,
                      batch_size: int | None = None, image_size: int | None = None,
                      seq_len: int | None = None, optimizer: str = "sgd", lr: float = 0.01,
                      seed: int = 0, timeout_s: float = 1800.0) -> TrainResult | None:
    """Run ``segments`` in this process as rank ``rank`` of a job someone else launched
    (``torchrun``: the process group from ``env://``); rank 0 returns the result, the other
    ranks ``None``."""
    config = _job_config(model, segments, nproc=world_size, batch_size=batch_size,
                         image_size=image_size, seq_len=seq_len, optimizer=optimizer, lr=lr,
                         seed=seed, timeout_s=timeout_s, port=None)
    data = _work({**config, "rank": rank})
    import torch.distributed as dist

    dist.destroy_process_group()
    return _train_result(data, world_size, optimizer) if rank == 0 else None


def train(model: str, comm: str = "priority", *, nproc: int = 2, steps: int = 20,
          warmup: int = 3, partition_bytes: int | None = 4 * MiB,
          credit_bytes: float | None = 16 * MiB, credit_mode: str = "overdraft",
          timeline_dir: str | None = None, tune: dict[str, Any] | None = None,
          order: str = "leader", enabled: bool = True, backfill: bool = False,
          backprop_k: int = 0, **options: Any) -> TrainResult:
    """Train ``model`` with ``comm`` (``fifo``, ``ddp``, ``priority``, ``bytescheduler``) and
    time its steps; with ``tune`` (OnlineTuner options, ``priority``/``bytescheduler`` only)
    tune partition and credit online first and time the steps at the best point. ``order``:
    the scheduler's collective order (``leader`` or ``static``); ``enabled=False``: the
    scheduler's pass-through to DDP; ``backfill``: the policy's (strict credit only);
    ``backprop_k``: out-of-order backprop, the dW of the first k split layers after the last
    dX (reverse-first-k; 0 = in order)."""
    segment = segment_for(comm, partition_bytes=partition_bytes, credit_bytes=credit_bytes,
                          credit_mode=credit_mode, steps=steps, warmup=warmup,
                          timeline_dir=timeline_dir, tune=tune, order=order, enabled=enabled,
                          backfill=backfill)
    if backprop_k:
        segment = replace(segment, backprop_k=backprop_k)
    return run_segments(model, [segment], nproc=nproc, **options)


def run_trial(model: str, partition_bytes: int, credit_bytes: float, *, steps: int = 10,
              warmup: int = 3, credit_mode: str = "overdraft", **options: Any) -> float:
    """The tuner's hook: the median step time (s) of ``priority`` scheduling at one
    (partition, credit) point, ``steps`` steps after ``warmup``."""
    result = train(model, "priority", steps=steps, warmup=warmup,
                   partition_bytes=partition_bytes, credit_bytes=credit_bytes,
                   credit_mode=credit_mode, **options)
    return result.first.median_s


# --- the workers ------------------------------------------------------------------------------


def _worker_main() -> None:  # pragma: no cover - runs in the spawned processes
    serve_worker(_work)


def _work(cfg: dict[str, Any]) -> dict[str, Any]:  # pragma: no cover - in the workers
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from trainsched.capture.zoo import build

    torch.set_num_threads(1)
    rank, n = int(cfg["rank"]), int(cfg["nproc"])
    init = "env://" if cfg["port"] is None else f"tcp://127.0.0.1:{cfg['port']}"
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=n,
                            timeout=timedelta(seconds=cfg["timeout_s"]))
    zoo = build(cfg["model"], batch_size=cfg["batch_size"], image_size=cfg["image_size"],
                seq_len=cfg["seq_len"], seed=cfg["seed"])
    model = zoo.model
    model.train()
    args, kwargs = _rank_inputs(zoo.args, zoo.kwargs, rank, cfg["seed"])
    results = []
    for raw in cfg["segments"]:
        seg = Segment(**raw)
        tuner = seg.tuner()
        times = _run_segment(model, args, kwargs, seg, cfg, rank, n, tuner)
        skip = seg.warmup + (tuner.total_steps if tuner is not None else 0)
        result = {"label": seg.label, "kind": seg.kind, "step_times_s": times[skip:]}
        if tuner is not None and tuner.result is not None:  # rank 0's tuner decided
            best = tuner.result
            result["autotune"] = {**best.to_dict(), "total_steps": tuner.total_steps,
                                  "switches": [[at, p, c] for at, (p, c) in tuner.switches]}
        results.append(result)
    host = {"torch": torch.__version__, "threads": torch.get_num_threads(),
            "python": sys.version.split()[0], "cpu_count": os.cpu_count()}
    return {"model": zoo.name, "batch_size": zoo.batch_size, "segments": results, "host": host}


def _rank_inputs(args: tuple, kwargs: dict, rank: int, seed: int) -> tuple[tuple, dict]:
    """Different synthetic data on every rank: floating inputs redrawn, token ids shifted."""
    import torch

    gen = torch.Generator().manual_seed(seed * 1000 + rank + 1)

    def redraw(x: Any) -> Any:
        if isinstance(x, torch.Tensor) and x.is_floating_point():
            return torch.randn(x.shape, generator=gen, dtype=x.dtype)
        if isinstance(x, torch.Tensor) and x.dtype in (torch.int64, torch.int32) and x.numel():
            high = int(x.max()) + 1
            return torch.randint(0, max(high, 2), x.shape, generator=gen, dtype=x.dtype)
        return x

    return tuple(redraw(a) for a in args), {k: redraw(v) for k, v in kwargs.items()}


def timed_steps(total: int, step: Callable[[int], Any], finish: Callable[[], Any] | None = None,
                clock: Callable[[], float] = time.perf_counter) -> list[float]:
    """Run ``step(0)`` … ``step(total - 1)`` and return each one's time: from its start to the
    next one's start, the last one's to its return. ``finish`` (a drain) runs after the last
    step's time is taken: the communication tail it waits for is paid once per run, not per
    step, and a steady step already overlaps the tail of the step before it."""
    times = []
    start = clock()
    for i in range(total):
        step(i)
        now = clock()
        times.append(now - start)
        start = now
    if finish is not None:
        finish()
    return times


def _run_segment(model: Any, args: tuple, kwargs: dict, seg: Segment, cfg: dict[str, Any],
                 rank: int, n: int,
                 tuner: Any = None) -> list[float]:  # pragma: no cover - in the workers
    import torch
    import torch.distributed as dist

    from trainsched.runtime.data_parallel import ScheduledDataParallel
    from trainsched.runtime.stage_modules import loss_of

    opt_cls, opt_kwargs = optimizer_spec(cfg["optimizer"], cfg["lr"])
    total = seg.warmup + seg.steps + (tuner.total_steps if tuner is not None else 0)
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.grad = None

    if seg.kind == "allreduce":
        flat = torch.zeros(sum(p.numel() for p in params))
        dist.barrier()
        times = []
        for _ in range(total):
            t0 = time.perf_counter()
            dist.all_reduce(flat)
            times.append(time.perf_counter() - t0)
        return times

    sdp = None
    if seg.kind == "sdp":
        policy = seg.policy_object()
        first = seg.warmup + (tuner.total_steps if tuner is not None else 0)
        window = (first, first + min(seg.steps, 3) - 1)
        sdp = ScheduledDataParallel(model, policy, optimizer=opt_cls,
                                    optimizer_kwargs=opt_kwargs, timeout_s=cfg["timeout_s"],
                                    timeline=seg.timeline_dir, timeline_steps=window,
                                    update=seg.update, comm_threads=seg.comm_threads,
                                    tuner=tuner, order=seg.order, enabled=seg.enabled,
                                    backprop_k=seg.backprop_k)
        net = sdp
        opt = None
    elif seg.kind == "ddp":
        net = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=seg.bucket_mb)
        opt = opt_cls(params, **opt_kwargs)
    elif seg.kind == "placed":  # logical devices on this CPU, in the placement's order
        from trainsched.plan import Placement
        from trainsched.runtime.placed import PlacedModule

        assert seg.placement is not None
        placement = Placement(device_of=seg.placement,
                              num_devices=max(seg.placement.values(), default=0) + 1,
                              order=seg.placement_order)
        net = PlacedModule(model, placement, example_args=args, example_kwargs=kwargs,
                           granularity="op")
        opt = opt_cls(params, **opt_kwargs)
    elif seg.slots is not None:  # compute with each layer's dW in its slot
        from trainsched.runtime.split import SlottedModel

        net = opt = SlottedModel(model, seg.slots, optimizer=opt_cls, optimizer_kwargs=opt_kwargs)
    else:  # flat, compute: the plain module, one optimizer
        net = model
        opt = opt_cls(params, **opt_kwargs)
    flat_buffer = None

    def step(_: int) -> None:
        nonlocal flat_buffer
        loss_of(net(*args, **kwargs)).backward()
        if seg.kind == "flat" and n > 1:
            if flat_buffer is None:
                flat_buffer = torch.empty(sum(p.numel() for p in params))
            torch.cat([p.grad.view(-1) for p in params], out=flat_buffer)
            dist.all_reduce(flat_buffer)
            flat_buffer.div_(n)
            offset = 0
            for p in params:
                p.grad.view(-1).copy_(flat_buffer[offset:offset + p.numel()])
                offset += p.numel()
        if opt is not None:
            opt.step()
            opt.zero_grad(set_to_none=True)

    dist.barrier()
    try:
        times = timed_steps(total, step, sdp.drain if sdp is not None else None)
    finally:
        if sdp is not None:
            sdp.close()
    net = opt = None  # the wrapper (and its hooks) goes with the last reference
    gc.collect()  # a finished DDP wrapper must drop its hooks before the next segment
    return times
