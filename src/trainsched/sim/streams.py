"""One device, two compute streams: out-of-order backprop's dW slots on a single device.

:func:`simulate_slots` lowers ``steps`` training steps of a graph on one device whose main and
side compute streams form an engine *stream pair* (:meth:`TaskGraph.add_stream_pair`: kernels
on both share the device, each at ``1/(1+ε)`` of its speed when both fit, else at 1/2; ε and
the fit come from ``cluster.device``: ``stream_slowdown`` and ``stream_fit_s``). Every op runs
on the main stream in program order except the dW of a layer whose slot
(:class:`~trainsched.backprop.reorder.Slot`) says otherwise:

- ``inline``: on the main stream in program order (in-order backprop);
- ``overlap_backward``: on the side stream, as soon as its inputs exist (x_i and gy_i), beside
  the dX ops that follow;
- ``overlap_forward(j)``: the dW of step s and the layer's update run in step s+1 on the side
  stream, once forward op of layer ``j`` of step s+1 has ended; the layer's forward in step
  s+1 waits for that update (its deadline). In the last step simulated, with no next step,
  they run as soon as their inputs exist.

Step s+1 starts once step s has run every op but the deferred dWs and updates (a zero-time
``step boundary`` task); each forward op also waits for its own update of step s. With
``steps`` > 1 the step time is the steady period: the start of the last step's first op minus
that of the step before. Memory follows the other executors' rules: parameters, buffers,
optimizer state and gradients resident; an op's output from its start to its last
consumer's end (so a deferred dW keeps x_i and gy_i alive until it ends); workspace while an
op runs. With every slot ``inline`` and one step, the tasks, times and memory are those of
:func:`~trainsched.sim.executors.simulate_single` (plus an idle side stream).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

from trainsched.backprop.reorder import Slot, check_slots, layers, parse_slot
from trainsched.cluster import Cluster, DeviceSpec
from trainsched.errors import TrainschedError
from trainsched.graph import Graph, gc_paused
from trainsched.sim.data_parallel import _steady
from trainsched.sim.engine import run_tasks
from trainsched.sim.executors import _Lowering, check_inputs
from trainsched.sim.result import Allocation, SimResult, build_result
from trainsched.trace import stream_name
from trainsched.units import is_int

__all__ = ["simulate_slots"]

#: ε and fit of a device given by no cluster: :class:`DeviceSpec`'s defaults.
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(DeviceSpec)}


def simulate_slots(graph: Graph, cluster: Cluster | None, slots: Sequence[Slot | str], *,
                   steps: int | None = None) -> SimResult:
    """``steps`` steps of ``graph`` on device 0 of ``cluster`` with the dW ``slots`` (one per
    layer, layer order; strings are parsed) on two compute streams (module docstring).
    ``steps`` defaults to 3 when a slot defers into the next step (the steady period), else 1.
    """
    began = time.perf_counter()
    check_inputs(graph, cluster, "simulate_slots", allow_forward_only=False)
    slots = tuple(s if isinstance(s, Slot) else parse_slot(s) for s in slots)
    check_slots(graph, slots)
    deferring = any(s.kind == "overlap_forward" for s in slots)
    if steps is None:
        steps = 3 if deferring else 1
    if not (is_int(steps) and steps >= 1):
        raise TrainschedError(f"steps must be an integer >= 1, got {steps!r}")
    with gc_paused():
        low = _Lowering(cluster, [0])
        side = low.tasks.add_resource(stream_name(low.names[0], "side"), device=0,
                                      kind="compute", policy="priority")
        slowdown = cluster.device.stream_slowdown if cluster else _DEFAULTS["stream_slowdown"]
        fit = cluster.device.stream_fit_s if cluster else _DEFAULTS["stream_fit_s"]
        low.tasks.add_stream_pair(low.stream[0], side, slowdown=slowdown, fit_s=fit)
        firsts = _lower(low, graph, slots, side, steps)
        replay = run_tasks(low.tasks)
        capacity = cluster.device.memory_bytes if cluster is not None else None
        result = build_result(low.tasks, replay, devices=low.names,
                              allocations=low.allocations, memory_capacity_bytes=capacity,
                              wall_s=time.perf_counter() - began)  # fmt: skip
    if steps == 1:
        return result
    return _steady(result, replay.start_s[firsts[-2]], replay.start_s[firsts[-1]])


def _lower(low: _Lowering, graph: Graph, slots: Sequence[Slot], side: int,
           steps: int) -> list[int]:
    """The tasks of every step; returns each step's first task (the period)."""
    tasks = low.tasks
    order = graph.topological_order()
    ops = [graph.op(name) for name in order]
    position = {name: p for p, name in enumerate(order)}
    pairs = sorted({(position[e.src], position[e.dst]) for e in graph.edges})
    users: list[list[int]] = [[] for _ in ops]
    has_pred = [False] * len(ops)
    for a, b in pairs:
        users[a].append(b)
        has_pred[b] = True
    layer_of = {name: i for i, name in enumerate(layers(graph))}
    slot_of: dict[int, Slot] = {}  # op position -> the slot of its layer (dW and update)
    for p, op in enumerate(ops):
        if op.kind in ("backward_weight", "optimizer") and op.forward_op in layer_of:
            slot_of[p] = slots[layer_of[op.forward_op]]
    forward_of_layer = {i: position[name] for name, i in layer_of.items()}
    updates: dict[int, list[int]] = {}  # forward op position -> its optimizer ops
    for p, op in enumerate(ops):
        if op.kind == "optimizer" and op.forward_op in position:
            updates.setdefault(position[op.forward_op], []).append(p)
    n_ops = len(ops)
    firsts: list[int] = []
    previous = -1
    resident = 0
    for step in range(steps):
        first = len(tasks)
        for p, op in enumerate(ops):
            slot = slot_of.get(p)
            on_side = slot is not None and (slot.kind == "overlap_forward" or (
                slot.kind == "overlap_backward" and op.kind == "backward_weight"))
            args = {"op": op.name, "bytes": op.output_bytes}
            if steps > 1:
                args["step"] = step
            if slot is not None and slot.kind != "inline" and op.kind == "backward_weight":
                args["slot"] = str(slot)
            tasks.add_task(op.name, op.compute_s, (side if on_side else low.stream[0],),
                           priority=step * n_ops + p, category=op.kind, device=0, args=args)
        for a, b in pairs:
            tasks.add_dependency(first + a, first + b)
        if step:
            boundary = tasks.add_task("step boundary", 0.0, (), priority=step * n_ops,
                                      category="barrier", device=0, args={"step": step})
            for p in range(n_ops):
                if not _deferred(slot_of.get(p)):
                    tasks.add_dependency(previous + p, boundary)
            for p in range(n_ops):
                if not has_pred[p]:
                    tasks.add_dependency(boundary, first + p)
                for u in updates.get(p, ()) if ops[p].kind == "forward" else ():
                    tasks.add_dependency(previous + u, first + p)
            for p, slot in slot_of.items():  # step-1's deferred work waits for forward j
                if _deferred(slot) and ops[p].kind == "backward_weight":
                    assert slot.after is not None
                    tasks.add_dependency(first + forward_of_layer[slot.after], previous + p)
        for p, op in enumerate(ops):
            t = first + p
            if step == 0:
                resident += op.param_bytes + op.buffer_bytes + op.optimizer_state_bytes
                if op.kind == "backward_weight":
                    resident += op.output_bytes
            if op.kind != "backward_weight" and op.output_bytes:
                low.allocations.append(Allocation(device=0, size_bytes=op.output_bytes,
                                                  at_task=t,
                                                  until_tasks=tuple(first + u for u in users[p])))
            if op.temp_bytes:
                low.allocations.append(Allocation(device=0, size_bytes=op.temp_bytes, at_task=t,
                                                  until_tasks=(t,)))
        firsts.append(first)
        previous = first
    low.allocations.append(Allocation(device=0, size_bytes=resident))
    return firsts


def _deferred(slot: Slot | None) -> bool:
    return slot is not None and slot.kind == "overlap_forward"
