"""torch -> Graph: trace a model, cost every step, and build the forward graph.

Costs come from one of three tiers (recorded in ``graph.meta["tier"]``):

- ``measured``: every step runs for real on the device at hand (CPU here, CUDA where present) and
  its forward, input-gradient and weight-gradient times are medians over repeats; whole eager
  training steps are timed too, and what the ops miss of them is charged to the ops
  (:mod:`trainsched.capture.step`, :mod:`trainsched.graph.overhead`);
- ``roofline``: nothing runs; each phase costs max(FLOPs / (0.75 x peak), bytes / bandwidth) +
  launch overhead on a named device kind (``costs.roofline_s``);
- ``static``: shapes, FLOPs and bytes only, every time zero.

The graph is built at op granularity (one op per ATen call) and can be coarsened to modules.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator, Mapping
from dataclasses import replace
from typing import Any

import torch

from trainsched.capture.profile import Phase, Progress, StepCost, StepRunner
from trainsched.capture.step import time_eager_step, time_optimizer_step
from trainsched.capture.trace import Traced, _tree_map, quiet_torch_logs, trace
from trainsched.errors import TrainschedError
from trainsched.graph import OPTIMIZER_STEP, PARAM_TENSORS, Edge, Graph, Op, coarsen_by_module
from trainsched.graph.overhead import charge_step_overhead
from trainsched.precision import check_precision

TIERS = ("measured", "roofline", "static")
GRANULARITIES = ("op", "module")


def capture(model: torch.nn.Module, example_inputs: tuple | Any = (), *,
            example_kwargs: Mapping[str, Any] | None = None,
            granularity: str = "op", module_depth: int | None = None,
            costs: str = "measured", device_kind: str | None = None,
            device: str | torch.device | None = None, warmup: int = 0, repeats: int = 10,
            method: str = "auto", name: str = "model", threads: int | None = None,
            precision: str = "fp32", meta: Mapping[str, Any] | None = None,
            progress: Progress | None = None, inputs_require_grad: bool = False,
            step_overhead: bool = True) -> Graph:
    """Capture ``model`` on an example batch into a forward :class:`~trainsched.graph.Graph`.

    ``example_inputs`` are the positional arguments of ``model.forward`` (a single tensor is
    accepted), ``example_kwargs`` its keyword arguments. ``granularity`` is ``"op"`` (ATen ops)
    or ``"module"`` (ops of one module call become one op; ``module_depth`` truncates module
    paths to that many components, e.g. 2 gives ResNet blocks ``layer1.0``). ``costs`` picks the
    tier (see the module docstring); ``device_kind`` names the device of the roofline tier
    (default H100). ``device`` is where measured costs run (default: CUDA when available, else
    CPU); the model is moved there. Each measured phase runs ``warmup`` untimed calls, then up
    to ``repeats`` timed calls: at least 3, and no more once they add up to a quarter second.
    ``precision`` (:data:`trainsched.precision.PRECISIONS`) is how training runs: ``bf16``/``fp16``
    convert the model (in place, as measuring moves it to ``device``) and its floating inputs,
    ``amp-*`` run every pass under ``torch.autocast``, so shapes, bytes and each op's dtype are
    PyTorch's own; ``tf32`` costs fp32 ops at the device's TF32 rate (roofline) or enables TF32
    math (measured on a GPU).
    ``threads`` sets torch's intra-op threads for the capture (restored afterwards); measured
    costs on the CPU default to one thread, the way the runtime runs every rank there (two
    ranks sharing a host's cores, or a busy host, inflate multi-threaded op times many-fold).
    A measured phase whose samples spread wider than
    :data:`~trainsched.graph.core.SPREAD_LIMIT` is timed again; the graph's meta counts
    the phases re-measured and those still spread (``remeasured_phases``, ``noisy_phases``).
    ``inputs_require_grad`` captures a pipeline stage on its own: its floating inputs are a
    previous stage's activations, so the ops reading them get (and are timed with) an input
    gradient; ``meta["grad_inputs"]`` names those inputs, which the training transform honours.
    ``step_overhead`` (measured tier): also time whole eager training steps and charge what the
    ops timed one by one miss (autograd engine, allocator, Python between ops) to the ops, per
    op (:func:`trainsched.graph.overhead.charge_step_overhead`; ``meta["step_overhead"]``
    records it), and time plain SGD's ``step()`` + ``zero_grad()`` on the model
    (``meta["optimizer_step"]``), which the training transform charges to the ``sgd``
    optimizer ops (:func:`trainsched.graph.training.charge_optimizer_step`).
    """
    if threads is not None and threads < 1:
        raise TrainschedError(f"threads must be at least 1, got {threads}")
    check_precision(precision)
    if threads is None and costs == "measured" and measure_device(device).type == "cpu":
        threads = 1
    previous = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        with quiet_torch_logs():
            return _capture(model, example_inputs, example_kwargs, granularity, module_depth,
                            costs, device_kind, device, warmup, repeats, method, name,
                            {**(meta or {}), "precision": precision}, progress,
                            bool(inputs_require_grad), bool(step_overhead))
    finally:
        torch.set_num_threads(previous)


def _capture(model: torch.nn.Module, example_inputs: Any, example_kwargs: Any,
             granularity: str, module_depth: int | None, costs: str, device_kind: str | None,
             device: Any, warmup: int, repeats: int, method: str, name: str,
             meta: Mapping[str, Any] | None, progress: Progress | None,
             inputs_require_grad: bool = False, step_overhead: bool = True) -> Graph:
    if granularity not in GRANULARITIES:
        raise TrainschedError(f"unknown granularity {granularity!r}; use op or module")
    if costs not in TIERS:
        raise TrainschedError(f"unknown cost tier {costs!r}; use one of {', '.join(TIERS)}")
    if repeats < 1 or warmup < 0:
        raise TrainschedError("repeats must be at least 1 and warmup at least 0")
    if module_depth is not None and module_depth < 1:
        raise TrainschedError("module depth must be at least 1")
    if module_depth is not None and granularity != "module":
        raise TrainschedError(f"module_depth groups ops by module: it applies to granularity "
                              f"'module', not {granularity!r}")
    args = example_inputs if isinstance(example_inputs, tuple) else (example_inputs,)
    kwargs = dict(example_kwargs or {})
    spec = None
    if costs == "roofline":
        from trainsched.cluster import DeviceSpec
        from trainsched.cluster import device_kind as lookup_device_kind

        spec = device_kind if isinstance(device_kind, DeviceSpec) else lookup_device_kind(
            device_kind or "H100")
    measure = costs == "measured"
    run_device = measure_device(device) if measure or device is not None else None
    precision = (meta or {}).get("precision", "fp32")
    if measure and precision == "tf32" and run_device.type != "cuda":
        raise TrainschedError("tf32 is a GPU math mode: measure fp32 on the CPU, or cost tf32 "
                              "for a GPU with the roofline tier")

    model.train()
    if measure:
        model.to(run_device)
        args, kwargs = _to_device((args, kwargs), run_device)
    if precision in HALF:
        model.to(HALF[precision])
        args, kwargs = _tree_map(lambda v: v.to(HALF[precision]) if isinstance(v, torch.Tensor)
                                 and v.is_floating_point() else v, (args, kwargs))
    traced = trace(model, args, kwargs, method)
    from torch._subclasses.fake_tensor import FakeTensorMode

    # Shapes, FLOPs and saved bytes always come from a pass on fake tensors (no compute); the
    # measured tier then times every step on real tensors.
    autocast_on = (run_device.type if run_device is not None else "cpu")
    with FakeTensorMode(allow_non_fake_inputs=True) as mode, _math(precision, autocast_on):
        step_costs = StepRunner(traced, measure=False, progress=None if measure else progress,
                                inputs_require_grad=inputs_require_grad
                                ).run(lambda t: mode.from_tensor(t))
    if measure:
        timer = StepRunner(traced, measure=True, warmup=warmup, repeats=repeats,
                           device=run_device, progress=progress,
                           inputs_require_grad=inputs_require_grad)
        with _math(precision, autocast_on):
            timed = timer.run(lambda t: t.detach())
        step_costs = [_with_times(c, t) for c, t in zip(step_costs, timed, strict=True)]

    def phase_s(phase: Phase | None, dtype: str) -> float | None:
        if phase is None:
            return None
        if measure:
            return phase.median_s
        if spec is not None:
            from trainsched import costs as cost_models

            return cost_models.roofline_s(flops=phase.flops, bytes_accessed=phase.bytes_accessed,
                                          device=spec,
                                          dtype="tf32" if precision == "tf32" and
                                          dtype == "fp32" else dtype)
        return 0.0

    graph_meta: dict[str, Any] = {
        "model": name,
        "tier": costs,
        "granularity": "op",
        "trace": traced.method,
        "torch": torch.__version__.split("+")[0],
    }
    if measure:
        graph_meta.update(device=_device_name(run_device), threads=torch.get_num_threads(),
                          warmup=warmup, repeats=repeats, timed_signatures=len(timer.timed),
                          remeasured_phases=timer.remeasured, noisy_phases=timer.noisy,
                          memory_bandwidth_bytes_per_s=_copy_bandwidth(run_device))
    elif spec is not None:
        graph_meta.update(device=spec.kind,
                          memory_bandwidth_bytes_per_s=spec.memory_bandwidth_bytes_per_s,
                          launch_overhead_s=spec.launch_overhead_s)
    if inputs_require_grad:
        graph_meta["grad_inputs"] = [n for n, v in traced.inputs.items()
                                     if isinstance(v, torch.Tensor) and v.is_floating_point()]
    graph_meta.update(dict(meta or {}))
    graph = _build_graph(traced, step_costs, phase_s, graph_meta)
    if measure and step_overhead:
        # After the per-op timings, on the same inputs, threads and precision.
        with _math(precision, autocast_on):
            eager = time_eager_step(model, args, kwargs, device=run_device, warmup=warmup,
                                    repeats=repeats, inputs_require_grad=inputs_require_grad)
            update = time_optimizer_step(model, device=run_device, warmup=warmup,
                                         repeats=repeats)
        graph = charge_step_overhead(graph, step_s=eager.step_s, forward_s=eager.forward_s,
                                     steps=eager.steps)
        if update is not None:  # charged by the training transform to the optimizer ops
            record = {"optimizer": "sgd", "step_s": update.step_s, "steps": update.steps,
                      "params": update.params}
            graph = Graph(graph.ops, graph.edges, {**graph.meta, OPTIMIZER_STEP: record})
    if granularity == "module":
        graph = coarsen_by_module(graph, depth=module_depth)
    return graph


#: The precisions whose parameters and inputs are converted, and to what.
HALF = {"bf16": torch.bfloat16, "fp16": torch.float16}
#: The autocast dtype of each mixed precision.
AUTOCAST = {"amp-bf16": torch.bfloat16, "amp-fp16": torch.float16}


@contextlib.contextmanager
def _math(precision: str, device_type: str) -> Iterator[None]:
    """Autocast for the ``amp-*`` precisions, TF32 matmuls on a GPU for ``tf32``."""
    if precision in AUTOCAST:
        with torch.autocast(device_type, dtype=AUTOCAST[precision]):
            yield
    elif precision == "tf32" and device_type == "cuda":
        saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        try:
            yield
        finally:
            torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
    else:
        yield


def _with_times(counted: StepCost, timed: StepCost) -> StepCost:
    """The fake pass's FLOPs and bytes with the real pass's times (and CUDA workspace)."""
    assert counted.name == timed.name

    def merge(c: Phase | None, t: Phase | None) -> Phase | None:
        if c is None or t is None:
            return c
        return replace(c, median_s=t.median_s, p10_s=t.p10_s, p90_s=t.p90_s, samples=t.samples)

    return replace(counted, forward=merge(counted.forward, timed.forward),
                   dx=merge(counted.dx, timed.dx), dw=merge(counted.dw, timed.dw),
                   temp_bytes=timed.temp_bytes)


def measure_device(device: str | torch.device | None = None) -> torch.device:
    """Where measured costs run: ``device`` (``"cpu"``, ``"cuda"``, ``"cuda:1"``), by default
    CUDA when torch finds a GPU, else the CPU. Any other name, or a CUDA device this machine
    does not have, is a :class:`TrainschedError`."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        found = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        found = None
    if found is None or found.type not in ("cpu", "cuda"):
        raise TrainschedError(f"device {str(device)!r}: costs are measured on 'cpu' or 'cuda' "
                              "(or 'cuda:N' for GPU N)")
    if found.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise TrainschedError(f"device {str(device)!r}: no CUDA device here (torch finds "
                                  "no GPU); measure on 'cpu', or estimate a GPU's costs with "
                                  "the roofline tier")
        if found.index is not None and found.index >= count:
            raise TrainschedError(f"device {str(device)!r}: this machine has {count} CUDA "
                                  f"device{'s' if count > 1 else ''} (cuda:0 to "
                                  f"cuda:{count - 1})")
    return found


def _to_device(value: Any, device: torch.device) -> Any:
    return _tree_map(lambda v: v.to(device) if isinstance(v, torch.Tensor) else v, value)


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return "cpu"


def _copy_bandwidth(device: torch.device) -> float:
    """Measured memory bandwidth: read + write bytes of a 64 MiB copy, best of 5."""
    n = 16 * 2**20
    src = torch.ones(n, device=device)
    dst = torch.empty_like(src)
    best = math.inf
    for _ in range(5):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        dst.copy_(src)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - start)
    return float(round(2 * src.numel() * src.element_size() / best, -6))


def _build_graph(traced: Traced, step_costs: list[StepCost], phase_s: Any,
                 meta: dict[str, Any]) -> Graph:
    steps = {s.name: s for s in traced.steps}
    ops: list[Op] = []
    edges: list[Edge] = []
    for name, value in traced.inputs.items():
        if isinstance(value, torch.Tensor):
            ops.append(Op(name=name, kind="forward", target="input",
                          output_bytes=value.numel() * value.element_size()))
    input_ops = {op.name for op in ops}
    output_of = {name: op.output_bytes for name, op in ((o.name, o) for o in ops)}

    owner: dict[str, str] = {}            # state fqn -> first step that reads it
    sharers: dict[str, list[str]] = {}
    tensors_of: dict[str, list[list[Any]]] = {}  # step -> its own parameters, two or more
    layer = 0
    for cost in step_costs:
        step = steps[cost.name]
        param_bytes = buffer_bytes = 0
        tied: list[str] = []
        tensors: list[list[Any]] = []
        for fqn in step.state:
            tensor = traced.state.get(fqn)
            if not isinstance(tensor, torch.Tensor):
                continue
            sharers.setdefault(fqn, []).append(step.name)
            if fqn in owner:
                if fqn in traced.trainable and owner[fqn] not in tied:
                    tied.append(owner[fqn])   # a tied weight: its gradient adds into owner's
                continue
            owner[fqn] = step.name
            nbytes = tensor.numel() * tensor.element_size()
            if fqn in traced.trainable:
                param_bytes += nbytes
                tensors.append([_local_name(fqn, step.module_path), nbytes])
            else:
                buffer_bytes += nbytes
        fwd_s = phase_s(cost.forward, cost.dtype)
        dx_s = phase_s(cost.dx, cost.dtype)
        dw_s = phase_s(cost.dw, cost.dtype)
        op = Op(
            name=step.name, kind="forward", target=step.target, module_path=step.module_path,
            compute_s=fwd_s or 0.0, flops=cost.forward.flops,
            bytes_accessed=cost.forward.bytes_accessed, param_bytes=param_bytes,
            buffer_bytes=buffer_bytes, output_bytes=cost.output_bytes,
            temp_bytes=cost.temp_bytes, saved_bytes=cost.saved_bytes,
            layer_index=layer if param_bytes else None,
            backward_input_s=dx_s, backward_weight_s=dw_s,
            backward_input_flops=cost.dx.flops if cost.dx else None,
            backward_weight_flops=cost.dw.flops if cost.dw else None,
            compute_p10_s=cost.forward.p10_s, compute_p90_s=cost.forward.p90_s,
            backward_input_p10_s=cost.dx.p10_s if cost.dx else None,
            backward_input_p90_s=cost.dx.p90_s if cost.dx else None,
            backward_weight_p10_s=cost.dw.p10_s if cost.dw else None,
            backward_weight_p90_s=cost.dw.p90_s if cost.dw else None,
            samples=cost.forward.samples, tied_to=tuple(tied),
        )
        if param_bytes:
            layer += 1
        if len(tensors) > 1:
            tensors_of[step.name] = tensors
        ops.append(op)
        output_of[step.name] = cost.output_bytes
        for root, nbytes in cost.inputs.items():
            if root in steps or root in input_ops:
                edges.append(Edge(src=root, dst=step.name,
                                  size_bytes=min(nbytes, output_of[root]) or output_of[root]))
    ops = _share_groups(ops, sharers, traced.trainable)
    if tensors_of:  # each is a gradient of its own on the wire (comm.policy.gradient_tensors)
        meta = {**meta, PARAM_TENSORS: tensors_of}
    return Graph(ops, edges, meta)


def _local_name(fqn: str, module_path: str) -> str:
    """``fqn`` relative to ``module_path`` (``fc1.weight`` in ``fc1``: ``weight``)."""
    prefix = module_path + "."
    return fqn[len(prefix):] if module_path and fqn.startswith(prefix) else fqn


def _share_groups(ops: list[Op], sharers: dict[str, list[str]], trainable: set[str]) -> list[Op]:
    """Ops that read one parameter (tied weights) must share a device: give them one group."""
    parent: dict[str, str] = {}
    tied: set[str] = set()

    def find(x: str) -> str:
        while parent.get(x, x) != x:
            x = parent[x]
        return x

    for fqn, users in sorted(sharers.items()):
        if fqn not in trainable or len(set(users)) < 2:
            continue
        tied.update(users)
        for other in users[1:]:
            a, b = find(users[0]), find(other)
            if a != b:
                parent[b] = a
    return [replace(op, group=f"tied:{find(op.name)}") if op.name in tied else op for op in ops]
