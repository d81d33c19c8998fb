"""The static plan of a placed model: which exported node runs on which device, in what order.

:class:`~trainsched.runtime.placed.PlacedModule` builds it once from the exported program and the
placement, then runs it every step. :func:`resolve_names` finds the naming the placement uses
(exported op names, or module calls at some depth), :func:`step_order` the order the ops run in
(the placement's stored order, checked against the program's data flow), and
:func:`static_plan` gives every node a home device and lists the segments (maximal same-device
runs of ops) and the copies between homes (:class:`Transfer`). The rules are in
:mod:`trainsched.runtime.placed`'s docstring.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch import fx

from trainsched.errors import TrainschedError
from trainsched.graph import Graph, Op, coarsen_by_module
from trainsched.runtime.exported import ExportedProgram

__all__ = ["PlacedSegment", "StaticPlan", "Transfer", "listed", "nbytes", "op_names",
           "resolve_names", "static_plan", "step_order"]


@dataclass(frozen=True)
class PlacedSegment:
    """A maximal run of consecutive ops (in the order they run) on one logical device."""

    index: int
    device: int
    ops: tuple[str, ...]          # exported node names, in the order they run


@dataclass(frozen=True)
class Transfer:
    """A value copied from logical device ``src`` to ``dst`` once per step.

    ``value`` is the exported node whose value moves (an op, or a view of one). ``tensor`` is what
    the plan calls it: the op the value comes from (the graph's edge key), or for ``state``
    copies (a parameter, buffer or constant read away from its home) the qualified name or node.
    It is issued after segment ``after`` (-1: at the start of the step). ``size_bytes`` is from
    the example batch.
    """

    value: str
    tensor: str
    state: bool
    src: int
    dst: int
    size_bytes: int
    after: int


# -----------------------------------------------------------------------------------------------
# The op names a placement uses


def op_names(program: ExportedProgram, granularity: str, depth: int | None) -> dict[str, str]:
    """Exported node (input or step) -> the name a placement at ``granularity`` gives it."""
    if granularity == "op":
        return {n: n for n in [*program.tensor_inputs, *program.steps]}
    # The op graph capture builds, listed in program order (its topological order, which is all
    # the coarsening reads), coarsened by the same function.
    ops = [Op(name=n, target="input") for n in program.tensor_inputs]
    ops += [Op(name=n, target=program.target[n], module_path=program.module_path[n])
            for n in program.steps]
    coarse = coarsen_by_module(Graph(ops, []), depth=depth)
    return {member: op.name for op in coarse.ops for member in (op.members or (op.name,))}


def listed(names: Sequence[str], limit: int = 8) -> str:
    shown = ", ".join(repr(n) for n in names[:limit])
    return shown + (f", ... ({len(names) - limit} more)" if len(names) > limit else "")


def resolve_names(program: ExportedProgram, device_of: Mapping[str, int], granularity: str,
                   depth: int | None) -> tuple[dict[str, str], str]:
    """Pick the naming the placement uses; raise naming missing/unknown ops if none fits."""
    tried = ["op", "module"] if granularity == "auto" else [granularity]
    mismatches = []
    for g in tried:
        mapping = op_names(program, g, depth)
        wanted = list(dict.fromkeys(mapping.values()))
        missing = [n for n in wanted if n not in device_of]
        unknown = sorted(n for n in device_of if n not in set(wanted))
        if not missing and not unknown:
            return mapping, g
        mismatches.append((len(missing) + len(unknown), g, missing, unknown))
    _, g, missing, unknown = min(mismatches, key=lambda m: m[0])
    parts = []
    if missing:
        parts.append(f"{len(missing)} op(s) of the model have no device: {listed(missing)}")
    if unknown:
        parts.append(f"{len(unknown)} op(s) are not in the model: {listed(unknown)}")
    level = f"{g} granularity" + (f", module depth {depth}" if g == "module" and depth else "")
    raise TrainschedError(
        f"the placement does not match this model ({level}): {'; '.join(parts)}; place the "
        "graph captured from the same model with the same example inputs (and granularity)")


def nbytes(value: Any) -> int:
    return sum(t.numel() * t.element_size() for t in pytree.tree_leaves(value)
               if isinstance(t, torch.Tensor))


# -----------------------------------------------------------------------------------------------
# The static plan: where every node is evaluated, segments, transfers


@dataclass
class StaticPlan:
    home: dict[str, int]                  # every evaluated node (and state placeholder) -> device
    steps: set[str]
    segments: list[PlacedSegment]
    sends: dict[int, list[Transfer]]      # after segment k (-1: at the start) -> copies, in order
    state_home: dict[str, int]            # state fqn -> device of its master
    kind: dict[str, str]                  # node -> "input", "state", "step" or "lazy"
    roots: dict[str, tuple[str, ...]]     # node -> the ops its value comes from, program order


def step_order(program: ExportedProgram, names: Mapping[str, str],
                order: Sequence[str] | None) -> list[str]:
    """The steps in the order they run: by the placement's ``order`` (of the names it uses,
    ``names[node]``; the steps of one coarse op in program order), else program order.
    Raises if that order runs a step before one whose value it needs."""
    if order is None:
        return list(program.steps)
    rank = {name: k for k, name in enumerate(order)}
    position = {name: k for k, name in enumerate(program.steps)}
    missing = [names[n] for n in program.steps if names[n] not in rank]
    if missing:
        raise TrainschedError(f"the placement's order leaves out {listed(missing)}; list every "
                              "op of the graph it places")
    steps = sorted(program.steps, key=lambda n: (rank[names[n]], position[n]))
    done: set[str] = set()
    needs: dict[str, set[str]] = {}  # node -> the steps its value comes from
    for name, node in program.nodes.items():
        found: set[str] = set()
        for i in node.all_input_nodes:
            found |= {i.name} if i.name in position else needs.get(i.name, set())
        needs[name] = found
    for name in steps:
        early = sorted(needs[name] - done, key=position.__getitem__)
        if early:
            raise TrainschedError(
                f"the placement's order runs {names[name]!r} before {names[early[0]]!r}, whose "
                "output it reads; place the graph captured from this model (its order is "
                "topological for it)")
        done.add(name)
    return steps


def static_plan(program: ExportedProgram, placed: dict[str, int],
                steps_in_order: list[str]) -> StaticPlan:
    """Give every node the program needs a home device and list the copies between homes.

    Inputs and steps: the placement. A view or other non-op node that reads activations: the
    device of the first op it comes from (a view lives with what it views). One that reads only
    state (``t(weight)``, masks, ``num_batches_tracked + 1``) and a state placeholder: the home of
    its first reader; read by nothing but a buffer update, its module's first op's device.
    """
    nodes = program.nodes
    position = {name: i for i, name in enumerate(nodes)}
    steps = set(program.steps)
    mutation_of = {out: fqn for out, fqn in program.mutations}
    needed: set[str] = set()
    stack = [*program.steps, *mutation_of,
             *(o.name for o in program.outputs if isinstance(o, fx.Node))]
    while stack:
        name = stack.pop()
        if name not in needed:
            needed.add(name)
            stack.extend(i.name for i in nodes[name].all_input_nodes)
    order = [name for name in nodes if name in needed]

    kind: dict[str, str] = {}
    roots: dict[str, tuple[str, ...]] = {}      # the ops a node's value comes from
    consumers: dict[str, list[str]] = {name: [] for name in order}
    for name in order:
        node = nodes[name]
        if name in placed:
            kind[name], roots[name] = ("step" if name in steps else "input"), (name,)
        elif name in program.user_inputs:   # a non-tensor input: no op of the graph
            kind[name], roots[name] = "input", ()
        elif node.op == "placeholder":
            kind[name], roots[name] = "state", ()
        else:
            kind[name] = "lazy"
            found = {r for i in node.all_input_nodes for r in roots[i.name]}
            roots[name] = tuple(sorted(found, key=position.__getitem__))
        for i in dict.fromkeys(node.all_input_nodes):
            consumers[i.name].append(name)

    fallback = placed[program.steps[0]]
    first_of_module: dict[str, int] = {}
    for name in program.steps:
        first_of_module.setdefault(program.module_path[name], placed[name])
    home: dict[str, int] = {}
    for name in reversed(order):   # a node's readers come after it
        if name in placed:
            home[name] = placed[name]
        elif roots[name]:
            home[name] = placed[roots[name][0]]
        elif consumers[name]:
            home[name] = home[consumers[name][0]]
        elif name in mutation_of:
            home[name] = first_of_module.get(mutation_of[name].rpartition(".")[0], fallback)
        else:
            home[name] = fallback

    segments: list[PlacedSegment] = []
    slot: dict[str, int] = {}
    for name in steps_in_order:
        if kind.get(name) != "step":
            continue
        if not segments or segments[-1].device != home[name]:
            segments.append(PlacedSegment(len(segments), home[name], ()))
        last = segments[-1]
        segments[-1] = PlacedSegment(last.index, last.device, (*last.ops, name))
        slot[name] = last.index
    for name in order:  # every other node: after the segments of what it reads
        if kind[name] != "step":
            slot[name] = max((slot[i.name] for i in nodes[name].all_input_nodes), default=-1)

    state_fqn = {name: fqn for name, (_kind, fqn) in program.state_of.items()}
    pairs = {(i.name, home[c]) for c in order for i in nodes[c].all_input_nodes
             if home[i.name] != home[c]}
    sends: dict[int, list[Transfer]] = {}
    for source, dst in sorted(pairs, key=lambda p: (slot[p[0]], position[p[0]], p[1])):
        is_state = not roots[source]
        sends.setdefault(slot[source], []).append(Transfer(
            value=source, tensor=state_fqn.get(source, source) if is_state else roots[source][0],
            state=is_state, src=home[source], dst=dst, after=slot[source],
            size_bytes=nbytes(nodes[source].meta.get("val"))))
    state_home = {state_fqn[name]: home[name] for name in order if name in state_fqn}
    return StaticPlan(home=home, steps=steps, segments=segments, sends=sends, state_home=state_home,
                 kind=kind, roots=roots)
