"""Named models with random weights, built without downloads.

``build(name, batch_size=..., seq_len=...)`` returns a :class:`ZooModel`: the module, its example
inputs and a short description. torchvision models take images (224 x 224; 299 for
Inception-V3); transformers models are built from their default configuration with
``use_cache=False`` and take token ids. Small built-in models serve tests and demos.
Weights are drawn from a fixed seed, so a name always gives the same model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from trainsched.errors import TrainschedError
from trainsched.units import is_int


@dataclass
class ZooModel:
    name: str
    model: nn.Module
    args: tuple
    kwargs: dict = field(default_factory=dict)
    description: str = ""
    batch_size: int = 1
    seq_len: int | None = None


@dataclass(frozen=True)
class Entry:
    family: str                      # "vision", "text" or "builtin"
    description: str
    default_batch_size: int
    builder: Callable[[int, int], tuple[nn.Module, tuple, dict]]


def _vision(fn_name: str, size: int = 224, **kw: Any) -> Callable[..., Any]:
    def build(batch_size: int, _seq_len: int,
              image_size: int | None = None) -> tuple[nn.Module, tuple, dict]:
        try:
            import torchvision
        except Exception as exc:  # pragma: no cover - depends on the install
            raise TrainschedError(f"model needs torchvision, which did not import: {exc}") \
                from exc
        model = getattr(torchvision.models, fn_name)(weights=None, **kw)
        side = size if image_size is None else image_size
        return model, (torch.randn(batch_size, 3, side, side),), {}
    return build


def _transformer(kind: str) -> Callable[[int, int], Any]:
    def build(batch_size: int, seq_len: int) -> tuple[nn.Module, tuple, dict]:
        try:
            import transformers
        except Exception as exc:  # pragma: no cover - depends on the install
            raise TrainschedError(f"model needs transformers, which did not import: {exc}") \
                from exc
        transformers.logging.set_verbosity_error()
        if kind == "gpt2":
            config = transformers.GPT2Config(use_cache=False)
            model = transformers.GPT2LMHeadModel(config)
        elif kind == "tiny-gpt2":
            config = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=1000,
                                             n_positions=256, bos_token_id=0, eos_token_id=0,
                                             use_cache=False)
            model = transformers.GPT2LMHeadModel(config)
        else:
            config = transformers.BertConfig()
            model = transformers.BertForMaskedLM(config)
        limit = getattr(config, "n_positions", None) or config.max_position_embeddings
        if seq_len > limit:
            raise TrainschedError(f"seq_len {seq_len} is longer than the model's {limit} "
                                  f"positions")
        ids = torch.randint(0, config.vocab_size, (batch_size, seq_len))
        return model, (), {"input_ids": ids}
    return build


class MLP(nn.Module):
    """A three-layer perceptron: the smallest model with real weight gradients."""

    def __init__(self, width: int = 256, depth: int = 3, classes: int = 10):
        super().__init__()
        layers: list[nn.Module] = []
        for _ in range(depth):
            layers += [nn.Linear(width, width), nn.ReLU()]
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


class SmallCNN(nn.Module):
    """Two conv blocks with batch norm, a residual add and a classifier (32 x 32 input)."""

    def __init__(self, channels: int = 16, classes: int = 10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, channels, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(channels)
        self.relu = nn.ReLU()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(channels, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.relu(self.bn2(self.conv2(y)) + y)
        return self.fc(torch.flatten(self.pool(y), 1))


def _builtin(cls: type[nn.Module], shape: Callable[[int], tuple[int, ...]]) -> Callable:
    def build(batch_size: int, _seq_len: int) -> tuple[nn.Module, tuple, dict]:
        return cls(), (torch.randn(shape(batch_size)),), {}
    return build


MODELS: dict[str, Entry] = {
    "resnet50": Entry("vision", "ResNet-50, 224x224 images (torchvision)", 32,
                      _vision("resnet50")),
    "vgg16": Entry("vision", "VGG-16, 224x224 images (torchvision)", 32, _vision("vgg16")),
    "inception_v3": Entry("vision", "Inception-V3, 299x299 images, no aux head (torchvision)",
                          32, _vision("inception_v3", 299, aux_logits=False,
                                      init_weights=False)),
    "densenet121": Entry("vision", "DenseNet-121, 224x224 images (torchvision)", 32,
                         _vision("densenet121")),
    "mobilenet_v3_large": Entry("vision", "MobileNetV3-Large, 224x224 images (torchvision)",
                                32, _vision("mobilenet_v3_large")),
    "gpt2": Entry("text", "GPT-2 small, 124M parameters (transformers, random weights)", 8,
                  _transformer("gpt2")),
    "bert-base": Entry("text", "BERT-base with masked-LM head (transformers, random weights)",
                       8, _transformer("bert")),
    "tiny-gpt2": Entry("builtin", "2-layer GPT-2, width 64 (transformers; for tests)", 4,
                       _transformer("tiny-gpt2")),
    "mlp": Entry("builtin", "3-layer MLP, width 256 (for tests and demos)", 64,
                 _builtin(MLP, lambda b: (b, 256))),
    "small-cnn": Entry("builtin", "2-block CNN with batch norm and a residual, 32x32 images",
                       8, _builtin(SmallCNN, lambda b: (b, 3, 32, 32))),
}

DEFAULT_SEQ_LEN = 128


def names() -> list[str]:
    return list(MODELS)


def _entry(name: str) -> tuple[str, Entry]:
    """The zoo's name and entry of ``name`` (``-`` and ``_`` alike, any case)."""
    if not isinstance(name, str):
        raise TrainschedError(f"a model is named by a str (a zoo name or path.py:function), got "
                              f"{type(name).__name__} {name!r}")
    entry = MODELS.get(name) or MODELS.get(name.lower().replace("-", "_")) or MODELS.get(
        name.lower().replace("_", "-"))
    if entry is None:
        raise TrainschedError(f"unknown model {name!r}; known models: {', '.join(MODELS)}")
    return next(k for k, v in MODELS.items() if v is entry), entry


def _takes_seq(name: str, entry: Entry) -> bool:
    """Whether the model takes token ids (the text models and the built-in tiny GPT-2)."""
    return entry.family != "vision" and name not in ("mlp", "small-cnn")


def size_options(name: str) -> tuple[str, ...]:
    """The input sizes :func:`build` takes for model ``name`` besides ``batch_size``:
    ``("image_size",)`` for the vision models, ``("seq_len",)`` for the text ones (and a model
    file, whose function gets ``seq_len`` when it takes one), ``()`` for the others."""
    if isinstance(name, str) and ".py:" in name:
        return ("seq_len",)
    key, entry = _entry(name)
    if entry.family == "vision":
        return ("image_size",)
    return ("seq_len",) if _takes_seq(key, entry) else ()


def models_taking(option: str) -> list[str]:
    """The zoo models whose :func:`size_options` hold ``option``."""
    return [n for n in MODELS if option in size_options(n)]


def build(name: str, *, batch_size: int | None = None, seq_len: int | None = None,
          image_size: int | None = None, seed: int = 0) -> ZooModel:
    """Build zoo model ``name`` with random weights drawn from ``seed``.

    ``image_size`` replaces the input side of a torchvision model (224, Inception 299): every
    zoo vision model ends in adaptive pooling, so smaller images such as 32 work and make
    CPU runs cheap; the model's parameters do not change.

    ``name`` may also be ``path/to/file.py:function``: the function (given ``batch_size`` and
    ``seq_len`` when it takes them) returns ``(model, args)`` or ``(model, args, kwargs)``.
    """
    for option, value, low in (("batch_size", batch_size, 1), ("seq_len", seq_len, 1),
                               ("image_size", image_size, 32)):
        if value is not None and not (is_int(value) and value >= low):
            raise TrainschedError(f"{option} must be an integer of at least {low}, got "
                                  f"{value!r}")
    if not is_int(seed):
        raise TrainschedError(f"seed must be an integer, got {seed!r}")
    if isinstance(name, str) and ".py:" in name:
        if image_size is not None:
            raise TrainschedError(f"image_size applies to the zoo's vision models; the function "
                                  f"of {name} makes its own inputs")
        return _from_file(name, batch_size=batch_size, seq_len=seq_len, seed=seed)
    name, entry = _entry(name)
    batch = entry.default_batch_size if batch_size is None else batch_size
    seq = DEFAULT_SEQ_LEN if seq_len is None else seq_len
    for option, value in (("image_size", image_size), ("seq_len", seq_len)):
        if value is not None and option not in size_options(name):
            raise TrainschedError(f"{option} applies to {', '.join(models_taking(option))} "
                                  f"only, not {name!r}")
    torch.manual_seed(seed)
    if image_size is not None:
        model, args, kwargs = entry.builder(batch, seq, image_size=image_size)
    else:
        model, args, kwargs = entry.builder(batch, seq)
    uses_seq = _takes_seq(name, entry)
    return ZooModel(name=name, model=model, args=args, kwargs=kwargs,
                    description=entry.description, batch_size=batch,
                    seq_len=seq if uses_seq else None)


def _from_file(spec: str, *, batch_size: int | None, seq_len: int | None, seed: int) -> ZooModel:
    import importlib.util
    import inspect
    from pathlib import Path

    path_text, func_name = spec.rsplit(":", 1)
    path = Path(path_text)
    if not path.is_file():
        raise TrainschedError(f"model file {path} does not exist")
    module_spec = importlib.util.spec_from_file_location(f"_trainsched_user_{path.stem}", path)
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    torch.manual_seed(seed)
    try:
        module_spec.loader.exec_module(module)
    except Exception as exc:
        raise TrainschedError(f"could not import model file {path}: {type(exc).__name__}: "
                              f"{exc}") from exc
    func = getattr(module, func_name, None)
    if not callable(func):
        raise TrainschedError(f"model file {path} has no function {func_name!r}")
    params = inspect.signature(func).parameters
    kwargs = {k: v for k, v in (("batch_size", batch_size), ("seq_len", seq_len))
              if v is not None}
    unused = [k for k in kwargs if k not in params]
    if unused:
        raise TrainschedError(f"{spec} takes no {' or '.join(unused)} parameter, so "
                              f"{' and '.join(unused)} cannot be set; add the parameter to the "
                              f"function or drop {'it' if len(unused) == 1 else 'them'}")
    try:
        result = func(**kwargs)
    except Exception as exc:
        raise TrainschedError(f"{spec} failed: {type(exc).__name__}: {exc}") from exc
    if isinstance(result, ZooModel):
        return result
    if not (isinstance(result, tuple) and len(result) in (2, 3)
            and isinstance(result[0], nn.Module)):
        raise TrainschedError(f"{spec} must return (model, args) or (model, args, kwargs)")
    model, args = result[0], result[1]
    args = args if isinstance(args, tuple) else (args,)
    first = next((a for a in args if isinstance(a, torch.Tensor)), None)
    return ZooModel(name=f"{path.stem}:{func_name}", model=model, args=args,
                    kwargs=dict(result[2]) if len(result) == 3 else {},
                    description=f"{func_name} from {path}",
                    batch_size=int(first.shape[0]) if first is not None and first.dim() else 1,
                    seq_len=seq_len)
