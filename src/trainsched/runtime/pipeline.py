"""Run a pipeline :class:`~trainsched.plan.Schedule` on real processes: :func:`run_pipeline`.

The same schedule the simulator (:func:`trainsched.sim.simulate_pipeline`) replays runs here on
``schedule.num_ranks`` gloo processes on this host (:mod:`trainsched.runtime.launch`). Every
rank builds the zoo model (same seed), exports it on one micro-batch and cuts it into the given
stages (:func:`~trainsched.runtime.stage_modules.build_stages`: one tuple of forward op names per
stage, as ``stage_costs_from_graph(...).ops`` lists them); rank ``r`` keeps the stages that
``schedule.stage_to_rank`` gives it. One training step:

1. a barrier, then rank ``r`` runs ``schedule.ranks[r]``'s ``F``, ``B``, ``I`` and ``W`` actions
   in order (:func:`run_actions`). The batch is split along
   dim 0 into ``num_microbatches`` equal micro-batches; the last stage's loss of a micro-batch
   is its mean square divided by their number, so the step's gradients are the full batch's.
2. **Communication is derived from the compute actions**; explicit ``SEND_*``/``RECV_*`` actions
   are skipped. ``F`` of stage ``s > 0`` receives its inputs from the rank of ``s - 1`` (a
   blocking ``irecv``), and a forward's outputs go to the rank of ``s + 1`` by ``isend``, which
   never blocks the sender; ``B``/``I`` do the same with gradients in the other direction.
   Every tensor has its own tag (direction, stage, micro-batch, position), so messages cannot be
   confused whatever order they arrive in. Sends never block and receives wait only for their
   producer: exactly the execution model :meth:`Schedule.validate` proves deadlock-free.
   Stages on the same rank hand their tensors over in memory.
3. the rank waits for its sends, steps its optimizer (``sgd``, ``momentum``, ``adam``) on its
   stages' parameters and zeroes the gradients.

A step's time on a rank is the wall time from the barrier to the end of its optimizer step; the
result reports, per step after ``warmup``, the largest over the ranks (the step ends when its
last rank does). A rank that fails stops the run at once (the other ranks are killed); its
error is raised here as a :class:`TrainschedError`. Fault injection for tests: with the
environment variable ``TRAINSCHED_PIPELINE_FAULT=R:K`` rank ``R`` exits with status 3 just
before its ``K``-th compute action of the first step. The parent process never imports torch
unless gradients are asked for.

:func:`run_local` runs one step of a schedule on stages built in this process (a thread per
rank, the same :func:`run_actions`), for tests and debugging.

**Activation memory.** With ``measure_memory`` both count, per rank, the bytes of the saved
activations (and the output gradients kept from ``I`` to ``W``) its stages hold, with a
:class:`~trainsched.runtime.saved_memory.SavedTensorMeter`, and report the peak of a step: the
quantity the simulator's memory model predicts, without the resident parameters, gradients and
optimizer state, and without the buffers in transit. A rank's peak depends only on its own
action order, so threads and processes measure the same.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainsched.errors import TrainschedError
from trainsched.plan import COMPUTE_KINDS, Schedule
from trainsched.runtime.launch import free_port, job, quantile, serve_worker
from trainsched.runtime.optim import OPTIMIZERS, make_optimizer

if TYPE_CHECKING:
    from trainsched.runtime.stage_modules import PipelineStage

__all__ = ["FAULT_ENV", "OPTIMIZERS", "GlooMailbox", "Key", "PipelineRunResult", "run_actions",
           "run_local", "run_pipeline"]

FAULT_ENV = "TRAINSCHED_PIPELINE_FAULT"


# --- running a schedule's actions -----------------------------------------------------------------

Key = tuple[str, int, int]  # ("F" activation into stage s | "B" gradient into stage s, s, m)


def run_actions(rank: int, schedule: Schedule, stages: Mapping[int, PipelineStage],
                inputs: Sequence[Sequence[Any]],
                send: Callable[[Key, int, list[Any]], None],
                recv: Callable[[Key, int, Sequence[Any]], list[Any]],
                before: Callable[[int], None] | None = None) -> None:
    """Run rank ``rank``'s compute actions of ``schedule`` in order on its ``stages``.

    Communication is derived from them: ``F`` of stage ``s > 0`` receives its inputs from the
    rank of stage ``s - 1`` and sends its outputs to the rank of ``s + 1``; ``B``/``I`` receive
    output gradients from there and send input gradients back. Explicit ``SEND_*``/``RECV_*``,
    stage-level actions and idle slots are skipped. ``inputs[m]`` is micro-batch ``m`` as stage
    0's flat inputs; ``before(k)`` is called before the ``k``-th compute action.
    """
    where, last = schedule.stage_to_rank, schedule.num_stages - 1
    for k, a in enumerate(x for x in schedule.ranks[rank] if x and x.kind in COMPUTE_KINDS):
        if before is not None:
            before(k)
        s, m = a.stage, a.microbatch
        assert m is not None
        stage = stages[s]
        if a.kind == "F":
            x = inputs[m] if s == 0 else recv(("F", s, m), where[s - 1], stage.input_specs)
            y = stage.forward(m, x)
            if s < last:
                send(("F", s + 1, m), where[s + 1], y)
        elif a.kind in ("B", "I"):
            g = [] if s == last else recv(("B", s, m), where[s + 1], stage.grad_specs)
            run = stage.backward if a.kind == "B" else stage.backward_input
            dx = run(m, g)
            if s > 0:
                send(("B", s - 1, m), where[s - 1], dx)
        else:
            stage.backward_weight(m)


def run_local(stages: Sequence[PipelineStage], schedule: Schedule,
              microbatches: Sequence[tuple[tuple, dict]], *, timeout_s: float = 120.0,
              measure_memory: bool = False) -> tuple[int, ...] | None:
    """Run one step of ``schedule`` on ``stages`` in this process: a thread per rank, messages
    through a shared mailbox. Gradients accumulate on the model; no optimizer step. With
    ``measure_memory``, returns each rank's peak activation bytes (module docstring)."""
    from trainsched.runtime.stage_modules import flat_microbatches

    schedule.validate()
    if len(stages) != schedule.num_stages:
        raise TrainschedError(f"{len(stages)} stages for a schedule of {schedule.num_stages}")
    inputs = flat_microbatches(stages[0], microbatches)
    box: dict[Key, list[Any]] = {}
    cond = threading.Condition()
    errors: list[BaseException] = []

    def send(key: Key, _dst: int, tensors: list[Any]) -> None:
        with cond:
            box[key] = tensors
            cond.notify_all()

    def recv(key: Key, _src: int, _specs: Sequence[Any]) -> list[Any]:
        with cond:
            if not cond.wait_for(lambda: key in box or bool(errors), timeout=timeout_s):
                raise TrainschedError(f"no message {key} within {timeout_s:g} s")
            if errors:
                raise TrainschedError("another rank failed")
            return box.pop(key)

    meters = [_meter(stages) if measure_memory else None for _ in range(schedule.num_ranks)]

    def rank_main(r: int) -> None:
        owned = {s: stages[s] for s in range(schedule.num_stages) if schedule.stage_to_rank[s] == r}
        for st in owned.values():
            st.meter = meters[r]
        try:
            run_actions(r, schedule, owned, inputs, send, recv)
        except BaseException as exc:
            with cond:
                errors.append(exc)
                cond.notify_all()

    threads = [threading.Thread(target=rank_main, args=(r,), daemon=True)
               for r in range(schedule.num_ranks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for st in stages:
        st.meter = None
    if errors:
        raise errors[0]
    return tuple(m.peak_bytes for m in meters) if measure_memory else None  # type: ignore


def _meter(stages: Sequence[PipelineStage]) -> Any:
    """A meter leaving out the model's parameters and buffers (resident all step)."""
    from trainsched.runtime.saved_memory import SavedTensorMeter

    model = stages[0].model
    return SavedTensorMeter(exclude=[*model.parameters(), *model.buffers()])


# --- real processes ------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class PipelineRunResult:
    """What :func:`run_pipeline` measured.

    ``step_times_s``: per step after warm-up, the largest wall time over the ranks.
    ``losses``: every step's loss (warm-up included), the sum over its micro-batches.
    ``gradients``: with ``return_gradients``, the first step's gradient of every parameter a
    stage owns, by name, before the optimizer step (torch tensors).
    ``peak_activation_bytes``: with ``measure_memory``, per rank, the largest peak of
    activation bytes over the timed steps (module docstring).
    """

    model: str
    num_ranks: int
    num_stages: int
    num_microbatches: int
    batch_size: int
    optimizer: str
    step_times_s: tuple[float, ...]
    losses: tuple[float, ...]
    gradients: Mapping[str, Any] | None = None
    host: Mapping[str, Any] = field(default_factory=dict)
    peak_activation_bytes: tuple[int, ...] | None = None

    @property
    def median_s(self) -> float:
        return statistics.median(self.step_times_s)

    def quantile_s(self, q: float) -> float:
        """The ``q`` quantile of the step times, linear between order statistics."""
        return quantile(self.step_times_s, q)

    @property
    def p10_s(self) -> float:
        return self.quantile_s(0.1)

    @property
    def p90_s(self) -> float:
        return self.quantile_s(0.9)

    def to_dict(self) -> dict[str, Any]:
        """The numbers, JSON-ready (gradients left out)."""
        return {"model": self.model, "num_ranks": self.num_ranks, "num_stages": self.num_stages,
                "num_microbatches": self.num_microbatches, "batch_size": self.batch_size,
                "optimizer": self.optimizer, "median_s": self.median_s, "p10_s": self.p10_s,
                "p90_s": self.p90_s, "step_times_s": list(self.step_times_s),
                "losses": list(self.losses), "host": dict(self.host),
                "peak_activation_bytes": None if self.peak_activation_bytes is None
                else list(self.peak_activation_bytes)}


def run_pipeline(model: str, stages: Sequence[Sequence[str]], schedule: Schedule, *,
                 steps: int = 10, warmup: int = 2, batch_size: int | None = None,
                 image_size: int | None = None, seq_len: int | None = None,
                 optimizer: str = "sgd", lr: float = 0.01, seed: int = 0,
                 timeout_s: float = 600.0, return_gradients: bool = False,
                 measure_memory: bool = False) -> PipelineRunResult:
    """Train zoo model ``model`` cut into ``stages`` with ``schedule`` on
    ``schedule.num_ranks`` gloo processes and time ``steps`` steps after ``warmup``."""
    if not isinstance(schedule, Schedule):
        raise TrainschedError(f"schedule must be a trainsched.plan.Schedule, got "
                              f"{type(schedule).__name__}")
    schedule.validate()
    if isinstance(stages, str) or len(stages) != schedule.num_stages:
        count = "a string" if isinstance(stages, str) else f"{len(stages)} stage(s)"
        raise TrainschedError(f"{count} given for a schedule of {schedule.num_stages} stages; "
                              "give one tuple of op names per stage")
    stage_lists = []
    for s, names in enumerate(stages):
        if isinstance(names, str) or not all(isinstance(n, str) for n in names):
            raise TrainschedError(f"stage {s} must be a sequence of op names, got {names!r}")
        stage_lists.append(list(names))
    for name, value, low in (("steps", steps, 1), ("warmup", warmup, 0)):
        if not (isinstance(value, int) and not isinstance(value, bool) and value >= low):
            raise TrainschedError(f"{name} must be an integer >= {low}, got {value!r}")
    if optimizer not in OPTIMIZERS:
        raise TrainschedError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got "
                              f"{optimizer!r}")
    if batch_size is not None and batch_size < 1:
        raise TrainschedError(f"batch size must be at least 1, got {batch_size}")
    if batch_size is not None and batch_size % schedule.num_microbatches:
        raise TrainschedError(f"batch size {batch_size} is not divisible by "
                              f"{schedule.num_microbatches} micro-batches; use a batch size that "
                              "is a multiple of the number of micro-batches")
    nproc = schedule.num_ranks
    config = {"model": model, "batch_size": batch_size, "image_size": image_size,
              "seq_len": seq_len, "seed": seed, "stages": stage_lists,
              "schedule": schedule.to_text(), "num_stages": schedule.num_stages,
              "num_microbatches": schedule.num_microbatches,
              "stage_to_rank": list(schedule.stage_to_rank or ()), "nproc": nproc,
              "steps": steps, "warmup": warmup, "optimizer": optimizer, "lr": lr,
              "port": free_port(), "timeout_s": float(timeout_s),
              "return_gradients": bool(return_gradients),
              "measure_memory": bool(measure_memory)}
    with job("trainsched.runtime.pipeline:worker_main", config, nproc, timeout_s=timeout_s,
             what="the pipeline") as tmpdir:
        data = json.loads((tmpdir / "rank0.json").read_text())
        gradients = None
        if return_gradients:
            import torch

            gradients = {}
            for r in range(nproc):
                gradients.update(torch.load(tmpdir / f"rank{r}.grads.pt"))
    return PipelineRunResult(
        model=data["model"], num_ranks=nproc, num_stages=schedule.num_stages,
        num_microbatches=schedule.num_microbatches, batch_size=data["batch_size"],
        optimizer=optimizer, step_times_s=tuple(data["step_times_s"][warmup:]),
        losses=tuple(data["losses"]), gradients=gradients, host=data["host"],
        peak_activation_bytes=None if data.get("peaks") is None else tuple(data["peaks"]))


# --- the workers ------------------------------------------------------------------------------


def worker_main() -> None:  # pragma: no cover - runs in the spawned processes
    """A worker's entry point: its JSON config is ``sys.argv[1]``; rank 0 writes the result."""
    serve_worker(_work)


def _fault(rank: int) -> int | None:
    """The action index before which this rank must die (``FAULT_ENV``), if any."""
    text = os.environ.get(FAULT_ENV, "")
    if not text:
        return None
    who, _, at = text.partition(":")
    return int(at or 0) if int(who) == rank else None


class GlooMailbox:
    """Point-to-point messages of one rank: ``isend`` (waited for at the end of the step) and
    blocking ``irecv``, one tag per tensor; messages to a stage on this rank stay in memory.
    ``width`` is the most tensors one message carries. Its ``send``/``recv`` are what
    :func:`run_actions` takes; :meth:`flush` waits for the sends at the end of a step."""

    def __init__(self, rank: int, num_stages: int, num_microbatches: int, width: int) -> None:
        self.rank, self.sizes = rank, (num_stages, num_microbatches, width)
        self.pending: list[tuple[Any, Any]] = []
        self.local: dict[tuple[str, int, int], list[Any]] = {}

    def tag(self, key: tuple[str, int, int], index: int) -> int:
        kind, stage, mb = key
        stages, mbs, width = self.sizes
        return (((kind == "B") * stages + stage) * mbs + mb) * width + index

    def send(self, key: tuple[str, int, int], dst: int, tensors: list[Any]) -> None:
        import torch.distributed as dist

        if dst == self.rank:
            self.local[key] = tensors
            return
        for i, t in enumerate(tensors):
            t = t.detach().contiguous()
            self.pending.append((dist.isend(t, dst, tag=self.tag(key, i)), t))

    def recv(self, key: tuple[str, int, int], src: int, specs: Sequence[Any]) -> list[Any]:
        import torch
        import torch.distributed as dist

        if src == self.rank:
            return self.local.pop(key)
        bufs = [torch.empty(shape, dtype=dtype) for shape, dtype in specs]
        works = [dist.irecv(b, src, tag=self.tag(key, i)) for i, b in enumerate(bufs)]
        for w in works:
            w.wait()
        return bufs

    def flush(self) -> None:
        for work, _tensor in self.pending:
            work.wait()
        self.pending.clear()


def _work(cfg: dict[str, Any]) -> dict[str, Any]:  # pragma: no cover - in the workers
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from trainsched.capture.zoo import build
    from trainsched.runtime.stage_modules import (
        build_stages,
        flat_microbatches,
        split_microbatches,
    )

    torch.set_num_threads(1)
    rank, n = int(cfg["rank"]), int(cfg["nproc"])
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{cfg['port']}", rank=rank,
                            world_size=n, timeout=timedelta(seconds=cfg["timeout_s"]))
    schedule = Schedule.from_text(cfg["schedule"], num_stages=cfg["num_stages"],
                                  num_microbatches=cfg["num_microbatches"],
                                  stage_to_rank=cfg["stage_to_rank"] or None)
    m = schedule.num_microbatches
    zoo = build(cfg["model"], batch_size=cfg["batch_size"], image_size=cfg["image_size"],
                seq_len=cfg["seq_len"], seed=cfg["seed"])
    micro = split_microbatches(zoo.args, zoo.kwargs, m)
    stages = build_stages(zoo.model, cfg["stages"], micro[0][0], micro[0][1],
                          num_microbatches=m)
    owned = {s: stages[s] for s in range(len(stages)) if schedule.stage_to_rank[s] == rank}
    inputs = flat_microbatches(stages[0], micro) if 0 in owned else []
    params = list({id(p): p for st in owned.values() for p in st.parameters.values()}.values())
    opt = None
    if params:
        opt = make_optimizer(cfg["optimizer"], params, cfg["lr"])
    meter = _meter(stages) if cfg.get("measure_memory") else None
    for st in owned.values():
        st.meter = meter
    peak = torch.zeros(n, dtype=torch.int64)
    width = max(len(st.input_names) for st in stages) + 1
    gloo = GlooMailbox(rank, len(stages), m, width)
    fault = _fault(rank)

    def die(k: int) -> None:
        if k == fault:
            sys.stdout.flush()
            os._exit(3)

    total = cfg["warmup"] + cfg["steps"]
    times, losses = torch.zeros(total, dtype=torch.float64), torch.zeros(total, dtype=torch.float64)
    for step in range(total):
        dist.barrier()
        if meter is not None:
            meter.reset_peak()
        start = time.perf_counter()
        run_actions(rank, schedule, owned, inputs, gloo.send, gloo.recv,
                    before=die if step == 0 and fault is not None else None)
        gloo.flush()
        paused = 0.0
        if step == 0 and cfg["return_gradients"]:
            began = time.perf_counter()
            grads = {f: p.grad.detach().clone() for st in owned.values()
                     for f, p in st.parameters.items() if p.grad is not None}
            torch.save(grads, Path(cfg["out"]) / f"rank{rank}.grads.pt")
            paused = time.perf_counter() - began
        if opt is not None:
            opt.step()
            opt.zero_grad(set_to_none=True)
        times[step] = time.perf_counter() - start - paused
        if meter is not None and step >= cfg["warmup"]:
            peak[rank] = max(int(peak[rank]), meter.peak_bytes)
        last = owned.get(len(stages) - 1)
        if last is not None:
            losses[step] = sum(last.losses.values())
            last.losses.clear()
    dist.all_reduce(times, op=dist.ReduceOp.MAX)
    dist.all_reduce(losses)
    dist.all_reduce(peak)   # each rank filled its own entry
    host = {"torch": torch.__version__, "threads": torch.get_num_threads(),
            "python": sys.version.split()[0], "cpu_count": os.cpu_count()}
    return {"model": zoo.name, "batch_size": zoo.batch_size, "host": host,
            "step_times_s": times.tolist(), "losses": losses.tolist(),
            "peaks": peak.tolist() if meter is not None else None}
