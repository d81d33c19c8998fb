"""Every zoo model captures, at op and module granularity, into a valid graph.

One static capture per model at a small size (batch 1; 32 tokens for text models) is shared by
all the checks of that model. Module granularity is a pure transform of the op graph
(``capture`` coarsens its op graph), so the module graph of each model is that transform of the
shared capture: a second export of every model would double the run time. The cheap models check
that ``capture(..., granularity="module")`` gives exactly that graph.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

torch = pytest.importorskip("torch")

from trainsched.capture import build, capture  # noqa: E402
from trainsched.capture.zoo import MODELS  # noqa: E402
from trainsched.graph import Graph, coarsen_by_module, to_training  # noqa: E402

CHEAP = ("mlp", "small-cnn", "tiny-gpt2")


def _small(name: str):
    """Zoo model ``name`` at batch 1 (and 32 tokens), skipped if its library is missing."""
    if MODELS[name].family == "vision":
        pytest.importorskip("torchvision")
    if name in ("gpt2", "bert-base", "tiny-gpt2"):
        pytest.importorskip("transformers")
        return build(name, batch_size=1, seq_len=32)
    return build(name, batch_size=1)


def _capture(zoo, granularity: str = "op") -> Graph:
    return capture(zoo.model, zoo.args, example_kwargs=zoo.kwargs, granularity=granularity,
                   costs="static", name=zoo.name)


@dataclass
class Captured:
    name: str
    op: Graph
    module: Graph
    param_bytes: int  # 4 x the model's parameters, tied weights once

    @property
    def graphs(self) -> tuple[Graph, Graph]:
        return self.op, self.module


@pytest.fixture(scope="module", params=list(MODELS))
def captured(request: pytest.FixtureRequest) -> Captured:
    zoo = _small(request.param)
    op = _capture(zoo)
    param_bytes = 4 * sum(p.numel() for p in zoo.model.parameters())
    return Captured(zoo.name, op, coarsen_by_module(op), param_bytes)


def test_graphs_are_valid_dags(captured: Captured):
    for g in captured.graphs:
        assert len(g.topological_order()) == len(g.ops) > 1
        assert g.totals().flops > 0
    assert captured.op.meta["granularity"] == "op"
    assert captured.module.meta["granularity"] == "module"


def test_json_round_trip_is_exact(captured: Captured):
    for g in captured.graphs:
        text = g.to_json()
        back = Graph.from_json(text)
        assert back == g
        assert back.to_json() == text


def test_parameter_bytes_are_the_models(captured: Captured):
    for g in captured.graphs:
        assert g.totals().param_bytes == captured.param_bytes


def test_module_granularity_coarsens_without_losing_work(captured: Captured):
    op, module = captured.op.totals(), captured.module.totals()
    assert module.num_ops <= op.num_ops
    assert module.flops == op.flops
    assert module.param_bytes == op.param_bytes
    assert module.saved_bytes == op.saved_bytes
    members = [m for o in captured.module.ops for m in (o.members or (o.name,))]
    assert sorted(members) == sorted(o.name for o in captured.op.ops)


def test_training_graph_builds(captured: Captured):
    for g in captured.graphs:
        train = to_training(g)
        kinds = train.totals().ops_by_kind
        assert kinds["forward"] == len(g.ops)
        assert kinds["optimizer"] == sum(1 for o in g.ops if o.param_bytes > 0) > 0
        # one dW per parameter owner, plus one per reader of tied weights (GPT-2's output layer)
        tied = sum(1 for o in g.ops if o.tied_to and o.param_bytes == 0)
        assert kinds["backward_weight"] == kinds["optimizer"] + tied
        assert train.totals().param_bytes == captured.param_bytes


@pytest.mark.parametrize("name", CHEAP)
def test_module_capture_is_the_coarsened_op_capture(name: str):
    zoo = _small(name)
    assert _capture(zoo, "module") == coarsen_by_module(_capture(zoo))


def test_image_size_shrinks_a_vision_model_input_not_its_parameters():
    pytest.importorskip("torchvision")
    full = build("vgg16", batch_size=1)
    small = build("vgg16", batch_size=2, image_size=32)
    assert tuple(small.args[0].shape) == (2, 3, 32, 32)
    assert tuple(full.args[0].shape) == (1, 3, 224, 224)
    n_full = sum(p.numel() for p in full.model.parameters())
    n_small = sum(p.numel() for p in small.model.parameters())
    assert n_full == n_small
    with torch.no_grad():
        assert tuple(small.model(*small.args).shape) == (2, 1000)


@pytest.mark.parametrize(("name", "size", "message"), [
    ("mlp", 64, "image_size applies to resnet50, .*, not 'mlp'"),
    ("resnet50", 16, "at least 32"),
])
def test_image_size_rejects_what_it_cannot_mean(name: str, size: int, message: str):
    from trainsched.errors import TrainschedError

    with pytest.raises(TrainschedError, match=message):
        build(name, batch_size=1, image_size=size)


@pytest.mark.parametrize(("call", "message"), [
    (lambda: build("mlp", batch_size="32"), "batch_size must be an integer of at least 1, got "
                                            "'32'"),
    (lambda: build("mlp", batch_size=0), "batch_size must be an integer of at least 1, got 0"),
    (lambda: build("gpt2", seq_len=2.5), "seq_len must be an integer"),
    (lambda: build("resnet50", seq_len=64), "seq_len applies to gpt2, bert-base, tiny-gpt2 "
                                            "only, not 'resnet50'"),
    (lambda: build(50), "a model is named by a str"),
    (lambda: build("mlp", seed="0"), "seed must be an integer"),
])
def test_wrong_arguments_are_errors_worded_for_the_caller(call, message):
    from trainsched.errors import TrainschedError

    with pytest.raises(TrainschedError, match=message) as raised:
        call()
    assert "--" not in str(raised.value)  # library errors name parameters, not flags


def test_each_model_says_which_sizes_it_takes():
    from trainsched.capture import size_options

    assert size_options("resnet50") == size_options("inception-v3") == ("image_size",)
    assert size_options("gpt2") == size_options("tiny-gpt2") == ("seq_len",)
    assert size_options("mlp") == size_options("small-cnn") == ()
    assert size_options("model.py:make") == ("seq_len",)


def test_a_model_file_refuses_sizes_its_function_does_not_take(tmp_path):
    from trainsched.errors import TrainschedError

    path = tmp_path / "m.py"
    path.write_text("import torch\n"
                    "def make(batch_size=2):\n"
                    "    return torch.nn.Linear(4, 2), (torch.randn(batch_size, 4),)\n")
    assert build(f"{path}:make", batch_size=3).batch_size == 3
    with pytest.raises(TrainschedError, match="takes no seq_len parameter"):
        build(f"{path}:make", seq_len=16)
    with pytest.raises(TrainschedError, match="image_size applies to the zoo's vision models"):
        build(f"{path}:make", image_size=64)
