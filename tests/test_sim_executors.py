"""Single-device and placed executors against closed forms; memory, results and traces."""

from __future__ import annotations

import gzip
import json
import math
from dataclasses import dataclass

import pytest

from trainsched.cluster import cluster_from_flags
from trainsched.costs import p2p_s
from trainsched.errors import TrainschedError
from trainsched.graph import Edge, Graph, Op, to_training
from trainsched.sim import (
    TaskGraph,
    build_result,
    chrome_trace,
    priority_order,
    run_tasks,
    simulate_placed,
    simulate_single,
    trace_json,
    write_trace,
)

MB = 1_000_000  # 1 ms on a 1 GB/s link
# The closed forms below are of hand-built graphs of forward ops, simulated as given: the
# executors refuse a forward-only graph unless told that its forward pass is what to simulate.
FORWARD = {"allow_forward_only": True}


def close(actual: float, expected: float) -> bool:
    return math.isclose(actual, expected, rel_tol=1e-9, abs_tol=1e-15)


def make_cluster(devices: int = 4, comm: str = "parallel", memory: str = "1GiB",
                 latency: str = "10us"):
    return cluster_from_flags(devices=devices, memory=memory, bandwidth="1GB/s", latency=latency,
                              comm=comm)


def comm_records(result):
    return [t for t in result.tasks if t.category == "comm"]


def record(result, name):
    return next(t for t in result.tasks if t.name == name)


# --- single device ---------------------------------------------------------------------------


def test_chain_is_the_sum_of_compute():
    costs = [1e-3 * (1 + (7 * i) % 13) / 3 for i in range(500)]
    ops = [Op(name=f"op{i}", compute_s=c) for i, c in enumerate(costs)]
    edges = [Edge(src=f"op{i}", dst=f"op{i + 1}", size_bytes=4) for i in range(499)]
    result = simulate_single(Graph(ops, edges), **FORWARD)
    assert close(result.step_time_s, math.fsum(costs))
    assert close(result.dependency_bound_s, math.fsum(costs))
    assert result.events == 500 and result.devices == ("device0",)
    assert result.busy_s == {"device0/compute": result.step_time_s}
    assert result.exposed_comm_s == 0.0


def test_single_runs_in_the_given_order_and_checks_it():
    g = Graph([Op(name=n, compute_s=1.0) for n in "abc"], [Edge(src="a", dst="c", size_bytes=1)])
    result = simulate_single(g, order=["b", "a", "c"], **FORWARD)
    assert [(t.name, t.start_s) for t in result.tasks] == [("b", 0.0), ("a", 1.0), ("c", 2.0)]
    assert [t.start_s for t in simulate_single(g, **FORWARD).tasks] == [0.0, 1.0, 2.0]
    with pytest.raises(TrainschedError, match="not topological"):
        simulate_single(g, order=["c", "a", "b"], **FORWARD)
    with pytest.raises(TrainschedError, match="each of the graph's 3 ops once"):
        simulate_single(g, order=["a", "b"], **FORWARD)
    with pytest.raises(TrainschedError, match="not a device"):
        simulate_single(g, make_cluster(2), device=2, **FORWARD)


def test_single_device_name_comes_from_the_cluster():
    g = Graph([Op(name="a", compute_s=1.0)], [])
    result = simulate_single(g, make_cluster(4), device=3, **FORWARD)
    assert result.devices == ("gpu3",) and result.tasks[0].resources == ("gpu3/compute",)


# --- placed: closed forms --------------------------------------------------------------------


def fork_join(k: int) -> tuple[Graph, dict[str, int]]:
    """src (1 ms, gpu0) sends 1 MB to b1..bk (gpu1..gpuk, 5, 4, 3 ... ms), each returns 1 MB
    to sink (1 ms, gpu0)."""
    ops = [Op(name="src", compute_s=1e-3), Op(name="sink", compute_s=1e-3)]
    ops += [Op(name=f"b{j}", compute_s=(6 - j) * 1e-3) for j in range(1, k + 1)]
    edges = [Edge(src="src", dst=f"b{j}", size_bytes=MB) for j in range(1, k + 1)]
    edges += [Edge(src=f"b{j}", dst="sink", size_bytes=MB) for j in range(1, k + 1)]
    placement = {"src": 0, "sink": 0} | {f"b{j}": j for j in range(1, k + 1)}
    return Graph(ops, edges), placement


def test_fork_join_with_parallel_channels():
    cluster = make_cluster(4, "parallel")
    g, placement = fork_join(3)
    x = p2p_s(MB, cluster.link(0, 1))
    expected = 1e-3 + max(x + (6 - j) * 1e-3 + x for j in (1, 2, 3)) + 1e-3
    result = simulate_placed(g, cluster, placement, **FORWARD)
    assert close(result.step_time_s, expected)
    assert len(comm_records(result)) == 6
    assert close(result.busy_s["gpu0->gpu1"], x) and close(result.busy_s["gpu1->gpu0"], x)


def test_fork_join_sends_serialise_on_a_sequential_channel():
    cluster = make_cluster(4, "sequential")
    g, placement = fork_join(3)
    x = p2p_s(MB, cluster.link(0, 1))  # 1.01 ms
    # Sends leave gpu0's channel one after another, longest branch first (priority order).
    branch_end = [1e-3 + j * x + (6 - j) * 1e-3 for j in (1, 2, 3)]
    # Returns share gpu0's channel too: each starts when its branch ends and the channel frees.
    channel_free = 0.0
    for end in branch_end:
        channel_free = max(channel_free, end) + x
    expected = channel_free + 1e-3
    result = simulate_placed(g, cluster, placement, **FORWARD)
    assert close(result.step_time_s, expected)
    sends = sorted((t.start_s, t.name) for t in comm_records(result) if t.args["src"] == "gpu0")
    assert [name for _, name in sends] == ["src->gpu1", "src->gpu2", "src->gpu3"]
    assert all(close(s, 1e-3 + k * x) for k, (s, _) in enumerate(sends))
    assert close(result.busy_s["gpu0/channel"], 6 * x)
    assert record(result, "src->gpu2").resources == ("gpu0/channel", "gpu2/channel")


def test_one_transfer_per_tensor_and_device():
    cluster = make_cluster(3)
    ops = [Op(name=n, compute_s=1e-3) for n in ("a", "b", "c", "d")]
    edges = [Edge(src="a", dst=n, size_bytes=MB) for n in ("b", "c", "d")]
    result = simulate_placed(Graph(ops, edges), cluster, {"a": 0, "b": 1, "c": 1, "d": 2},
                             **FORWARD)
    transfers = comm_records(result)
    assert sorted(t.name for t in transfers) == ["a->gpu1", "a->gpu2"]
    x = p2p_s(MB, cluster.link(0, 1))
    assert close(record(result, "b").start_s, 1e-3 + x)
    assert close(record(result, "c").start_s, 1e-3 + x + 1e-3)  # after b on gpu1's stream
    # Two tensors of one producer to one device are two transfers.
    edges2 = [Edge(src="a", dst="b", size_bytes=MB, tensor="a.0"),
              Edge(src="a", dst="c", size_bytes=MB, tensor="a.1")]
    result2 = simulate_placed(Graph(ops[:3], edges2), cluster, {"a": 0, "b": 1, "c": 1}, **FORWARD)
    assert len(comm_records(result2)) == 2


def test_diamond_on_two_devices():
    # a (gpu0, 1 ms) feeds b (gpu0, 1 ms) and c (gpu1, 2 ms); b and c feed d (gpu1, 1 ms).
    # Both transfers go gpu0 -> gpu1 and share that link's channel (parallel) or both device
    # channels (sequential): a->gpu1 [1, 1+x], b->gpu1 [1+x, 1+2x] (ready at 2 < 1+x).
    g = Graph([Op(name="a", compute_s=1e-3), Op(name="b", compute_s=1e-3),
               Op(name="c", compute_s=2e-3), Op(name="d", compute_s=1e-3)],
              [Edge(src="a", dst="b", size_bytes=MB), Edge(src="a", dst="c", size_bytes=MB),
               Edge(src="b", dst="d", size_bytes=MB), Edge(src="c", dst="d", size_bytes=MB)])
    placement = {"a": 0, "b": 0, "c": 1, "d": 1}
    for comm in ("parallel", "sequential"):
        cluster = make_cluster(2, comm, latency="20us")
        x = p2p_s(MB, cluster.link(0, 1))  # 1.02 ms
        result = simulate_placed(g, cluster, placement, **FORWARD)
        assert close(record(result, "b->gpu1").start_s, 1e-3 + x)
        assert close(record(result, "c").end_s, 1e-3 + x + 2e-3)
        d_start = max(1e-3 + 2 * x, 1e-3 + x + 2e-3)
        assert close(result.step_time_s, d_start + 1e-3)
        assert close(result.dependency_bound_s, 1e-3 + x + 2e-3 + 1e-3)
        assert [p.name for p in result.critical_path] == ["a", "a->gpu1", "c", "d"]
        total = sum(p.end_s - p.start_s + p.wait_s for p in result.critical_path)
        assert close(total, result.step_time_s)
        # gpu1 computes nothing while a->gpu1 runs; b->gpu1 overlaps c entirely.
        assert close(result.exposed_comm_s, x)


def test_exposed_comm_counts_only_idle_destinations():
    # x = a->gpu1 runs [1, 1+x]; gpu1 runs e [0, 1.5] meanwhile: exposed = x - 0.5 ms.
    cluster = make_cluster(2, latency="0s")
    g = Graph([Op(name="a", compute_s=1e-3), Op(name="b", compute_s=1e-3),
               Op(name="e", compute_s=1.5e-3)], [Edge(src="a", dst="b", size_bytes=MB)])
    result = simulate_placed(g, cluster, {"a": 0, "b": 1, "e": 1}, order=["a", "e", "b"],
                             **FORWARD)
    assert close(result.exposed_comm_s, 1e-3 - 0.5e-3)
    assert result.step_time_s == pytest.approx(3e-3, rel=1e-9)


def test_placement_checks_and_protocol():
    cluster = make_cluster(2)
    g = Graph([Op(name="a", compute_s=1.0), Op(name="b", compute_s=1.0)],
              [Edge(src="a", dst="b", size_bytes=1)])
    with pytest.raises(TrainschedError, match="no device for 1 op"):
        simulate_placed(g, cluster, {"a": 0}, **FORWARD)
    with pytest.raises(TrainschedError, match="not in the graph: zz"):
        simulate_placed(g, cluster, {"a": 0, "b": 1, "zz": 0}, **FORWARD)
    with pytest.raises(TrainschedError, match="placement of op 'b': device 5"):
        simulate_placed(g, cluster, {"a": 0, "b": 5}, **FORWARD)

    @dataclass(frozen=True)
    class Placement:
        device_of: dict
        num_devices: int = 2

    via_object = simulate_placed(g, cluster, Placement({"a": 0, "b": 1}), **FORWARD)
    by_map = simulate_placed(g, cluster, {"a": 0, "b": 1}, **FORWARD)
    assert via_object.to_json() == by_map.to_json()


def test_priority_order_puts_critical_work_first_and_ignores_listing():
    fwd = Graph([Op(name=f"l{i}", compute_s=1e-3, param_bytes=8) for i in range(3)],
                [Edge(src=f"l{i}", dst=f"l{i + 1}", size_bytes=8) for i in range(2)])
    train = to_training(fwd)
    order = priority_order(train)
    assert order.index("l2:dX") < order.index("l2:dW")
    shuffled = Graph(reversed(train.ops), train.edges)
    assert priority_order(shuffled) == order


# --- memory ----------------------------------------------------------------------------------


def memory_chain() -> Graph:
    return Graph(
        [Op(name="w1", compute_s=1.0, param_bytes=1000, output_bytes=100, temp_bytes=50),
         Op(name="w2", compute_s=1.0, param_bytes=2000, output_bytes=200),
         Op(name="w3", compute_s=1.0, output_bytes=10)],
        [Edge(src="w1", dst="w2", size_bytes=100), Edge(src="w2", dst="w3", size_bytes=200)],
    )


def test_memory_of_a_chain_by_hand():
    result = simulate_single(memory_chain(), make_cluster(1, memory="4KiB"), **FORWARD)
    # resident 3000; w1 +100 +50 temp; at 1 w1's temp goes, w2 +200; at 2 w1's output goes
    # (its consumer w2 ended), w3 +10; at 3 w2's output goes (w3 ended); w3's output stays.
    assert result.memory_timeline["gpu0"] == ((0.0, 3150), (1.0, 3300), (2.0, 3210),
                                              (3.0, 3010))
    assert result.peak_memory_bytes == {"gpu0": 3300} and result.peak_op == {"gpu0": "w2"}
    assert result.oom == {"gpu0": False} and result.memory_capacity_bytes == 4096
    small = simulate_single(memory_chain(), make_cluster(1, memory="3200B"), **FORWARD)
    assert small.oom == {"gpu0": True}
    assert simulate_single(memory_chain(), **FORWARD).oom == {"device0": False}


def test_memory_with_gradients_and_optimizer_state():
    fwd = Graph([Op(name="fc", compute_s=1.0, param_bytes=400, output_bytes=40,
                    saved_bytes=40)], [])
    train = to_training(fwd, optimizer="adam")
    result = simulate_single(train)
    # params 400, Adam state 800, gradient 400 resident; fc's output lives until fc:dW ends.
    assert result.memory_timeline["device0"][0] == (0.0, 1600 + 40)
    assert result.peak_memory_bytes["device0"] == 1640 and result.peak_op["device0"] == "fc"
    assert result.memory_timeline["device0"][-1] == (2.0, 1600)


def test_memory_of_received_copies_and_sent_tensors():
    cluster = make_cluster(2, latency="0s")
    g = Graph([Op(name="a", compute_s=1e-3, output_bytes=MB),
               Op(name="b", compute_s=1e-3, output_bytes=5)],
              [Edge(src="a", dst="b", size_bytes=MB)])
    result = simulate_placed(g, cluster, {"a": 0, "b": 1}, **FORWARD)
    # a's output is freed on gpu0 when its transfer ends (2 ms); gpu1 holds the copy from the
    # transfer's start (1 ms) to b's end (3 ms); b's output has no consumer and stays.
    assert result.memory_timeline["gpu0"] == ((0.0, MB), (2e-3, 0))
    assert result.memory_timeline["gpu1"] == ((0.0, 0), (1e-3, MB), (2e-3, MB + 5), (3e-3, 5))
    assert result.peak_op == {"gpu0": "a", "gpu1": "b"}
    assert result.peak_memory_bytes == {"gpu0": MB, "gpu1": MB + 5}


# --- results and traces ----------------------------------------------------------------------


def small_placed():
    fwd = Graph([Op(name=f"l{i}", compute_s=1e-3 * (i + 1), param_bytes=1000, saved_bytes=500,
                    output_bytes=300, temp_bytes=10) for i in range(4)],
                [Edge(src=f"l{i}", dst=f"l{i + 1}", size_bytes=300) for i in range(3)])
    train = to_training(fwd, optimizer="momentum")
    placement = {op.name: int(op.forward_op[1] if op.forward_op else op.name[1]) // 2
                 for op in train.ops}
    return simulate_placed(train, make_cluster(2, "sequential"), placement)


def test_result_json_is_stable_and_leaves_out_wall_time():
    a, b = small_placed(), small_placed()
    assert a.to_json() == b.to_json() and a == b
    doc = json.loads(a.to_json())
    assert "wall_s" not in doc and a.wall_s > 0
    assert doc["step_time_s"] == a.step_time_s
    assert list(doc) == sorted(doc)
    assert doc["tasks"][0]["resources"] == ["gpu0/compute"]


def test_trace_layout():
    result = small_placed()
    trace = chrome_trace(result, title="t", meta={"plan": "abc"})
    assert trace["displayTimeUnit"] == "ms"
    assert trace["otherData"]["plan"] == "abc" and trace["otherData"]["title"] == "t"
    events = trace["traceEvents"]
    names = {(e["pid"], e["args"]["name"]) for e in events if e["name"] == "process_name"}
    assert names == {(1, "gpu0"), (2, "gpu1")}
    threads = {(e["pid"], e["args"]["name"]) for e in events if e["name"] == "thread_name"}
    assert threads == {(1, "gpu0/compute"), (1, "gpu0/channel"), (2, "gpu1/compute"),
                       (2, "gpu1/channel")}
    tids = [e["tid"] for e in events if e["name"] == "thread_name"]
    assert len(set(tids)) == 4 and min(tids) > 2  # unique in the trace, above every pid
    slices = [e for e in events if e["ph"] == "X"]
    transfers = len(comm_records(result))
    assert len(slices) == len(result.tasks) + transfers  # a transfer shows on both channels
    assert {e["cat"] for e in slices} >= {"forward", "backward_input", "comm"}
    flows = [e for e in events if e["ph"] in "sf"]
    comm = {k for k, t in enumerate(result.tasks) if t.category == "comm"}
    # producer->transfer->consumer (a channel's transfers, chained in order, share a thread)
    crossing = [d for d in result.dependencies if len(set(d) & comm) == 1]
    assert len(flows) == 2 * len(crossing) > 2 * transfers
    assert sorted(e["id"] for e in flows) == sorted(2 * list(range(1, len(crossing) + 1)))
    counters = [e for e in events if e["ph"] == "C"]
    assert {(e["pid"], e["tid"]) for e in counters} == {(1, 1), (2, 2)}
    # Each flow point lies inside a slice of its thread.
    spans = {}
    for e in slices:
        spans.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    for e in flows:
        assert any(a <= e["ts"] <= b for a, b in spans[e["pid"], e["tid"]])
    keys = [(e["pid"], e["tid"], e.get("ts", -1)) for e in events]
    assert keys == sorted(keys)


def test_trace_lanes_for_overlapping_tasks():
    g = TaskGraph()
    pair = g.add_resource("pool", device=0, capacity=2)
    for k, d in enumerate((2.0, 1.0, 1.0)):
        g.add_task(f"t{k}", d, (pair,), device=0)
    free = g.add_task("latency", 0.5, device=0)
    g.add_dependency(free, 2)
    result = build_result(g, run_tasks(g), devices=("gpu0",))
    events = chrome_trace(result)["traceEvents"]
    tid = {e["name"]: e["tid"] for e in events if e["ph"] == "X"}
    thread = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
    # t0 [0,2] lane 1; t1 [0,1] lane 2; latency [0,0.5] on gpu0/tasks; t2 [1,2] reuses lane 2.
    assert thread[tid["t0"]] == "pool" and thread[tid["t1"]] == "pool (lane 2)"
    assert tid["t2"] == tid["t1"] and thread[tid["latency"]] == "gpu0/tasks"


def test_write_trace_plain_and_gzip(tmp_path):
    result = small_placed()
    text = trace_json(result)
    write_trace(tmp_path / "t.json", result)
    write_trace(tmp_path / "t.json.gz", result)
    write_trace(tmp_path / "u.json.gz", result)
    assert (tmp_path / "t.json").read_text() == text
    assert gzip.decompress((tmp_path / "t.json.gz").read_bytes()).decode() == text
    assert (tmp_path / "t.json.gz").read_bytes() == (tmp_path / "u.json.gz").read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json", "t.json.gz", "u.json.gz"]
    with pytest.raises(TrainschedError, match="cannot write"):
        write_trace(tmp_path / "missing" / "t.json", result)
    with pytest.raises(TrainschedError, match="not JSON-serialisable"):
        write_trace(tmp_path / "bad.json", result, meta={"x": object()})
    assert not (tmp_path / "bad.json").exists()


# --- what the executors refuse ------------------------------------------------------------------
def test_a_forward_only_graph_is_refused_unless_its_forward_pass_is_asked_for():
    from trainsched.comm import FifoPolicy
    from trainsched.sim import crossing_bound_s, simulate_data_parallel

    g = Graph([Op(name="a", compute_s=1.0, param_bytes=1000), Op(name="b", compute_s=2.0)],
              [Edge(src="a", dst="b", size_bytes=10)], {"model": "fwd"})
    cluster = make_cluster(2)
    calls = {
        "simulate_single": lambda: simulate_single(g, cluster),
        "simulate_placed": lambda: simulate_placed(g, cluster, {"a": 0, "b": 1}),
        "simulate_data_parallel": lambda: simulate_data_parallel(g, cluster, ranks=2,
                                                                 policy=FifoPolicy()),
        "crossing_bound_s": lambda: crossing_bound_s(g, cluster, ranks=2),
    }
    for name, call in calls.items():
        with pytest.raises(TrainschedError, match=f"{name} simulates a training step, but graph "
                                                  "'fwd' has forward ops only: call "
                                                  r"trainsched.graph.to_training\(graph\)"):
            call()
    assert simulate_single(g, cluster, allow_forward_only=True).step_time_s == 3.0
    train = to_training(g)
    assert simulate_single(train, cluster).step_time_s == train.totals().compute_s


@pytest.mark.parametrize(("call", "message"), [
    (lambda g: simulate_single(g, "p3.16xlarge"),
     "simulate_single takes a trainsched.cluster.Cluster \\(trainsched.cluster.resolve_cluster "
     "makes one from a preset name\\), got str 'p3.16xlarge'"),
    (lambda g: simulate_single("g.json"), "simulate_single takes a trainsched.graph.Graph, got "
                                          "str"),
    (lambda g: simulate_placed(g, None, {"a": 0}), "needs the cluster"),
    (lambda g: simulate_single(g, allow_forward_only="yes"), "allow_forward_only must be True "
                                                             "or False"),
])
def test_wrong_types_are_errors_worded_for_the_caller(call, message):
    g = to_training(Graph([Op(name="a", compute_s=1.0, param_bytes=1000)], []))
    with pytest.raises(TrainschedError, match=message):
        call(g)
