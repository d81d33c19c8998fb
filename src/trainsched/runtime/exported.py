"""The exported training program every torch runtime runs: :func:`export_program`.

:class:`~trainsched.runtime.placed.PlacedModule` and the pipeline stages
(:mod:`trainsched.runtime.stage_modules`) run the very program capture names its ops after:
``torch.export`` + ``run_decompositions({})`` of the model in training mode, with its nodes
classified by capture's own code (:func:`trainsched.capture.trace.normalise_graph`), so an op of a
placement or a stage is a node here by the same name. :func:`flatten_inputs` checks a call's
arguments against the example inputs the program was exported with (static shapes, constants
export baked in).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch import fx, nn
from torch.export.graph_signature import ConstantArgument, InputKind, OutputKind

from trainsched.capture.trace import match_inputs, normalise_graph, quiet_torch_logs
from trainsched.errors import TrainschedError

__all__ = ["ExportedProgram", "export_program", "flatten_inputs"]




@dataclass
class ExportedProgram:
    """The exported training program and what capture calls its ops (:func:`export_program`).

    ``nodes`` are the program's fx nodes by name; ``steps`` the nodes capture makes ops of (the
    op-level names of a placement or a pipeline stage); the rest are user inputs, state
    placeholders (``state_of``) and views or input-independent work evaluated where needed.
    """

    gm: fx.GraphModule
    nodes: dict[str, fx.Node]
    in_spec: Any
    out_spec: Any
    user_inputs: list[str]                 # user-input placeholders, flat-argument order
    constant_inputs: dict[str, Any]        # those export specialised to their example value
    tensor_inputs: list[str]               # those capture makes input ops of
    state_of: dict[str, tuple[str, str]]   # placeholder -> (kind, fqn): param/buffer/constant
    constants: dict[str, Any]
    steps: list[str]                       # capture's op-level ops, program order
    module_path: dict[str, str]
    target: dict[str, str]
    mutations: list[tuple[str, str]]       # (output node, buffer fqn)
    outputs: list[fx.Node | Any]           # user outputs (nodes, or literals)


def export_program(model: nn.Module, args: tuple, kwargs: dict, *,
                   purpose: str = "PlacedModule") -> ExportedProgram:
    """Export ``model`` like capture does and classify nodes with capture's own code.

    ``purpose`` names the caller in the error raised when ``torch.export`` fails.
    """
    model.train()
    try:
        with quiet_torch_logs():
            program = torch.export.export(model, args, kwargs).run_decompositions({})
    except Exception as exc:
        text = str(exc).strip().splitlines()
        raise TrainschedError(
            f"{purpose} needs torch.export, which failed on the model: {type(exc).__name__}: "
            f"{text[0] if text else ''}") from exc
    signature = program.graph_signature
    state_of: dict[str, tuple[str, str]] = {}
    user_inputs: list[str] = []
    constant_inputs: dict[str, Any] = {}   # non-tensor inputs export baked into the program
    for spec in signature.input_specs:
        kind = {InputKind.PARAMETER: "param", InputKind.BUFFER: "buffer",
                InputKind.CONSTANT_TENSOR: "constant"}.get(spec.kind)
        if spec.kind == InputKind.USER_INPUT:
            user_inputs.append(spec.arg.name)
            if isinstance(spec.arg, ConstantArgument):
                constant_inputs[spec.arg.name] = spec.arg.value
        elif kind is not None:
            state_of[spec.arg.name] = (kind, spec.target)
        else:
            raise TrainschedError(f"PlacedModule cannot run a program with {spec.kind.name} "
                                  "inputs; export a model without custom objects or effects")
    constants = dict(getattr(program, "constants", {}) or {})
    mutations: list[tuple[str, str]] = []
    user_outputs: list[str] = []
    output_node = next(n for n in program.graph.nodes if n.op == "output")
    returned = list(output_node.args[0])
    outputs: list[Any] = []
    for spec, value in zip(signature.output_specs, returned, strict=True):
        if spec.kind == OutputKind.BUFFER_MUTATION:
            mutations.append((value.name, spec.target))
        elif spec.kind == OutputKind.USER_OUTPUT:
            outputs.append(value)
            if isinstance(value, fx.Node):
                user_outputs.append(value.name)
        else:
            raise TrainschedError(f"PlacedModule cannot run a program that returns "
                                  f"{spec.kind.name} outputs (the model mutates its inputs?)")

    # Which nodes are ops: capture's classification, on this very program.
    named = dict(program.named_parameters())
    named.update(dict(program.named_buffers()))
    named.update(constants)
    fqn_of = {name: fqn for name, (_kind, fqn) in state_of.items()}
    state = {fqn: named[fqn] for fqn in fqn_of.values() if fqn in named}
    trainable = {fqn for name, (kind, fqn) in state_of.items()
                 if kind == "param" and fqn in state and state[fqn].requires_grad}
    traced = normalise_graph(program.graph, fqn_of, match_inputs(program, args, kwargs), state,
                             trainable, user_outputs, "export")
    nodes = {n.name: n for n in program.graph.nodes}
    return ExportedProgram(
        gm=program.graph_module, nodes=nodes, in_spec=program.call_spec.in_spec,
        out_spec=program.call_spec.out_spec, user_inputs=user_inputs,
        constant_inputs=constant_inputs, tensor_inputs=list(traced.inputs), state_of=state_of,
        constants=constants, steps=[s.name for s in traced.steps],
        module_path={s.name: s.module_path for s in traced.steps},
        target={s.name: s.target for s in traced.steps}, mutations=mutations, outputs=outputs)


def flatten_inputs(program: ExportedProgram, args: tuple, kwargs: dict, *,
                   purpose: str = "PlacedModule") -> list[Any]:
    """The user inputs of ``program`` as its flat argument list, checked against the example
    inputs it was exported with (structure, baked-in constants, tensor shapes and dtypes).

    ``purpose`` names the caller in the errors.
    """
    from torch.export._tree_utils import reorder_kwargs

    try:
        kwargs = reorder_kwargs(kwargs, program.in_spec)
    except Exception as exc:
        raise TrainschedError(f"{purpose} takes the keyword arguments it was built with: "
                              f"{exc}") from None
    flat, spec = pytree.tree_flatten((args, kwargs))
    if spec != program.in_spec or len(flat) != len(program.user_inputs):
        raise TrainschedError(
            f"{purpose} was called with arguments structured unlike the example inputs "
            "it was built with; pass the same positional and keyword arguments")
    for name, value in zip(program.user_inputs, flat, strict=True):
        if name in program.constant_inputs and value != program.constant_inputs[name]:
            raise TrainschedError(
                f"argument {name!r} is {value!r}, but the model was exported with "
                f"{program.constant_inputs[name]!r}, which the program has baked in; build "
                f"the {purpose} with the value you call it with")
        expected = program.nodes[name].meta.get("val") if name in program.nodes else None
        if isinstance(expected, torch.Tensor) and not (
                isinstance(value, torch.Tensor) and value.shape == expected.shape
                and value.dtype == expected.dtype):
            got = (f"{tuple(value.shape)} {value.dtype}" if isinstance(value, torch.Tensor)
                   else type(value).__name__)
            raise TrainschedError(
                f"input {name!r} is {got}, but the model was exported with "
                f"{tuple(expected.shape)} {expected.dtype}; the exported program has static "
                f"shapes: build the {purpose} with an example batch of this shape")
    return flat
