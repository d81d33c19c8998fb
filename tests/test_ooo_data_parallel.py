"""Reverse-first-k (``backprop_k``) on the scheduled data-parallel runtime, on real gloo
processes (``tests/ooo_jobs.py``): N-step equivalence with BSP for k in {0, L/2, L} and SGD,
momentum, Adam; the issue order; checkpoints mid-run; bad input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from trainsched.runtime.data_parallel.options import SPLIT_BACKENDS, DataParallelOptions
from trainsched.runtime.launch import free_port, run_workers
from trainsched.runtime.split import BACKENDS

JOBS = str(Path(__file__).with_name("ooo_jobs.py"))

# The issue order's names: the test model's parameters in forward order, layer by layer
# (conv, fc1, norm, fc2, fc3; L = 4 split layers, the norm stays whole).
CONV = ["conv.weight", "conv.bias"]
FC1 = ["fc1.weight", "fc1.bias"]
NORM = ["norm.weight", "norm.bias"]
FC2 = ["fc2.weight", "fc2.bias"]
FC3 = ["fc3.weight", "fc3.bias"]


def run_job(tmp_path: Path, job: str, limit_s: float = 240) -> list[dict]:
    port = free_port()
    configs = [{"job": job, "rank": r, "world_size": 2, "port": port, "out": str(tmp_path)}
               for r in range(2)]
    exits = run_workers(JOBS, configs, workdir=tmp_path, timeout_s=limit_s)
    results = []
    for e in exits:
        path = tmp_path / f"rank{e.rank}.json"
        results.append(json.loads(path.read_text()) if path.exists() else
                       {"crash": f"no result; status {e.status}: {e.log.read_text()[-2000:]}"})
    for r in results:
        assert "crash" not in r, r["crash"]
    return results


def flat(params: list[list[float]]) -> np.ndarray:
    return np.concatenate([np.asarray(p) for p in params])


@pytest.fixture(scope="module")
def equivalence(tmp_path_factory) -> list[dict]:
    return run_job(tmp_path_factory.mktemp("ooo_equivalence"), "equivalence", limit_s=400)


@pytest.mark.timeout(450)
@pytest.mark.parametrize("optimizer", ["sgd", "momentum", "adam"])
@pytest.mark.parametrize("k", [0, 2, 4])
def test_n_steps_of_reverse_first_k_equal_bsp(equivalence, k, optimizer):
    for result in equivalence:
        plain_losses, plain_params = result[f"plain/{optimizer}"]
        losses, params = result[f"k{k}/{optimizer}"]
        np.testing.assert_allclose(losses, plain_losses, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(flat(params), flat(plain_params), rtol=1e-5, atol=1e-6)
    # every rank ends with the same parameters
    assert flat(equivalence[0][f"k{k}/{optimizer}"][1]).tolist() == \
        flat(equivalence[1][f"k{k}/{optimizer}"][1]).tolist()


@pytest.mark.timeout(450)
def test_k_zero_is_the_runtime_without_the_option_bit_for_bit(equivalence):
    for result in equivalence:
        assert result["k0/adam"] == result["k0_default/adam"]


@pytest.mark.timeout(450)
@pytest.mark.parametrize("run", ["static_order/k2", "graph_backend/k4", "partitions/k2"])
def test_the_static_order_the_graph_backend_and_partitions_equal_bsp_too(equivalence, run):
    for result in equivalence:
        np.testing.assert_allclose(result[run][0], result["plain/adam"][0], rtol=1e-5,
                                   atol=1e-6)
        np.testing.assert_allclose(flat(result[run][1]), flat(result["plain/adam"][1]),
                                   rtol=1e-5, atol=1e-6)


@pytest.mark.timeout(450)
@pytest.mark.parametrize("k", [1, 3])
def test_a_tied_embedding_and_output_weight_under_reverse_first_k_equals_bsp(equivalence, k):
    for result in equivalence:
        np.testing.assert_allclose(result[f"tied/k{k}"][0], result["tied/plain"][0],
                                   rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(flat(result[f"tied/k{k}"][1]), flat(result["tied/plain"][1]),
                                   rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def rest(tmp_path_factory) -> list[dict]:
    return run_job(tmp_path_factory.mktemp("ooo_rest"), "rest")


@pytest.fixture(scope="module")
def order(rest) -> list[dict]:
    return [result["order"] for result in rest]


def layers_of(names: list[str]) -> list[str]:
    """The layer of each name, consecutive repeats merged."""
    out: list[str] = []
    for name in names:
        layer = name.split(".")[0]
        if not out or out[-1] != layer:
            out.append(layer)
    return out


@pytest.mark.timeout(300)
def test_fifo_with_k_zero_issues_layers_in_backward_order(order):
    """In-order backprop (the runtime unchanged): layer by layer as backward produces them
    (which of a layer's weight and bias autograd accumulates first is its own business)."""
    for result in order:
        for issued in result["fifo/k0"]:
            assert sorted(issued) == sorted(CONV + FC1 + NORM + FC2 + FC3)
            assert layers_of(issued) == ["fc3", "fc2", "norm", "fc1", "conv"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("k", "expected"), [
    # layers 3 and 2 as produced, the norm with its dX, then layer 0 and 1 after the last dX
    (2, FC3 + FC2 + NORM + CONV + FC1),
    # every split layer after the last dX, in forward order; the whole norm comes first
    (4, NORM + CONV + FC1 + FC2 + FC3),
])
def test_fifo_issues_each_gradient_as_its_dw_produces_it(order, k, expected):
    for result in order:
        steps = result[f"fifo/k{k}"]
        assert len(steps) == 3
        for issued in steps:
            assert issued == expected


@pytest.mark.timeout(300)
@pytest.mark.parametrize("k", [0, 2, 4])
def test_priority_lets_layer_zero_overtake_queued_gradients(order, k):
    """Rank 0's dispatcher sleeps 0.1 s before each issue, so every gradient but the first it
    saw waits in the queue: they leave by layer, layer 0 (conv) first, ahead of the later
    layers that backward produced before it; rank 1 issues the same sequence."""
    by_layer = CONV + FC1 + NORM + FC2 + FC3
    for result in order:
        for issued in result[f"priority/k{k}"]:
            assert sorted(issued) == sorted(by_layer)
            rest = issued[1:]
            assert rest == sorted(rest, key=by_layer.index)
            assert rest[0] in CONV or issued[0] in CONV
    assert order[0][f"priority/k{k}"] == order[1][f"priority/k{k}"]


@pytest.mark.timeout(300)
def test_bytes_held_by_deferred_weight_gradients_equal_a_hand_count(rest):
    """Batch 5, fp32, each storage once. conv: its input 5x2x6 and output gradient 5x4x6;
    fc1: its input (the flattened ReLU output, 5x4x6) and output gradient 5x16; fc2: input
    and output gradient 5x16 each; fc3: input 5x16, output gradient 5x3."""
    conv, fc1 = 60 + 120, 120 + 80
    fc2, fc3 = 80 + 80, 80 + 15
    for result in rest:
        assert result["held"] == {"k0": 0, "k2": 4 * (conv + fc1),
                                  "k4": 4 * (conv + fc1 + fc2 + fc3)}


@pytest.mark.timeout(300)
def test_checkpoint_mid_run_restores_to_the_same_parameters(rest):
    for result in (r["checkpoint"] for r in rest):
        assert result["adam_steps"] and set(result["adam_steps"]) == {2.0}
        np.testing.assert_allclose(flat(result["restored"]), flat(result["going_on"]),
                                   rtol=0, atol=1e-7)
        assert result["stock_grad_after_close"]


@pytest.mark.timeout(300)
def test_bad_input_is_refused_in_one_line(rest):
    for result in (r["refused"] for r in rest):
        assert result["k_above"] == (
            "TrainschedError: backprop_k=5 is above the model's 4 split layers (Linear, Conv, "
            "Embedding and other modules owning parameters, norms excluded, counted in "
            "forward order); use a k from 0 to 4")
        assert "refuses backprop_k" in result["disabled"]
        assert "backprop_k must be an integer >= 0" in result["negative"]
        assert "ScheduledDataParallel with backprop_k" in result["ddp_inside"]
        for backend in ("auto", "graph"):
            assert result[f"outside/{backend}"] == (
                "TrainschedError: parameter 'fc3.bias' belongs to a split layer but is also "
                "used outside it (autograd brought it a gradient); with backprop_k > 0 every "
                "use of a split layer's parameter must go through that layer")
            assert result[f"outside_close/{backend}"] == "no error"  # closes cleanly after


def test_options_check_backprop_k_and_the_backends_agree_with_the_split():
    assert DataParallelOptions().backprop_k == 0
    assert SPLIT_BACKENDS == BACKENDS
    with pytest.raises(Exception, match="split_backend must be one of auto, function, graph"):
        DataParallelOptions(backprop_k=1, split_backend="fx")
    with pytest.raises(Exception, match="backprop_k must be an integer"):
        DataParallelOptions(backprop_k=True)


def test_a_training_segment_takes_backprop_k_on_the_scheduled_runtime_only():
    from trainsched.errors import TrainschedError
    from trainsched.runtime.train import Segment

    Segment(label="ooo", kind="sdp", backprop_k=3).check()
    with pytest.raises(TrainschedError, match=r"backprop_k .* needs comm other than 'ddp'"):
        Segment(label="ooo", kind="ddp", backprop_k=3).check()
    with pytest.raises(TrainschedError, match=r"backprop_k .* scheduling on"):
        Segment(label="ooo", kind="sdp", enabled=False, backprop_k=3).check()
    with pytest.raises(TrainschedError, match="backprop_k must be an integer >= 0"):
        Segment(label="ooo", kind="sdp", backprop_k=-2).check()


@pytest.mark.timeout(300)
def test_the_training_runtime_runs_a_plan_segment_with_backprop_k():
    from trainsched.comm import PriorityPolicy
    from trainsched.runtime.run import policy_segment
    from trainsched.runtime.train import run_segments

    segment = policy_segment(PriorityPolicy(cross_barrier=True), label="ooo", steps=2, warmup=1,
                             backprop_k=4)
    result = run_segments("mlp", [segment], nproc=2, timeout_s=240)
    assert len(result.first.step_times_s) == 2


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_training_runtime_refuses_k_above_the_layers_in_one_line():
    from trainsched.comm import PriorityPolicy
    from trainsched.errors import TrainschedError
    from trainsched.runtime.run import policy_segment
    from trainsched.runtime.train import run_segments

    segment = policy_segment(PriorityPolicy(cross_barrier=True), label="ooo", steps=1, warmup=0,
                             backprop_k=5)
    with pytest.raises(TrainschedError, match="backprop_k=5 is above the model's 4 split "
                                              "layers") as caught:
        run_segments("mlp", [segment], nproc=2, timeout_s=240)
    assert "\n" not in str(caught.value)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("k", [2, 4])
def test_the_predicted_dw_queue_peak_matches_the_measured_one_within_ten_percent(rest, k):
    """The simulator's prediction from the captured graph (``deferred_bytes``) against the
    bytes the runtime's dW queue held at its peak on the same network and batch."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from ooo_jobs import batch, net
    from trainsched.backprop.reorder import deferred_bytes, layers
    from trainsched.capture import capture
    from trainsched.graph import to_training

    graph = to_training(capture(net(), batch(0, 0), costs="static"))
    assert len(layers(graph)) == 4          # conv, fc1, fc2, fc3; the LayerNorm stays whole
    predicted = deferred_bytes(graph, k)
    for result in rest:
        measured = result["held"][f"k{k}"]
        assert abs(predicted - measured) <= 0.1 * measured, (predicted, measured)
