"""``run(plan)``: the runtime's one entry, the twin of :func:`trainsched.sim.simulate`.

The plan that the simulator scored is the plan that runs, on this host's processes:

- single device: one worker trains the model (forward, backward, optimizer step);
- placed: one worker runs :class:`~trainsched.runtime.placed.PlacedModule` with the plan's
  placement (logical devices on the CPU here: correct, not faster; on GPUs, timed per device);
- data parallel: ``plan.ranks`` gloo workers; ``ddp`` is stock ``DistributedDataParallel``
  with the plan's bucket size, every other policy runs on
  :class:`~trainsched.runtime.data_parallel.ScheduledDataParallel` with the plan's policy
  object and collective order;
- pipeline: one worker per schedule rank runs the plan's actions
  (:func:`trainsched.runtime.pipeline.run_pipeline`);
- data parallel with a sync policy other than BSP (``bsp:0.5,asp:0.5``, ``ssp(s=4)``,
  ``bsp;straggler(relax)``): the sync runtime (:func:`trainsched.runtime.sync.run_sync`) trains
  the model on data generated in code (:class:`~trainsched.runtime.tasks.ZooTask`) with the
  plan's ranks, batch and policy, switching protocols in process; its BSP phases average the
  gradients with one flat all-reduce (the plan's comm policy is not applied there).

The model is rebuilt from the zoo by the name and input sizes the plan records (or the ones
given). Every run reports the step times after the warm-up (median, p10, p90) as
:class:`RunResult`; the parent process never imports torch.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainsched.errors import TrainschedError
from trainsched.plan import DataParallelPlan, PipelinePlan, PlacedPlan, Plan, SinglePlan
from trainsched.runtime.launch import quantile

__all__ = ["RunResult", "data_parallel_segment", "interleaved_trial", "policy_segment", "run",
           "runnable", "write_steps_trace"]

MiB = 1 << 20
TRAINING_SUFFIXES = ("dX", "dW", "opt")  # the training transform's op names: forward op + ":dX"


@dataclass(frozen=True, kw_only=True)
class RunResult:
    """What running a plan measured: the step times after the warm-up (seconds), the samples
    one step processes, and the ranks that ran it. A sync plan's run (module docstring) gives
    worker 0's mean time per batch in each phase as its step times, and the whole
    :class:`~trainsched.runtime.sync.SyncRunResult` (phases, switches, held-out curve) as
    ``sync``."""

    kind: str
    model: str
    ranks: int
    samples_per_step: int
    step_times_s: tuple[float, ...]
    peak_memory_bytes: int | None = None
    sync: Any = None

    @property
    def median_s(self) -> float:
        return statistics.median(self.step_times_s)

    @property
    def mean_s(self) -> float:
        """The timed steps' total time over their count: what a step costs a run of them, and
        what a prediction of the expected step is compared with."""
        return sum(self.step_times_s) / len(self.step_times_s)

    @property
    def p10_s(self) -> float:
        return quantile(self.step_times_s, 0.1)

    @property
    def p90_s(self) -> float:
        return quantile(self.step_times_s, 0.9)

    @property
    def samples_per_s(self) -> float:
        """Samples over the timed steps' total time: what a run of them achieves (a median
        step would miss the slow ones of a host whose steps are bimodal)."""
        return self.samples_per_step / self.mean_s

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "model": self.model, "ranks": self.ranks,
                "samples_per_step": self.samples_per_step, "mean_s": self.mean_s,
                "median_s": self.median_s,
                "p10_s": self.p10_s, "p90_s": self.p90_s, "samples_per_s": self.samples_per_s,
                "peak_memory_bytes": self.peak_memory_bytes,
                "step_times_s": list(self.step_times_s),
                **({"sync": self.sync.to_json()} if self.sync is not None else {})}


def runnable(plan: Plan, model: str | None = None) -> str | None:
    """Why this host cannot run ``plan`` (``None``: it can): the model must be one the zoo
    builds (a name or ``file.py:function``), and every rank needs a core of its own."""
    import os

    from trainsched.capture.zoo import MODELS

    name = model or plan.model.name
    if name not in MODELS and ":" not in name:
        return f"model {name!r} is not in the zoo (trainsched models lists it)"
    pending = _not_run_yet(plan)
    if pending is not None:
        return pending
    cores = os.cpu_count() or 1
    if plan.devices > cores:
        return f"needs {plan.devices} ranks; this host has {cores} core{'s' if cores != 1 else ''}"
    return None


def _not_run_yet(plan: Plan) -> str | None:
    """Why the runtime cannot run ``plan``'s backprop order (``None``: it can), so that no run
    silently measures in-order backprop under another name. Reverse-first-k runs on the
    scheduled runtime's split backward; a single-device plan's dW slots run through
    :class:`~trainsched.runtime.split.SlottedModel` (on this CPU runtime one stream: the slots'
    order without overlap, and :func:`run` says so)."""
    if isinstance(plan, DataParallelPlan) and plan.backprop not in ("inorder", "ooo"):
        return f"backprop {plan.backprop!r} is simulated only: the runtime does not run it"
    if isinstance(plan, DataParallelPlan) and plan.sync != "bsp" and plan.backprop != "inorder":
        return (f"backprop {plan.backprop!r} with sync policy {plan.sync!r}: the sync runtime "
                f"runs backprop in order; make the plan with in-order backprop")
    return None


def policy_segment(policy: Any, *, label: str, order: str = "leader", steps: int,
                   warmup: int, backprop_k: int = 0) -> Any:
    """The runtime's segment for any comm policy object: DDP's buckets on stock
    ``DistributedDataParallel``, every other policy on ``ScheduledDataParallel`` (its class
    and fields travel to the workers). ``backprop_k``: out-of-order backprop, reverse-first-k
    (``ScheduledDataParallel``'s; 0 = in order; refused with DDP's buckets)."""
    from trainsched.comm.policy import DdpBucketPolicy, policy_to_json
    from trainsched.runtime.train import Segment

    if isinstance(policy, DdpBucketPolicy):
        return Segment(label=label, kind="ddp", bucket_mb=policy.bucket_bytes / MiB,
                       steps=steps, warmup=warmup, backprop_k=backprop_k)
    doc = policy_to_json(policy)
    return Segment(label=label, kind="sdp", policy_class=doc["class"],
                   policy_fields=doc["fields"], order=order, steps=steps, warmup=warmup,
                   backprop_k=backprop_k)


def data_parallel_segment(plan: DataParallelPlan, *, label: str, steps: int,
                          warmup: int) -> Any:
    """The segment :func:`run` times for a data-parallel ``plan`` (its policy, collective
    order and out-of-order backprop), labelled ``label``: a benchmark that interleaves it
    with other segments in one job times exactly what :func:`run` would."""
    pending = _not_run_yet(plan)
    if pending is None and plan.sync != "bsp":
        pending = (f"sync policy {plan.sync!r} trains on the sync runtime (run(plan) does "
                   f"that), not as a data-parallel segment")
    if pending is not None:
        raise TrainschedError(f"cannot run this plan: {pending}")
    return policy_segment(plan.policy, label=label, order=plan.order, steps=steps,
                          warmup=warmup, backprop_k=plan.k if plan.backprop == "ooo" else 0)


def interleaved_trial(model: str, plans: Mapping[str, DataParallelPlan], *, rounds: int,
                      steps: int, warmup: int = 2, **common: Any
                      ) -> dict[str, tuple[float, ...]]:
    """Time data-parallel ``plans`` of ``model`` (by name) on the same ranks, interleaved in
    one job: ``rounds`` rounds, each running every plan for ``warmup`` + ``steps`` steps, the
    order rotated by one each round so that drift favours none. Returns each plan's median step
    time per round. ``common``: :func:`~trainsched.runtime.train.run_segments`'s sizes,
    optimizer, learning rate and timeout."""
    from trainsched.runtime.train import run_segments

    names = list(plans)
    if len(names) < 2 or len({p.ranks for p in plans.values()}) != 1:
        raise TrainschedError(f"a trial compares at least two plans on the same ranks, got "
                              f"{', '.join(f'{n} ({p.ranks} ranks)' for n, p in plans.items())}")
    if rounds < 1 or steps < 1:
        raise TrainschedError(f"a trial needs rounds and steps >= 1, got {rounds} and {steps}")
    segments = []
    for r in range(rounds):
        for k in range(len(names)):
            name = names[(r + k) % len(names)]
            segments.append(data_parallel_segment(plans[name], label=f"{name} {r}",
                                                  steps=steps, warmup=warmup))
    result = run_segments(model, segments, nproc=plans[names[0]].ranks, **common)
    medians = {s.label: s.median_s for s in result.segments}
    return {n: tuple(medians[f"{n} {r}"] for r in range(rounds)) for n in names}


def run(plan: Plan, model: str | None = None, *, steps: int = 10, warmup: int = 2,
        batch_size: int | None = None, image_size: int | None = None,
        seq_len: int | None = None, optimizer: str = "sgd", lr: float = 0.01,
        timeout_s: float = 900.0, timeline_dir: str | None = None) -> RunResult | None:
    """Run ``plan`` for ``warmup`` + ``steps`` steps and measure them (module docstring).
    ``model`` defaults to the plan's; the input sizes to the ones the plan was made at.

    Under ``torchrun`` this process is one rank of the job (its process group from
    ``env://``): the job's world size must be the plan's ranks; rank 0 returns the result and
    the other ranks ``None``. Elsewhere trainsched starts the ranks itself on this host.

    ``timeline_dir``: write ``steps.trace.json`` there (the measured steps, back to back, in
    the simulator's trace layout), and for a plan on ``ScheduledDataParallel`` also each
    rank's timeline of its first 3 timed steps (``rank<r>.trace.json``: compute, updates,
    queued and running collectives).

    A data-parallel plan whose sync policy is not BSP trains ``warmup + steps`` steps' worth
    of samples (``ranks x batch`` each, rounded up to the phases' common update size) on the
    sync runtime, cut into the policy's phases; ``optimizer`` ``momentum`` is SGD with
    momentum 0.9 there, and no timeline is written."""
    from trainsched.runtime.launch import torchrun_rank
    from trainsched.runtime.train import Segment, run_segments, run_segments_here

    pending = _not_run_yet(plan)
    if pending is not None:
        raise TrainschedError(f"cannot run this plan: {pending}")
    ref = plan.model
    name = model or ref.name
    if model is not None and model != ref.name:
        raise TrainschedError(f"the plan was made for model {ref.name!r}, not {model!r}; give "
                              f"{ref.name} or make a plan for {model} (trainsched compare)")
    sizes = {"batch_size": batch_size or ref.batch_size,
             "image_size": image_size or ref.image_size, "seq_len": seq_len or ref.seq_len}
    common = {**sizes, "optimizer": optimizer, "lr": lr, "timeout_s": timeout_s}
    if isinstance(plan, DataParallelPlan) and plan.sync != "bsp":
        if timeline_dir is not None:
            raise TrainschedError("the sync runtime records no per-step timeline; drop the "
                                  "timeline directory (train --trace-dir)")
        return _run_sync_plan(plan, name, steps=warmup + steps, **common)
    if isinstance(plan, PipelinePlan):
        from trainsched.runtime.pipeline import run_pipeline

        if torchrun_rank() is not None:
            raise TrainschedError("pipeline plans run with trainsched's own launcher for now; "
                                  "run the plan without torchrun")
        measured = run_pipeline(name, plan.stages, plan.schedule, steps=steps, warmup=warmup,
                                **common)
        return _traced(RunResult(kind=plan.kind, model=measured.model, ranks=plan.devices,
                                 samples_per_step=measured.batch_size,
                                 step_times_s=tuple(measured.step_times_s)), timeline_dir)
    if isinstance(plan, SinglePlan):
        if plan.slots:
            import sys

            print("trainsched: note: the plan's dW slots overlap weight gradients on a second "
                  "CUDA stream; this runtime runs on the CPU, one stream, so they run in their "
                  "slots' order without overlapping", file=sys.stderr, flush=True)
        segment = Segment(label="single", kind="compute", steps=steps, warmup=warmup,
                          slots=[str(s) for s in plan.slots] or None)
        ranks = 1
    elif isinstance(plan, PlacedPlan):
        # Backward and optimizer ops (``op:dX``, ``op:dW``, ``op:opt``) run where autograd
        # and the parameters put them: with their forward op, as the placers place them.
        forward = {n: d for n, d in plan.placement.device_of.items()
                   if n.rpartition(":")[2] not in TRAINING_SUFFIXES}
        order = plan.placement.order
        segment = Segment(label="placed", kind="placed", steps=steps, warmup=warmup,
                          placement=forward, placement_order=None if order is None
                          else [n for n in order if n in forward])
        ranks = 1
    elif isinstance(plan, DataParallelPlan):
        segment = data_parallel_segment(plan, label=plan.comm, steps=steps, warmup=warmup)
        if segment.kind == "sdp" and timeline_dir is not None:
            segment = dataclasses.replace(segment, timeline_dir=str(timeline_dir))
        ranks = plan.ranks
    else:
        raise TrainschedError(f"not a plan: {type(plan).__name__}")
    launched = torchrun_rank()
    if launched is None:
        result = run_segments(name, [segment], nproc=ranks, **common)
    else:
        rank, world = launched
        if world != ranks:
            raise TrainschedError(f"the plan runs on {ranks} rank{'s' if ranks > 1 else ''} but "
                                  f"torchrun started {world}; use torchrun --nproc-per-node "
                                  f"{ranks} (times --nnodes)")
        here = run_segments_here(name, [segment], rank=rank, world_size=world, **common)
        if here is None:
            return None
        result = here
    return _traced(RunResult(kind=plan.kind, model=result.model, ranks=ranks,
                             samples_per_step=ranks * result.batch_size,
                             step_times_s=tuple(result.first.step_times_s)), timeline_dir)


def _run_sync_plan(plan: DataParallelPlan, name: str, *, steps: int,
                   batch_size: int | None, image_size: int | None, seq_len: int | None,
                   optimizer: str, lr: float, timeout_s: float) -> RunResult | None:
    """A data-parallel plan with a sync policy other than BSP, on the sync runtime: the model
    on its :class:`~trainsched.runtime.tasks.ZooTask`, ``steps`` BSP-sized steps of
    ``ranks x batch`` samples (rounded up to the phases' common update size) cut into the
    policy's phases."""
    import sys

    from trainsched.comm.policy import comm_policy
    from trainsched.runtime.optim import check_optimizer
    from trainsched.runtime.sync import phase_quantum, policy_phases, run_sync
    from trainsched.runtime.tasks import ZooTask
    from trainsched.sync import parse_policy

    if batch_size is None:
        raise TrainschedError(f"the plan records no batch size, and the sync runtime needs "
                              f"one to cut the policy {plan.sync!r} into phases; give "
                              f"batch_size (--batch-size)")
    check_optimizer(optimizer)
    policy = parse_policy(plan.sync)
    ranks = plan.ranks
    quantum = phase_quantum(policy.protocols, ranks, batch_size)
    total = -(-steps * ranks * batch_size // quantum) * quantum
    phases = policy_phases(policy, total, ranks=ranks, batch_per_rank=batch_size)
    print(f"trainsched: note: sync policy {plan.sync}: the sync runtime trains {name} on "
          f"synthetic data for {total} samples; its BSP phases reduce gradients with comm "
          f"policy {plan.comm}", file=sys.stderr, flush=True)
    task = ZooTask(model=name, image_size=image_size, seq_len=seq_len)
    result = run_sync(task, phases, ranks=ranks, batch_per_rank=batch_size, lr=lr,
                      momentum=0.9 if optimizer == "momentum" else 0.0,
                      optimizer="adam" if optimizer == "adam" else "sgd",
                      straggler_policy=policy.straggler, timeout_s=min(timeout_s, 120.0),
                      deadline_s=timeout_s,
                      servers=plan.servers if plan.sync_policy.uses_servers else 1,
                      comm=plan.comm if plan.policy == comm_policy(plan.comm) else plan.policy,
                      comm_order=plan.order)
    if result is None:  # a rank of a torchrun job other than worker 0
        return None
    step_times = tuple(p.step_s for p in result.phases if p.step_s is not None)
    return RunResult(kind=plan.kind, model=name, ranks=ranks,
                     samples_per_step=ranks * batch_size, step_times_s=step_times,
                     sync=result)


def _traced(result: RunResult, timeline_dir: str | None) -> RunResult:
    """Write ``result``'s steps as ``timeline_dir/steps.trace.json`` (when given)."""
    if timeline_dir is not None:
        write_steps_trace(Path(timeline_dir) / "steps.trace.json", result)
    return result


def write_steps_trace(path: str | os.PathLike[str], result: RunResult) -> None:
    """The measured steps as a Chrome trace in the simulator's layout: process ``rank0``,
    thread ``rank0/step``, one slice per timed step laid back to back (the time a step took,
    rank 0's, or the slowest rank's for a pipeline)."""
    from trainsched.trace import (
        TraceEvents,
        stream_name,
        trace_document,
        trace_text,
        write_trace_text,
    )

    events = TraceEvents()
    events.process(1, "rank0")
    tid = 2
    events.thread(1, tid, stream_name("rank0", "step"))
    start = 0.0
    for k, step_s in enumerate(result.step_times_s):
        events.slice(1, tid, name=f"step {k}", cat="step", start_s=start, end_s=start + step_s,
                     args={"step": k, "samples": result.samples_per_step})
        start += step_s
    document = trace_document(events, title=f"{result.model} {result.kind} (measured)",
                              other={"kind": result.kind, "ranks": result.ranks,
                                     "median_s": result.median_s})
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    write_trace_text(path, trace_text(document))
