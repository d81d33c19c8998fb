"""Run each traced step on its own and record what it costs.

Every step runs with its real input values (fake tensors for the static tier, real tensors for
the measured tier), so shapes, FLOPs and saved activations are exact. For each step the runner
records: forward FLOPs, the FLOPs of the input-gradient (dX) and the weight-gradient (dW) computed
separately with ``torch.autograd.grad(inputs=...)``, the bytes autograd saves for backward
(``saved_tensors_hooks``, deduplicated by storage across the whole model, parameters excluded),
and, when measuring, the median and p10/p90 wall time of each of the three phases.

Timing a step in isolation misses cross-op cache effects and fused kernels; it is what makes the
dX/dW split measurable at all, which whole-step profiles cannot give.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

from trainsched.capture.trace import Ref, StateRef, Traced, _flatten, _tree_map
from trainsched.errors import TrainschedError
from trainsched.graph.core import SPREAD_LIMIT

Progress = Callable[[int, int, str], None]

#: Timing stops after this many samples once a phase has used ``PHASE_BUDGET_S`` of wall time.
MIN_REPEATS = 3
PHASE_BUDGET_S = 0.25
#: A phase whose p90 exceeds ``SPREAD_LIMIT`` times its p10 was disturbed (another process, a
#: frequency change, a page fault): it is timed again, up to ``REMEASURES`` more rounds, and the
#: round with the lowest median is kept (disturbances only ever add time).
REMEASURES = 2


@dataclass
class Phase:
    """Cost of one phase (forward, dX or dW) of one step."""

    flops: float = 0.0
    bytes_accessed: int = 0
    median_s: float | None = None
    p10_s: float | None = None
    p90_s: float | None = None
    samples: int = 0


@dataclass
class StepCost:
    """Everything capture learned about one step."""

    name: str
    forward: Phase
    dx: Phase | None          # None: no input of the step needs a gradient
    dw: Phase | None          # None: the step owns no trainable parameter
    output_bytes: int
    saved_bytes: int
    temp_bytes: int
    dtype: str
    inputs: dict[str, int] = field(default_factory=dict)   # producer root -> bytes read from it
    requires_grad: bool = False


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _dtype_name(t: torch.Tensor | None) -> str:
    if t is None:
        return "fp32"
    return {torch.float16: "fp16", torch.bfloat16: "bf16"}.get(t.dtype, "fp32")


def _signature(target: str, args: Any, kwargs: Any) -> tuple:
    """What determines an op's cost: the op, its tensors' shapes, dtypes, strides, devices and
    which need gradients, and every non-tensor argument."""
    def part(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return (tuple(value.shape), str(value.dtype), value.stride(), str(value.device),
                    value.requires_grad)
        return repr(value)
    return (target, tuple(part(v) for v in _flatten([args])),
            tuple((k, tuple(part(v) for v in _flatten([val]))) for k, val in sorted(
                kwargs.items())))


def _percentiles(samples: list[float]) -> tuple[float, float, float]:
    ordered = sorted(samples)
    n = len(ordered)
    return (statistics.median(ordered), ordered[int(0.1 * (n - 1))],
            ordered[round(0.9 * (n - 1))])


class StepRunner:
    """Interprets a :class:`Traced` program step by step, costing each step."""

    def __init__(self, traced: Traced, *, measure: bool, warmup: int = 0, repeats: int = 10,
                 device: torch.device | None = None, progress: Progress | None = None,
                 inputs_require_grad: bool = False):
        self.traced = traced
        self.inputs_require_grad = inputs_require_grad
        self.measure = measure
        self.warmup = warmup
        self.repeats = repeats
        self.device = device or torch.device("cpu")
        self.progress = progress
        self.values: dict[str, Any] = {}
        self.requires_grad: dict[str, bool] = {}
        self.root: dict[str, list[str]] = {}
        self.saved_storages: set[int] = set()
        self.state: dict[str, torch.Tensor] = {}
        self.state_storages: set[int] = set()
        self._keep: list[torch.Tensor] = []
        #: measured phases by op signature, so repeated layers are timed once
        self.timed: dict[tuple, tuple[Phase, Phase | None, Phase | None]] = {}
        #: phases timed again for their spread, and those still spread after every round
        self.remeasured = 0
        self.noisy = 0

    # -- values -------------------------------------------------------------------------------
    def _load(self, convert: Callable[[torch.Tensor], torch.Tensor]) -> None:
        for fqn, tensor in self.traced.state.items():
            self.state[fqn] = convert(tensor) if isinstance(tensor, torch.Tensor) else tensor
            if isinstance(self.state[fqn], torch.Tensor):
                self.state_storages.add(self.state[fqn].untyped_storage()._cdata)
        for name, value in self.traced.inputs.items():
            self.values[name] = convert(value) if isinstance(value, torch.Tensor) else value
            # A pipeline stage's input is a previous stage's activation: it needs a gradient.
            self.requires_grad[name] = (self.inputs_require_grad
                                        and isinstance(value, torch.Tensor)
                                        and value.is_floating_point())
            self.root[name] = [name]

    def _value(self, arg: Any) -> Any:
        if isinstance(arg, Ref):
            if arg.node not in self.values:
                raise TrainschedError(f"traced node {arg.node!r} is used before it is computed")
            return self.values[arg.node]
        if isinstance(arg, StateRef):
            return self.state[arg.fqn]
        return arg

    def _refs(self, args: Any) -> list[Ref]:
        return [a for a in _flatten(list(args)) if isinstance(a, Ref)]

    def _compute_view(self, name: str) -> None:
        fn, args, kwargs = self.traced.views[name]
        with torch.no_grad():
            self.values[name] = fn(*_tree_map(self._value, args), **_tree_map(self._value, kwargs))
        refs = self._refs([args, kwargs])
        self.requires_grad[name] = any(self.requires_grad[r.node] for r in refs)
        self.root[name] = sorted({root for r in refs for root in self.root[r.node]})

    # -- running -----------------------------------------------------------------------------
    def run(self, convert: Callable[[torch.Tensor], torch.Tensor]) -> list[StepCost]:
        self._load(convert)
        step_of = {s.name: s for s in self.traced.steps}
        costs: list[StepCost] = []
        total = len(self.traced.steps)
        for name in self.traced.order:
            if name in self.traced.views:
                self._compute_view(name)
                continue
            step = step_of[name]
            costs.append(self._run_step(step))
            if self.progress:
                self.progress(len(costs), total, step.name)
        return costs

    def _run_step(self, step: Any) -> StepCost:
        trainable = self.traced.trainable
        refs = self._refs([step.args, step.kwargs])
        leaves: dict[str, torch.Tensor] = {}       # Ref name -> leaf tensor standing for it
        act_leaves: list[torch.Tensor] = []
        for r in dict.fromkeys(x.node for x in refs):
            v = self.values[r]
            if isinstance(v, torch.Tensor):
                leaf = v.detach()
                if self.requires_grad[r] and leaf.is_floating_point():
                    leaf.requires_grad_(True)
                    act_leaves.append(leaf)
                leaves[r] = leaf
        param_leaves: dict[str, torch.Tensor] = {}
        for fqn in step.state:
            if fqn in trainable:
                param_leaves[fqn] = self.state[fqn].detach().requires_grad_(True)

        def arg(a: Any) -> Any:
            if isinstance(a, Ref):
                return leaves.get(a.node, self.values[a.node])
            if isinstance(a, StateRef):
                return param_leaves.get(a.fqn, self.state[a.fqn])
            return a

        args = _tree_map(arg, step.args)
        kwargs = _tree_map(arg, step.kwargs)
        if step.state and getattr(step.fn, "__name__", "") == "call":
            # fx leaf module: its parameters travel as one tuple, in its own order.
            kwargs = {**kwargs, "__state": tuple(param_leaves.get(f, self.state[f])
                                                 for f in step.state)}
        def call() -> Any:
            return step.fn(*args, **kwargs)

        saved: list[torch.Tensor] = []

        def pack(t: torch.Tensor) -> torch.Tensor:
            saved.append(t)
            return t

        try:
            key = _signature(step.target, args, kwargs) if self.measure else None
            known = self.timed.get(key) if key is not None else None
            if known is not None:
                # The same op on the same shapes was timed already (repeated layers): reuse its
                # times; one untimed call still produces the value downstream steps read.
                out = call()
                forward = replace(known[0])
            elif self.measure:
                # Real tensors: every call is timed; FLOPs and saved bytes come from the fake
                # pass that capture runs first, so no call is spent on counting.
                forward, out = self._time_phase(call, Phase())
            else:
                with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), \
                        FlopCounterMode(display=False) as counter:
                    out = call()
                forward = Phase(flops=float(counter.get_total_flops()))
        except Exception as exc:
            raise TrainschedError(
                f"the model's forward failed at {step.name} ({step.target}, module "
                f"'{step.module_path or '<root>'}'): {type(exc).__name__}: "
                f"{str(exc).strip().splitlines()[0] if str(exc).strip() else ''}") from exc
        outs = [o for o in _flatten([out]) if isinstance(o, torch.Tensor)]
        grad_outs = [o for o in outs if o.requires_grad]

        saved_bytes = 0
        for t in saved:
            key = t.untyped_storage()._cdata
            if key in self.state_storages or key in self.saved_storages:
                continue
            self.saved_storages.add(key)
            self._keep.append(t)   # keep the storage alive so its key is never reused
            saved_bytes += t.untyped_storage().nbytes()

        in_bytes = {}
        for r in dict.fromkeys(x.node for x in refs):
            v = self.values[r]
            nbytes = _nbytes(v) if isinstance(v, torch.Tensor) else 0
            for root in self.root[r]:
                in_bytes[root] = in_bytes.get(root, 0) + nbytes
        read_bytes = sum(in_bytes.values()) + sum(_nbytes(self.state[f]) for f in step.state
                                                  if isinstance(self.state[f], torch.Tensor))
        out_bytes = sum(_nbytes(o) for o in outs)
        forward.bytes_accessed = read_bytes + out_bytes

        dx = dw = None
        if known is not None:
            dx = replace(known[1]) if known[1] is not None else None
            dw = replace(known[2]) if known[2] is not None else None
        elif grad_outs:
            grads = [torch.ones_like(o) for o in grad_outs]
            grad_bytes = sum(_nbytes(g) for g in grads)
            if act_leaves:
                dx = self._backward(grad_outs, grads, act_leaves)
                dx.bytes_accessed = grad_bytes + saved_bytes + sum(_nbytes(a) for a in act_leaves)
            if param_leaves:
                dw = self._backward(grad_outs, grads, list(param_leaves.values()))
                dw.bytes_accessed = grad_bytes + saved_bytes + sum(
                    _nbytes(p) for p in param_leaves.values())

        if key is not None and known is None:
            self.timed[key] = (forward, dx, dw)
        temp_bytes = 0
        if self.measure and self.device.type == "cuda":
            temp_bytes = self._cuda_temp(call, out_bytes)
        # Downstream steps see plain values; they build their own leaves.
        result = out.detach() if isinstance(out, torch.Tensor) else _tree_map(
            lambda x: x.detach() if isinstance(x, torch.Tensor) else x, out)
        self.values[step.name] = result
        self.requires_grad[step.name] = bool(grad_outs)
        self.root[step.name] = [step.name]
        return StepCost(name=step.name, forward=forward, dx=dx, dw=dw, output_bytes=out_bytes,
                        saved_bytes=saved_bytes, temp_bytes=temp_bytes,
                        dtype=_dtype_name(outs[0] if outs else None), inputs=in_bytes,
                        requires_grad=bool(grad_outs))

    def _backward(self, outs: list[torch.Tensor], grads: list[torch.Tensor],
                  wrt: list[torch.Tensor]) -> Phase:
        def grad() -> Any:
            return torch.autograd.grad(outs, wrt, grads, retain_graph=True, allow_unused=True)

        if self.measure:
            return self._time_phase(grad, Phase())[0]
        with FlopCounterMode(display=False) as counter:
            grad()
        return Phase(flops=float(counter.get_total_flops()))

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _time_phase(self, fn: Callable[[], Any], phase: Phase) -> tuple[Phase, Any]:
        """Median of up to ``repeats`` timed calls; at least ``MIN_REPEATS``, and no more once
        the samples add up to ``PHASE_BUDGET_S`` (big ops are stable, small ones need many).
        A round spread wider than ``SPREAD_LIMIT`` is timed again (at most ``REMEASURES``
        times) and the round with the lowest median kept. Returns the phase and the last
        call's result."""
        for _ in range(self.warmup):
            fn()
        best, result = self._timed_round(fn)
        for _ in range(REMEASURES):
            if best[2] <= SPREAD_LIMIT * best[1]:
                break
            self.remeasured += 1
            again, result = self._timed_round(fn)
            best = min(best, again)
        if best[2] > SPREAD_LIMIT * best[1]:
            self.noisy += 1
        phase.median_s, phase.p10_s, phase.p90_s, phase.samples = best
        return phase, result

    def _timed_round(self, fn: Callable[[], Any]) -> tuple[tuple[float, float, float, int], Any]:
        """One round of timed calls: ((median, p10, p90, samples), last result)."""
        samples: list[float] = []
        result = None
        while len(samples) < self.repeats:
            self._sync()
            start = time.perf_counter()
            result = fn()
            self._sync()
            samples.append(time.perf_counter() - start)
            if len(samples) >= min(MIN_REPEATS, self.repeats) and sum(samples) > PHASE_BUDGET_S:
                break
        return (*_percentiles(samples), len(samples)), result

    def _cuda_temp(self, fn: Callable[[], Any], out_bytes: int) -> int:
        self._sync()
        torch.cuda.reset_peak_memory_stats(self.device)
        before = torch.cuda.memory_allocated(self.device)
        fn()
        self._sync()
        peak = torch.cuda.max_memory_allocated(self.device)
        return max(0, peak - before - out_bytes)
