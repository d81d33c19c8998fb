"""The pipeline executor: per-rank action lists (``0F0 0F1 0I0 0W0 ...``) on stage costs.

:func:`simulate_pipeline` takes :class:`~trainsched.backprop.stages.StageCosts` (what one
micro-batch costs on each stage), a :class:`~trainsched.plan.Schedule` and a cluster, validates
the schedule (so a deadlocking schedule is reported by :meth:`Schedule.validate`, never
simulated) and lowers it to one task graph on the engine, through the same ``_Lowering`` as the
other executors:

- every rank is a device with one compute stream that runs the rank's ``F``/``I``/``W``/``B``
  actions in list order (``B`` costs I + W); idle slots, explicit ``SEND``/``RECV`` and
  stage-level actions are accepted and ignored, because the transfers are implied;
- a stage boundary implies two transfers per micro-batch, ``{s}SEND_F{m}`` (the activation,
  after ``F(s, m)``, before ``F(s+1, m)``) and ``{s+1}SEND_B{m}`` (its gradient, after
  ``I``/``B(s+1, m)``, before ``I``/``B(s, m)``), each ``activation_bytes[s]`` and costing
  ``costs.p2p_s`` over ``cluster.link`` on the channels ``cluster.comm`` implies; between
  stages on one device they are free (a plain dependency), and without a cluster all
  communication is free;
- the last stage's ``I``/``B`` waits only for its own ``F`` (earlier on its list); ``W`` follows
  its ``I`` on the same list;
- **host time** (with a cluster): every compute action's ops take ``cluster.device.
  microbatch_stretch`` times their stage's time alone, and the action costs ``cluster.device.
  microbatch_overhead_s`` more (the runtime's per-micro-batch dispatch),
  and ``cluster.device.message_host_s`` more per point-to-point message it posts or collects
  across devices: ``F(s, m)`` receives from ``s − 1`` and sends to ``s + 1``, ``I``/``B(s, m)``
  receives from ``s + 1`` and sends to ``s − 1`` (one message per stage boundary, whatever
  the number of tensors). The stretch defaults to 1, the others to 0.

Memory per device: the ``resident_bytes`` of its stages all step. ``F(s, m)`` allocates
``saved_bytes[s]``; the share ``input_grad_only_fraction`` (default one half) that only dX needs
is freed when ``I(s, m)`` ends and the rest when ``W(s, m)`` ends (all of it when a fused ``B``
ends). Stages that say what a deferred ``W`` keeps (``stages.weight_input_bytes``: each weight
op's input and output gradient) free all of ``saved_bytes`` when ``I`` ends and hold
``weight_input_bytes[s]`` from then (the start of the rank's next action) until ``W`` ends. An
activation sent downstream is held by its producer from the start of ``F`` until its transfer
ends and by the receiver from the transfer's start until ``F(s+1, m)`` ends; gradients likewise
from the start of ``I``/``B(s+1, m)`` and until ``I``/``B(s, m)`` ends. Between stages on one
device the producer's buffer lives until the consumer ends; without a cluster the producer holds
it while it runs and the receiver from the producer's start to its own end.

The result is a :class:`PipelineResult`: a :class:`~trainsched.sim.result.SimResult` plus per
rank busy and idle compute time and ``bubble_fraction`` = idle compute of all ranks ÷ (ranks ×
step time). With uniform stages and free communication GPipe and 1F1B give
``(m + p − 1)(F + B)`` and ``(p − 1)/(m + p − 1)`` exactly.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, fields

from trainsched.backprop.stages import StageCosts
from trainsched.cluster import Cluster
from trainsched.costs import p2p_s
from trainsched.errors import TrainschedError
from trainsched.graph import gc_paused
from trainsched.plan import Schedule
from trainsched.sim.executors import _check_device, _Lowering
from trainsched.sim.result import Allocation, SimResult

__all__ = ["PipelineResult", "bubble_fraction", "simulate_pipeline"]

# The category (an op kind) of each compute action in results and traces.
CATEGORY = {"F": "forward", "I": "backward_input", "W": "backward_weight", "B": "backward"}


@dataclass(frozen=True, kw_only=True)
class PipelineResult(SimResult):
    """A simulated pipeline step: a :class:`SimResult` plus, indexed by rank,
    ``rank_devices`` (the device name of each rank), ``rank_busy_s`` (summed durations of its
    compute actions), ``rank_idle_s`` (``step_time_s − busy``) and ``bubble_fraction``
    (``Σ idle ÷ (ranks × step_time_s)``, 0 for an empty step). All are in the JSON."""

    rank_devices: tuple[str, ...]
    rank_busy_s: tuple[float, ...]
    rank_idle_s: tuple[float, ...]
    bubble_fraction: float


def bubble_fraction(result: SimResult) -> float:
    """The idle share of compute: a :class:`PipelineResult`'s own field (over ranks); for any
    other result, the compute streams' idle time ÷ (their capacity × step time)."""
    if isinstance(result, PipelineResult):
        return result.bubble_fraction
    compute = [r for r in result.resources if r.kind == "compute"]
    capacity = sum(r.capacity for r in compute)
    if not capacity or result.step_time_s <= 0:
        return 0.0
    return math.fsum(result.idle_s[r.name] for r in compute) / (capacity * result.step_time_s)


def _rank_devices(cluster: Cluster | None, ranks_to_devices: Sequence[int] | None,
                  num_ranks: int) -> list[int]:
    if ranks_to_devices is None:
        if cluster is not None and num_ranks > cluster.num_devices:
            raise TrainschedError(f"the schedule has {num_ranks} ranks but cluster "
                                  f"{cluster.name!r} has {cluster.num_devices} devices; use a "
                                  "larger cluster or pass ranks_to_devices")
        return list(range(num_ranks))
    devices = list(ranks_to_devices)
    if len(devices) != num_ranks:
        raise TrainschedError(f"ranks_to_devices has {len(devices)} entries for {num_ranks} "
                              "ranks; give one device index per rank")
    for r, d in enumerate(devices):
        if cluster is not None:
            _check_device(cluster, d, f"ranks_to_devices[{r}]")
        elif not (isinstance(d, int) and not isinstance(d, bool) and d >= 0):
            raise TrainschedError(f"ranks_to_devices[{r}]: device must be an index >= 0, "
                                  f"got {d!r}")
    return devices


def simulate_pipeline(stages: StageCosts, schedule: Schedule, cluster: Cluster | None = None, *,
                      ranks_to_devices: Sequence[int] | None = None,
                      input_grad_only_fraction: float = 0.5) -> PipelineResult:
    """Simulate one step of ``schedule`` with ``stages``' costs on ``cluster`` (module docstring).

    ``ranks_to_devices[r]`` is the cluster device of rank ``r`` (default: device ``r``); ranks
    on one device share its compute stream. ``input_grad_only_fraction`` is the share of a
    stage's saved activations freed when its ``I`` ends (the rest is freed at ``W``).
    """
    began = time.perf_counter()
    if not isinstance(stages, StageCosts):
        raise TrainschedError(f"stages must be StageCosts, got {type(stages).__name__}")
    if not isinstance(schedule, Schedule):
        raise TrainschedError(f"schedule must be a plan.Schedule, got {type(schedule).__name__}")
    if stages.num_stages != schedule.num_stages:
        raise TrainschedError(f"the stage costs have {stages.num_stages} stages but the "
                              f"schedule has {schedule.num_stages}; cut the model into as many "
                              "stages as the schedule runs")
    m_costs = stages.num_microbatches
    if m_costs is not None and m_costs != schedule.num_microbatches:
        raise TrainschedError(f"the stage costs are per micro-batch of {m_costs} but the "
                              f"schedule runs {schedule.num_microbatches} micro-batches; cost "
                              "the stages for the schedule's micro-batch count")
    fraction = input_grad_only_fraction
    if not (isinstance(fraction, int | float) and not isinstance(fraction, bool)
            and 0.0 <= fraction <= 1.0):
        raise TrainschedError(f"input_grad_only_fraction must be a number in [0, 1], "
                              f"got {fraction!r}")
    schedule.validate()
    devices = _rank_devices(cluster, ranks_to_devices, schedule.num_ranks)
    with gc_paused():
        result = _simulate(stages, schedule, cluster, devices, fraction, began)
    return result


def _simulate(stages: StageCosts, schedule: Schedule, cluster: Cluster | None,
              devices: list[int], fraction: float, began: float) -> PipelineResult:
    used = sorted(set(devices))
    local = {d: k for k, d in enumerate(used)}
    rank_dev = [local[d] for d in devices]
    low = _Lowering(cluster, used)
    tasks = low.tasks
    depend = tasks.add_dependency
    p, num_mb = schedule.num_stages, schedule.num_microbatches
    stage_dev = [rank_dev[r] for r in schedule.stage_to_rank]
    durations = {"F": stages.forward_s, "I": stages.backward_input_s,
                 "W": stages.backward_weight_s, "B": stages.backward_s}  # fmt: skip
    action_s = message_s = 0.0
    stretch = 1.0
    if cluster is not None:
        action_s = cluster.device.microbatch_overhead_s
        stretch = cluster.device.microbatch_stretch
        message_s = cluster.device.message_host_s
    # Per stage, the cross-device messages of an F (from below, to above) and of an I/B.
    crosses = [s > 0 and stage_dev[s - 1] != stage_dev[s] for s in range(p)] + [False]
    messages = {"F": [crosses[s] + crosses[s + 1] for s in range(p)],
                "W": [0] * p}  # fmt: skip
    messages["I"] = messages["B"] = messages["F"]

    # Compute: each rank's actions in list order, chained on its device's stream.
    forward_task: dict[tuple[int, int], int] = {}  # (stage, mb) -> F
    grad_task: dict[tuple[int, int], int] = {}  # (stage, mb) -> I or B: makes the gradient
    weight_task: dict[tuple[int, int], int] = {}  # (stage, mb) -> W or B: ends the backward
    position: dict[int, int] = {}  # task -> its position on its rank's list
    rank_tasks: list[list[int]] = []
    for r, row in enumerate(schedule.ranks):
        d = rank_dev[r]
        mine: list[int] = []
        for a in row:
            if a is None or a.kind not in CATEGORY:
                continue
            s, kind, mb = a.stage, a.kind, a.microbatch
            assert mb is not None
            label = f"{s}{kind}{mb}"
            took = durations[kind][s] * stretch + action_s + message_s * messages[kind][s]
            t = low.compute(label, took, d, priority=len(mine),
                            category=CATEGORY[kind],
                            args={"action": label, "rank": r, "stage": s, "microbatch": mb})
            if mine:
                depend(mine[-1], t)
            position[t] = len(mine)
            mine.append(t)
            if kind == "F":
                forward_task[s, mb] = t
            else:
                if kind != "W":
                    grad_task[s, mb] = t
                if kind != "I":
                    weight_task[s, mb] = t
        rank_tasks.append(mine)

    # Stage boundaries: an activation forward and its gradient back, per micro-batch.
    if cluster is not None:
        low.add_channels([pair for s in range(p - 1) if stage_dev[s] != stage_dev[s + 1]
                          for pair in ((stage_dev[s], stage_dev[s + 1]),
                                       (stage_dev[s + 1], stage_dev[s]))])  # fmt: skip
    alloc = low.allocations.append
    act = stages.activation_bytes
    names = low.names

    def transfer(tensor: str, size: int, src: int, dst: int, duration_s: float,
                 priority: int) -> int:
        # As _Lowering.transfer (same name, resources, args), with the cost computed once per
        # boundary: the same link and size serve every micro-batch.
        return tasks.add_task(f"{tensor}->{names[dst]}", duration_s, low.channels[src, dst],
                              priority=priority, category="comm", device=dst,
                              args={"tensor": tensor, "bytes": size, "src": names[src],
                                    "dst": names[dst]})  # fmt: skip

    for s in range(p - 1):
        a, b = stage_dev[s], stage_dev[s + 1]
        size = act[s]
        if cluster is not None and a != b:
            down = p2p_s(size, cluster.link(used[a], used[b]))
            up = p2p_s(size, cluster.link(used[b], used[a]))
        for mb in range(num_mb):
            f0, f1 = forward_task[s, mb], forward_task[s + 1, mb]
            g1, g0 = grad_task[s + 1, mb], grad_task[s, mb]
            if a == b or cluster is None:
                depend(f0, f1)
                depend(g1, g0)
                if size:
                    if a == b:  # handed over in place: the producer's buffer until its use
                        alloc(Allocation(device=a, size_bytes=size, at_task=f0,
                                         until_tasks=(f1,)))
                        alloc(Allocation(device=a, size_bytes=size, at_task=g1,
                                         until_tasks=(g0,)))
                    else:  # free communication: no transfer, a copy on each side
                        alloc(Allocation(device=a, size_bytes=size, at_task=f0,
                                         until_tasks=(f0,)))
                        alloc(Allocation(device=b, size_bytes=size, at_task=f0,
                                         until_tasks=(f1,)))
                        alloc(Allocation(device=b, size_bytes=size, at_task=g1,
                                         until_tasks=(g1,)))
                        alloc(Allocation(device=a, size_bytes=size, at_task=g1,
                                         until_tasks=(g0,)))
                continue
            x = transfer(f"{s}SEND_F{mb}", size, a, b, down, position[f1])
            depend(f0, x)
            depend(x, f1)
            y = transfer(f"{s + 1}SEND_B{mb}", size, b, a, up, position[g0])
            depend(g1, y)
            depend(y, g0)
            if size:
                alloc(Allocation(device=a, size_bytes=size, at_task=f0, until_tasks=(x,)))
                alloc(Allocation(device=b, size_bytes=size, at_task=x, until_tasks=(f1,)))
                alloc(Allocation(device=b, size_bytes=size, at_task=g1, until_tasks=(y,)))
                alloc(Allocation(device=a, size_bytes=size, at_task=y, until_tasks=(g0,)))

    # Saved activations: the dX-only share until I, the rest until W (all of it until B).
    for s in range(p):
        saved = stages.saved_bytes[s]
        kept = stages.weight_input_bytes[s] if stages.weight_input_bytes else None
        if not saved and not kept:
            continue
        d = stage_dev[s]
        at_input = int(saved * fraction)
        for mb in range(num_mb):
            f, g, w = forward_task[s, mb], grad_task[s, mb], weight_task[s, mb]
            if kept is not None and g != w:   # I frees the graph; W keeps its inputs
                alloc(Allocation(device=d, size_bytes=saved, at_task=f, until_tasks=(g,)))
                if kept:   # from I's end: from the start of the rank's next action
                    mine = rank_tasks[schedule.stage_to_rank[s]]
                    alloc(Allocation(device=d, size_bytes=kept, at_task=mine[position[g] + 1],
                                     until_tasks=(w,)))
                continue
            if g == w or not at_input:
                alloc(Allocation(device=d, size_bytes=saved, at_task=f, until_tasks=(w,)))
                continue
            alloc(Allocation(device=d, size_bytes=at_input, at_task=f, until_tasks=(g,)))
            if saved > at_input:
                alloc(Allocation(device=d, size_bytes=saved - at_input, at_task=f,
                                 until_tasks=(w,)))
    resident = [0] * len(used)
    for s, size in enumerate(stages.resident_bytes):
        resident[stage_dev[s]] += size
    for d, size in enumerate(resident):
        alloc(Allocation(device=d, size_bytes=size))

    base = low.run(began)
    step = base.step_time_s
    duration = tasks.duration_s
    busy = tuple(math.fsum(duration[t] for t in mine) for mine in rank_tasks)
    idle = tuple(step - b for b in busy)
    bubble = math.fsum(idle) / (len(busy) * step) if step > 0 else 0.0
    return PipelineResult(
        **{f.name: getattr(base, f.name) for f in fields(SimResult) if f.name != "wall_s"},
        rank_devices=tuple(low.names[d] for d in rank_dev),
        rank_busy_s=busy,
        rank_idle_s=idle,
        bubble_fraction=bubble,
        wall_s=time.perf_counter() - began,
    )
