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
    assert gpipe > zb_h2 >= 2 * ofob
