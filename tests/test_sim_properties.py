"""Invariants of the simulator on random placed DAGs (hypothesis), and determinism."""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import subprocess
import sys
from collections import defaultdict

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainsched.cluster import cluster_from_flags
from trainsched.graph import Edge, Graph, Op
from trainsched.sim import SimResult, simulate_placed, simulate_single, trace_json

REL = 1e-9
costs = st.one_of(st.just(0.0), st.floats(min_value=1e-6, max_value=1e-2))
sizes = st.one_of(st.just(0), st.integers(min_value=1, max_value=50_000_000))
PROPERTY = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


@st.composite
def placed_graphs(draw: st.DrawFn) -> tuple[Graph, dict[str, int], object, list[int]]:
    """Up to 30 ops, edges from lower to higher index (some sharing a tensor), placed on 1-4
    devices, either comm mode; plus a permutation of the op listing."""
    n = draw(st.integers(min_value=1, max_value=30))
    ops = [Op(name=f"op{i}", compute_s=draw(costs), output_bytes=draw(sizes),
              temp_bytes=draw(st.sampled_from([0, 0, 1000])),
              param_bytes=draw(st.sampled_from([0, 0, 4096])))
           for i in range(n)]  # fmt: skip
    index = st.integers(0, n - 1)
    pairs = draw(st.lists(st.tuples(index, index, sizes, st.booleans()), max_size=2 * n))
    edges = {}
    for i, j, size, own_tensor in pairs:
        if i != j:
            a, b = min(i, j), max(i, j)
            tensor = f"op{a}.{b}" if own_tensor else ""
            edges[a, b] = Edge(src=f"op{a}", dst=f"op{b}", size_bytes=size, tensor=tensor)
    devices = draw(st.integers(min_value=1, max_value=4))
    placement = {f"op{i}": draw(st.integers(0, devices - 1)) for i in range(n)}
    cluster = cluster_from_flags(devices=devices, memory="64MiB", bandwidth="10GB/s",
                                 latency=draw(st.sampled_from(["0s", "5us"])),
                                 comm=draw(st.sampled_from(["parallel", "sequential"])))
    permutation = draw(st.permutations(range(n)))
    return Graph(ops, list(edges.values())), placement, cluster, permutation


def close_or_below(a: float, b: float) -> bool:
    return a <= b * (1 + REL) + 1e-15


def check_invariants(result: SimResult) -> None:
    tasks = result.tasks
    step = result.step_time_s
    serial = math.fsum(t.end_s - t.start_s for t in tasks)
    assert close_or_below(result.dependency_bound_s, step)
    assert close_or_below(step, serial)
    for before, after in result.dependencies:
        assert tasks[before].end_s <= tasks[after].start_s
    by_resource = defaultdict(list)
    for t in tasks:
        for name in t.resources:
            by_resource[name].append((t.start_s, t.end_s))
    for spans in by_resource.values():
        spans.sort()
        for (_, end), (start, _) in itertools.pairwise(spans):
            assert end <= start
    path = result.critical_path
    total = math.fsum(p.end_s - p.start_s + p.wait_s for p in path)
    assert math.isclose(total, step, rel_tol=REL, abs_tol=1e-15)
    assert all(p.wait_s == 0 or abs(p.wait_s) <= 1e-15 for p in path)
    assert 0.0 <= result.exposed_comm_s <= step * (1 + REL)
    for name, peak in result.peak_memory_bytes.items():
        assert result.oom[name] == (peak > result.memory_capacity_bytes)
        assert peak == max(size for _, size in result.memory_timeline[name])


@PROPERTY
@given(placed_graphs())
def test_placed_invariants(case):
    graph, placement, cluster, _ = case
    check_invariants(simulate_placed(graph, cluster, placement, allow_forward_only=True))


@PROPERTY
@given(placed_graphs())
def test_single_device_invariants(case):
    graph, _, cluster, _ = case
    result = simulate_single(graph, cluster, allow_forward_only=True)
    check_invariants(result)
    assert math.isclose(result.step_time_s, math.fsum(op.compute_s for op in graph.ops),
                        rel_tol=REL, abs_tol=1e-15)


@PROPERTY
@given(placed_graphs())
def test_same_input_same_bytes_and_listing_does_not_matter(case):
    graph, placement, cluster, permutation = case
    first = simulate_placed(graph, cluster, placement, allow_forward_only=True)
    again = simulate_placed(graph, cluster, placement, allow_forward_only=True)
    assert first.to_json() == again.to_json()
    text = trace_json(first)
    assert text == trace_json(again)
    slices = defaultdict(list)  # slices on one trace thread never overlap, so they nest
    for e in json.loads(text)["traceEvents"]:
        if e["ph"] == "X":
            slices[e["pid"], e["tid"]].append((e["ts"], e["ts"] + e["dur"]))
    for spans in slices.values():
        spans.sort()
        for (_, end), (start, _) in itertools.pairwise(spans):
            assert end <= start + 1e-6
    # The default order is the graph's own (its listing); given the same order, the listing
    # does not matter.
    shuffled = Graph([graph.ops[i] for i in permutation], graph.edges)
    permuted = simulate_placed(shuffled, cluster, placement, order=graph.topological_order(),
                               allow_forward_only=True)
    assert permuted.step_time_s == first.step_time_s
    assert permuted.peak_memory_bytes == first.peak_memory_bytes


@PROPERTY
@given(placed_graphs(), st.data())
def test_zero_cost_op_changes_nothing(case, data):
    graph, placement, cluster, _ = case
    base = simulate_placed(graph, cluster, placement, allow_forward_only=True)
    # A free op: alone, or hanging off an op of its device by an empty edge.
    host = data.draw(st.sampled_from([None, *[op.name for op in graph.ops]]))
    edges = list(graph.edges)
    if host is not None:
        edges.append(Edge(src=host, dst="zero", size_bytes=0))
    used = sorted(set(placement.values()))  # a new device would add idle resources
    device = placement[host] if host is not None else data.draw(st.sampled_from(used))
    more = simulate_placed(Graph([*graph.ops, Op(name="zero")], edges), cluster,
                           placement | {"zero": device}, allow_forward_only=True)
    assert more.step_time_s == base.step_time_s
    assert more.busy_s == base.busy_s
    if host is None:  # a consumer frees its host's output, which otherwise lives to the end
        assert more.peak_memory_bytes == base.peak_memory_bytes
    spans = {t.name: (t.start_s, t.end_s) for t in more.tasks}
    assert all(spans[t.name] == (t.start_s, t.end_s) for t in base.tasks)


DETERMINISM_SCRIPT = """
import hashlib
from trainsched.cluster import cluster_from_flags
from trainsched.graph import Edge, Graph, Op, to_training
from trainsched.sim import simulate_placed, trace_json

ops = [Op(name=f"block{i}", compute_s=1e-3 * (1 + i % 3), param_bytes=4096 * (i % 2),
          output_bytes=8192, saved_bytes=4096, temp_bytes=512) for i in range(12)]
edges = [Edge(src=f"block{i}", dst=f"block{j}", size_bytes=8192)
         for i in range(12) for j in (i + 1, i + 3) if j < 12]
train = to_training(Graph(ops, edges), optimizer="adam")
names = sorted({op.forward_op or op.name for op in train.ops})
device = {name: k % 3 for k, name in enumerate(names)}
placement = {op.name: device[op.forward_op or op.name] for op in train.ops}
for comm in ("sequential", "parallel"):
    cluster = cluster_from_flags(devices=3, memory="1MiB", bandwidth="1GB/s", latency="20us",
                                 comm=comm)
    result = simulate_placed(train, cluster, placement)
    print(comm, hashlib.sha256(trace_json(result, meta={"comm": comm}).encode()).hexdigest(),
          hashlib.sha256(result.to_json().encode()).hexdigest())
"""


def test_byte_identical_across_processes_and_hash_seeds():
    outputs = []
    for seed in ("0", "12345"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        done = subprocess.run([sys.executable, "-c", DETERMINISM_SCRIPT], capture_output=True,
                              text=True, env=env, timeout=120)
        assert done.returncode == 0, done.stderr
        outputs.append(done.stdout)
    assert outputs[0] == outputs[1]
    assert len(outputs[0].splitlines()) == 2
    assert hashlib.sha256(outputs[0].encode()).hexdigest()  # non-empty, comparable
