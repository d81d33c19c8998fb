"""Run a model placed across devices: :class:`PlacedModule`.

``PlacedModule(model, placement, devices, example_args=...)`` exports the model once (the same
``torch.export`` + ``run_decompositions({})`` program that :func:`trainsched.capture.capture`
names its ops after), gives every op the device the placement says, and runs the program as
maximal same-device *segments* in the placement's order. Nothing in the model is rewritten.

- **Order.** The forward ops run in the order the placement stores (``Placement.order``, the
  order its placer scheduled and the simulator replays): the host launches them one after
  another in that order, so each device runs its ops in that order. A placement without an
  order (or a plain mapping) runs program order, which is the captured graph's own order and
  so again what the simulator replays for it. :attr:`PlacedModule.last_order` records the
  order the last forward ran its ops in.

- **Ops.** Steps (the ops of the captured graph) run on their device. Views and input-independent
  work (masks, ``num_batches_tracked + 1``) are no ops of the graph: they are evaluated on every
  device that needs them, from values already there, the way capture folds them into their users.
- **Activations** move to a consumer's device once per (tensor, destination): the tensor is the
  op whose output a consumer reads, through any views (the graph's edge key); of an op returning
  several tensors (batch norm) only the ones read there move. Copies leave right after the
  segment that produced them, so a channel serves them in the order they became ready.
- **Parameters and buffers** live on the device of the first op (in program order) that reads
  them; the model's own tensors are moved there. An op on another device reading the same
  parameter (a tied weight placed apart from its group) gets a differentiable copy made at the
  start of each step, so its gradient flows back into the one master parameter.
- **Training.** Gradients land on the original model's parameters: ``placed.parameters()`` are
  the model's own ``Parameter`` objects, in its order (names carry the ``module.`` prefix, as with
  DDP), so a standard optimizer works. The exported program returns new buffer values (BatchNorm
  running statistics) instead of writing them; they are copied back into the model's buffers
  at the end of each forward, as the unplaced model would have updated them.
- **CUDA.** One compute stream per logical device; copies on side streams (``comm="sequential"``:
  one per device, a copy also holding the receiver's; ``"parallel"``: one per ordered pair),
  ``non_blocking``, ordered by CUDA events only (no host synchronisation within a step), and
  ``record_stream`` so the allocator never reuses a buffer a copy still reads. Backward runs
  through autograd on the streams of the forward ops. Several logical devices may share one GPU.
- **Same physical device.** A transfer is a plain ``.to``: between logical devices that share a
  physical device (every logical device is the CPU here) it moves nothing and adds no autograd
  node, so the step computes exactly what the unplaced model computes; the streams and events
  still order the work as the placement says. Counts and bytes report the logical transfers.
  ``copy_same_device=True`` makes real copies there too (to emulate the memory of separate
  devices); gradients then equal the unplaced model's up to the order in which autograd sums the
  gradients of a tensor read by three or more ops (a copy adds a node and changes that order).

Names: op-granularity placements name exported nodes (``conv2d_3``) and user inputs (``x``);
module-granularity placements name module calls (``layer1.0``, ``relu#2``, ``<root>``) exactly as
:func:`trainsched.graph.coarsen_by_module` builds them (that function does the mapping here).
The program is the training-mode one; the wrapper refuses to run in ``eval()`` mode.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch import fx, nn

from trainsched.errors import TrainschedError
from trainsched.runtime.exported import export_program, flatten_inputs
from trainsched.runtime.placed_plan import (
    PlacedSegment,
    Transfer,
    nbytes,
    resolve_names,
    static_plan,
    step_order,
)

__all__ = ["PlacedModule", "PlacedSegment", "StepStats", "StepTiming", "Transfer"]

COMM_MODES = ("sequential", "parallel")
GRANULARITIES = ("auto", "op", "module")


@dataclass(frozen=True)
class StepStats:
    """What moved between logical devices in one forward step (counted while it ran)."""

    transfers: int        # distinct (tensor, destination) pairs: the simulator's transfers
    copies: int           # values moved for them (two views of one tensor: two values)
    bytes_moved: int
    state_copies: int     # parameters, buffers, constants read away from their home
    state_bytes: int

    def to_dict(self) -> dict[str, int]:
        return {"transfers": self.transfers, "copies": self.copies,
                "bytes_moved": self.bytes_moved, "state_copies": self.state_copies,
                "state_bytes": self.state_bytes}


@dataclass(frozen=True)
class StepTiming:
    """Measured training steps (forward, backward, optional optimizer step) of a PlacedModule.

    ``step_s``: each measured step's time (CUDA: events on the caller's stream of the first GPU,
    after every stream joined it; CPU: wall time). ``device_step_s``: median step time per
    physical CUDA device (events on that device). ``forward_busy_s``: per logical device, the
    median summed time of its forward segments (CUDA events on its compute stream).
    ``peak_memory_bytes``: ``torch.cuda.max_memory_allocated`` per physical CUDA device over the
    measured steps. CUDA-only fields are None on the CPU.
    """

    device: str
    step_s: tuple[float, ...]
    device_step_s: dict[str, float] | None
    forward_busy_s: tuple[float, ...] | None
    peak_memory_bytes: dict[str, int] | None
    stats: StepStats

    @property
    def median_step_s(self) -> float:
        return statistics.median(self.step_s)

    def to_dict(self) -> dict[str, Any]:
        return {"device": self.device, "median_step_s": self.median_step_s,
                "step_s": list(self.step_s), "device_step_s": self.device_step_s,
                "forward_busy_s": None if self.forward_busy_s is None
                else list(self.forward_busy_s),
                "peak_memory_bytes": self.peak_memory_bytes, "stats": self.stats.to_dict()}


# -----------------------------------------------------------------------------------------------
# CUDA streams


class _Streams:
    """One compute stream per logical device and the copy streams (CUDA only)."""

    def __init__(self, physical: list[torch.device], comm: str,
                 pairs: Sequence[tuple[int, int]]) -> None:
        self.physical = physical
        self.comm = comm
        self.compute = [torch.cuda.Stream(device=d) for d in physical]
        self.channels: dict[Any, torch.cuda.Stream] = {}
        for src, dst in pairs:
            if self._key(src, dst) not in self.channels:
                self.channels[self._key(src, dst)] = torch.cuda.Stream(device=physical[src])
            if comm == "sequential" and dst not in self.channels:
                self.channels[dst] = torch.cuda.Stream(device=physical[dst])

    def _key(self, src: int, dst: int) -> Any:
        return src if self.comm == "sequential" else (src, dst)

    def all(self) -> list[torch.cuda.Stream]:
        return [*self.compute, *self.channels.values()]

    def begin(self) -> None:
        """Every stream waits for what the caller queued before the step (e.g. an optimizer)."""
        for s in self.all():
            s.wait_stream(torch.cuda.current_stream(s.device))

    def end(self) -> None:
        """The caller's streams wait for everything the step queued."""
        for s in self.all():
            for d in {str(p): p for p in self.physical}.values():
                torch.cuda.current_stream(d).wait_stream(s)

    def copy(self, x: torch.Tensor, src: int, dst: int,
             force: bool) -> tuple[torch.Tensor, torch.cuda.Event]:
        """Move ``x`` (made on ``src``'s compute stream) to ``dst`` (a copy if ``force`` or the
        GPUs differ); return it and the event that marks it ready."""
        s = self.channels[self._key(src, dst)]
        s.wait_stream(self.compute[src])
        if self.comm == "sequential":
            s.wait_stream(self.channels[dst])      # the receiver's channel is busy too
        with torch.cuda.stream(s):
            y = x.to(self.physical[dst], non_blocking=True, copy=force)
        if x.is_cuda:
            x.record_stream(s)
        done = torch.cuda.Event()
        done.record(s)
        if self.comm == "sequential":
            self.channels[dst].wait_event(done)
        return y, done


# -----------------------------------------------------------------------------------------------
# The module


class PlacedModule(nn.Module):
    """``model`` run with its ops on the devices ``placement`` gives them (see the module doc).

    ``placement`` is a :class:`trainsched.plan.Placement` (or a mapping op name -> device index)
    for the graph captured from ``model`` with ``example_args``/``example_kwargs``, at op or
    module granularity (``granularity="auto"`` tries op names, then module names with
    ``module_depth``). ``devices[i]`` is the torch device of logical device ``i`` (default: every
    logical device on the CPU); all must be CPUs or all CUDA GPUs, and several may be the same
    GPU. ``comm`` is ``"sequential"`` or ``"parallel"`` (copy streams, CUDA only);
    ``copy_same_device`` copies tensors between logical devices that share a physical one.
    """

    def __init__(self, model: nn.Module, placement: Any,
                 devices: Sequence[str | torch.device] | None = None, *,
                 example_args: tuple | Any = (), example_kwargs: Mapping[str, Any] | None = None,
                 granularity: str = "auto", module_depth: int | None = None,
                 comm: str = "sequential", copy_same_device: bool = False) -> None:
        super().__init__()
        if comm not in COMM_MODES:
            raise TrainschedError(f"unknown comm mode {comm!r}; use sequential or parallel")
        if granularity not in GRANULARITIES:
            raise TrainschedError(f"unknown granularity {granularity!r}; use auto, op or module")
        device_of = getattr(placement, "device_of", placement)
        if not isinstance(device_of, Mapping):
            raise TrainschedError(f"a placement maps op names to device indices, got "
                                  f"{type(placement).__name__}")
        count = getattr(placement, "num_devices", None) or (max(device_of.values(), default=0)
                                                             + 1)
        physical = [torch.device(d) for d in (devices if devices is not None
                                              else ["cpu"] * count)]
        physical = [torch.device("cuda", torch.cuda.current_device())
                    if d.type == "cuda" and d.index is None else d for d in physical]
        if not physical or len({d.type for d in physical}) != 1 or \
                physical[0].type not in ("cpu", "cuda"):
            raise TrainschedError(f"devices must be all CPUs or all CUDA GPUs, got "
                                  f"{[str(d) for d in physical]}")
        for name, d in device_of.items():
            if not (isinstance(d, int) and 0 <= d < len(physical)):
                raise TrainschedError(
                    f"op {name!r} is placed on device {d!r}, but {len(physical)} device(s) were "
                    f"given ({', '.join(str(p) for p in physical)}); pass one torch device per "
                    "logical device index of the placement")
        args = example_args if isinstance(example_args, tuple) else (example_args,)
        kwargs = dict(example_kwargs or {})

        self.module = model
        self.comm = comm
        self.copy_same_device = bool(copy_same_device)
        self.physical = tuple(physical)
        self._program = export_program(model, args, kwargs)
        self._state_kind = {fqn: kind for kind, fqn in self._program.state_of.values()}
        names, self.granularity = resolve_names(self._program, device_of, granularity,
                                                 module_depth)
        order = getattr(placement, "order", None)
        placed = {node: device_of[op] for node, op in names.items()}
        self._plan = static_plan(self._program, placed, step_order(self._program, names, order))
        self._move_state()
        pairs = sorted({(t.src, t.dst) for t in self.transfers})
        self._streams = _Streams(physical, comm, pairs) if physical[0].type == "cuda" else None
        self._timing: list[tuple[int, Any, Any]] | None = None
        self.last_step: StepStats | None = None
        #: The exported ops (op-level names) in the order the last forward ran them.
        self.last_order: tuple[str, ...] = ()

    # --- introspection -------------------------------------------------------------------------

    @property
    def segments(self) -> tuple[PlacedSegment, ...]:
        """The maximal same-device runs of ops, in the order they are launched."""
        return tuple(self._plan.segments)

    def segments_on(self, device: int) -> tuple[PlacedSegment, ...]:
        return tuple(s for s in self._plan.segments if s.device == device)

    @property
    def transfers(self) -> tuple[Transfer, ...]:
        """Every copy of one step (activations and state), in issue order."""
        return tuple(t for k in sorted(self._plan.sends) for t in self._plan.sends[k])

    @property
    def device_of(self) -> dict[str, int]:
        """Logical device of every exported node the step evaluates (op-level names)."""
        return dict(self._plan.home)

    @property
    def state_device(self) -> dict[str, int]:
        """Logical device of every parameter, buffer and constant (by qualified name)."""
        return dict(self._plan.state_home)

    def summary(self) -> dict[str, Any]:
        """Segments and ops per device, and the copies of one step (example batch sizes)."""
        moved = [t for t in self.transfers if not t.state]
        state = [t for t in self.transfers if t.state]
        n = len(self.physical)
        return {
            "devices": [str(d) for d in self.physical], "granularity": self.granularity,
            "comm": self.comm, "segments": len(self._plan.segments),
            "segments_per_device": [len(self.segments_on(d)) for d in range(n)],
            "ops_per_device": [sum(len(s.ops) for s in self.segments_on(d)) for d in range(n)],
            "transfers": len({(t.tensor, t.dst) for t in moved}), "copies": len(moved),
            "bytes_moved": sum(t.size_bytes for t in moved), "state_copies": len(state),
            "state_bytes": sum(t.size_bytes for t in state),
        }

    # --- state ---------------------------------------------------------------------------------

    def _state_tensor(self, fqn: str) -> torch.Tensor:
        kind = self._state_kind[fqn]
        if kind == "param":
            return self.module.get_parameter(fqn)
        if kind == "buffer":
            return self.module.get_buffer(fqn)
        return self._program.constants[fqn]

    def _move_state(self) -> None:
        """Put every parameter, buffer and constant on its home device (objects kept)."""
        with torch.no_grad():
            for fqn, device in self._plan.state_home.items():
                tensor = self._state_tensor(fqn)
                target = self.physical[device]
                if isinstance(tensor, torch.Tensor) and tensor.device != target:
                    tensor.data = tensor.data.to(target)

    def _state_value(self, fqn: str) -> Any:
        kind = self._state_kind[fqn]
        tensor = self._state_tensor(fqn)
        # Buffers go in through ``.data``: the program returns their new values, which are
        # written back in place while backward may still hold the old ones (as eager BN does).
        return tensor if kind == "param" else tensor.data

    # --- running -------------------------------------------------------------------------------

    def _flat_inputs(self, args: tuple, kwargs: dict) -> list[Any]:
        return flatten_inputs(self._program, args, kwargs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if not self.training:
            raise TrainschedError(
                "PlacedModule runs the training-mode program it was exported with; evaluate "
                "with the original module (placed.module) or build a PlacedModule from a model "
                "in eval mode's graph")
        step = _Step(self)
        outputs = step.run(self._flat_inputs(args, kwargs))
        self.last_step = step.stats()
        self.last_order = tuple(step.executed)
        return pytree.tree_unflatten(outputs, self._program.out_spec)

    # --- measuring -----------------------------------------------------------------------------

    def measure_step(self, *args: Any, loss_fn: Callable[[Any], torch.Tensor] | None = None,
                     optimizer: torch.optim.Optimizer | None = None, repeats: int = 5,
                     warmup: int = 1, **kwargs: Any) -> StepTiming:
        """Time ``repeats`` training steps after ``warmup`` untimed ones.

        A step: gradients set to None, forward, ``loss_fn(output)`` (default: the sum of the
        first output tensor), backward, and ``optimizer.step()`` when given. It updates the
        parameters (with an optimizer) and the BatchNorm statistics, like any training step.
        """
        if repeats < 1 or warmup < 0:
            raise TrainschedError("repeats must be at least 1 and warmup at least 0")
        cuda = self._streams is not None
        gpus = list({str(d): d for d in self.physical}.values()) if cuda else []
        loss_fn = loss_fn or _default_loss

        def one_step() -> None:
            for p in self.parameters():
                p.grad = None
            loss = loss_fn(self(*args, **kwargs))
            loss.backward()
            if optimizer is not None:
                optimizer.step()

        for _ in range(warmup):
            one_step()
        if cuda:
            for d in gpus:
                torch.cuda.synchronize(d)
                torch.cuda.reset_peak_memory_stats(d)
        steps_s: list[float] = []
        per_gpu: dict[str, list[float]] = {str(d): [] for d in gpus}
        busy: list[list[float]] = [[] for _ in self.physical]
        for _ in range(repeats):
            if not cuda:
                began = time.perf_counter()
                one_step()
                steps_s.append(time.perf_counter() - began)
                continue
            starts = {str(d): _event(torch.cuda.current_stream(d)) for d in gpus}
            self._timing = []
            try:
                one_step()
            finally:
                timing, self._timing = self._timing, None
            assert self._streams is not None
            self._streams.end()
            ends = {str(d): _event(torch.cuda.current_stream(d)) for d in gpus}
            for d in gpus:
                torch.cuda.synchronize(d)
            for key in per_gpu:
                per_gpu[key].append(starts[key].elapsed_time(ends[key]) / 1e3)
            steps_s.append(per_gpu[str(gpus[0])][-1])
            sums = [0.0] * len(self.physical)
            for device, begin, end in timing:
                sums[device] += begin.elapsed_time(end) / 1e3
            for device, total in enumerate(sums):
                busy[device].append(total)
        assert self.last_step is not None
        return StepTiming(
            device="cuda" if cuda else "cpu", step_s=tuple(steps_s),
            device_step_s={k: statistics.median(v) for k, v in per_gpu.items()} if cuda
            else None,
            forward_busy_s=tuple(statistics.median(b) for b in busy) if cuda else None,
            peak_memory_bytes={str(d): torch.cuda.max_memory_allocated(d) for d in gpus}
            if cuda else None,
            stats=self.last_step)


def _event(stream: Any) -> Any:
    event = torch.cuda.Event(enable_timing=True)
    event.record(stream)
    return event


def _default_loss(output: Any) -> torch.Tensor:
    tensors = [t for t in pytree.tree_leaves(output) if isinstance(t, torch.Tensor)]
    if not tensors:
        raise TrainschedError("the model returned no tensor; pass loss_fn to measure_step")
    return tensors[0].sum()


class _Step:
    """One forward step: every needed node evaluated once, at its home; copies between homes."""

    def __init__(self, owner: PlacedModule) -> None:
        self.owner = owner
        self.program = owner._program
        self.plan = owner._plan
        self.physical = owner.physical
        self.streams = owner._streams
        self.values: dict[str, Any] = {}                     # node -> value at its home
        self.received: dict[tuple[str, int], Any] = {}       # (node, device) -> (value, event)
        self.ready: set[tuple[str, int]] = set()             # received values the device waited
        self.pairs: set[tuple[str, int]] = set()
        self.copies = self.bytes = self.state_copies = self.state_bytes = 0
        self.executed: list[str] = []                         # steps, in the order they ran

    def stats(self) -> StepStats:
        return StepStats(transfers=len(self.pairs), copies=self.copies, bytes_moved=self.bytes,
                         state_copies=self.state_copies, state_bytes=self.state_bytes)

    def on(self, device: int) -> Any:
        """The stream context for work on logical ``device`` (nothing on the CPU)."""
        if self.streams is None:
            return contextlib.nullcontext()
        return torch.cuda.stream(self.streams.compute[device])

    def run(self, flat: list[Any]) -> list[Any]:
        plan, program = self.plan, self.program
        if self.streams is not None:
            self.streams.begin()
        for name, value in zip(program.user_inputs, flat, strict=True):
            if name not in plan.home:
                continue  # an input no op reads
            d = plan.home[name]
            with self.on(d):
                moved = value.to(self.physical[d], non_blocking=True) \
                    if isinstance(value, torch.Tensor) else value
            if self.streams is not None and isinstance(moved, torch.Tensor) and moved.is_cuda:
                moved.record_stream(self.streams.compute[d])
            self.values[name] = moved
        self.send(-1)
        timing = self.owner._timing
        for segment in plan.segments:
            stream = self.streams.compute[segment.device] if self.streams is not None else None
            with self.on(segment.device):
                begin = _event(stream) if timing is not None else None
                for name in segment.ops:
                    self.values[name] = self.call(program.nodes[name], segment.device)
                    self.executed.append(name)
                if timing is not None:
                    timing.append((segment.device, begin, _event(stream)))
            self.send(segment.index)
        new_buffers = [(fqn, self.value(out)) for out, fqn in program.mutations]
        outputs = [self.value(out.name) if isinstance(out, fx.Node) else out
                   for out in program.outputs]
        if self.streams is not None:
            self.streams.end()
            for t in pytree.tree_leaves([outputs, [v for _, v in new_buffers]]):
                if isinstance(t, torch.Tensor) and t.device.type == "cuda":
                    t.record_stream(torch.cuda.current_stream(t.device))
        with torch.no_grad():
            for fqn, value in new_buffers:
                self.owner._state_tensor(fqn).copy_(value)
        return outputs

    def value(self, name: str) -> Any:
        """The value of node ``name`` at its home, evaluated there on first use."""
        if name not in self.values:
            kind = self.plan.kind[name]
            assert kind in ("state", "lazy"), f"{name} used before it ran"
            if kind == "state":
                self.values[name] = self.owner._state_value(self.program.state_of[name][1])
            else:
                d = self.plan.home[name]
                with self.on(d):
                    self.values[name] = self.call(self.program.nodes[name], d)
        return self.values[name]

    def value_on(self, name: str, d: int) -> Any:
        """The value of node ``name`` on logical device ``d`` (moved there once per step)."""
        if self.plan.home[name] == d:
            return self.value(name)
        key = (name, d)
        if key not in self.received:
            self.move(name, d)   # not sent ahead: only a node reading two devices' values
        y, done = self.received[key]
        if self.streams is not None and key not in self.ready:
            self.ready.add(key)
            compute = self.streams.compute[d]
            for event in done:
                compute.wait_event(event)
            for t in pytree.tree_leaves(y):
                if isinstance(t, torch.Tensor) and t.is_cuda:
                    t.record_stream(compute)
        return y

    def call(self, node: fx.Node, d: int) -> Any:
        here = self.physical[d]

        def arg(n: fx.Node) -> Any:
            return self.value_on(n.name, d)

        args = tuple(here if isinstance(a, torch.device) else a
                     for a in fx.node.map_arg(node.args, arg))
        kwargs = fx.node.map_arg(node.kwargs, arg)
        if isinstance(kwargs.get("device"), torch.device):
            kwargs = {**kwargs, "device": here}  # device literals of the trace mean "here"
        return node.target(*args, **kwargs)

    def send(self, after: int) -> None:
        for t in self.plan.sends.get(after, ()):
            if (t.value, t.dst) not in self.received:
                self.move(t.value, t.dst)

    def move(self, name: str, dst: int) -> None:
        """Move node ``name``'s value from its home to ``dst`` (a plain ``.to`` unless the
        devices differ physically or ``copy_same_device``), counting what moved."""
        src = self.plan.home[name]
        x = self.value(name)
        force = self.owner.copy_same_device
        events = []

        def one(t: Any) -> Any:
            if not isinstance(t, torch.Tensor):
                return t
            if self.streams is None:
                return t.to(self.physical[dst], copy=force)
            y, done = self.streams.copy(t, src, dst, force)
            events.append(done)
            return y

        y = pytree.tree_map(one, x)
        self.received[(name, dst)] = (y, events)
        size = nbytes(x)
        if self.plan.kind[name] == "state" or not self.plan.roots[name]:
            self.state_copies += 1
            self.state_bytes += size
        else:
            self.pairs.add((self.plan.roots[name][0], dst))
            self.copies += 1
            self.bytes += size


