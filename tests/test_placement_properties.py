"""Property tests of the placers (specs/placement.md §8) on random layered DAGs.

The central ones: replaying a placer's per-device op order and per-channel transfer order on the
simulator's engine, with the simulator's memory accounting, reproduces every start, end and
peak of the placer's own schedule, and m-ETF and m-SCT (ample memory) start every op as early as
those orders allow; and ``simulate_placed``, given the order the placement stores, reproduces the
placer's schedule exactly (every placer, both channel modes), never runs slower than it for a
fused placement, and for a forward-only one reproduces the list schedule of the whole step
(docs/placement.md, "One order"). ``auto`` scores candidates with it.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import random

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from trainsched import placement
from trainsched.cluster import cluster_from_flags
from trainsched.costs import p2p_s
from trainsched.errors import TrainschedError
from trainsched.graph import Edge, Graph, Op, to_training
from trainsched.placement import Machine, Stall, reduce_graph, run_schedule
from trainsched.placement.sct import m_sct
from trainsched.sim import TaskGraph, build_result, predict_placement, run_tasks, simulate_placed
from trainsched.sim.result import Allocation

PROPERTY = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])

# place() as the command line and compare call it: predicted by the simulator
place = functools.partial(placement.place, predict=predict_placement)


def layered_dag(seed: int, n: int, *, memory: bool = True, groups: bool = True,
                comm: bool = True) -> Graph:
    rng = random.Random(seed)
    layer = sorted(rng.randrange(max(1, n // 4)) for _ in range(n))
    ops = []
    for i in range(n):
        group = f"g{rng.randrange(n // 4 + 1)}" if groups and rng.random() < 0.2 else None
        ops.append(Op(name=f"op{i:03d}", compute_s=rng.choice([0.0, 0.5, 1.0, 2.0, 3.0]),
                      param_bytes=rng.choice([0, 0, 100, 300]) if memory else 0,
                      output_bytes=rng.choice([0, 50, 200]) if memory else 0,
                      temp_bytes=rng.choice([0, 0, 100]) if memory else 0, group=group))
    edges = {}
    for j in range(n):
        for i in range(j):
            if layer[i] < layer[j] and rng.random() < 2.5 / max(1, j):
                tensor = ops[i].name + ("" if rng.random() < 0.7 else ":aux")
                size = rng.choice([0, 10, 100, 300]) if comm else 0
                edges[ops[i].name, ops[j].name, tensor] = Edge(
                    src=ops[i].name, dst=ops[j].name, size_bytes=size, tensor=tensor)
    return Graph(ops, list(edges.values()))


def make_cluster(m: int, comm: str, memory: str = "1TB"):
    # 100 B/s: the 10-300 B tensors take 0.1-3 s, like the compute.
    return cluster_from_flags(devices=m, memory=memory, bandwidth="100B/s", latency="0.1s",
                              comm=comm)


def replay(problem, cluster, schedule, *, release: bool):
    """The placer's orders on the simulator's engine: per-device chains of ops, per-channel
    chains of transfers in commit order, the simulator's allocations. With ``release`` every
    op and transfer also waits for its planned start (a placer may wait on purpose)."""
    m = cluster.num_devices
    tasks = TaskGraph()
    stream = [tasks.add_resource(f"d{d}") for d in range(m)]
    if cluster.comm == "sequential":
        own = [tasks.add_resource(f"ch{d}", kind="channel") for d in range(m)]

        def channels(a, b):
            return (own[a], own[b])
    else:
        pair = {(a, b): tasks.add_resource(f"ch{a}>{b}", kind="channel")
                for a in range(m) for b in range(m) if a != b}

        def channels(a, b):
            return (pair[a, b],)
    n, dev = problem.n, schedule.device
    op_task = [tasks.add_task(problem.names[i], problem.compute_s[i], (stream[dev[i]],),
                              device=dev[i]) for i in range(n)]  # fmt: skip

    def released(task, at):
        if release:
            gate = tasks.add_task("release", at)
            tasks.add_dependency(gate, task)

    last_on: dict[int, int] = {}
    copy_task = {}
    for x in schedule.transfers:
        duration = p2p_s(x.size_bytes, cluster.link(x.src, x.dst))
        k = tasks.add_task("copy", duration, channels(x.src, x.dst), device=x.dst)
        tasks.add_dependency(op_task[problem.tensor_producer[x.tensor]], k)
        for r in channels(x.src, x.dst):
            if r in last_on:
                tasks.add_dependency(last_on[r], k)
            last_on[r] = k
        released(k, x.start_s)
        copy_task[x.tensor, x.dst] = (k, x.size_bytes)
    for v in range(n):
        for u, tid, _ in problem.inputs[v]:
            before = op_task[u] if dev[u] == dev[v] else copy_task[tid, dev[v]][0]
            tasks.add_dependency(before, op_task[v])
        released(op_task[v], schedule.start_s[v])
    for ops in schedule.order:
        for a, b in itertools.pairwise(ops):
            tasks.add_dependency(op_task[a], op_task[b])
    times = run_tasks(tasks)
    allocations = []
    resident = [0] * m
    for i in range(n):
        d = dev[i]
        resident[d] += problem.resident[i]
        local = [op_task[v] for v in problem.successors[i] if dev[v] == d]
        sent = [k for (tid, _), (k, _) in copy_task.items() if problem.tensor_producer[tid] == i]
        allocations.append(Allocation(device=d, size_bytes=problem.output[i], at_task=op_task[i],
                                      until_tasks=(*local, *sent)))
        allocations.append(Allocation(device=d, size_bytes=problem.temp[i], at_task=op_task[i],
                                      until_tasks=(op_task[i],)))
    for (tid, d), (k, size) in copy_task.items():
        users = tuple(op_task[v] for v in problem.tensor_consumers[tid] if dev[v] == d)
        allocations.append(Allocation(device=d, size_bytes=size, at_task=k, until_tasks=users))
    allocations += [Allocation(device=d, size_bytes=b) for d, b in enumerate(resident)]
    result = build_result(tasks, times, devices=[f"d{d}" for d in range(m)],
                          allocations=allocations)
    peaks = tuple(result.peak_memory_bytes[f"d{d}"] for d in range(m))
    return times, op_task, [k for k, _ in copy_task.values()], peaks


def schedule_of(problem, machine, algorithm):
    if algorithm == "m-etf":
        return run_schedule(problem, machine)
    schedule, _, _ = m_sct(problem, machine)
    return schedule


@PROPERTY
@given(seed=st.integers(0, 10**6), n=st.integers(2, 60), m=st.integers(1, 4),
       comm=st.sampled_from(["parallel", "sequential"]),
       algorithm=st.sampled_from(["m-etf", "m-sct"]), tight=st.booleans(),
       coplacement=st.booleans(), fusion=st.booleans())
def test_replaying_the_orders_reproduces_the_schedule(seed, n, m, comm, algorithm, tight,
                                                      coplacement, fusion):
    graph = layered_dag(seed, n)
    cap = max(200, sum(op.param_bytes + op.output_bytes for op in graph.ops) // (2 * m)) \
        if tight else 10**12
    cluster = make_cluster(m, comm, f"{cap}B")
    machine = Machine.from_cluster(cluster)
    problem = reduce_graph(graph, forward_only=False, coplacement=coplacement, fusion=fusion,
                           group_cap_bytes=cap / 2)
    try:
        schedule = schedule_of(problem, machine, algorithm)
    except Stall:
        return
    times, op_task, copy_tasks, peaks = replay(problem, cluster, schedule, release=True)
    assert [times.start_s[t] for t in op_task] == list(schedule.start_s)
    assert [times.end_s[t] for t in op_task] == list(schedule.end_s)
    assert [times.start_s[k] for k in copy_tasks] == [x.start_s for x in schedule.transfers]
    assert [times.end_s[k] for k in copy_tasks] == [x.end_s for x in schedule.transfers]
    assert times.makespan_s == schedule.makespan_s
    assert peaks == schedule.peak_bytes  # the simulator's memory rules agree
    assert max(peaks) <= cap  # memory is never over capacity
    if not tight:
        # Semi-active: without the planned starts as release times, nothing moves earlier.
        free_run, op_task, _, _ = replay(problem, cluster, schedule, release=False)
        assert [free_run.start_s[t] for t in op_task] == list(schedule.start_s)


@PROPERTY
@given(seed=st.integers(0, 10**6), n=st.integers(2, 60), m=st.integers(1, 4),
       comm=st.sampled_from(["parallel", "sequential"]),
       algorithm=st.sampled_from(list(placement.PLACERS)), coplacement=st.booleans())
def test_the_simulator_replays_the_stored_order_exactly(seed, n, m, comm, algorithm,
                                                        coplacement):
    graph = layered_dag(seed, n)
    cluster = make_cluster(m, comm)
    r = place(graph, cluster, algorithm, fusion=False, coplacement=coplacement)
    assert r.placement.meta["order_from"] == "placer"
    assert r.predicted_step_s == r.makespan_s  # exactly: one cost model, one order
    result = simulate_placed(graph, cluster, r.placement, allow_forward_only=True)
    ran = {t.name: (t.start_s, t.end_s) for t in result.tasks if t.category != "comm"}
    assert ran == {name: (start, end) for name, (_, start, end) in r.op_times().items()}
    assert r.simulated_peak_bytes == r.peak_bytes
    # Each device ran its ops in the stored order.
    for device, ops in enumerate(r.placement.device_orders()):
        assert list(ops) == sorted(ops, key=lambda name: ran[name][0])
        assert tuple(ops) == r.device_order()[device]


@PROPERTY
@given(seed=st.integers(0, 10**6), n=st.integers(2, 60), m=st.integers(2, 4),
       comm=st.sampled_from(["parallel", "sequential"]),
       algorithm=st.sampled_from(list(placement.PLACERS)), coplacement=st.booleans())
# A tensor whose edges disagree in size (100 B to op015 on another device, 300 B to an op fused
# with its producer): the placer must send what the simulator sends, the largest.
@example(seed=34, n=34, m=2, comm="parallel", algorithm="m-sct", coplacement=False)
def test_a_fused_placement_never_runs_slower_than_its_placer_said(seed, n, m, comm, algorithm,
                                                                  coplacement):
    # Expanded, a fused op's members start as soon as their own inputs are there.
    graph = layered_dag(seed, n)
    r = place(graph, make_cluster(m, comm), algorithm, fusion=True, coplacement=coplacement)
    assert r.predicted_step_s <= r.makespan_s


@PROPERTY
@given(seed=st.integers(0, 10**6), n=st.integers(2, 30), m=st.integers(1, 4),
       comm=st.sampled_from(["parallel", "sequential"]),
       algorithm=st.sampled_from(["m-etf", "m-sct", "m-topo", "single"]))
def test_a_forward_only_placement_runs_the_list_schedule_of_the_step(seed, n, m, comm,
                                                                     algorithm):
    train = to_training(layered_dag(seed, n, groups=False))
    assume(any(op.kind != "forward" for op in train.ops))  # no parameters: nothing to train
    cluster = make_cluster(m, comm)
    r = place(train, cluster, algorithm)
    assert r.placement.meta["forward_only"]
    assert r.placement.meta["order_from"] == "list schedule of the step"
    full = reduce_graph(train, forward_only=False, coplacement=False, fusion=False,
                        group_cap_bytes=math.inf)
    listed = run_schedule(full, Machine.from_cluster(cluster),
                          fixed=[r.placement.device_of[name] for name in full.names])
    assert r.placement.order == tuple(full.names[i] for i in listed.sequence)
    assert r.predicted_step_s == listed.makespan_s


@PROPERTY
@given(seed=st.integers(0, 10**6), n=st.integers(2, 60), m=st.integers(2, 4),
       algorithm=st.sampled_from(["auto", "m-etf", "m-sct", "m-topo", "contiguous-compute"]),
       tight=st.booleans())
def test_groups_stay_whole_and_memory_stays_within_capacity(seed, n, m, algorithm, tight):
    graph = layered_dag(seed, n)
    total = sum(op.param_bytes + op.output_bytes + op.temp_bytes for op in graph.ops)
    cap = max(400, total // m) if tight else 10**12
    cluster = make_cluster(m, "sequential", f"{cap}B")
    try:
        r = place(graph, cluster, algorithm)
    except TrainschedError as exc:
        assert "does not fit" in str(exc) and "needs at least" in str(exc)
        return
    r.placement.validate(graph, cluster)  # every op placed, groups never split
    assert max(r.peak_bytes) <= cap
    if algorithm == "auto":
        assert not any(c.step_s is not None and c.oom and c.name == r.placer
                       for c in r.candidates) or all(c.oom for c in r.candidates)


@PROPERTY
@given(seed=st.integers(0, 10**6), n=st.integers(2, 80), coplacement=st.booleans(),
       forward_only=st.booleans())
# Two reduced nodes alike in everything (one producer, one tensor, equal costs, no
# successors): the problem numbers them by their places in the original graph, the reduced
# graph's own canonical order would by name; either order is topological.
@example(seed=266, n=21, coplacement=False, forward_only=False)
def test_fusion_is_acyclic_and_expands_each_op_once(seed, n, coplacement, forward_only):
    graph = layered_dag(seed, n, memory=True)
    problem = reduce_graph(graph, forward_only=forward_only, coplacement=coplacement,
                           fusion=True, group_cap_bytes=500)
    members = [name for ms in problem.members for name in ms]
    assert sorted(members) == sorted(op.name for op in graph.ops)
    reduced = problem.to_graph()  # raises on a cycle
    number = {name: i for i, name in enumerate(problem.names)}
    assert all(number[e.src] < number[e.dst] for e in reduced.edges)  # numbered topologically
    assert set(problem.group_of) == {op.name for op in graph.ops}
    for i, ms in enumerate(problem.members):
        assert {problem.group_of[name] for name in ms} == {problem.group[i]}
    assert math.isclose(sum(problem.compute_s), graph.totals().compute_s)


@PROPERTY
@given(seed=st.integers(0, 10**6), n=st.integers(2, 50), m=st.integers(1, 4),
       algorithm=st.sampled_from(["auto", "m-etf", "m-sct", "m-topo"]))
def test_same_input_same_result_in_any_listing_order(seed, n, m, algorithm):
    graph = layered_dag(seed, n)
    rng = random.Random(seed)
    ops, edges = list(graph.ops), list(graph.edges)
    rng.shuffle(ops)
    rng.shuffle(edges)
    cluster = make_cluster(m, "sequential")
    a = place(graph, cluster, algorithm)
    b = place(Graph(ops, edges), cluster, algorithm)
    assert a.placement.to_json() == b.placement.to_json()
    assert a.op_times() == b.op_times() and a.transfers() == b.transfers()
    assert a.peak_bytes == b.peak_bytes and a.predicted_step_s == b.predicted_step_s


@PROPERTY
@given(seed=st.integers(0, 10**6), n=st.integers(1, 60),
       algorithm=st.sampled_from(["m-etf", "m-sct", "m-topo", "auto"]))
def test_one_device_takes_the_sum(seed, n, algorithm):
    graph = layered_dag(seed, n)
    r = place(graph, make_cluster(1, "sequential"), algorithm)
    assert math.isclose(r.makespan_s, graph.totals().compute_s, abs_tol=1e-12)


@PROPERTY
@given(seed=st.integers(0, 10**6), n=st.integers(2, 80), m=st.integers(2, 4))
def test_etf_without_communication_meets_grahams_bound(seed, n, m):
    graph = layered_dag(seed, n, groups=False, comm=False)
    r = place(graph, make_cluster(m, "sequential"), "m-etf", coplacement=False, fusion=False)
    critical, _ = graph.critical_path()
    work = graph.totals().compute_s
    assert r.makespan_s <= work / m + (1 - 1 / m) * critical + 1e-9


@PROPERTY
@given(seed=st.integers(0, 10**6), n=st.integers(2, 40), m=st.integers(1, 4))
def test_more_resident_memory_than_the_cluster_raises(seed, n, m):
    graph = layered_dag(seed, n)
    resident = sum(op.param_bytes for op in graph.ops)
    if resident == 0:
        return
    cap = max(1, (resident - 1) // m)
    with pytest.raises(TrainschedError, match=r"does not fit.*needs at least"):
        place(graph, make_cluster(m, "parallel", f"{cap}B"), "auto")


def renamed(graph: Graph, seed: int) -> tuple[Graph, dict[str, str]]:
    """``graph`` with every op under a random new name (structure, costs and groups kept);
    tensors are renamed after their producer, keeping their order among its tensors."""
    rng = random.Random(seed)
    names = [op.name for op in graph.ops]
    fresh = rng.sample(range(16**6), len(names))
    new = {name: f"n{k:06x}" for name, k in zip(names, fresh, strict=True)}
    keys: dict[str, list[str]] = {}
    for e in graph.edges:
        keys.setdefault(e.src, [])
        if e.tensor not in keys[e.src]:
            keys[e.src].append(e.tensor)
    tensor = {(src, key): f"{new[src]}#{k}" for src, ks in keys.items()
              for k, key in enumerate(sorted(ks))}
    ops = [dataclasses.replace(op, name=new[op.name],
                               forward_op=new.get(op.forward_op) if op.forward_op else None)
           for op in graph.ops]
    edges = [Edge(src=new[e.src], dst=new[e.dst], size_bytes=e.size_bytes,
                  tensor=tensor[e.src, e.tensor]) for e in graph.edges]
    order = list(range(len(ops)))
    rng.shuffle(order)
    return Graph([ops[i] for i in order], edges), new


def shared_groups(graph: Graph, seed: int) -> Graph:
    """Some forward ops share a co-location group with another layer (tied weights), so that
    their backward and optimizer ops share it too."""
    rng = random.Random(seed)
    forward = [op.name for op in graph.ops]
    ties = {name: rng.choice(forward) for name in forward if rng.random() < 0.15}
    ops = [dataclasses.replace(op, group=f"tie-{ties[op.name]}") if op.name in ties else op
           for op in graph.ops]
    return Graph(ops, graph.edges)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10**6), n=st.integers(2, 24), m=st.integers(2, 4),
       comm=st.sampled_from(["parallel", "sequential"]),
       algorithm=st.sampled_from(["auto", *placement.PLACERS]))
def test_renaming_the_ops_renames_the_placement(seed, n, m, comm, algorithm):
    train = to_training(shared_groups(layered_dag(seed, n, groups=False), seed))
    other, new = renamed(train, seed + 1)
    cluster = make_cluster(m, comm)
    a = place(train, cluster, algorithm)
    b = place(other, cluster, algorithm)
    assert b.predicted_step_s == a.predicted_step_s and b.makespan_s == a.makespan_s
    assert b.placer == a.placer
    # The same placement and order, up to the renaming and to exchanging ops that nothing
    # in the graph tells apart (an automorphism: there the names break the tie).
    lab = labels(train)
    old = {v: k for k, v in new.items()}
    assert [[lab[old[x]] for x in ops] for ops in b.placement.device_orders()] == \
        [[lab[x] for x in ops] for ops in a.placement.device_orders()]
    alike = {k for k in lab if sum(v == lab[k] for v in lab.values()) > 1}
    assert {k: b.placement.device_of[new[k]] for k in lab if k not in alike} == \
        {k: a.placement.device_of[k] for k in lab if k not in alike}


def labels(graph: Graph) -> dict[str, tuple]:
    """What an op is, apart from its name: its costs and the sizes of its edges."""
    ins: dict[str, list[int]] = {op.name: [] for op in graph.ops}
    outs: dict[str, list[int]] = {op.name: [] for op in graph.ops}
    for e in graph.edges:
        ins[e.dst].append(e.size_bytes)
        outs[e.src].append(e.size_bytes)
    return {op.name: (op.kind, op.compute_s, op.param_bytes, op.output_bytes, op.temp_bytes,
                      tuple(sorted(ins[op.name])), tuple(sorted(outs[op.name])))
            for op in graph.ops}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10**6), n=st.integers(2, 20), m=st.integers(2, 4),
       comm=st.sampled_from(["parallel", "sequential"]))
def test_reductions_never_make_auto_worse(seed, n, m, comm):
    # Training graphs whose forward and backward ops share co-location groups across layers.
    train = to_training(shared_groups(layered_dag(seed, n, groups=False), seed))
    cluster = make_cluster(m, comm)
    best = place(train, cluster, "auto")
    for algorithm in placement.PLACERS:
        for reductions in ({"fusion": False}, {"coplacement": False},
                           {"fusion": False, "coplacement": False, "forward_only": False}):
            alone = place(train, cluster, algorithm, **reductions)
            assert best.predicted_step_s <= alone.predicted_step_s
