"""The training transform charges a measured optimizer step to the optimizer ops (torch-free),
worked by hand: two layers whose SGD ops cost their bytes over the memory bandwidth."""

from __future__ import annotations

import pytest

from trainsched.errors import TrainschedError
from trainsched.graph import Edge, Graph, Op, to_training

MS = 1e-3


def two_layers(record=None) -> Graph:
    """A (3 MB of parameters) -> B (1 MB); SGD reads param and grad and writes param: 3 bytes
    per parameter byte, at 6 GB/s: A:opt 1.5 ms, B:opt 0.5 ms, 2 ms in all."""
    ops = [Op(name="A", compute_s=MS, param_bytes=3_000_000, output_bytes=8),
           Op(name="B", compute_s=MS, param_bytes=1_000_000, output_bytes=8)]
    meta = {} if record is None else {"optimizer_step": record}
    return Graph(ops, [Edge(src="A", dst="B", size_bytes=8)], meta)


def updates(graph: Graph, optimizer: str = "sgd") -> dict[str, float]:
    ops = to_training(graph, optimizer=optimizer, memory_bandwidth_bytes_per_s=6e9).ops
    return {op.name: op.compute_s / MS for op in ops if op.kind == "optimizer"}


def test_without_a_measured_step_the_ops_cost_their_bytes():
    assert updates(two_layers()) == pytest.approx({"A:opt": 1.5, "B:opt": 0.5})


def test_a_longer_measured_step_is_shared_evenly():
    """5 ms measured, 2 ms of bytes: each of the 2 ops gets 1.5 ms more."""
    graph = two_layers({"optimizer": "sgd", "step_s": 5 * MS, "steps": 5, "params": 4})
    assert updates(graph) == pytest.approx({"A:opt": 3.0, "B:opt": 2.0})
    assert to_training(graph, memory_bandwidth_bytes_per_s=6e9).meta["training"][
        "optimizer_step_per_op_s"] == pytest.approx(1.5 * MS)


def test_a_shorter_measured_step_takes_nothing_away():
    graph = two_layers({"optimizer": "sgd", "step_s": 1 * MS, "steps": 5, "params": 4})
    assert updates(graph) == pytest.approx({"A:opt": 1.5, "B:opt": 0.5})


def test_another_optimizer_is_not_charged_with_sgd_timing():
    """Momentum reads and writes one state tensor more: 5 bytes per parameter byte."""
    graph = two_layers({"optimizer": "sgd", "step_s": 5 * MS, "steps": 5, "params": 4})
    assert updates(graph, "momentum") == pytest.approx({"A:opt": 2.5, "B:opt": 5 / 6})


def test_a_broken_record_is_refused():
    graph = two_layers({"optimizer": "sgd", "step_s": -1.0})
    with pytest.raises(TrainschedError, match="step_s must be a finite number of seconds"):
        to_training(graph)
