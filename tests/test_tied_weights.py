"""Tied weights: every reader of a shared parameter contributes its weight gradient, the sum is
costed, and the shared gradient is reduced once, after its last contribution."""

from __future__ import annotations

import json

import pytest

from trainsched.comm.policy import graph_gradients
from trainsched.errors import TrainschedError
from trainsched.graph import Edge, Graph, Op, to_training

BANDWIDTH = 1e9


def _tied_graph() -> Graph:
    # emb owns a 4,000-byte table; head reads it again (an output layer tied to the input).
    ops = [Op(name="emb", compute_s=1e-3, param_bytes=4000, backward_weight_s=2e-3),
           Op(name="mid", compute_s=1e-3, param_bytes=800, backward_input_s=1e-3,
              backward_weight_s=1e-3),
           Op(name="head", compute_s=5e-3, backward_input_s=5e-3, backward_weight_s=5e-3,
              tied_to=("emb",))]
    edges = [Edge(src="emb", dst="mid", size_bytes=64), Edge(src="mid", dst="head",
                                                              size_bytes=64)]
    return Graph(ops, edges, {"memory_bandwidth_bytes_per_s": BANDWIDTH})


def test_a_reader_of_a_tied_weight_gets_a_weight_gradient_op_with_the_sum_costed():
    dw = to_training(_tied_graph()).op("head:dW")
    # its own 5 ms of dW work plus adding into emb's gradient: read 2 x 4,000 B, write 4,000 B
    assert dw.compute_s == pytest.approx(5e-3 + 3 * 4000 / BANDWIDTH)
    assert dw.output_bytes == 0


def test_the_owners_gradient_waits_for_every_contribution():
    train = to_training(_tied_graph())
    assert "emb:dW" in train.successors("head:dW")


def test_the_shared_gradient_is_reduced_once():
    grads = graph_gradients(to_training(_tied_graph()))
    assert [(g.name, g.size_bytes) for g in grads] == [("mid:grad", 800), ("emb:grad", 4000)]


def test_tied_to_round_trips_through_the_graph_file():
    graph = _tied_graph()
    again = Graph.from_json(graph.to_json())
    assert again.op("head").tied_to == ("emb",)
    assert json.loads(graph.to_json())["ops"]["tied_to"][2] == ["emb"]


def test_tied_to_an_op_without_parameters_is_a_clear_error():
    ops = [Op(name="a", compute_s=1e-3), Op(name="b", compute_s=1e-3, tied_to=("a",))]
    graph = Graph(ops, [Edge(src="a", dst="b", size_bytes=4)])
    with pytest.raises(TrainschedError, match="tied to 'a', which is not an op owning"):
        to_training(graph)


torch = pytest.importorskip("torch")


def test_capture_marks_the_second_reader_of_a_parameter_as_tied():
    from trainsched.capture import capture

    class Tied(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = torch.nn.Embedding(50, 16)
            self.head = torch.nn.Linear(16, 50, bias=False)
            self.head.weight = self.emb.weight       # tied, as in GPT-2

        def forward(self, ids):
            return self.head(self.emb(ids))

    graph = capture(Tied(), torch.randint(0, 50, (2, 5)), costs="static")
    tied = [op for op in graph.ops if op.tied_to]
    owner = next(op for op in graph.ops if op.param_bytes)
    assert [op.tied_to for op in tied] == [(owner.name,)]
    assert owner.param_bytes == 50 * 16 * 4
    train = to_training(graph)
    assert sum(1 for op in train.ops if op.kind == "backward_weight") == 2
