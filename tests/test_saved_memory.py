"""Measured activation memory of pipeline ranks (runtime/saved_memory.py) against the model.

Peaks are per rank and depend only on that rank's action order, so one-process runs (a
thread per rank) measure what real processes do.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from trainsched.backprop.schedules import build_schedule, schedule_stage_count  # noqa: E402
from trainsched.backprop.stages import stage_costs_from_graph  # noqa: E402
from trainsched.capture import capture  # noqa: E402
from trainsched.capture.zoo import build  # noqa: E402
from trainsched.runtime.pipeline import run_local  # noqa: E402
from trainsched.runtime.saved_memory import SavedTensorMeter  # noqa: E402
from trainsched.runtime.stage_modules import build_stages, split_microbatches  # noqa: E402

BATCH, RANKS, MICRO = 16, 2, 8


def test_a_storage_saved_twice_counts_once_and_is_freed_by_the_backward():
    meter = SavedTensorMeter()
    x = torch.randn(100, requires_grad=True)   # 400 bytes
    with meter.saving():
        y = (x * x).sum()                      # mul saves x twice: one storage
    assert meter.bytes == 400
    y.backward()
    assert meter.bytes == 0 and meter.peak_bytes == 400


def test_parameters_are_left_out():
    w = torch.nn.Parameter(torch.randn(10, 10))
    meter = SavedTensorMeter(exclude=[w])
    x = torch.randn(4, 10, requires_grad=True)
    with meter.saving():
        y = (x @ w).sum()                      # saves x (160 bytes) and w (excluded)
    assert meter.bytes == 160
    del y


@pytest.fixture(scope="module")
def graph():
    z = build("mlp", batch_size=BATCH)
    return capture(z.model, z.args, costs="roofline", name="mlp")


def _peaks(graph, name: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    stages = stage_costs_from_graph(graph, schedule_stage_count(name, RANKS), MICRO,
                                    cut="params")
    schedule = build_schedule(name, RANKS, MICRO, stages=stages)
    z = build("mlp", batch_size=BATCH)
    micro = split_microbatches(z.args, z.kwargs, MICRO)
    built = build_stages(z.model, stages.ops, *micro[0], num_microbatches=MICRO)
    peaks = run_local(built, schedule, micro, timeout_s=60.0, measure_memory=True)
    assert peaks is not None
    return peaks, stages.saved_bytes


def test_gpipe_holds_every_micro_batch_of_stage_zero(graph):
    peaks, saved = _peaks(graph, "gpipe")
    assert peaks[0] == MICRO * saved[0]


def test_1f1b_holds_two_micro_batches_on_rank_zero_of_two(graph):
    peaks, saved = _peaks(graph, "1f1b")
    assert peaks[0] == 2 * saved[0]


def test_measured_peaks_order_gpipe_zb_h2_1f1b(graph):
    gpipe, zb_h2, ofob = (max(_peaks(graph, n)[0]) for n in ("gpipe", "zb-h2", "1f1b"))
    # ZB-H2 lets 2p - 1 = 3 micro-batches be in flight where 1F1B has p = 2
    assert gpipe > zb_h2 >= 1.5 * ofob


# --- what I frees ---------------------------------------------------------------------------------

def _encoder_stages(m: int):
    from torch import nn

    from trainsched.graph import Graph

    torch.manual_seed(0)
    model = nn.Sequential(*[nn.TransformerEncoderLayer(32, 2, 64, dropout=0.0, batch_first=True)
                            for _ in range(2)])
    x = torch.randn(4, 8, 32)
    graph: Graph = capture(model, (x,), costs="static", name="enc")
    order = [n for n in graph.topological_order() if graph.op(n).kind == "forward"]
    half = next(k for k, n in enumerate(order) if graph.op(n).module_path.startswith("1"))
    micro = split_microbatches((x,), {}, m)
    return model, x, build_stages(model, [order[:half], order[half:]], *micro[0],
                                  num_microbatches=m), micro


def test_a_transformer_split_backward_matches_gradient_accumulation():
    model, x, stages, micro = _encoder_stages(2)
    run_local(stages, build_schedule("zb-h1", 2, 2), micro, timeout_s=60.0)
    got = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    for chunk in x.chunk(2):
        (model(chunk).square().mean() / 2).backward()
    for n, p in model.named_parameters():
        assert torch.allclose(got[n], p.grad, rtol=1e-4, atol=1e-6), n


def test_input_gradient_frees_what_only_it_needed():
    _model, _x, stages, micro = _encoder_stages(1)
    first = stages[0]
    meter = SavedTensorMeter(exclude=[*_model.parameters(), *_model.buffers()])
    first.meter = meter
    sent = first.forward(0, list(micro[0][0]))
    after_forward = meter.bytes
    first.backward_input(0, [torch.ones_like(t) for t in sent])
    after_input = meter.bytes
    first.backward_weight(0)
    # Stage 0 is one encoder layer (d = 32, feed-forward 64) on 4 x 8 = 32 tokens. After I it
    # holds only what the deferred W needs, per token: the inputs of in_proj, out_proj,
    # linear1 (32 each) and linear2 (64), 160 floats; and the output gradients of in_proj
    # (96), out_proj (32), linear1 (64) and linear2 (32), 224 floats. The norms' weight
    # gradients ran in I: their inputs and output gradients are not kept.
    assert after_input == 32 * (160 + 224) * 4
    # the inputs W keeps are less than the forward saved: q, k, v and the rest are gone
    assert after_forward > 32 * 160 * 4
    assert meter.bytes == 0


def test_input_gradient_runs_the_norms_weight_gradients_and_no_linears():
    model, _x, stages, micro = _encoder_stages(1)
    first = stages[0]
    sent = first.forward(0, list(micro[0][0]))
    first.backward_input(0, [torch.ones_like(t) for t in sent])
    layer = model[0]
    for p in (layer.norm1.weight, layer.norm1.bias, layer.norm2.weight, layer.norm2.bias):
        assert p.grad is not None and p.grad.abs().sum() > 0
    for p in (layer.linear1.weight, layer.linear2.weight, layer.self_attn.in_proj_weight,
              layer.self_attn.out_proj.weight):
        assert p.grad is None
    first.backward_weight(0)
    assert layer.linear1.weight.grad is not None
