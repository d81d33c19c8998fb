"""Cut an exported model into pipeline stages that run forward and backward per micro-batch.

:func:`build_stages` exports the model once (:func:`~trainsched.runtime.exported.export_program`,
the program capture names its ops after) and cuts it into one :class:`PipelineStage` per tuple
of forward op names (``stage_costs_from_graph(...).ops`` gives them). The pipeline runtime
(:mod:`trainsched.runtime.pipeline`) runs a schedule's actions on these stages, on real processes
or in one process (``run_local``).

- **What a stage evaluates.** Its ops (the exported nodes named in its tuple), the views and
  other non-op nodes that read its ops' values or its inputs (a node reading values of
  several stages goes to the latest of them), and the input-independent nodes its nodes read
  (``t(weight)``, masks), evaluated again in every stage that reads them.
- **Inputs and outputs.** Stage 0 takes the model's flat user inputs; stage ``s > 0`` takes
  exactly what stage ``s - 1`` outputs: every value produced in stages ``<= s - 1`` that a stage
  ``>= s`` reads, in program order. A skip connection across several stages is therefore passed
  through each stage in between. The last stage returns the model's outputs and a loss.
- **State.** A parameter or buffer belongs to the stage whose nodes read it; one read in two
  stages (tied weights) is refused. The model's own ``Parameter`` objects are used, so gradients
  land on the model. New BatchNorm statistics the program returns are copied into the buffers
  after each forward, as :class:`~trainsched.runtime.placed.PlacedModule` does.
- **Loss.** The mean square of the first floating output (``trainsched train``'s loss) divided
  by the number of micro-batches, so the gradients summed over the micro-batches are those of
  the whole batch's loss (gradient accumulation).
- **Backward.** ``backward`` (``B``) runs autograd from the outputs, given their gradients, and
  returns the gradients of the floating inputs. ``backward_input`` (``I``) computes only those
  and the gradients at the outputs of the nodes that read parameters, keeping the graph;
  ``backward_weight`` (``W``) then turns them into parameter gradients, one node at a time, so it
  repeats no activation gradient. A parameter read by several nodes of one stage gets its
  gradient in ``I`` already (a per-node ``W`` would count the paths between them twice).
- **What ``I`` frees.** When every weight node of a stage is a ``linear`` or a ``layer_norm``
  reading its parameters directly (transformers, MLPs), ``W`` needs only each node's input and
  its output gradient: it computes the parameter gradients from them by formula (``gyᵀx`` and
  the sum of ``gy``; the sums of ``gy · x̂`` and ``gy``), so ``I`` runs autograd without
  keeping the graph and everything else the forward saved is freed at ``I``, as the memory
  model says. Any other weight node (a convolution, batch norm) keeps the graph until ``W``.
  A ``layer_norm``'s weight gradient is not deferred: ``I`` runs its formula at once and keeps
  nothing for it (a norm's backward is one op in the training graph; its ``dW`` takes no time).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.utils._pytree as pytree
from torch import fx, nn

from trainsched.errors import TrainschedError
from trainsched.runtime.exported import ExportedProgram, export_program, flatten_inputs
from trainsched.runtime.weight_grads import accumulate_grads, deferred, weight_formula

if TYPE_CHECKING:
    from trainsched.runtime.saved_memory import SavedTensorMeter

__all__ = ["PipelineStage", "Spec", "build_stages", "flat_microbatches", "loss_of",
           "split_microbatches"]

Spec = tuple[tuple[int, ...], torch.dtype]  # a tensor's shape and dtype, to receive it


def _listed(names: Sequence[str], limit: int = 8) -> str:
    shown = ", ".join(repr(n) for n in names[:limit])
    return shown + (f", ... ({len(names) - limit} more)" if len(names) > limit else "")


# --- splitting the batch ------------------------------------------------------------------------


def split_microbatches(args: tuple, kwargs: Mapping[str, Any],
                       num_microbatches: int) -> list[tuple[tuple, dict[str, Any]]]:
    """Split the batch along dim 0 into ``num_microbatches`` equal micro-batches.

    The batch size is the first dimension of the first tensor input; every tensor input with
    that first dimension is split, other inputs go whole to every micro-batch.
    """
    m = num_microbatches
    if not (isinstance(m, int) and not isinstance(m, bool) and m >= 1):
        raise TrainschedError(f"num_microbatches must be an integer >= 1, got {m!r}")
    batched = [t for t in pytree.tree_leaves((args, dict(kwargs)))
               if isinstance(t, torch.Tensor) and t.dim() >= 1]
    if not batched:
        raise TrainschedError("the model takes no tensor input with a batch dimension to split "
                              "into micro-batches")
    batch = batched[0].shape[0]
    if batch % m:
        raise TrainschedError(f"batch size {batch} is not divisible by {m} micro-batches; use a "
                              f"batch size that is a multiple of the number of micro-batches")
    size = batch // m

    def piece(k: int) -> tuple[tuple, dict[str, Any]]:
        def cut(x: Any) -> Any:
            if isinstance(x, torch.Tensor) and x.dim() >= 1 and x.shape[0] == batch:
                return x[k * size:(k + 1) * size].clone()
            return x
        return pytree.tree_map(cut, (tuple(args), dict(kwargs)))

    return [piece(k) for k in range(m)]


def loss_of(output: Any) -> torch.Tensor:
    """The mean square of the first floating tensor of ``output`` (a tensor, an object with
    ``logits``, a mapping or a sequence), as ``trainsched train`` computes its loss."""
    if isinstance(output, torch.Tensor):
        return output.float().square().mean()
    logits = getattr(output, "logits", None)
    if isinstance(logits, torch.Tensor):
        return loss_of(logits)
    values = list(output.values()) if isinstance(output, Mapping) else output
    if isinstance(values, list | tuple):
        for v in values:
            if isinstance(v, torch.Tensor) and v.is_floating_point():
                return loss_of(v)
    raise TrainschedError(f"cannot make a loss from the model's output "
                          f"({type(output).__name__}); return a tensor or logits")


# --- the cut ------------------------------------------------------------------------------------


@dataclass
class _Cut:
    """What one stage evaluates, receives and sends, and the state it owns."""

    nodes: list[str] = field(default_factory=list)      # evaluated here, program order
    inputs: list[str] = field(default_factory=list)     # received (stage 0: user inputs)
    outputs: list[str] = field(default_factory=list)    # sent on (empty for the last stage)
    params: list[str] = field(default_factory=list)     # trainable parameters (fqn)
    weight_nodes: dict[str, list[str]] = field(default_factory=dict)  # node -> its own params
    shared: list[str] = field(default_factory=list)     # params whose gradient ``I`` computes
    mutations: list[tuple[str, str]] = field(default_factory=list)  # (value node, buffer fqn)


def _stage_of_ops(program: ExportedProgram, stages: Sequence[Sequence[str]]) -> dict[str, int]:
    known = set(program.steps) | set(program.tensor_inputs)
    stage_of: dict[str, int] = {}
    unknown: list[str] = []
    repeated: list[str] = []
    for s, names in enumerate(stages):
        if isinstance(names, str) or not names:
            raise TrainschedError(f"stage {s} must be a non-empty sequence of op names, got "
                                  f"{names!r}")
        for name in names:
            if name not in known:
                unknown.append(str(name))
            elif name in stage_of:
                repeated.append(name)
            else:
                stage_of[name] = s
    if unknown:
        raise TrainschedError(
            f"{len(unknown)} op name(s) of the stages are not forward ops of the model: "
            f"{_listed(unknown)}; take the stages from the graph captured from the same model "
            "(stage_costs_from_graph(...).ops)")
    if repeated:
        raise TrainschedError(f"op(s) {_listed(repeated)} appear in more than one stage; give "
                              "every op exactly one stage")
    missing = [n for n in program.steps if n not in stage_of]
    if missing:
        raise TrainschedError(f"the stages leave {len(missing)} forward op(s) of the model out: "
                              f"{_listed(missing)}; every forward op must be in one stage")
    return stage_of


def _homes(program: ExportedProgram, order: list[str], stage_of: dict[str, int],
           trainable: Sequence[str]) -> tuple[dict[str, int], dict[str, set[str]]]:
    """The stage of every node that reads an input or an op (the rest float), and for each
    floating node the trainable parameters it reads."""
    home: dict[str, int] = {}
    params_under: dict[str, set[str]] = {}
    for name in order:
        node = program.nodes[name]
        if name in program.user_inputs and name not in program.constant_inputs:
            home[name] = 0
            continue
        if node.op == "placeholder":   # state, or an input export baked in
            kind, fqn = program.state_of.get(name, ("input", name))
            params_under[name] = {fqn} if kind == "param" and fqn in trainable else set()
            continue
        placed = [i.name for i in node.all_input_nodes if i.name in home]
        if name in stage_of:
            late = [i for i in placed if home[i] > stage_of[name]]
            if late:
                raise TrainschedError(
                    f"op {name!r} in stage {stage_of[name]} reads {late[0]!r}, computed in "
                    f"stage {home[late[0]]}; stages must follow the data flow (contiguous runs "
                    "of the graph's topological order)")
            home[name] = stage_of[name]
        elif placed:
            home[name] = max(home[i] for i in placed)
        else:
            params_under[name] = set().union(*(params_under[i.name]
                                               for i in node.all_input_nodes))
    return home, params_under


def _closure(program: ExportedProgram, roots: set[str]) -> set[str]:
    seen: set[str] = set()
    stack = list(roots)
    while stack:
        name = stack.pop()
        if name not in seen:
            seen.add(name)
            stack.extend(i.name for i in program.nodes[name].all_input_nodes)
    return seen


def _cut(program: ExportedProgram, stages: Sequence[Sequence[str]],
         trainable: Sequence[str]) -> list[_Cut]:
    """Give every needed node a stage (module docstring) and list each stage's traffic."""
    nodes, num = program.nodes, len(stages)
    stage_of = _stage_of_ops(program, stages)
    outs = [o.name for o in program.outputs if isinstance(o, fx.Node)]
    needed = _closure(program, {*program.steps, *dict(program.mutations), *outs})
    order = [n for n in nodes if n in needed]
    home, params_under = _homes(program, order, stage_of, trainable)

    cuts = [_Cut() for _ in range(num)]
    roots: list[set[str]] = [set() for _ in range(num)]   # floating nodes each stage reads
    last_use = dict(home)
    readers: dict[str, list[str]] = {}                     # param -> nodes that read it
    for name in order:
        if name not in home:
            continue
        mine: set[str] = set()
        for i in nodes[name].all_input_nodes:
            if i.name in home:
                last_use[i.name] = max(last_use[i.name], home[name])
            else:
                roots[home[name]].add(i.name)
                mine |= params_under[i.name]
        for fqn in sorted(mine):
            readers.setdefault(fqn, []).append(name)
    for name in outs:
        if name in home:
            last_use[name] = num - 1
        else:
            roots[num - 1].add(name)
    first_of_module: dict[str, int] = {}
    for name in program.steps:
        first_of_module.setdefault(program.module_path[name], stage_of[name])
    for value, fqn in program.mutations:   # a buffer update goes with the value it copies
        s = home.get(value, first_of_module.get(fqn.rpartition(".")[0], 0))
        if value not in home:
            roots[s].add(value)
        cuts[s].mutations.append((value, fqn))

    owner: dict[str, list[int]] = {fqn: [] for _, fqn in program.mutations}
    for s in range(num):
        floating = _closure(program, roots[s])
        for name in floating:
            kind, fqn = program.state_of.get(name, ("input", name))
            if kind in ("param", "buffer"):
                owner.setdefault(fqn, []).append(s)
        cuts[s].nodes = [n for n in order if n in floating or home.get(n) == s]
    for fqn, where in sorted(owner.items()):
        if len(where) > 1:
            kind = "parameter" if fqn in trainable else "parameter or buffer"
            raise TrainschedError(
                f"{kind} {fqn!r} is read by ops in stages {sorted(where)}: stages cannot share "
                "parameters or buffers (tied weights) yet; put the ops that read it in one stage")
    for s, cut in enumerate(cuts):
        for _value, fqn in cut.mutations:
            if owner[fqn] not in ([], [s]):
                raise TrainschedError(f"buffer {fqn!r} is read in stage {owner[fqn][0]} but "
                                      f"updated in stage {s}; put its module in one stage")
        cut.params = [f for f in trainable if owner.get(f) == [s]]
        for fqn in cut.params:   # one reader: its W is local; several: I computes it
            who = readers.get(fqn, [])
            if len(who) == 1:
                cut.weight_nodes.setdefault(who[0], []).append(fqn)
            else:
                cut.shared.append(fqn)
        cut.inputs = list(program.user_inputs) if s == 0 else cuts[s - 1].outputs
        if s < num - 1:
            cut.outputs = [n for n in order if n in home and home[n] <= s < last_use[n]]
            for name in cut.outputs:
                if not isinstance(nodes[name].meta.get("val"), torch.Tensor):
                    raise TrainschedError(f"stage {s} would send {name!r}, which is not a "
                                          "tensor; cut the stages elsewhere")
        received = set(cut.inputs)
        cut.nodes = [n for n in cut.nodes if n not in received]
    return cuts


# --- a stage ------------------------------------------------------------------------------------


@dataclass
class _Saved:
    """One micro-batch's forward, kept for its backward."""

    leaves: list[torch.Tensor]               # the floating inputs (leaves of this stage)
    pairs: list[tuple[torch.Tensor, int]]    # outputs that need a gradient, their grad index
    weights: dict[str, list[torch.Tensor]]   # weight node -> its output tensors
    weight_grads: dict[str, list[Any]] | None = None   # filled by ``I``
    held: list[Any] = field(default_factory=list)       # meter handles of what W needs
    weight_inputs: dict[str, Any] = field(default_factory=dict)  # formula W: node -> input


class PipelineStage:
    """Stage ``index`` of ``num_stages``: forward and backward of one micro-batch at a time.

    ``input_specs`` are the shapes and dtypes it receives (stage 0: the model's flat inputs),
    ``grad_specs`` those of the output gradients it receives (one per floating output).
    ``parameters`` are the model's own trainable parameters this stage owns, by name.
    ``meter``, when set, counts the activations the stage holds (:mod:`~trainsched.runtime.
    saved_memory`).
    """

    def __init__(self, program: ExportedProgram, cut: _Cut, index: int, num_stages: int,
                 model: nn.Module, num_microbatches: int) -> None:
        self.index, self.num_stages = index, num_stages
        self.is_last = index == num_stages - 1
        self._program, self._cut, self._model = program, cut, model
        self._scale = 1.0 / num_microbatches
        self.input_names = tuple(cut.inputs)
        self.output_names = tuple(cut.outputs)
        vals = [program.nodes[n].meta.get("val") for n in cut.inputs]
        self.input_specs: tuple[Spec, ...] = tuple(
            (tuple(v.shape), v.dtype) if isinstance(v, torch.Tensor) else ((), torch.float32)
            for v in vals)
        self._float_in = [k for k, v in enumerate(vals) if index > 0 and v.is_floating_point()]
        outs = [program.nodes[n].meta["val"] for n in cut.outputs]
        self._float_out = [k for k, v in enumerate(outs) if v.is_floating_point()]
        self.grad_specs: tuple[Spec, ...] = tuple((tuple(outs[k].shape), outs[k].dtype)
                                                  for k in self._float_out)
        self.parameters: dict[str, nn.Parameter] = {f: model.get_parameter(f)
                                                    for f in cut.params}
        self._saved: dict[int, _Saved] = {}
        self.losses: dict[int, float] = {}
        self.meter: SavedTensorMeter | None = None
        formulas = {n: weight_formula(program, model, program.nodes[n], fqns)
                    for n, fqns in cut.weight_nodes.items()}
        # W by formula for every weight node, or by the kept graph for all of them
        self._formulas = formulas if all(formulas.values()) else None
        # weight nodes whose formula I runs at once (norms), when W goes by formula
        self._eager = [] if self._formulas is None else \
            [n for n in self._formulas if not deferred(program.nodes[n])]

    @property
    def model(self) -> nn.Module:
        """The whole model the stage was cut from (its parameters are the model's own)."""
        return self._model

    def __repr__(self) -> str:
        return (f"<PipelineStage {self.index}/{self.num_stages}: {len(self._cut.nodes)} nodes, "
                f"{len(self.input_names)} inputs, {len(self.output_names)} outputs, "
                f"{len(self.parameters)} parameters>")

    def _state(self, name: str) -> Any:
        if name in self._program.constant_inputs:
            return self._program.constant_inputs[name]
        kind, fqn = self._program.state_of[name]
        if kind == "param":
            return self._model.get_parameter(fqn)
        if kind == "buffer":
            return self._model.get_buffer(fqn).data   # updated in place after the forward
        return self._program.constants[fqn]

    def forward(self, microbatch: int, inputs: Sequence[Any]) -> list[torch.Tensor]:
        """Run the forward of ``microbatch``; return the tensors to send (none for the last
        stage, which keeps the loss in ``losses``)."""
        if microbatch in self._saved:
            raise TrainschedError(f"stage {self.index} ran forward of micro-batch {microbatch} "
                                  "twice before its backward")
        inputs = list(inputs)
        for k in self._float_in:
            inputs[k] = inputs[k].detach().requires_grad_(True)
        values = dict(zip(self.input_names, inputs, strict=True))
        nodes = self._program.nodes
        with torch.enable_grad(), self.meter.saving() if self.meter else nullcontext():
            for name in self._cut.nodes:
                node = nodes[name]
                if node.op == "placeholder":
                    values[name] = self._state(name)
                    continue
                args = fx.node.map_arg(node.args, lambda n: values[n.name])
                kwargs = fx.node.map_arg(node.kwargs, lambda n: values[n.name])
                values[name] = node.target(*args, **kwargs)
            with torch.no_grad():
                for value, fqn in self._cut.mutations:
                    self._model.get_buffer(fqn).copy_(values[value])
            weights = {n: [t for t in pytree.tree_leaves(values[n])
                           if isinstance(t, torch.Tensor) and t.requires_grad]
                       for n in self._cut.weight_nodes}
            if self.is_last:
                flat = [values[o.name] if isinstance(o, fx.Node) else o
                        for o in self._program.outputs]
                loss = loss_of(pytree.tree_unflatten(flat, self._program.out_spec)) * self._scale
                self.losses[microbatch] = float(loss.detach())
                pairs = [(loss, -1)] if loss.requires_grad else []
                sent: list[torch.Tensor] = []
            else:
                sent = [values[n] for n in self.output_names]
                pairs = [(sent[k], j) for j, k in enumerate(self._float_out)
                         if sent[k].requires_grad]
        leaves = [inputs[k] for k in self._float_in]
        self._saved[microbatch] = _Saved(leaves=leaves, pairs=pairs, weights=weights)
        if self._formulas is not None:
            self._saved[microbatch].weight_inputs = {
                n: values[nodes[n].args[0].name].detach() for n in self._formulas}
        return [t.detach() for t in sent]

    def _roots(self, microbatch: int, grads: Sequence[torch.Tensor],
               keep: bool) -> tuple[_Saved, list[torch.Tensor], list[Any]]:
        saved = self._saved.get(microbatch) if keep else self._saved.pop(microbatch, None)
        if saved is None:
            raise TrainschedError(f"stage {self.index} has no forward of micro-batch "
                                  f"{microbatch} to run a backward for")
        if len(grads) != len(self.grad_specs):
            raise TrainschedError(f"stage {self.index} got {len(grads)} output gradients, "
                                  f"expected {len(self.grad_specs)}")
        return (saved, [t for t, _ in saved.pairs],
                [None if j < 0 else grads[j] for _, j in saved.pairs])

    def _input_grads(self, leaves: list[torch.Tensor], got: Sequence[Any]) -> list[torch.Tensor]:
        return [torch.zeros_like(x) if g is None else g for x, g in zip(leaves, got, strict=True)]

    def backward(self, microbatch: int, grads: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Full backward (``B``): parameter gradients accumulate; returns input gradients."""
        saved, outputs, grad_outputs = self._roots(microbatch, grads, keep=False)
        if outputs:
            torch.autograd.backward(outputs, grad_outputs)
        return self._input_grads(saved.leaves, [x.grad for x in saved.leaves])

    def backward_input(self, microbatch: int,
                       grads: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Input gradients only (``I``), keeping what :meth:`backward_weight` needs."""
        saved, outputs, grad_outputs = self._roots(microbatch, grads, keep=True)
        weight = [t for n in self._cut.weight_nodes for t in saved.weights[n]]
        shared = [self.parameters[f] for f in self._cut.shared]
        wanted = [*saved.leaves, *weight, *shared]
        by_formula = self._formulas is not None
        if by_formula and self.meter is not None:   # kept for W after the graph is freed
            saved.held += self.meter.hold(x for n, x in saved.weight_inputs.items()
                                          if n not in self._eager)
        got: Sequence[Any] = [None] * len(wanted)
        if outputs and wanted:
            got = torch.autograd.grad(outputs, wanted, grad_outputs,
                                      retain_graph=not by_formula, allow_unused=True)
        n, w = len(saved.leaves), len(weight)
        captured, at = {}, n
        for node in self._cut.weight_nodes:
            captured[node] = list(got[at:at + len(saved.weights[node])])
            at += len(saved.weights[node])
        if by_formula:   # W needs none of the graph: let it go now; norms' W runs now
            saved.pairs, saved.weights = [], {}
            del outputs, weight
            assert self._formulas is not None
            for node in self._eager:
                gy = captured.pop(node)
                if gy and gy[0] is not None:
                    self._formulas[node](saved.weight_inputs[node], gy[0])
                del saved.weight_inputs[node]
        saved.weight_grads = captured
        if self.meter is not None:
            saved.held += self.meter.hold(g for gs in captured.values() for g in gs)
        accumulate_grads(shared, got[n + w:])
        return self._input_grads(saved.leaves, got[:n])

    def backward_weight(self, microbatch: int) -> None:
        """Weight gradients (``W``) of a micro-batch whose ``I`` ran: one node at a time."""
        saved = self._saved.pop(microbatch, None)
        if saved is None or saved.weight_grads is None:
            raise TrainschedError(f"stage {self.index} runs W of micro-batch {microbatch} "
                                  "before its I")
        if self._formulas is not None:
            for node, gy in saved.weight_grads.items():
                if gy and gy[0] is not None:
                    self._formulas[node](saved.weight_inputs[node], gy[0])
            return
        for node, fqns in self._cut.weight_nodes.items():
            pairs = [(t, g) for t, g in zip(saved.weights[node], saved.weight_grads[node],
                                            strict=True) if g is not None]
            if not pairs:
                continue
            params = [self.parameters[f] for f in fqns]
            got = torch.autograd.grad([t for t, _ in pairs], params, [g for _, g in pairs],
                                      retain_graph=True, allow_unused=True)
            accumulate_grads(params, got)


def build_stages(model: nn.Module, stages: Sequence[Sequence[str]], example_args: tuple,
                 example_kwargs: Mapping[str, Any] | None = None, *,
                 num_microbatches: int = 1) -> tuple[PipelineStage, ...]:
    """Export ``model`` on one micro-batch (``example_args``/``example_kwargs``) and cut it into
    one :class:`PipelineStage` per tuple of forward op names (module docstring); the loss of a
    micro-batch is divided by ``num_microbatches``."""
    if isinstance(stages, str) or not stages:
        raise TrainschedError("give at least one stage (a sequence of op-name sequences)")
    args = example_args if isinstance(example_args, tuple) else (example_args,)
    program = export_program(model, args, dict(example_kwargs or {}), purpose="the pipeline")
    trainable = [fqn for kind, fqn in program.state_of.values()
                 if kind == "param" and model.get_parameter(fqn).requires_grad]
    cuts = _cut(program, stages, trainable)
    return tuple(PipelineStage(program, cut, s, len(cuts), model, num_microbatches)
                 for s, cut in enumerate(cuts))


def flat_microbatches(stage: PipelineStage, microbatches: Sequence[tuple[tuple, dict]]
                      ) -> list[list[Any]]:
    """Each micro-batch as stage 0's flat input list."""
    return [flatten_inputs(stage._program, a, k, purpose="the pipeline") for a, k in microbatches]
