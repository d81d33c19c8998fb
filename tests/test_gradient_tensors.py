"""One gradient per parameter tensor: capture records the tensors of an op that owns several,
the comm policies see each as a gradient of its own (as the runtime reduces them), the
data-parallel simulator issues a collective per tensor and the optimizer waits for all of
its op's."""

from __future__ import annotations

import torch
from torch import nn

from test_sim_data_parallel import MB, MS, close, make_cluster, spans_close, three_layers
from trainsched.capture import capture
from trainsched.comm import FifoPolicy, PriorityPolicy
from trainsched.comm.policy import gradient_sources, graph_gradients
from trainsched.graph import PARAM_TENSORS, Graph, to_training
from trainsched.sim import crossing_bound_s, simulate_data_parallel


def split_l0(weight: int, bias: int) -> Graph:
    """:func:`three_layers` (2 MB, 0.6 MB, 0.6 MB) with L0's 2 MB recorded as two tensors."""
    g = three_layers(weight + bias, 600_000, 600_000)
    return Graph(g.ops, g.edges, {**g.meta, PARAM_TENSORS: {"L0": [["weight", weight],
                                                                   ["bias", bias]]}})


def test_capture_records_each_parameter_of_an_op_that_owns_several():
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4, bias=False))
    graph = capture(model, (torch.randn(4, 16),), costs="static")
    # Linear(16, 32): weight 32*16*4 = 2048 B, bias 32*4 = 128 B; the second layer owns one
    # tensor and is not recorded.
    assert {op: sorted(map(tuple, rows)) for op, rows in graph.meta[PARAM_TENSORS].items()} \
        == {"linear": [("bias", 128), ("weight", 2048)]}


def test_each_tensor_is_a_gradient_of_its_own_in_ready_order():
    g = split_l0(1_900_000, 100_000)
    grads = graph_gradients(g)
    assert [(x.name, x.size_bytes, x.layer_index, x.ready_index) for x in grads] == [
        ("L2:grad", 600_000, 2, 0), ("L1:grad", 600_000, 1, 1),
        ("L0:grad.weight", 1_900_000, 0, 2), ("L0:grad.bias", 100_000, 0, 3)]
    assert gradient_sources(g) == ("L2:dW", "L1:dW", "L0:dW", "L0:dW")


def test_a_record_that_does_not_add_up_to_the_gradient_is_not_used():
    g = three_layers(2 * MB, 600_000, 600_000)
    g = Graph(g.ops, g.edges, {**g.meta, PARAM_TENSORS: {"L0": [["weight", MB],
                                                                ["bias", 1]]}})
    assert [x.name for x in graph_gradients(g)] == ["L2:grad", "L1:grad", "L0:grad"]


def test_fifo_reduces_each_tensor_by_hand():
    """As test_fifo_versus_ddp_buckets_by_hand, but L0's 2 MB is a 1.9 MB weight and a 0.1 MB
    bias, ready together at 8 ms: one collective each (0.1 ms + S/(1 GB/s)), one after the
    other: 8-10.0 and 10.0-10.2 ms; the barrier at 10.2 ms, then the SGD steps (1 + 0.3 + 0.3
    ms): one start-up more than the whole 2 MB (11.7 ms)."""
    result = simulate_data_parallel(split_l0(1_900_000, 100_000), make_cluster(), ranks=2,
                                    policy=FifoPolicy(runtime_passes=False))
    spans_close(result, {"L2:grad": (5, 5.7), "L1:grad": (7, 7.7),
                         "L0:grad.weight": (8, 10.0), "L0:grad.bias": (10.0, 10.2),
                         "barrier": (10.2, 10.2), "L0:opt": (10.2, 11.2),
                         "L2:opt": (11.5, 11.8)})  # fmt: skip
    assert close(result.step_time_s, 11.8 * MS)


def test_an_update_across_the_barrier_waits_for_every_tensor_of_its_op():
    """Priority across the barrier: L0 (layer 0) goes first at 8 ms, its weight then its bias
    (ready order among equals): 8-10.0, 10.0-10.2 ms; L0's update starts when the bias is
    reduced, not the weight."""
    policy = PriorityPolicy(runtime_passes=False, cross_barrier=True)
    result = simulate_data_parallel(split_l0(1_900_000, 100_000), make_cluster(), ranks=2,
                                    policy=policy)
    spans_close(result, {"L0:grad.weight": (8, 10.0), "L0:grad.bias": (10.0, 10.2),
                         "L0:opt": (10.2, 11.2)})


def test_the_crossing_bound_takes_the_largest_tensor():
    """L0's loop: its forward at 0 ms to L0:dW's end at 8 ms, the all-reduce of its largest
    tensor (1.5 MB: 1.6 ms), its 1 ms update: 10.6 ms (the whole 2 MB would say 11.1)."""
    bound, name = crossing_bound_s(split_l0(1_500_000, 500_000), make_cluster(), ranks=2)
    assert close(bound, 10.6 * MS) and name == "L0:grad.weight"


def test_a_training_graph_keeps_the_record_through_the_transform():
    g = to_training(Graph(split_l0(10, 6).ops[:1], [],
                          {PARAM_TENSORS: {"L0": [["weight", 10], ["bias", 6]]}}))
    assert [x.name for x in graph_gradients(g)] == ["L0:grad.weight", "L0:grad.bias"]



class TiedLM(nn.Module):
    """An embedding tied to the output layer (which also has a bias), a norm between."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 16)
        self.norm = nn.LayerNorm(16)
        self.head = nn.Linear(16, 50)
        self.head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.embed(tokens)))


def test_as_many_gradients_as_the_runtime_reduces_tensors():
    """The runtime reduces one gradient per trainable parameter tensor (a shared one once):
    the simulator's count and sizes must be the model's own, at op and at module
    granularity."""
    from trainsched.capture import build

    cases = [(z.model, z.args) for z in (build("mlp", batch_size=4),
                                         build("small-cnn", batch_size=2))]
    cases.append((TiedLM(), (torch.randint(0, 50, (2, 8)),)))
    for model, args in cases:
        params = [p for p in model.parameters() if p.requires_grad]  # shared ones once
        sizes = sorted(p.numel() * p.element_size() for p in params)
        for granularity in ("op", "module"):  # a module's ops merged keep their tensors
            graph = to_training(capture(model, args, costs="static", granularity=granularity))
            assert sorted(g.size_bytes for g in graph_gradients(graph)) == sizes, \
                (type(model), granularity)
