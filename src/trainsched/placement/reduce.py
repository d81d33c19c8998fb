"""Graph reduction: the small problem the placers solve, and the way back to the graph.

Four steps (``specs/placement.md`` §3), each mapping reduced ops to original ops:

1. **Co-location** (hard): ops sharing ``Op.group`` (a parameter, a forward op and its backward
   and optimizer ops) and ops with their ``forward_op`` are merged transitively; a group is
   never split.
2. **Forward-only** (training graphs): only forward ops are scheduled; backward and optimizer
   ops go where their group goes. Their persistent memory (gradients, optimizer state) is
   charged to the group, and so is what a forward op keeps for its backward (the larger of its
   output and its saved bytes, held for the whole step). Compute is the forward's unless
   ``backward_in_weight``.
3. **Co-placement** (soft): an op with a single consumer joins that consumer's group, unless
   the merged group would need more than ``group_cap_bytes`` (chains stay placeable).
4. **Fusion**: inside a group, edge u→v is contracted unless u has another successor *and* v
   another predecessor, the only case in which a second u⇝v path (and so a cycle after
   contracting) can exist. A fused op's temp is the peak of running its members in order
   minus its output, so no internal tensor is lost.

Everything is ordered by a canonical topological order (:func:`structural_order`: Kahn, ties
by the longest remaining path, a structural signature and the ranks of the predecessors, names
last), so the result depends neither on the order in which a graph lists its ops nor on their
names: renaming the ops renames the problem.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from trainsched.graph import Edge, Graph, Op


@dataclass(frozen=True, kw_only=True, eq=False)
class Problem:
    """A reduced graph, numbered densely in topological order (index = topo index).

    Per op ``i``: ``compute_s[i]``; ``resident[i]`` bytes held from the start of the step (its
    group's are charged when the group's first op lands); ``output[i]`` bytes allocated at its
    start, freed once its consumers on its device and its outgoing transfers have ended;
    ``temp[i]`` bytes while it runs; ``group[i]``. ``inputs[i]`` lists (producer, tensor,
    bytes), ordered by (producer, tensor key); tensors are numbered in that order too, and a
    tensor's bytes are the largest of its edges'.
    ``group_of`` maps every original op name to its group; ``members[i]`` are the original ops
    op ``i`` runs (in topological order); ``input_rank[i][k]`` is the index among them of the
    first that reads input ``k``, and a producer's tensors are numbered in the order of the
    members that make them, so a placer can send them in the order a replay of its expanded
    order does.
    """

    names: tuple[str, ...]
    members: tuple[tuple[str, ...], ...]
    compute_s: tuple[float, ...]
    resident: tuple[int, ...]
    output: tuple[int, ...]
    temp: tuple[int, ...]
    group: tuple[int, ...]
    inputs: tuple[tuple[tuple[int, int, int], ...], ...]
    successors: tuple[tuple[int, ...], ...]
    tensor_key: tuple[str, ...]
    tensor_producer: tuple[int, ...]
    tensor_consumers: tuple[tuple[int, ...], ...]
    group_ops: tuple[tuple[int, ...], ...]
    group_of: Mapping[str, int]
    original_ops: int
    input_rank: tuple[tuple[int, ...], ...] = ()  # per input: its first reader among members

    @property
    def n(self) -> int:
        return len(self.names)

    def group_resident(self) -> list[int]:
        totals = [0] * len(self.group_ops)
        for i, g in enumerate(self.group):
            totals[g] += self.resident[i]
        return totals

    def critical_path_s(self) -> float:
        """The longest path by compute (ops are numbered topologically)."""
        finish = [0.0] * self.n
        for v in range(self.n):
            start = max((finish[u] for u, _, _ in self.inputs[v]), default=0.0)
            finish[v] = start + self.compute_s[v]
        return max(finish, default=0.0)

    def static_bytes(self) -> list[int]:
        """Per op, everything it may ever hold, charged for good (m-TOPO, contiguous): resident,
        output and temp bytes, and a copy of every input that comes from another group. A
        device's level never exceeds the sum over its ops, so a static fit is a real one."""
        out = []
        for i in range(self.n):
            g = self.group[i]
            copies = sum(size for u, _, size in self.inputs[i] if self.group[u] != g)
            out.append(self.resident[i] + self.output[i] + self.temp[i] + copies)
        return out

    def to_graph(self) -> Graph:
        """The reduced graph as a :class:`Graph` (resident bytes as ``param_bytes``, groups as
        ``g<k>``): what the placers schedule, for the simulator to replay."""
        ops = [Op(name=self.names[i], compute_s=self.compute_s[i], param_bytes=self.resident[i],
                  output_bytes=self.output[i], temp_bytes=self.temp[i],
                  group=f"g{self.group[i]}", members=self.members[i])
               for i in range(self.n)]  # fmt: skip
        edges = [Edge(src=self.names[u], dst=self.names[v], size_bytes=size,
                      tensor=self.tensor_key[tid])
                 for v in range(self.n) for u, tid, size in self.inputs[v]]  # fmt: skip
        return Graph(ops, edges, {"reduced_from_ops": self.original_ops})


def canonical_order(graph: Graph) -> list[str]:
    """A topological order that depends on the graph's structure, not on its names or listing:
    :func:`structural_order` of its ops (attributes: compute, persistent, output and temp bytes,
    kind; edges weighted by bytes)."""
    ops = graph.ops
    index = {op.name: i for i, op in enumerate(ops)}
    attrs = [(op.compute_s, _persistent(op), op.output_bytes, op.temp_bytes, op.kind)
             for op in ops]  # fmt: skip
    readers: dict[tuple[str, str], int] = {}  # (producer, tensor) -> edges reading it
    for e in graph.edges:
        readers[e.src, e.tensor] = readers.get((e.src, e.tensor), 0) + 1
    edges = [(index[e.src], index[e.dst], (e.size_bytes, readers[e.src, e.tensor]))
             for e in graph.edges]
    order = structural_order([op.name for op in ops], [op.compute_s for op in ops], attrs, edges)
    return [ops[i].name for i in order]


def structural_order(names: Sequence[Any], compute_s: Sequence[float],
                     attrs: Sequence[tuple], edges: Sequence[tuple[int, int, Any]]) -> list[int]:
    """Kahn's topological order of a DAG (``edges``: (src, dst, label) over indices, the label a
    comparable value such as the bytes sent), taking among ready nodes the one with the
    smallest structural key, names last:

    1. the longest remaining path by ``compute_s`` (its own included), longest first, so that
       critical work comes first wherever a rank breaks a tie;
    2. the node's *descendant signature*: its ``attrs``, in- and out-degree, and the sorted
       signatures (with bytes) of its successors, ranked level by level from the sinks, so
       it is a comparable value that no name enters;
    3. the sorted ranks of its predecessors (already ranked) with the labels of the edges from
       them, which tells apart nodes alike in themselves but fed by different nodes or
       tensors;
    4. its name (or any distinct sortable key given as ``names``): reached only by nodes that
       nothing above tells apart (in practice, nodes that an automorphism of the graph
       exchanges), where the order chosen does not matter.

    Renaming the nodes of a graph therefore renames its order and changes nothing else.
    """
    n = len(names)
    succ: list[list[tuple[int, int]]] = [[] for _ in range(n)]
    indeg = [0] * n
    for u, v, size in edges:
        succ[u].append((v, size))
        indeg[v] += 1
    # Any topological order, to compute the levels (the result never depends on it).
    left = indeg[:]
    stack = [i for i in range(n) if left[i] == 0]
    topo: list[int] = []
    while stack:
        u = stack.pop()
        topo.append(u)
        for v, _ in succ[u]:
            left[v] -= 1
            if left[v] == 0:
                stack.append(v)
    assert len(topo) == n, "the graph has a cycle"
    remaining = [0.0] * n
    height = [0] * n
    for u in reversed(topo):
        remaining[u] = compute_s[u] + max((remaining[v] for v, _ in succ[u]), default=0.0)
        height[u] = 1 + max((height[v] for v, _ in succ[u]), default=-1)
    # Descendant signatures, ranked within each height (heights first, so comparable).
    signature: list[tuple[int, int]] = [(0, 0)] * n
    by_height: dict[int, list[int]] = {}
    for u in range(n):
        by_height.setdefault(height[u], []).append(u)
    for h in sorted(by_height):
        keys = {u: (attrs[u], indeg[u], len(succ[u]),
                    tuple(sorted((signature[v], size) for v, size in succ[u])))
                for u in by_height[h]}  # fmt: skip
        ranked = sorted(set(keys.values()))
        rank = {key: k for k, key in enumerate(ranked)}
        for u, key in keys.items():
            signature[u] = (h, rank[key])
    preds: list[list[tuple[int, Any]]] = [[] for _ in range(n)]
    for u, v, label in edges:
        preds[v].append((u, label))
    position = [-1] * n
    left = indeg[:]
    ready = [(-remaining[u], signature[u], (), names[u], u) for u in range(n) if left[u] == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        u = heapq.heappop(ready)[-1]
        position[u] = len(order)
        order.append(u)
        for v, _ in succ[u]:
            left[v] -= 1
            if left[v] == 0:
                ranks = tuple(sorted((position[p], label) for p, label in preds[v]))
                heapq.heappush(ready, (-remaining[v], signature[v], ranks, names[v], v))
    return order


class _UnionFind:
    """Union-find whose representative is always the smallest index (deterministic)."""

    def __init__(self, n: int) -> None:
        self.parent = list(range(n))

    def find(self, x: int) -> int:
        parent = self.parent
        root = x
        while parent[root] != root:
            root = parent[root]
        while parent[x] != root:
            parent[x], x = root, parent[x]
        return root

    def union(self, a: int, b: int) -> int:
        ra, rb = self.find(a), self.find(b)
        if ra > rb:
            ra, rb = rb, ra
        self.parent[rb] = ra
        return ra


def _persistent(op: Op) -> int:
    """Bytes held all step: parameters, buffers, optimizer state, and a weight gradient."""
    held = op.param_bytes + op.buffer_bytes + op.optimizer_state_bytes
    return held + (op.output_bytes if op.kind == "backward_weight" else 0)


def reduce_graph(graph: Graph, *, forward_only: bool, coplacement: bool, fusion: bool,
                 group_cap_bytes: float, backward_in_weight: bool = False) -> Problem:
    """The reduced problem of ``graph`` (see the module docstring)."""
    order = canonical_order(graph)
    pos = {name: k for k, name in enumerate(order)}
    ops = [graph.op(name) for name in order]
    n0 = len(ops)
    succ0: list[list[int]] = [[] for _ in ops]
    for e in graph.edges:
        succ0[pos[e.src]].append(pos[e.dst])

    # 1. Co-location classes.
    uf = _UnionFind(n0)
    first_of_group: dict[str, int] = {}
    for k, op in enumerate(ops):
        if op.group is not None:
            uf.union(first_of_group.setdefault(op.group, k), k)
        if op.forward_op is not None and op.forward_op in pos:
            uf.union(pos[op.forward_op], k)

    # 2. Which ops are scheduled; memory and compute of each.
    if forward_only:
        with_forward = {uf.find(k) for k, op in enumerate(ops) if op.kind == "forward"}
        scheduled = [op.kind == "forward" or uf.find(k) not in with_forward
                     for k, op in enumerate(ops)]  # fmt: skip
    else:
        scheduled = [True] * n0
    resident = [_persistent(op) for op in ops]
    output = [0 if op.kind == "backward_weight" else op.output_bytes for op in ops]
    temp = [op.temp_bytes for op in ops]
    compute = [op.compute_s for op in ops]
    extra_resident: dict[int, int] = {}  # class -> bytes of its unscheduled ops
    for k, op in enumerate(ops):
        if scheduled[k]:
            if forward_only and any(not scheduled[j] for j in succ0[k]):
                # Kept for backward through the step: charged as resident, no transient output.
                resident[k] += max(op.output_bytes, op.saved_bytes)
                output[k] = 0
            continue
        c = uf.find(k)
        extra_resident[c] = extra_resident.get(c, 0) + resident[k]
        if backward_in_weight:
            host = pos.get(op.forward_op) if op.forward_op is not None else None
            if host is None or not scheduled[host]:
                host = min(j for j in range(n0) if scheduled[j] and uf.find(j) == c)
            compute[host] += op.compute_s

    sched = [k for k in range(n0) if scheduled[k]]
    ssucc = {k: sorted({j for j in succ0[k] if scheduled[j]}) for k in sched}

    # 3. Co-placement: a sole consumer takes its producer's group, within the cap.
    weight: dict[int, int] = {}
    for k in sched:
        c = uf.find(k)
        weight[c] = weight.get(c, 0) + resident[k] + output[k] + temp[k]
    for c, extra in extra_resident.items():
        weight[c] = weight.get(c, 0) + extra
    if coplacement:
        for k in sched:
            if len(ssucc[k]) != 1:
                continue
            a, b = uf.find(k), uf.find(ssucc[k][0])
            if a != b and weight[a] + weight[b] <= group_cap_bytes:
                total = weight.pop(a) + weight.pop(b)
                weight[uf.union(a, b)] = total

    # 4. Fusion inside groups.
    fuse = _UnionFind(n0)
    if fusion:
        _fuse(sched, ssucc, uf, fuse)

    return _build(graph, order, ops, sched, scheduled, uf, fuse, compute, resident, output, temp,
                  extra_resident)


def _fuse(sched: list[int], ssucc: dict[int, list[int]], uf: _UnionFind,
          fuse: _UnionFind) -> None:
    """Contract edges inside groups, never closing a cycle (see the module docstring)."""
    succ = {k: set(ssucc[k]) for k in sched}
    pred: dict[int, set[int]] = {k: set() for k in sched}
    for k in sched:
        for j in succ[k]:
            pred[j].add(k)
    for x in sched:
        r = fuse.find(x)
        while True:
            group = uf.find(r)
            pick = -1
            for v in sorted(succ[r]):
                if uf.find(v) == group and (len(succ[r]) == 1 or len(pred[v]) == 1):
                    pick = v
                    break
            if pick < 0:
                break
            v = pick
            # Contract v into r (r < v in topological order, so r stays the representative).
            fuse.parent[v] = r
            for w in succ.pop(v):
                pred[w].discard(v)
                if w != r:
                    pred[w].add(r)
                    succ[r].add(w)
            for w in pred.pop(v):
                succ[w].discard(v)
                if w != r:
                    succ[w].add(r)
                    pred[r].add(w)
            succ[r].discard(v)
            pred[r].discard(v)


def _build(graph: Graph, order: list[str], ops: list[Op], sched: list[int],
           scheduled: list[bool], uf: _UnionFind, fuse: _UnionFind, compute: list[float],
           resident: list[int], output: list[int], temp: list[int],
           extra_resident: dict[int, int]) -> Problem:
    """Reduced ops (fused members), their edges and tensors, renumbered topologically."""
    node_of = {k: fuse.find(k) for k in sched}
    members: dict[int, list[int]] = {}
    for k in sched:
        members.setdefault(node_of[k], []).append(k)
    pos = {name: k for k, name in enumerate(order)}
    # Edges between scheduled ops: inside a node (for the fused memory) or between nodes.
    inside: dict[int, set[int]] = {k: set() for k in sched}  # producer -> consumers in its node
    inside_pred: dict[int, set[int]] = {k: set() for k in sched}
    leaves = dict.fromkeys(sched, False)  # has a consumer in another node
    consumed = dict.fromkeys(sched, False)
    between: dict[tuple[int, int, str], int] = {}  # (src node, dst node, tensor) -> bytes
    rank = {k: i for ks in members.values() for i, k in enumerate(ks)}  # place in its node
    made: dict[tuple[int, str], int] = {}  # (src node, tensor) -> rank of the member making it
    read: dict[tuple[int, int, str], int] = {}  # -> rank of the first member reading it
    # One tensor, one size: the largest of all its edges (the simulator sends that), also
    # where the edge that makes it largest stays inside a fused node.
    tensor_size: dict[tuple[str, str], int] = {}
    for e in graph.edges:
        key2 = (e.src, e.tensor)
        tensor_size[key2] = max(tensor_size.get(key2, 0), e.size_bytes)
    for e in graph.edges:
        a, b = pos[e.src], pos[e.dst]
        if not (scheduled[a] and scheduled[b]):
            continue
        consumed[a] = True
        na, nb = node_of[a], node_of[b]
        if na == nb:
            inside[a].add(b)
            inside_pred[b].add(a)
        else:
            leaves[a] = True
            key = (na, nb, e.tensor)
            between[key] = tensor_size[e.src, e.tensor]
            made[na, e.tensor] = min(made.get((na, e.tensor), rank[a]), rank[a])
            read[key] = min(read.get(key, rank[b]), rank[b])

    # Node attributes.
    node_name = {r: order[ks[0]] for r, ks in members.items()}
    attrs: dict[int, tuple[float, int, int, int]] = {}
    for r, ks in members.items():
        out = sum(output[k] for k in ks if leaves[k] or not consumed[k])
        level = peak = 0
        left = {k: len(inside[k]) for k in ks}
        for k in ks:  # members run in topological order
            level += output[k] + temp[k]
            peak = max(peak, level)
            level -= temp[k]
            for p in inside_pred[k]:
                left[p] -= 1
                if left[p] == 0 and consumed[p] and not leaves[p]:
                    level -= output[p]  # every consumer has run, none outside: freed
        attrs[r] = (sum(compute[k] for k in ks), sum(resident[k] for k in ks), out,
                    max(0, peak - out))

    # Renumber nodes topologically, by structure (names last): structural_order.
    node_succ: dict[int, set[int]] = {r: set() for r in members}
    for na, nb, _ in between:
        node_succ[na].add(nb)
    nodes = sorted(members)
    slot = {r: k for k, r in enumerate(nodes)}
    tensor_bytes: dict[tuple[int, str], int] = {}
    readers: dict[tuple[int, str], int] = {}  # nodes reading a tensor
    for (na, _, key), size in between.items():
        tensor_bytes[na, key] = max(tensor_bytes.get((na, key), 0), size)
        readers[na, key] = readers.get((na, key), 0) + 1
    # Ties: the bytes its class holds in unscheduled ops (gradients, optimizer state), then
    # its first member's place in the original graph's structural order (not its name).
    held_by: dict[int, int] = {}
    for c, extra in extra_resident.items():
        held_by[uf.find(c)] = held_by.get(uf.find(c), 0) + extra
    held = {r: held_by.get(uf.find(r), 0) for r in nodes}
    ranked = structural_order(
        nodes, [attrs[r][0] for r in nodes],
        [(attrs[r][0], attrs[r][1], attrs[r][2], attrs[r][3], held[r]) for r in nodes],
        [(slot[na], slot[nb], (tensor_bytes[na, key], readers[na, key]))
         for na, nb, key in between])
    topo = [nodes[k] for k in ranked]
    index = {r: i for i, r in enumerate(topo)}

    # Groups, numbered by their first op; unscheduled ops' memory goes to that first op.
    group_index: dict[int, int] = {}
    group_ops: list[list[int]] = []
    for r in topo:
        c = uf.find(r)
        if c not in group_index:
            group_index[c] = len(group_ops)
            group_ops.append([])
        group_ops[group_index[c]].append(index[r])
    res_list = [attrs[r][1] for r in topo]
    for c, extra in extra_resident.items():
        res_list[group_ops[group_index[uf.find(c)]][0]] += extra
    group_of = {order[k]: group_index[uf.find(k)] for k in range(len(order))}

    # Tensors: per producer, by (member making it, key); inputs ordered by (producer, tensor).
    n = len(topo)
    by_tensor: dict[tuple[int, int, str], list[tuple[int, int, int]]] = {}
    for (na, nb, key), size in between.items():
        by_tensor.setdefault((index[na], made[na, key], key), []).append(
            (index[nb], size, read[na, nb, key]))
    tensor_key: list[str] = []
    tensor_producer: list[int] = []
    tensor_consumers: list[tuple[int, ...]] = []
    inputs: list[list[tuple[int, int, int]]] = [[] for _ in range(n)]
    input_rank: list[list[int]] = [[] for _ in range(n)]
    for (u, made_by, key) in sorted(by_tensor):
        tid = len(tensor_key)
        tensor_key.append(key)
        tensor_producer.append(u)
        users = sorted(by_tensor[u, made_by, key])
        tensor_consumers.append(tuple(v for v, _, _ in users))
        size = max(size for _, size, _ in users)  # one tensor, one size (edges may disagree)
        for v, _, first in users:
            inputs[v].append((u, tid, size))
            input_rank[v].append(first)
    successors = [sorted({index[s] for s in node_succ[r]}) for r in topo]
    return Problem(
        names=tuple(node_name[r] for r in topo),
        members=tuple(tuple(order[k] for k in members[r]) for r in topo),
        compute_s=tuple(attrs[r][0] for r in topo),
        resident=tuple(res_list),
        output=tuple(attrs[r][2] for r in topo),
        temp=tuple(attrs[r][3] for r in topo),
        group=tuple(group_index[uf.find(r)] for r in topo),
        inputs=tuple(tuple(x) for x in inputs),
        input_rank=tuple(tuple(x) for x in input_rank),
        successors=tuple(tuple(s) for s in successors),
        tensor_key=tuple(tensor_key),
        tensor_producer=tuple(tensor_producer),
        tensor_consumers=tuple(tensor_consumers),
        group_ops=tuple(tuple(g) for g in group_ops),
        group_of=group_of,
        original_ops=len(order),
    )
