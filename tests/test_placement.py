"""Placement: hand-solved graphs (specs/placement.md §8), the m-SCT LP, reduction, baselines,
infeasibility, auto, determinism and the Placement a placer returns."""

from __future__ import annotations

import contextlib
import functools
import math
import random

import pytest

from trainsched import placement
from trainsched.cluster import cluster_from_flags
from trainsched.errors import TrainschedError
from trainsched.graph import Edge, Graph, Op, to_training
from trainsched.placement import PLACERS, Machine, reduce_graph, run_schedule
from trainsched.placement.baselines import contiguous_devices
from trainsched.placement.reduce import canonical_order
from trainsched.placement.sct import edge_costs, favourites, solve_lp
from trainsched.placement.topo import topo_devices
from trainsched.plan import Placement
from trainsched.sim import predict_placement

GB = 10**9  # 1 s on a 1 GB/s link

# place() as the command line and compare call it: predicted by the simulator
place = functools.partial(placement.place, predict=predict_placement)


def cluster(m: int, comm: str = "parallel", memory: str = "1TB", latency: str = "0s",
            bandwidth: str = "1GB/s"):
    return cluster_from_flags(devices=m, memory=memory, bandwidth=bandwidth, latency=latency,
                              comm=comm)


def graph(ops: list[tuple[str, float]], edges: list[tuple[str, str, float]], **fields) -> Graph:
    """Ops (name, compute s) and edges (src, dst, transfer seconds at 1 GB/s)."""
    return Graph([Op(name=n, compute_s=float(p), **fields.get(n, {})) for n, p in ops],
                 [Edge(src=a, dst=b, size_bytes=round(c * GB)) for a, b, c in edges])


def raw(g: Graph, c, algorithm: str, **kw):
    """Place without reduction: the hand-solved answers are about the placers themselves."""
    return place(g, c, algorithm, coplacement=False, fusion=False, **kw)


DYNAMIC = ("m-etf", "m-sct")


# --- hand-solved ---------------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", [*DYNAMIC, "auto"])
def test_expensive_chain_stays_on_one_device(algorithm):
    g = graph([("a", 1), ("b", 2), ("c", 3)], [("a", "b", 10), ("b", "c", 10)])
    r = raw(g, cluster(2), algorithm)
    assert set(r.placement.device_of.values()) == {0}
    assert r.makespan_s == 6.0 and r.predicted_step_s == 6.0


DIAMOND = ([("a", 1), ("b", 4), ("c", 4), ("d", 1)],
           [("a", "b", 1), ("a", "c", 1), ("b", "d", 1), ("c", "d", 1)])


@pytest.mark.parametrize("comm", ["parallel", "sequential"])
@pytest.mark.parametrize("algorithm", DYNAMIC)
def test_diamond_splits_its_branches(algorithm, comm):
    r = raw(graph(*DIAMOND), cluster(2, comm), algorithm)
    where = r.placement.device_of
    assert where["b"] != where["c"]  # one branch per device
    assert where["d"] in (where["b"], where["c"]) and where["a"] in (where["b"], where["c"])
    assert r.makespan_s == 7.0 and r.predicted_step_s == 7.0  # the optimum; LB is 6
    assert r.lower_bound_s == 6.0


def test_coplacement_merges_a_diamond_like_baechi():
    """Co-placement joins each branch's end with its sole consumer: the diamond becomes one
    group (as in Baechi); without co-placement the placers find the optimum 7."""
    r = place(graph(*DIAMOND), cluster(2), "m-etf", fusion=False)
    assert r.ops_after == 4 and len(set(r.placement.device_of.values())) == 1
    assert r.makespan_s == 10.0
    # auto also runs the dynamic placers without co-placement, and finds 7.
    best = place(graph(*DIAMOND), cluster(2), "auto", fusion=False)
    assert best.predicted_step_s == 7.0 and best.placer.endswith("/no-coplacement")
    assert best.placement.meta["coplacement"] is False


FORK3 = ([("a", 1), ("b", 5), ("c", 5), ("e", 5)], [("a", "b", 1), ("a", "c", 1), ("a", "e", 1)])


@pytest.mark.parametrize("algorithm", DYNAMIC)
@pytest.mark.parametrize(("comm", "expected"), [("parallel", 7.0), ("sequential", 8.0)])
def test_three_way_fork(algorithm, comm, expected):
    """Parallel channels send both copies at once; one sequential channel queues e's copy
    behind c's."""
    r = raw(graph(*FORK3), cluster(3, comm), algorithm)
    assert len(set(r.placement.device_of.values())) == 3
    assert r.makespan_s == expected and r.predicted_step_s == expected
    if comm == "sequential":
        starts = sorted(x["start_s"] for x in r.transfers())
        assert starts == [1.0, 2.0]


def capped_fork(memory: str):
    """s(1) -> x, y, z (2 each, 4 resident bytes each), transfers 10 s (latency) of 1 byte."""
    g = Graph([Op(name="s", compute_s=1.0)]
              + [Op(name=n, compute_s=2.0, param_bytes=4) for n in "xyz"],
              [Edge(src="s", dst=n, size_bytes=1) for n in "xyz"])
    return g, cluster(3, memory=memory, latency="10s", bandwidth="1TB/s")


@pytest.mark.parametrize("algorithm", [*DYNAMIC, "m-topo", "auto"])
def test_capped_fork_spreads_only_when_memory_forces_it(algorithm):
    g, c = capped_fork("5B")
    r = raw(g, c, algorithm)
    assert sorted(r.placement.device_of[n] for n in "xyz") == [0, 1, 2]
    assert math.isclose(r.makespan_s, 13.0) and math.isclose(r.predicted_step_s, 13.0)
    assert max(r.peak_bytes) <= 5 and max(r.simulated_peak_bytes) <= 5
    if algorithm in DYNAMIC:
        g, c = capped_fork("1TB")
        r = raw(g, c, algorithm)
        assert set(r.placement.device_of.values()) == {0} and r.makespan_s == 7.0


@pytest.mark.parametrize("algorithm", DYNAMIC)
def test_one_transfer_serves_two_consumers(algorithm):
    """a's output goes once to the device running c and d, while b (long) keeps a's device
    busy."""
    g = Graph([Op(name="a", compute_s=1.0), Op(name="b", compute_s=20.0),
               Op(name="c", compute_s=3.0), Op(name="d", compute_s=3.0)],
              [Edge(src="a", dst="b", size_bytes=0), Edge(src="a", dst="c", size_bytes=GB),
               Edge(src="a", dst="d", size_bytes=GB)])
    r = raw(g, cluster(2), algorithm)
    assert r.makespan_s == 21.0
    assert len(r.transfers()) == 1  # one copy per (tensor, device), whatever the layout
    if algorithm == "m-etf":
        where = r.placement.device_of
        assert where["a"] == where["b"] != where["c"] == where["d"]
        assert [(x["producer"], x["start_s"], x["end_s"]) for x in r.transfers()] == \
            [("a", 1, 2)]
        times = r.op_times()
        assert times["c"][1:] == (2.0, 5.0) and times["d"][1:] == (5.0, 8.0)


def test_lp_fork_has_value_seven_and_one_favourite():
    g = graph([("a", 1), ("b", 1), ("c", 1)], [("a", "b", 10), ("a", "c", 10)])
    problem = reduce_graph(g, forward_only=False, coplacement=False, fusion=False,
                           group_cap_bytes=math.inf)
    machine = Machine.from_cluster(cluster(2))
    edges = edge_costs(problem, machine)
    assert [c for _, _, c in edges] == [10.0, 10.0]
    w_star, x = solve_lp(problem, edges)
    assert math.isclose(w_star, 7.0, rel_tol=1e-7)
    assert x == pytest.approx([0.5, 0.5], abs=1e-7)
    fav = favourites(problem.n, edges, x, 0.5)
    names = problem.names
    assert [(names[u], names[v]) for u, v in enumerate(fav) if v >= 0] == [("a", "b")]
    # Not a lower bound here (c > min p): one device finishes in 3.
    r = raw(g, cluster(2), "m-sct")
    assert r.lp_value_s == pytest.approx(7.0) and r.makespan_s == 3.0


def test_favourites_never_give_an_op_two_children_or_two_parents():
    edges = [(0, 1, 1.0), (0, 2, 1.0), (3, 2, 1.0), (3, 4, 2.0)]
    fav = favourites(5, edges, [0.0, 0.0, 0.0, 0.0], 0.5)
    children = [v for v in fav if v >= 0]
    assert len(children) == len(set(children))  # one favourite parent each
    assert fav[0] == 1 and fav[3] == 4  # by (x, -c, parent, child)


def test_sct_reserves_a_device_for_its_favourite_child():
    """a's children: f (5, also needs x from the other device) and u (1). The LP makes f the
    favourite (x = 0.3 against u's 0.7). m-ETF fills a's idle device with u at once; m-SCT
    keeps it for f, since u is not urgent (on the other device its inputs come only at 11)."""
    g = graph([("a", 1), ("x", 3), ("f", 5), ("u", 1)],
              [("a", "f", 10), ("a", "u", 10), ("x", "f", 0.5)])
    etf = raw(g, cluster(2), "m-etf").op_times()
    sct = raw(g, cluster(2), "m-sct")
    times = sct.op_times()
    assert etf["a"][0] == etf["u"][0] == etf["f"][0] and etf["u"][1] < etf["f"][1]
    assert times["a"][0] == times["f"][0] == times["u"][0]
    assert times["f"][1:] == (3.5, 8.5) and times["u"][1:] == (8.5, 9.5)
    assert sct.lp_value_s == pytest.approx(9.0)


# --- one device, baselines, lower bound ----------------------------------------------------


def random_dag(seed: int, n: int = 40) -> Graph:
    rng = random.Random(seed)
    ops = [Op(name=f"o{i:02d}", compute_s=rng.choice([0.0, 0.5, 1.0, 2.0]),
              param_bytes=rng.choice([0, 100]), output_bytes=rng.choice([0, 50]))
           for i in range(n)]  # fmt: skip
    edges = [Edge(src=ops[i].name, dst=ops[j].name, size_bytes=rng.choice([0, GB // 2, GB]))
             for j in range(n) for i in range(max(0, j - 6), j) if rng.random() < 0.3]
    return Graph(ops, edges)


@pytest.mark.parametrize("algorithm", list(PLACERS))
def test_one_device_takes_the_sum_of_compute(algorithm):
    g = random_dag(3)
    r = place(g, cluster(1), algorithm)
    assert math.isclose(r.makespan_s, g.totals().compute_s)
    assert math.isclose(r.predicted_step_s, g.totals().compute_s)


def test_lower_bound_is_critical_path_or_work_per_device():
    g = random_dag(5)
    r = place(g, cluster(4), "m-etf")
    cp, _ = g.critical_path()
    assert r.lower_bound_s == max(cp, g.totals().compute_s / 4)
    assert r.predicted_step_s >= r.lower_bound_s - 1e-12


def test_contiguous_split_is_min_max_and_contiguous():
    ops = [Op(name=f"l{i}", compute_s=1.0, param_bytes=p) for i, p in
           enumerate([4, 1, 1, 1, 1, 4, 2, 2])]
    g = Graph(ops, [Edge(src=f"l{i}", dst=f"l{i + 1}", size_bytes=0) for i in range(7)])
    problem = reduce_graph(g, forward_only=False, coplacement=False, fusion=False,
                           group_cap_bytes=math.inf)
    machine = Machine.from_cluster(cluster(3))
    devices = contiguous_devices(problem, machine, [float(op.param_bytes) for op in ops])
    assert devices == sorted(devices)  # contiguous, in order
    loads = [sum(ops[i].param_bytes for i, d in enumerate(devices) if d == k) for k in range(3)]
    assert max(loads) == 6  # {4,1,1}, {1,1,4}... the best split of 16 into 3 is 6
    by_count = contiguous_devices(problem, machine, [1.0] * 8)
    assert [by_count.count(k) for k in range(3)] == [3, 3, 2]


def test_m_topo_fills_devices_in_order_up_to_a_proportional_share():
    ops = [Op(name=f"l{i}", compute_s=1.0, param_bytes=10) for i in range(8)]
    g = Graph(ops, [Edge(src=f"l{i}", dst=f"l{i + 1}", size_bytes=0) for i in range(7)])
    problem = reduce_graph(g, forward_only=False, coplacement=False, fusion=False,
                           group_cap_bytes=math.inf)
    devices = topo_devices(problem, Machine.from_cluster(cluster(4, memory="1KB")))
    assert devices == sorted(devices)
    assert max(devices.count(d) for d in range(4)) == 3  # share 20 B + largest 10 B


def test_auto_is_never_worse_than_single_or_contiguous():
    for seed in range(4):
        g = random_dag(seed)
        c = cluster(4, "sequential", latency="100ms")
        r = place(g, c, "auto")
        steps = {cand.name: cand.step_s for cand in r.candidates}
        assert set(PLACERS) <= set(steps)  # and, when co-placement merged ops, variants
        assert r.predicted_step_s == min(steps.values())
        assert r.predicted_step_s <= steps["single"]
        assert r.predicted_step_s <= min(steps[n] for n in steps if n.startswith("contiguous"))


def test_communication_heavy_graphs_stay_on_few_devices():
    """Layers of 8 ops joined by tensors that take 50x the compute to move: m-ETF and m-SCT
    keep the work on one device, no slower than single."""
    ops, edges = [], []
    for layer in range(6):
        for k in range(8):
            ops.append(Op(name=f"L{layer}_{k}", compute_s=0.01))
            if layer:
                edges += [Edge(src=f"L{layer - 1}_{j}", dst=f"L{layer}_{k}", size_bytes=GB // 2)
                          for j in (k, (k + 1) % 8)]
    g = Graph(ops, edges)
    for algorithm in DYNAMIC:
        r = place(g, cluster(4, "sequential"), algorithm, coplacement=False)
        single = place(g, cluster(4, "sequential"), "single")
        assert r.predicted_step_s <= single.predicted_step_s
        assert len(set(r.placement.device_of.values())) == 1


# --- infeasible ------------------------------------------------------------------------------


def test_resident_memory_above_the_cluster_total_raises():
    ops = [Op(name=f"w{i}", compute_s=1.0, param_bytes=400) for i in range(4)]
    g = Graph(ops, [Edge(src=f"w{i}", dst=f"w{i + 1}", size_bytes=1) for i in range(3)])
    with pytest.raises(TrainschedError, match=r"op 'w\d' does not fit.*needs at least 400 B "
                                              r"per device; the cluster has 300 B"):
        place(g, cluster(4, memory="300B"), "m-etf", coplacement=False)


def test_a_group_larger_than_a_device_raises_naming_its_op():
    g = Graph([Op(name="big", compute_s=1.0, param_bytes=600), Op(name="x", compute_s=1.0)],
              [Edge(src="big", dst="x", size_bytes=1)])
    with pytest.raises(TrainschedError, match=r"op 'big' does not fit.*600 B per device"):
        place(g, cluster(2, memory="500B"), "auto")


def test_dynamic_memory_shortfall_names_the_op_and_what_it_needs():
    """Activations, not parameters, overflow: 3 outputs of 300 B all alive at the join."""
    g = Graph([Op(name="s", compute_s=1.0, output_bytes=10)]
              + [Op(name=f"b{i}", compute_s=1.0, output_bytes=300) for i in range(3)]
              + [Op(name="join", compute_s=1.0)],
              [Edge(src="s", dst=f"b{i}", size_bytes=10) for i in range(3)]
              + [Edge(src=f"b{i}", dst="join", size_bytes=300) for i in range(3)])
    with pytest.raises(TrainschedError) as info:
        place(g, cluster(2, memory="500B"), "auto", coplacement=False, fusion=False)
    message = str(info.value)
    assert "does not fit" in message and "needs at least" in message
    assert "the cluster has 500 B on each of 2 devices" in message
    need = int(message.split("needs at least ")[1].split(" B")[0])
    assert need > 500
    place(g, cluster(2, memory=f"{need}B"), "auto", coplacement=False, fusion=False)


def test_bad_options_are_user_errors():
    g = random_dag(1, 5)
    for kwargs, text in [({"algorithm": "m-foo"}, "unknown placement algorithm"),
                         ({"comm": "both"}, "comm must be"),
                         ({"group_cap_fraction": 0}, "group_cap_fraction"),
                         ({"memory_fraction": 1.5}, "memory_fraction")]:
        with pytest.raises(TrainschedError, match=text):
            place(g, cluster(2), **kwargs)


# --- reduction -------------------------------------------------------------------------------


def training_graph() -> Graph:
    ops = [Op(name="x", compute_s=1e-3, output_bytes=400, saved_bytes=400)]
    edges = []
    prev = "x"
    for i in range(6):
        name = f"layer{i}"
        ops.append(Op(name=name, compute_s=1e-3, param_bytes=1000, output_bytes=400,
                      saved_bytes=400 if i % 2 else 800, temp_bytes=50))
        edges.append(Edge(src=prev, dst=name, size_bytes=400))
        prev = name
    return to_training(Graph(ops, edges), optimizer="adam")


def test_forward_only_reduction_keeps_groups_and_charges_training_state():
    g = training_graph()
    problem = reduce_graph(g, forward_only=True, coplacement=False, fusion=False,
                           group_cap_bytes=math.inf)
    assert {m for members in problem.members for m in members} == \
        {op.name for op in g.ops if op.kind == "forward"}
    groups: dict[int, set[str]] = {}
    for name, gid in problem.group_of.items():
        groups.setdefault(gid, set()).add(name)
    assert {"layer3", "layer3:dX", "layer3:dW", "layer3:opt"} in groups.values()
    i = problem.names.index("layer3")
    # params 1000 + Adam state 2000 + gradient 1000 + the larger of output and saved (400)
    assert problem.resident[i] == 1000 + 2000 + 1000 + 400 and problem.output[i] == 0
    assert problem.resident[problem.names.index("layer0")] == 4000 + 800


def test_fusion_contracts_chains_but_never_closes_a_cycle():
    # a -> b -> d and a -> c -> d in one group: a->b cannot be contracted with a->c also
    # there... contraction order must leave a DAG, and every op appears once.
    ops = [Op(name=n, compute_s=1.0, group="g", output_bytes=10) for n in "abcd"]
    edges = [Edge(src="a", dst="b", size_bytes=10), Edge(src="a", dst="c", size_bytes=10),
             Edge(src="b", dst="d", size_bytes=10), Edge(src="c", dst="d", size_bytes=10),
             Edge(src="a", dst="d", size_bytes=10)]
    problem = reduce_graph(Graph(ops, edges), forward_only=False, coplacement=False,
                           fusion=True, group_cap_bytes=math.inf)
    members = [m for ms in problem.members for m in ms]
    assert sorted(members) == list("abcd")
    problem.to_graph()  # a cycle would raise here
    assert problem.n < 4


def test_fused_temp_keeps_internal_tensors():
    """A chain fused into one op: peak = the largest pair of live outputs (a's 100 B still
    alive while b allocates 300 B), more than any member's own temp."""
    ops = [Op(name="a", compute_s=1.0, output_bytes=100, group="g"),
           Op(name="b", compute_s=1.0, output_bytes=300, group="g"),
           Op(name="c", compute_s=1.0, output_bytes=20, group="g")]
    edges = [Edge(src="a", dst="b", size_bytes=100), Edge(src="b", dst="c", size_bytes=300)]
    problem = reduce_graph(Graph(ops, edges), forward_only=False, coplacement=False,
                           fusion=True, group_cap_bytes=math.inf)
    assert problem.n == 1 and problem.members[0] == ("a", "b", "c")
    assert problem.output[0] == 20  # only c's output leaves (it is a sink)
    assert problem.output[0] + problem.temp[0] == 400  # a + b alive while b runs


def test_coplacement_respects_the_group_cap():
    ops = [Op(name=f"c{i}", compute_s=1.0, param_bytes=100) for i in range(6)]
    g = Graph(ops, [Edge(src=f"c{i}", dst=f"c{i + 1}", size_bytes=1) for i in range(5)])
    merged = reduce_graph(g, forward_only=False, coplacement=True, fusion=False,
                          group_cap_bytes=math.inf)
    capped = reduce_graph(g, forward_only=False, coplacement=True, fusion=False,
                          group_cap_bytes=250)
    assert len(merged.group_ops) == 1
    assert [sum(capped.resident[i] for i in members) for members in capped.group_ops] == \
        [200, 200, 200]


def test_canonical_order_ignores_listing_order():
    g = random_dag(7, 30)
    shuffled = list(g.ops)
    random.Random(1).shuffle(shuffled)
    assert canonical_order(g) == canonical_order(Graph(shuffled, g.edges))


# --- results ---------------------------------------------------------------------------------


def test_training_placement_covers_every_op_and_keeps_groups():
    g = training_graph()
    r = place(g, cluster(2, memory="1MB"), "m-sct")
    r.placement.validate(g, cluster(2))
    assert set(r.placement.device_of) == {op.name for op in g.ops}
    meta = r.placement.meta
    assert meta["algorithm"] == "m-sct" and meta["forward_only"] is True
    assert meta["ops_before"] == len(g) and meta["ops_after"] == r.ops_after < len(g)
    assert meta["predicted_step_s"] == r.predicted_step_s > 0
    assert "lp_value_s" in meta
    again = Placement.from_json(r.placement.to_json())
    assert dict(again.device_of) == dict(r.placement.device_of)


def test_same_input_same_bytes_even_when_ops_are_listed_differently():
    g = random_dag(11, 50)
    shuffled = list(g.ops)
    random.Random(3).shuffle(shuffled)
    edges = list(g.edges)
    random.Random(4).shuffle(edges)
    g2 = Graph(shuffled, edges)
    for algorithm in ("auto", "m-sct", "m-etf"):
        a = place(g, cluster(3, "sequential"), algorithm)
        b = place(g2, cluster(3, "sequential"), algorithm)
        assert a.placement.to_json() == b.placement.to_json()
        assert a.op_times() == b.op_times() and a.transfers() == b.transfers()


def test_comm_option_overrides_the_cluster():
    g = graph(*FORK3)
    seq = raw(g, cluster(3, "parallel"), "m-etf", comm="sequential")
    assert seq.makespan_s == 8.0 and seq.placement.meta["comm"] == "sequential"


def test_schedule_on_a_fixed_placement_is_its_list_schedule():
    g = graph(*DIAMOND)
    problem = reduce_graph(g, forward_only=False, coplacement=False, fusion=False,
                           group_cap_bytes=math.inf)
    machine = Machine.from_cluster(cluster(2))
    fixed = [0, 1, 0, 1]  # a, c on device 0; b, d on device 1 (index order a b c d)
    s = run_schedule(problem, machine, fixed=fixed)
    assert list(s.device) == fixed
    # a 0..1; b waits for a's copy (1..2), runs 2..6; c 1..5 then its copy 5..6; d 6..7
    assert s.start_s == (0.0, 2.0, 1.0, 6.0) and s.makespan_s == 7.0


def test_auto_gives_the_placers_less_memory_until_the_simulated_step_fits():
    """Forward-only placement does not see backward's working memory: on this chain the first
    round's best placement runs out of memory in the simulator, and auto retries with less."""
    rng = random.Random(4)
    ops = [Op(name="x", compute_s=1e-3, output_bytes=100)]
    edges = []
    for i in range(10):
        out = rng.choice([100, 400, 800])
        ops.append(Op(name=f"l{i}", compute_s=1e-3, param_bytes=rng.choice([50, 200]),
                      output_bytes=out, saved_bytes=out, temp_bytes=rng.choice([0, 100])))
        edges.append(Edge(src=ops[-2].name, dst=ops[-1].name, size_bytes=ops[-2].output_bytes))
    g = to_training(Graph(ops, edges))
    c = cluster(4, memory="2800B")
    for algorithm in PLACERS:  # given the full 2800 B, every placement overshoots
        with contextlib.suppress(TrainschedError):  # or does not fit at all
            assert place(g, c, algorithm).placement.meta["out_of_memory"]
    r = place(g, c, "auto")
    assert r.placement.meta["placer_capacity_bytes"] < 2800
    assert r.placement.meta["out_of_memory"] == [] and max(r.simulated_peak_bytes) <= 2800
    r.placement.validate(g, c)
