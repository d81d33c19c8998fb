"""Out-of-order backprop in the simulator: reverse-first-k orders, the k sweep (hand-worked
steps), memory held by deferred dW, two compute streams, dW slots, the plan fields and the
command line's errors."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import tomllib

from trainsched.backprop.reorder import (
    Slot,
    format_slot,
    layers,
    parse_slot,
    reverse_first_k,
)
from trainsched.cli import main
from trainsched.cluster import Cluster, DeviceSpec, Link, device_kind
from trainsched.comm import PriorityPolicy, comm_policy
from trainsched.errors import TrainschedError
from trainsched.graph import Edge, Graph, Op, to_training
from trainsched.plan import DataParallelPlan, ModelRef, SinglePlan, plan_from_json, plan_to_json
from trainsched.sim import (
    TaskGraph,
    choose_slots,
    run_tasks,
    simulate,
    simulate_single,
    simulate_slots,
    sweep_k,
)

MS = 1e-3
MB = 1_000_000  # 1 ms on the 1 GB/s link below: a 2-rank ring costs S/B without latency
B = 4096  # every activation and activation gradient of the hand graphs
# TicTac: priority queue, one collective per gradient, one in flight, lazy updates; the wire's
# rules alone (no pass of the scheduled runtime over a collective's bytes)
TICTAC = dataclasses.replace(comm_policy("tictac"), runtime_passes=False)


def hand_graph(*sizes: int, dw: tuple[float, ...] | None = None) -> Graph:
    """L0 -> L1 -> L2..., 1 ms per forward, dX and dW (dW times ``dw``); SGD steps of about
    a nanosecond (memory bandwidth 1e15 B/s). L0 has no dX."""
    dw = dw or (1.0,) * len(sizes)
    ops = [Op(name=f"L{i}", compute_s=MS, backward_input_s=MS, backward_weight_s=dw[i] * MS,
              param_bytes=size, output_bytes=B, saved_bytes=B, layer_index=i)
           for i, size in enumerate(sizes)]  # fmt: skip
    edges = [Edge(src=f"L{i}", dst=f"L{i + 1}", size_bytes=B) for i in range(len(sizes) - 1)]
    return to_training(Graph(ops, edges, {"model": "hand"}), memory_bandwidth_bytes_per_s=1e15)


def two_ranks(bandwidth: float = 1e9) -> Cluster:
    plain = dataclasses.replace(device_kind("V100"), compute_rate_with_comm=1.0,
                                device_cv=0.0)  # FIFO wire, no spread
    return Cluster(name="t", device=plain, devices_per_node=2, num_nodes=1,
                   intra_node=Link(bandwidth_bytes_per_s=bandwidth, latency_s=0.0))


# --- orders ----------------------------------------------------------------------------------


def test_layers_are_the_forward_ops_with_a_weight_gradient_in_forward_order():
    g = to_training(Graph([Op(name="a", compute_s=MS, param_bytes=8),
                           Op(name="relu", compute_s=MS),
                           Op(name="b", compute_s=MS, param_bytes=8)],
                          [Edge(src="a", dst="relu", size_bytes=4),
                           Edge(src="relu", dst="b", size_bytes=4)]))
    assert layers(g) == ("a", "b")


def test_k0_is_program_order():
    g = hand_graph(MB, MB, MB)
    assert reverse_first_k(g, 0) == g.topological_order()


def test_k2_moves_the_first_two_weight_gradients_after_the_chain_in_forward_order():
    g = hand_graph(MB, MB, MB)
    assert reverse_first_k(g, 2) == ("L0", "L1", "L2", "L2:dX", "L2:dW", "L1:dX", "L0:dW",
                                     "L1:dW", "L0:opt", "L1:opt", "L2:opt")


def test_k_equal_to_the_layer_count_runs_every_weight_gradient_after_the_last_dx():
    g = hand_graph(MB, MB, MB)
    assert reverse_first_k(g, 3) == ("L0", "L1", "L2", "L2:dX", "L1:dX", "L0:dW", "L1:dW",
                                     "L2:dW", "L0:opt", "L1:opt", "L2:opt")


def test_k1_equals_k0_when_the_first_layer_has_no_input_gradient():
    g = hand_graph(MB, MB, MB)  # L0:dW ends the chain already
    assert reverse_first_k(g, 1) == reverse_first_k(g, 0)


def test_k_above_the_layer_count_is_refused():
    with pytest.raises(TrainschedError, match=r"it has 3 layers .* 0\.\.3"):
        reverse_first_k(hand_graph(MB, MB, MB), 4)


# --- the simulator ---------------------------------------------------------------------------


def test_k0_plan_simulates_exactly_as_the_in_order_plan():
    g = hand_graph(2 * MB, MB, 3 * MB)
    model = ModelRef.of(g)
    policy = comm_policy("bytescheduler")
    inorder = DataParallelPlan(model=model, ranks=2, comm="bytescheduler", policy=policy,
                               steps=3)
    ooo = DataParallelPlan(model=model, ranks=2, comm="bytescheduler", policy=policy, steps=3,
                           backprop="ooo", k=0)
    cluster = two_ranks()
    assert simulate(ooo, g, cluster).to_json() == simulate(inorder, g, cluster).to_json()


def test_heavy_comm_sweep_matches_the_hand_worked_periods():
    # 2 ms per all-reduce, one at a time. k=0: gradients ready at 5, 7, 8 ms of a step, the
    # wire runs g2 5-7, g1 7-9, g0 9-11, so layer 0's next forward waits until 11: period 11.
    # k=2 (L0:dW before L1:dW): g0 is ready at 7 and reduced 7-9, g1 9-11; the next forward
    # of L0 starts at 9 and L1's at 11 -> period 10; k=3 also 10; k=1 is k=0's order.
    sweep = sweep_k(hand_graph(2 * MB, 2 * MB, 2 * MB), two_ranks(), ranks=2, policy=TICTAC)
    assert sweep.step_time_s == pytest.approx([11 * MS, 11 * MS, 10 * MS, 10 * MS], abs=1e-7)
    assert sweep.k == 2  # ties to the smaller k
    assert sweep.speedup == pytest.approx(1.1, rel=1e-5)


def test_free_comm_chooses_k0_and_gains_nothing():
    sweep = sweep_k(hand_graph(2 * MB, 2 * MB, 2 * MB), two_ranks(bandwidth=1e18), ranks=2,
                    policy=TICTAC)
    # every step is the 8 ms of compute (plus three ~1 ns SGD steps)
    assert sweep.step_time_s == pytest.approx([8 * MS] * 4, abs=1e-7)
    assert sweep.k == 0 and sweep.speedup == 1.0


def test_deferred_weight_gradients_keep_their_inputs_alive():
    # k=0: at most 4 buffers of B live (e.g. L0, L1, L2 outputs and L2:dX's in [3, 5) ms);
    # k=3: L2's output waits for L2:dW at 8 ms, L1:dX's for L0:dW, so in [4, 5) ms the
    # outputs of L0, L1, L2, L2:dX and L1:dX are all alive: 5 buffers.
    g = hand_graph(MB, 2 * MB, 3 * MB)
    resident = 2 * 6 * MB  # parameters and gradients
    peaks = [simulate_single(g, order=reverse_first_k(g, k)).peak_memory_bytes["device0"]
             for k in (0, 2, 3)]
    assert peaks == [resident + 4 * B, resident + 4 * B, resident + 5 * B]


def test_a_memory_cap_limits_k():
    # by hand as above: k=0, 1 -> 10 ms, k=2 -> 9 ms, k=3 -> 8 ms; only k=3 holds a fifth B
    g = hand_graph(MB, 2 * MB, MB)
    free = sweep_k(g, two_ranks(), ranks=2, policy=TICTAC)
    assert free.step_time_s == pytest.approx([10 * MS, 10 * MS, 9 * MS, 8 * MS], abs=1e-7)
    assert free.k == 3
    capped = sweep_k(g, two_ranks(), ranks=2, policy=TICTAC,
                     memory_cap_bytes=2 * 4 * MB + 4 * B)
    assert capped.k == 2


def test_sweeping_k_needs_a_policy_that_crosses_the_barrier():
    with pytest.raises(TrainschedError, match="cross the step barrier"):
        sweep_k(hand_graph(MB, MB), two_ranks(), ranks=2, policy=PriorityPolicy())


# --- two streams -----------------------------------------------------------------------------


def two_streams(fit_s: float) -> tuple[TaskGraph, int, int]:
    g = TaskGraph()
    main_stream, side = g.add_resource("main"), g.add_resource("side")
    g.add_stream_pair(main_stream, side, slowdown=0.25, fit_s=fit_s)
    return g, main_stream, side


def test_two_kernels_that_fit_cost_the_longer_times_one_plus_epsilon():
    g, a, b = two_streams(fit_s=1.0)
    g.add_task("x", 1.0, (a,))
    g.add_task("y", 1.0, (b,))
    assert run_tasks(g).end_s == (1.25, 1.25)  # max(1, 1) * (1 + 0.25)


def test_two_kernels_that_do_not_fit_cost_their_sum():
    g, a, b = two_streams(fit_s=0.5)
    g.add_task("x", 1.0, (a,))
    g.add_task("y", 0.5, (b,))
    end = run_tasks(g).end_s
    assert end == (1.5, 1.0)  # y at half speed until 1.0; x's last 0.5 alone: 1 + 0.5


def test_a_kernel_alone_on_a_paired_stream_runs_at_full_speed_after_its_partner_ends():
    g, a, b = two_streams(fit_s=1.0)
    g.add_task("x", 0.5, (a,))
    g.add_task("y", 1.0, (b,))
    replay = run_tasks(g)
    # both at 1/1.25 until x ends at 0.625 (y has done 0.5), then y's 0.5 alone
    assert replay.end_s == (0.625, 1.125)
    assert replay.busy_s == (0.625, 1.125)


def test_all_inline_slots_simulate_as_one_stream():
    g = hand_graph(MB, 2 * MB, 3 * MB)
    cluster = two_ranks()
    inline = simulate_slots(g, cluster, ["inline"] * 3)
    single = simulate_single(g, cluster)
    assert inline.step_time_s == single.step_time_s
    assert inline.peak_memory_bytes == single.peak_memory_bytes
    assert [(t.name, t.start_s, t.end_s) for t in inline.tasks] == \
        [(t.name, t.start_s, t.end_s) for t in single.tasks]


def fitting(cluster: Cluster, fit_s: float, slowdown: float = 0.25) -> Cluster:
    device = DeviceSpec(kind="V100-16GB", memory_bytes=16 * 2**30,
                        peak_flops_per_s={"fp32": 15.7e12}, memory_bandwidth_bytes_per_s=9e11,
                        stream_slowdown=slowdown, stream_fit_s=fit_s)
    return Cluster(name=cluster.name, device=device, devices_per_node=2, num_nodes=1,
                   intra_node=cluster.intra_node)


def test_overlap_backward_hides_a_weight_gradient_under_the_next_input_gradient():
    # L2:dW (ready at 4 ms) on the side stream beside L1:dX, both 1 ms and fitting: both end
    # at 4 + 1.25; L1:dW then L0:dW inline: step 5.25 + 2 ms (+ ~3 ns of SGD).
    g = hand_graph(MB, MB, MB)
    cluster = fitting(two_ranks(), fit_s=1.0)
    result = simulate_slots(g, cluster, ["inline", "inline", "overlap_backward"])
    assert result.step_time_s == pytest.approx(7.25 * MS, abs=1e-7)
    side = [t.name for t in result.tasks if t.resources[0].endswith("/side")]
    assert side == ["L2:dW"]


def test_overlap_forward_defers_a_weight_gradient_into_the_next_step():
    # L2:dW of step s runs beside L1's forward of step s+1 (launched after L0's forward).
    # Each step: F0 1, then F1 beside L2:dW(s-1) 1.25, F2 1 (L2:opt ~0), L2:dX 1, L1:dX 1,
    # L1:dW 1, L0:dW 1: period 7.25 ms instead of 8.
    g = hand_graph(MB, MB, MB)
    cluster = fitting(two_ranks(), fit_s=1.0)
    result = simulate_slots(g, cluster, ["inline", "inline", "overlap_forward(0)"])
    assert result.step_time_s == pytest.approx(7.25 * MS, abs=1e-6)


def test_slots_are_checked_against_the_layers():
    g = hand_graph(MB, MB, MB)
    with pytest.raises(TrainschedError, match="its update must end before its own forward"):
        simulate_slots(g, None, ["inline", "overlap_forward(1)", "inline"])
    with pytest.raises(TrainschedError, match="2 dW slots for a model of 3 layers"):
        simulate_slots(g, None, ["inline", "inline"])


def test_slot_text_round_trips():
    for text in ("inline", "overlap_backward", "overlap_forward(12)"):
        assert format_slot(parse_slot(text)) == text
    with pytest.raises(TrainschedError, match="unknown dW slot"):
        parse_slot("overlap_forward(x)")


def test_slot_choice_never_loses_to_inline():
    g = hand_graph(MB, MB, MB, MB)
    choice = choose_slots(g, fitting(two_ranks(), fit_s=1.0))
    assert len(choice.slots) == 4
    assert choice.step_time_s < choice.inline_step_time_s


# --- plans -----------------------------------------------------------------------------------


def test_plan_json_round_trips_backprop_and_slots():
    g = hand_graph(MB, MB, MB)
    model = ModelRef.of(g)
    dp = DataParallelPlan(model=model, ranks=2, comm="bytescheduler",
                          policy=comm_policy("bytescheduler"), steps=3, backprop="ooo", k=2)
    single = SinglePlan(model=model, slots=("inline", "overlap_backward", "overlap_forward(0)"))
    for plan in (dp, single):
        text = plan_to_json(plan)
        assert plan_from_json(text) == plan and plan_to_json(plan_from_json(text)) == text
    doc = json.loads(plan_to_json(dp))["strategy"]
    assert (doc["backprop"], doc["k"]) == ("ooo", 2)
    assert single.slots[2] == Slot(kind="overlap_forward", after=0)


def test_an_old_plan_file_without_backprop_loads_in_order():
    g = hand_graph(MB, MB)
    plan = DataParallelPlan(model=ModelRef.of(g), ranks=2, comm="fifo",
                            policy=comm_policy("fifo"))
    doc = json.loads(plan_to_json(plan))
    del doc["strategy"]["backprop"], doc["strategy"]["k"]
    loaded = plan_from_json(json.dumps(doc))
    assert (loaded.backprop, loaded.k) == ("inorder", 0)


def test_plan_k_above_the_layer_count_fails_validation():
    g = hand_graph(MB, MB)
    plan = DataParallelPlan(model=ModelRef.of(g), ranks=2, comm="bytescheduler",
                            policy=comm_policy("bytescheduler"), backprop="ooo", k=3)
    with pytest.raises(TrainschedError, match=r"k 3 is not a layer count .* 2 layers"):
        plan.validate(g)


def test_plan_refuses_ooo_without_lazy_updates_and_k_with_in_order():
    model = ModelRef.of(hand_graph(MB, MB))
    with pytest.raises(TrainschedError, match="cross the step barrier; 'priority' does not"):
        DataParallelPlan(model=model, ranks=2, comm="priority", policy=PriorityPolicy(),
                         backprop="ooo", k=1)
    with pytest.raises(TrainschedError, match="k = 1 with in-order backprop"):
        DataParallelPlan(model=model, ranks=2, comm="fifo", policy=comm_policy("fifo"), k=1)


# --- the command line ------------------------------------------------------------------------


@pytest.fixture
def graph_file(tmp_path):
    path = tmp_path / "hand.json"
    hand_graph(2 * MB, 2 * MB, 2 * MB).save(path)
    return str(path)


def one_line_error(capsys, argv, *needles):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in err, err


def test_cli_refuses_k_above_the_layer_count(capsys, graph_file):
    one_line_error(capsys, ["simulate", graph_file, "--cluster", "p3.16xlarge", "--parallelism",
                            "data", "--ranks", "2", "--backprop", "ooo", "--k", "4"],
                   "--k 4 is not a layer count", "0..3")


def test_cli_refuses_k_with_in_order_backprop(capsys, graph_file):
    one_line_error(capsys, ["simulate", graph_file, "--cluster", "p3.16xlarge", "--parallelism",
                            "data", "--backprop", "inorder", "--k", "1"],
                   "--k", "with --backprop inorder", "--backprop ooo")


def test_cli_reports_the_chosen_k_and_the_sweep(capsys, graph_file):
    assert main(["simulate", graph_file, "--cluster", "p3.16xlarge", "--parallelism", "data",
                 "--ranks", "2", "--backprop", "ooo", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    backprop = doc["backprop"]
    assert backprop["name"] == "ooo" and backprop["layers"] == 3
    sweep = backprop["sweep"]
    assert len(sweep["step_time_s"]) == 4 and backprop["k"] == sweep["k"]
    assert doc["step_time_s"] == sweep["step_time_s"][sweep["k"]]
    assert math.isclose(sweep["speedup"], sweep["step_time_s"][0] / doc["step_time_s"])


def test_cluster_files_carry_the_two_stream_figures():
    text = ('format = "trainsched.cluster/1"\nname = "lab"\n[device]\nkind = "V100"\ncount = 2\n'
            'stream_slowdown = 0.3\nstream_fit = "40us"\n'
            '[intra_node]\nbandwidth = "100GB/s"\nlatency = "10us"\n')
    cluster = Cluster.from_dict(tomllib.loads(text), "lab.toml")
    assert cluster.device.stream_slowdown == 0.3
    assert cluster.device.stream_fit_s == pytest.approx(40e-6, rel=1e-12)
    assert Cluster.from_dict(json.loads(cluster.to_json())) == cluster
    assert device_kind("V100").stream_fit_s == 100e-6  # the catalogue's GPUs


def test_cli_chooses_single_device_slots_and_reports_them(capsys, tmp_path):
    graph = tmp_path / "hand.json"
    hand_graph(MB, MB, MB).save(graph)
    cluster = tmp_path / "lab.toml"
    cluster.write_text('format = "trainsched.cluster/1"\nname = "lab"\n[device]\nkind = "V100"\n'
                       'count = 1\nstream_slowdown = 0.25\nstream_fit = "2ms"\n'
                       '[intra_node]\nbandwidth = "100GB/s"\nlatency = "10us"\n')
    assert main(["simulate", str(graph), "--cluster", str(cluster), "--backprop", "ooo",
                 "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    # every dW on the side stream: L2:dW (needing only L2's output) beside L2:dX, L1:dW beside
    # L1:dX, 1.25 ms each pair, then L0:dW alone: 3 + 1.25 + 1.25 + 1 = 6.5 ms, against 8 ms
    # inline; L0:dW, the one dW after the last dX, has no earlier forward to defer behind.
    assert doc["slots"]["inline_step_time_s"] == pytest.approx(8 * MS, abs=1e-7)
    assert doc["step_time_s"] == pytest.approx(6.5 * MS, abs=1e-7)
    assert doc["slots"]["slots"] == ["overlap_backward"] * 3
