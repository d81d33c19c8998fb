"""What the pipeline runtime itself costs on this host, per action and per message.

A pipeline action (``F``, ``B``, ``I`` or ``W`` of one micro-batch on one stage) takes its ops'
time plus the runtime's own work around them: the stage's Python, the autograd calls, the
bookkeeping of saved tensors. A point-to-point message takes the host time of posting it. On a
GPU that work hides behind the kernels; on a CPU host, where a small model's ops take
microseconds, it is most of the step. The simulator charges the two as
``DeviceSpec.microbatch_overhead_s`` and ``DeviceSpec.message_host_s``.

:func:`pipeline_host_times` measures both inside ``trainsched calibrate``'s workers: ranks 0 and
1 run GPipe over a model whose ops take a few microseconds (the zoo's MLP at width 16, one
example per micro-batch) cut into two stages by the same code that runs real pipeline plans,
with every action, every send posted and every receive collected timed. Every action's time
counts as overhead (the ops inside are a few percent of it); a message's host time is the mean of
posting it and collecting it, because the simulator charges it once on each side.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

__all__ = ["MICROBATCHES", "TimedStage", "pipeline_host_times"]

MICROBATCHES = 8  # GPipe over 2 stages: 8 F and 8 B per rank and step
WIDTH = 16


class TimedStage:
    """A pipeline stage whose compute actions are timed: ``record[kind]`` gets the seconds of
    each ``F``, ``B``, ``I`` and ``W`` it runs."""

    def __init__(self, stage: Any, record: dict[str, list[float]]) -> None:
        self._stage, self._record = stage, record

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stage, name)

    def _timed(self, kind: str, fn: Callable[..., Any], *args: Any) -> Any:
        began = time.perf_counter()
        out = fn(*args)
        self._record.setdefault(kind, []).append(time.perf_counter() - began)
        return out

    def forward(self, microbatch: int, inputs: Any) -> Any:
        return self._timed("F", self._stage.forward, microbatch, inputs)

    def backward(self, microbatch: int, grads: Any) -> Any:
        return self._timed("B", self._stage.backward, microbatch, grads)

    def backward_input(self, microbatch: int, grads: Any) -> Any:
        return self._timed("I", self._stage.backward_input, microbatch, grads)

    def backward_weight(self, microbatch: int) -> Any:
        return self._timed("W", self._stage.backward_weight, microbatch)


def pipeline_host_times(rank: int, world_size: int, *, steps: int = 10,
                        warmup: int = 2) -> tuple[float, float]:  # pragma: no cover - workers
    """``(seconds per action, seconds per message)`` of the pipeline runtime on this host
    (module docstring), the same on every rank: the means over ranks 0 and 1 of the median
    action and of the median send and receive. A receive waits for its message too, but the
    median one finds it there: GPipe's ranks wait at the first and last micro-batches. Call
    it on every rank of an initialised gloo group of ``world_size`` >= 2 processes at once;
    ranks above 1 only wait."""
    import torch
    import torch.distributed as dist

    from trainsched.backprop.schedules import build_schedule
    from trainsched.backprop.stages import stage_costs_from_graph
    from trainsched.capture import capture
    from trainsched.capture.zoo import MLP
    from trainsched.graph import to_training
    from trainsched.runtime.pipeline import GlooMailbox, run_actions
    from trainsched.runtime.stage_modules import (
        build_stages,
        flat_microbatches,
        split_microbatches,
    )

    figures = torch.zeros(2, dtype=torch.float64)
    if rank < 2:
        torch.manual_seed(0)
        model = MLP(width=WIDTH)
        x = torch.randn(MICROBATCHES, WIDTH)
        graph = to_training(capture(model, (x,), costs="static"))
        cut = stage_costs_from_graph(graph, 2, MICROBATCHES, cut="params").ops
        micro = split_microbatches((x,), {}, MICROBATCHES)
        stages = build_stages(model, cut, *micro[0], num_microbatches=MICROBATCHES)
        record: dict[str, list[float]] = {}
        owned = {rank: TimedStage(stages[rank], record)}
        inputs = flat_microbatches(stages[0], micro) if rank == 0 else []
        schedule = build_schedule("gpipe", 2, MICROBATCHES)
        width = max(len(st.input_names) for st in stages) + 1
        sends: list[float] = []
        receives: list[float] = []
        group = dist.new_group([0, 1]) if world_size > 2 else None
        for step in range(warmup + steps):
            if step == warmup:
                record.clear()
                sends.clear()
                receives.clear()
            dist.barrier(group=group)
            mailbox = GlooMailbox(rank, 2, MICROBATCHES, width)

            def send(key: Any, dst: int, tensors: list[Any], post: Any = mailbox.send) -> None:
                began = time.perf_counter()
                post(key, dst, tensors)
                sends.append(time.perf_counter() - began)

            def recv(key: Any, src: int, specs: Any, collect: Any = mailbox.recv) -> list[Any]:
                began = time.perf_counter()
                out = collect(key, src, specs)
                receives.append(time.perf_counter() - began)
                return out

            run_actions(rank, schedule, owned, inputs, send, recv)
            mailbox.flush()
            model.zero_grad(set_to_none=True)
        actions = [t for times in record.values() for t in times]
        figures[0] = statistics.median(actions)
        figures[1] = (statistics.median(sends) + statistics.median(receives)) / 2
    elif world_size > 2:
        dist.new_group([0, 1])  # every rank takes part in creating a group
    dist.all_reduce(figures)
    action_s, message_s = (float(v) / 2 for v in figures)
    return action_s, message_s
