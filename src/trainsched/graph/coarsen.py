"""Coarsen an op-level graph to module granularity.

Ops of one module call become one op. The rule is *contiguous runs*: walking the ops in
topological order, consecutive ops with the same key (module path, optionally truncated to a
depth) form one coarse op. Contracting a contiguous segment of a topological order can never
create a cycle (a path that leaves the segment only reaches later ops), so the result is always a
DAG; a module called three times (ResNet's shared ``relu``) becomes three ops, named ``path``,
``path#1``, ``path#2``. Each coarse op keeps its members, so a coarse plan expands back.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import replace

from trainsched.errors import TrainschedError
from trainsched.graph.core import PARAM_TENSORS, Edge, Graph, Op, param_tensor_record

ROOT = "<root>"


def module_key(depth: int | None) -> Callable[[Op], str]:
    """The grouping key: the op's module path, truncated to ``depth`` components."""

    def key(op: Op) -> str:
        path = op.module_path
        if op.target == "input":
            return f"input:{op.name}"
        if not path:
            return ROOT
        return ".".join(path.split(".")[:depth]) if depth else path

    return key


def coarsen_by_module(graph: Graph, depth: int | None = None) -> Graph:
    """One op per module call (see the module docstring)."""
    if depth is not None and depth < 1:
        raise TrainschedError("module depth must be at least 1")
    meta = dict(graph.meta)
    meta["granularity"] = "module" if depth is None else f"module:{depth}"
    return coarsen(graph, module_key(depth), meta)


def coarsen(graph: Graph, key: Callable[[Op], str], meta: dict) -> Graph:
    """Contract contiguous runs of equal ``key`` in topological order."""
    if any(op.kind != "forward" for op in graph.ops):
        raise TrainschedError("coarsen a forward graph, before the training transform")
    order = graph.topological_order()
    runs: list[tuple[str, list[Op]]] = []
    for name in order:
        op = graph.op(name)
        k = key(op)
        if runs and runs[-1][0] == k:
            runs[-1][1].append(op)
        else:
            runs.append((k, [op]))

    seen: Counter[str] = Counter()
    group_of: dict[str, str] = {}
    coarse_names: list[str] = []
    for k, members in runs:
        base = members[0].name if k.startswith("input:") else k
        name = base if seen[base] == 0 else f"{base}#{seen[base]}"
        seen[base] += 1
        coarse_names.append(name)
        for m in members:
            group_of[m.name] = name

    ops: list[Op] = []
    layer = 0
    tensors: dict[str, list[list]] = {}
    for name, (_key, members) in zip(coarse_names, runs, strict=True):
        op = _merge(name, members, graph, group_of)
        if op.param_bytes:
            op = replace(op, layer_index=layer)
            layer += 1
        own: list[list] = []
        for m in members:
            if m.param_bytes:
                rows = param_tensor_record(graph.meta, m.name)
                own += [[f"{m.name}.{p}", size] for p, size in rows] if rows else \
                    [[m.name, m.param_bytes]]
        if len(own) > 1:  # each member's parameters stay gradients of their own
            tensors[name] = own
        ops.append(op)
    meta = {k: v for k, v in meta.items() if k != PARAM_TENSORS}
    if tensors:
        meta[PARAM_TENSORS] = tensors

    edges: dict[tuple[str, str, str], int] = {}
    for e in graph.edges:
        src, dst = group_of[e.src], group_of[e.dst]
        if src == dst:
            continue
        tensor = e.tensor or e.src
        k3 = (src, dst, tensor)
        edges[k3] = max(edges.get(k3, 0), e.size_bytes)
    return Graph(ops, [Edge(src=s, dst=d, size_bytes=b, tensor=t)
                       for (s, d, t), b in edges.items()], meta)


def _sum_optional(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _merge(name: str, members: list[Op], graph: Graph, group_of: dict[str, str]) -> Op:
    if len(members) == 1 and members[0].target == "input":
        return members[0]
    index = {m.name: i for i, m in enumerate(members)}
    # An output read only inside the run is transient memory of the coarse op; one that leaves
    # it (or is a model output) is the coarse op's output. Replay the run to find the peak.
    internal_last_use: dict[str, int] = {}
    leaving: list[Op] = []
    for m in members:
        succ = graph.successors(m.name)
        if succ and all(group_of[s] == name for s in succ):
            internal_last_use[m.name] = max(index[s] for s in succ)
        else:
            leaving.append(m)
    frees: dict[int, int] = {}
    for m_name, last in internal_last_use.items():
        frees[last] = frees.get(last, 0) + members[index[m_name]].output_bytes
    alive = peak = 0
    for i, m in enumerate(members):
        if m.name in internal_last_use:
            alive += m.output_bytes
        peak = max(peak, alive + m.temp_bytes)
        alive -= frees.pop(i, 0)
    groups = sorted({m.group for m in members if m.group})
    targets = Counter(m.target for m in members)
    return Op(
        name=name, kind="forward",
        compute_s=sum(m.compute_s for m in members),
        flops=sum(m.flops for m in members),
        bytes_accessed=sum(m.bytes_accessed for m in members),
        param_bytes=sum(m.param_bytes for m in members),
        buffer_bytes=sum(m.buffer_bytes for m in members),
        optimizer_state_bytes=sum(m.optimizer_state_bytes for m in members),
        output_bytes=sum(m.output_bytes for m in leaving),
        temp_bytes=peak,
        saved_bytes=sum(m.saved_bytes for m in members),
        group=groups[0] if groups else None,
        module_path="" if name.split("#")[0] == ROOT else name.split("#")[0],
        target=targets.most_common(1)[0][0],
        members=tuple(x for m in members for x in (m.members or (m.name,))),
        backward_input_s=_sum_optional([m.backward_input_s for m in members]),
        backward_weight_s=_sum_optional([m.backward_weight_s for m in members]),
        backward_input_flops=_sum_optional([m.backward_input_flops for m in members]),
        backward_weight_flops=_sum_optional([m.backward_weight_flops for m in members]),
        compute_p10_s=_sum_optional([m.compute_p10_s for m in members]),
        compute_p90_s=_sum_optional([m.compute_p90_s for m in members]),
        samples=min(m.samples for m in members),
        tied_to=tuple(dict.fromkeys(group_of[t] for m in members for t in m.tied_to
                                    if group_of[t] != name)),
    )
