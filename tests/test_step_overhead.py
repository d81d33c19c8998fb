"""The per-op framework overhead charged to a measured graph (graph.overhead): the spreading rule
worked out by hand, its application to a forward graph, what show prints, and files written
before it existed. Torch-free; the capture side is in test_capture_overhead.py."""

from __future__ import annotations

import pytest

from trainsched.errors import TrainschedError
from trainsched.graph import Edge, Graph, Op, graph_to_json, to_training
from trainsched.graph.overhead import Spread, charge_step_overhead, spread_gap
from trainsched.report.graph_summary import describe_graph, graph_summary

# -- the rule --------------------------------------------------------------------------------


def test_a_positive_gap_without_a_forward_time_is_shared_evenly():
    # step 10 s, ops 3 + 4 = 7 s: gap 3 s over 2 + 4 = 6 ops -> 0.5 s each.
    spread = spread_gap(step_s=10.0, forward_ops_s=3.0, forward_ops=2, backward_ops_s=4.0,
                        backward_ops=4)
    assert spread == Spread(0.5, 0.5, "even")


def test_a_negative_gap_charges_nothing():
    # step 5 s, ops 7 s: the ops already cover the step; nothing is taken away either.
    spread = spread_gap(step_s=5.0, forward_s=2.0, forward_ops_s=3.0, forward_ops=2,
                        backward_ops_s=4.0, backward_ops=4)
    assert spread == Spread(0.0, 0.0, "none")


def test_forward_and_backward_ops_share_their_own_gaps():
    # forward 5 s against 3 s of forward ops: 2 s over 2 ops = 1 s each;
    # backward 10 - 5 = 5 s against 4 s of backward ops: 1 s over 4 ops = 0.25 s each.
    spread = spread_gap(step_s=10.0, forward_s=5.0, forward_ops_s=3.0, forward_ops=2,
                        backward_ops_s=4.0, backward_ops=4)
    assert spread == Spread(1.0, 0.25, "split")


def test_a_negative_forward_gap_puts_the_whole_gap_on_the_backward_ops():
    # forward 2.5 s against 3 s of forward ops (-0.5 s); the step's gap is 10 - 7 = 3 s,
    # all of it on the 4 backward ops: 0.75 s each (their own gap, 3.5 s, would overshoot).
    spread = spread_gap(step_s=10.0, forward_s=2.5, forward_ops_s=3.0, forward_ops=2,
                        backward_ops_s=4.0, backward_ops=4)
    assert spread == Spread(0.0, 0.75, "backward")


def test_a_negative_backward_gap_puts_the_whole_gap_on_the_forward_ops():
    # forward 8 s against 3 s: +5 s; backward 2 s against 4 s: -2 s; the gap, 3 s, on the
    # 2 forward ops: 1.5 s each.
    spread = spread_gap(step_s=10.0, forward_s=8.0, forward_ops_s=3.0, forward_ops=2,
                        backward_ops_s=4.0, backward_ops=4)
    assert spread == Spread(1.5, 0.0, "forward")


def test_a_forward_longer_than_the_step_is_refused():
    with pytest.raises(TrainschedError, match="cannot take longer than the whole step"):
        spread_gap(step_s=1.0, forward_s=2.0, forward_ops_s=0.1, forward_ops=1,
                   backward_ops_s=0.1, backward_ops=1)


# -- applied to a forward graph ---------------------------------------------------------------


def _forward_graph(meta=None):
    """x (input) -> a (parameters: dW only, as a first layer) -> b (no parameters: dX)
    -> c (parameters: dX derived from FLOPs, 1.0 s x 8 / 4 = 2.0 s, and dW).
    Forward ops a, b, c: 1.0 + 0.5 + 1.0 = 2.5 s; backward a:dW 2.0, b:dX 0.5, c:dX 2.0,
    c:dW 1.0 = 5.5 s."""
    ops = [Op(name="x", target="input", output_bytes=8),
           Op(name="a", compute_s=1.0, param_bytes=4, backward_weight_s=2.0,
              backward_input_s=9.0),   # a dX time the training graph does not use
           Op(name="b", compute_s=0.5, backward_input_s=0.5),
           Op(name="c", compute_s=1.0, flops=4.0, backward_input_flops=8.0, param_bytes=4,
              backward_weight_s=1.0)]
    edges = [Edge(src="x", dst="a", size_bytes=8), Edge(src="a", dst="b", size_bytes=8),
             Edge(src="b", dst="c", size_bytes=8)]
    return Graph(ops, edges, meta or {"tier": "measured"})


def _step_sum(graph):
    return sum(op.compute_s for op in to_training(graph).ops if op.kind != "optimizer")


def test_the_charged_phases_are_the_ones_the_training_graph_runs():
    # step 11 s, forward 4 s: forward gap 4 - 2.5 = 1.5 s over 3 ops = 0.5 s; backward gap
    # 7 - 5.5 = 1.5 s over 4 ops = 0.375 s.
    charged = charge_step_overhead(_forward_graph(), step_s=11.0, forward_s=4.0, steps=5)
    got = {op.name: (op.compute_s, op.backward_input_s, op.backward_weight_s)
           for op in charged.ops}
    assert got == {"x": (0.0, None, None),
                   "a": (1.5, 9.0, 2.375),
                   "b": (1.0, 0.875, None),
                   "c": (1.5, 2.375, 1.375)}


def test_the_charged_training_graph_adds_up_to_the_eager_step():
    charged = charge_step_overhead(_forward_graph(), step_s=11.0, forward_s=4.0)
    assert _step_sum(_forward_graph()) == 8.0
    assert _step_sum(charged) == pytest.approx(11.0, rel=1e-12)


def test_what_was_charged_is_recorded_in_meta():
    charged = charge_step_overhead(_forward_graph(), step_s=11.0, forward_s=4.0, steps=5)
    assert charged.meta["step_overhead"] == {
        "eager_step_s": 11.0, "eager_forward_s": 4.0, "eager_steps": 5, "ops_s": 8.0,
        "forward_ops_s": 2.5, "backward_ops_s": 5.5, "forward_ops": 3, "backward_ops": 4,
        "forward_per_op_s": 0.5, "backward_per_op_s": 0.375, "rule": "split"}
    assert charged.meta["tier"] == "measured"


def test_a_step_shorter_than_the_ops_leaves_them_as_they_were():
    before = _forward_graph()
    charged = charge_step_overhead(before, step_s=6.0, forward_s=2.0)
    assert charged.ops == before.ops
    assert charged.meta["step_overhead"]["rule"] == "none"


def test_a_graph_is_charged_once():
    charged = charge_step_overhead(_forward_graph(), step_s=11.0)
    with pytest.raises(TrainschedError, match="charged already"):
        charge_step_overhead(charged, step_s=11.0)


def test_a_coarsened_graph_is_refused():
    grouped = Graph([Op(name="m", compute_s=1.0, members=("a", "b"))], [])
    with pytest.raises(TrainschedError, match="at op granularity"):
        charge_step_overhead(grouped, step_s=2.0)


def test_the_same_numbers_give_the_same_file():
    one = charge_step_overhead(_forward_graph(), step_s=11.0, forward_s=4.0, steps=5)
    two = charge_step_overhead(_forward_graph(), step_s=11.0, forward_s=4.0, steps=5)
    assert graph_to_json(one) == graph_to_json(two)


# -- show, and files from before ----------------------------------------------------------------


def test_show_prints_what_was_charged():
    # The record of the graph above with times in ms: gap 3 ms; 0.5 ms to each forward op,
    # 0.375 ms to each backward op.
    record = {"eager_step_s": 0.011, "eager_forward_s": 0.004, "ops_s": 0.008,
              "forward_ops": 3, "backward_ops": 4, "forward_per_op_s": 0.0005,
              "backward_per_op_s": 0.000375, "rule": "split"}
    graph = Graph([Op(name="a", compute_s=0.001)], [], {"step_overhead": record})
    lines = describe_graph(graph_summary(graph), top=1).splitlines()
    assert ("  step overhead    eager step 11.0 ms, ops 8.00 ms before: +3.00 ms charged, "
            "500 µs to each of 3 forward ops and 375 µs to each of 4 backward ops") in lines


def test_show_says_when_nothing_was_charged():
    charged = charge_step_overhead(_forward_graph(), step_s=6.0)
    lines = describe_graph(graph_summary(charged), top=1).splitlines()
    assert ("  step overhead    eager step 6.00 s, ops 8.00 s before: nothing charged (the ops "
            "already add up to the step)") in lines


OLD_FILE = """{"format": "trainsched.graph/1",
"meta": {"model": "old", "tier": "measured", "granularity": "op"},
"ops": [
{"name": "x", "target": "input", "output_bytes": 8},
{"name": "a", "compute_s": 1.0, "param_bytes": 4, "backward_weight_s": 2.0}
],
"edges": [
{"src": "x", "dst": "a", "size_bytes": 8}
]}
"""


def test_a_file_written_before_the_charge_loads_with_nothing_charged(tmp_path):
    path = tmp_path / "old.json"
    path.write_text(OLD_FILE)
    graph = Graph.load(str(path))
    assert "step_overhead" not in graph.meta
    assert _step_sum(graph) == 3.0
    assert "step overhead" not in describe_graph(graph_summary(graph), top=1)
