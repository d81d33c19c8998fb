"""Built-in training tasks that need no download: data generated in code from a seed.

:class:`TeacherStudent` is a classification task with a real accuracy curve. A frozen random MLP
(the *teacher*) scores Gaussian inputs; the label is its top class. Inputs whose two best scores
lie close together are dropped (``margin_quantile`` of them), so the classes are separated by a
margin and a student network can drive its held-out loss down by orders of magnitude in a few
thousand samples on a CPU — enough to compare synchronisation protocols by loss and accuracy.

The value is plain data (torch-free, JSON round trip through :meth:`TeacherStudent.to_json`);
:meth:`TeacherStudent.data` and :meth:`TeacherStudent.student` build tensors and the student
network inside the worker processes. The training stream is the fixed training set read in a
fresh seeded permutation per epoch: global sample ``s`` is ``train[perm(s // n)[s % n]]``
(:meth:`TeacherStudent.stream_indices`), so any rank can read any stretch of it without state
beyond a position.

:class:`ZooTask` gives any zoo model (``mlp``, ``small-cnn``, the torchvision and transformers
models, ``file.py:function``) a task of the same kind, so the sync runtime trains it like the
student. The rule that labels the data depends on the model's input:

* a floating input (images, vectors) is a **mixture of class prototypes**: class ``c`` has a
  fixed random prototype of the input's shape (images: a random 4 x 4 pattern per channel,
  upsampled, so that convolutions and pooling see it), a sample of class ``c`` is its prototype
  plus Gaussian noise (``noise`` times the prototypes' spread), and its label is ``c``; the
  model's first ``classes`` outputs are the classes;
* token ids are **next-token prediction on a seeded Markov chain** over the first ``classes``
  token ids: each token has two possible successors, drawn once; a sequence starts at a random
  token and follows the chain, and the label of position ``i`` is the token at ``i + 1``
  (the best possible loss is ``ln 2`` per token, the untrained one about ``ln V``).

Neither needs a teacher forward pass, so the data costs nothing next to training; both are
learnable by any model of the zoo and generalise (the held-out split is drawn from the same rule
with other noise), so held-out loss and accuracy are real curves. Samples are generated from
``(seed, index)`` when read, so a task of large images holds no data set in memory.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

from trainsched.errors import TrainschedError
from trainsched.registry import Registry
from trainsched.units import is_int

__all__ = ["TASKS", "TASK_TYPES", "Task", "TaskData", "TeacherStudent", "ZooTask",
           "stream_indices", "task_for", "task_from_json"]


@dataclass(frozen=True)
class TaskData:
    """The tensors of a task: training inputs and labels, held-out inputs and labels."""

    x_train: Any
    y_train: Any
    x_test: Any
    y_test: Any


@dataclass(frozen=True, kw_only=True)
class TeacherStudent:
    """Gaussian inputs labelled by a frozen random MLP; the student is a wider MLP (optionally
    with BatchNorm, to exercise buffer handling) trained with cross-entropy."""

    input_dim: int = 16
    teacher_hidden: int = 32
    classes: int = 4
    student_hidden: int = 64
    train_samples: int = 4096
    test_samples: int = 1024
    margin_quantile: float = 0.5
    batch_norm: bool = False
    seed: int = 0

    name: ClassVar[str] = "teacher-student"

    def __post_init__(self) -> None:
        for field in ("input_dim", "teacher_hidden", "student_hidden", "train_samples",
                      "test_samples"):
            value = getattr(self, field)
            if not is_int(value) or value < 1:
                raise TrainschedError(f"teacher-student: {field} must be a whole number >= 1, "
                                      f"got {value!r}")
        if not is_int(self.classes) or self.classes < 2:
            raise TrainschedError(f"teacher-student: classes must be a whole number >= 2, got "
                                  f"{self.classes!r}")
        if not (isinstance(self.margin_quantile, (int, float))
                and 0 <= self.margin_quantile < 1):
            raise TrainschedError(f"teacher-student: margin_quantile must be in [0, 1), got "
                                  f"{self.margin_quantile!r}")
        if not is_int(self.seed):
            raise TrainschedError(f"teacher-student: seed must be a whole number, got "
                                  f"{self.seed!r}")

    def to_json(self) -> dict[str, Any]:
        return {"task": self.name, **asdict(self)}

    def describe(self) -> str:
        """One line naming the task and its sizes (for reports and error messages)."""
        norm = ", batch norm" if self.batch_norm else ""
        return (f"teacher-student ({self.input_dim} inputs, {self.classes} classes, student "
                f"hidden {self.student_hidden}{norm}, seed {self.seed})")

    # --- inside the workers (torch) --------------------------------------------------------

    def data(self) -> TaskData:
        """The training and held-out sets, the same in every process for the same fields."""
        import torch

        gen = torch.Generator().manual_seed(self.seed)
        w1 = torch.randn(self.input_dim, self.teacher_hidden, generator=gen)
        w2 = torch.randn(self.teacher_hidden, self.classes, generator=gen)
        w1 /= math.sqrt(self.input_dim)
        w2 /= math.sqrt(self.teacher_hidden)
        wanted = self.train_samples + self.test_samples
        kept_x, kept_y, have = [], [], 0
        while have < wanted:  # draw in rounds until enough inputs clear the margin
            x = torch.randn(2 * wanted, self.input_dim, generator=gen)
            scores = torch.tanh(x @ w1) @ w2
            top = scores.topk(2, dim=1).values
            gap = top[:, 0] - top[:, 1]
            keep = gap > torch.quantile(gap, self.margin_quantile) if self.margin_quantile \
                else torch.ones_like(gap, dtype=torch.bool)
            kept_x.append(x[keep])
            kept_y.append(scores[keep].argmax(dim=1))
            have += int(keep.sum())
        x_all = torch.cat(kept_x)[:wanted].contiguous()
        y_all = torch.cat(kept_y)[:wanted].contiguous()
        n = self.train_samples
        return TaskData(x_train=x_all[:n], y_train=y_all[:n], x_test=x_all[n:], y_test=y_all[n:])

    def student(self) -> Any:
        """A fresh student network, its weights drawn from ``seed`` (the same on every rank)."""
        import torch
        from torch import nn

        torch.manual_seed(self.seed + 1)
        h = self.student_hidden
        layers: list[nn.Module] = [nn.Linear(self.input_dim, h)]
        if self.batch_norm:
            layers.append(nn.BatchNorm1d(h))
        layers += [nn.ReLU(), nn.Linear(h, h), nn.ReLU(), nn.Linear(h, self.classes)]
        return nn.Sequential(*layers)

    def stream_indices(self, start: int, count: int) -> Any:
        """Training-set indices of global samples ``start .. start + count - 1`` of the stream
        (a fresh permutation of the training set per epoch, seeded by ``seed`` and the epoch)."""
        return stream_indices(self.seed, self.train_samples, start, count)

    @staticmethod
    def forward(model: Any, inputs: Any) -> Any:
        """The model's scores of ``inputs`` (batch x classes)."""
        return model(inputs)

    @staticmethod
    def loss(outputs: Any, labels: Any) -> Any:
        import torch.nn.functional as F

        return F.cross_entropy(outputs, labels)

    def evaluate(self, model: Any, data: TaskData) -> tuple[float, float]:
        """Held-out loss and accuracy of ``model`` (in the mode the caller set), one batch."""
        out = self.forward(model, data.x_test)
        loss = float(self.loss(out, data.y_test))
        return loss, float((out.argmax(dim=1) == data.y_test).float().mean())


def stream_indices(seed: int, n: int, start: int, count: int) -> Any:
    """Indices into a training set of ``n`` samples of the global samples ``start .. start +
    count - 1`` of a task's stream: the set read in a fresh permutation per epoch, seeded by
    ``seed`` and the epoch."""
    import torch

    out, pos = [], start
    while pos < start + count:
        epoch, offset = divmod(pos, n)
        take = min(n - offset, start + count - pos)
        gen = torch.Generator().manual_seed(seed * 1_000_003 + epoch + 7)
        out.append(torch.randperm(n, generator=gen)[offset:offset + take])
        pos += take
    return torch.cat(out)


@dataclass(frozen=True, kw_only=True)
class ZooTask:
    """Zoo model ``model`` (a zoo name or ``file.py:function``) on data generated from
    ``seed`` (module docstring): ``classes`` prototype classes, or token ids of the Markov
    chain, ``noise`` the prototypes' noise, ``train_samples`` + ``test_samples`` samples.
    ``image_size`` and ``seq_len`` are the zoo's input sizes (default: the zoo's)."""

    model: str
    image_size: int | None = None
    seq_len: int | None = None
    classes: int = 10
    noise: float = 2.0
    train_samples: int = 2048
    test_samples: int = 512
    seed: int = 0

    name: ClassVar[str] = "zoo"
    #: Held-out samples evaluated per forward pass.
    EVAL_BATCH: ClassVar[int] = 64

    def __post_init__(self) -> None:
        if not (isinstance(self.model, str) and self.model.strip()):
            raise TrainschedError(f"zoo task: model must be a zoo model's name or "
                                  f"file.py:function, got {self.model!r}")
        for field in ("train_samples", "test_samples"):
            value = getattr(self, field)
            if not is_int(value) or value < 1:
                raise TrainschedError(f"zoo task: {field} must be a whole number >= 1, got "
                                      f"{value!r}")
        for field in ("image_size", "seq_len"):
            value = getattr(self, field)
            if value is not None and (not is_int(value) or value < 1):
                raise TrainschedError(f"zoo task: {field} must be a whole number >= 1, got "
                                      f"{value!r}")
        if not is_int(self.classes) or self.classes < 2:
            raise TrainschedError(f"zoo task: classes must be a whole number >= 2, got "
                                  f"{self.classes!r}")
        if not (isinstance(self.noise, (int, float)) and not isinstance(self.noise, bool)
                and math.isfinite(self.noise) and self.noise >= 0):
            raise TrainschedError(f"zoo task: noise must be a finite number >= 0, got "
                                  f"{self.noise!r}")
        if not is_int(self.seed):
            raise TrainschedError(f"zoo task: seed must be a whole number, got {self.seed!r}")

    def to_json(self) -> dict[str, Any]:
        return {"task": self.name, **asdict(self)}

    def describe(self) -> str:
        """One line naming the model and the data (for reports and error messages)."""
        sizes = "".join(f", {label} {value}" for label, value in (
            ("image size", self.image_size), ("sequence length", self.seq_len))
            if value is not None)
        return (f"{self.model} on synthetic data ({self.classes} classes or tokens, noise "
                f"{self.noise:g}{sizes}, seed {self.seed})")

    # --- inside the workers (torch) --------------------------------------------------------

    def _build(self) -> Any:
        from trainsched.capture.zoo import build

        one = None if ".py:" in self.model else 1  # a model file sizes its own batch
        return build(self.model, batch_size=one, image_size=self.image_size,
                     seq_len=self.seq_len, seed=self.seed)

    def student(self) -> Any:
        """The zoo model with its weights drawn from ``seed`` (the same on every rank)."""
        return self._build().model

    def _example(self) -> Any:
        """The model's one input tensor (batch 1), checked to give scores the task can use."""
        import torch

        zoo = self._build()
        tensors = [*zoo.args, *zoo.kwargs.values()]
        if len(tensors) != 1 or not isinstance(tensors[0], torch.Tensor):
            raise TrainschedError(f"the sync runtime feeds a model one input tensor; "
                                  f"{self.model} takes {len(tensors)} inputs: give a model of "
                                  f"one input")
        example = tensors[0]
        token_ids = not example.is_floating_point()
        zoo.model.eval()
        try:
            with torch.no_grad():
                out = self.forward(zoo.model, example)
        except Exception as exc:
            raise TrainschedError(f"{self.model} failed on its input {tuple(example.shape)} "
                                  f"({type(exc).__name__}: {exc}); the sync runtime cannot "
                                  f"train it at these sizes") from None
        want = 3 if token_ids else 2
        if not isinstance(out, torch.Tensor) or out.dim() != want:
            shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            kind = ("token ids, so its output must be scores per token (batch x tokens x "
                    "vocabulary)" if token_ids else "a floating input, so its output must be "
                    "class scores (batch x classes)")
            raise TrainschedError(f"{self.model} takes {kind}, got {shape}; the sync runtime "
                                  f"cannot train it")
        if out.shape[-1] < self.classes:
            raise TrainschedError(f"{self.model} scores {out.shape[-1]} classes; the task "
                                  f"uses {self.classes}: give classes <= {out.shape[-1]}")
        return example

    def check(self) -> None:
        """Refuse a model the sync runtime cannot train (builds and runs it once; torch)."""
        self._example()

    def data(self) -> TaskData:
        """The training and held-out sets, the same in every process for the same fields."""
        import torch

        example = self._example()
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + 11)
        total = self.train_samples + self.test_samples
        if not example.is_floating_point():
            tokens = _markov_tokens(gen, self.classes, total, example.shape[1] + 1)
            x, y = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
            n = self.train_samples
            return TaskData(x_train=x[:n], y_train=y[:n], x_test=x[n:], y_test=y[n:])
        prototypes = _prototypes(gen, self.classes, tuple(example.shape[1:]))
        labels = torch.randint(self.classes, (total,), generator=gen)
        base = self.seed * (1 << 32)
        train = _Prototyped(prototypes, labels[:self.train_samples], self.noise, base)
        test = _Prototyped(prototypes, labels[self.train_samples:], self.noise, base + (1 << 31))
        return TaskData(x_train=train, y_train=train.labels, x_test=test, y_test=test.labels)

    def stream_indices(self, start: int, count: int) -> Any:
        """As :meth:`TeacherStudent.stream_indices`."""
        return stream_indices(self.seed, self.train_samples, start, count)

    @staticmethod
    def forward(model: Any, inputs: Any) -> Any:
        """The model's scores of ``inputs``: its output, or the output's ``logits``."""
        out = model(inputs)
        logits = getattr(out, "logits", None)
        return out if logits is None else logits

    @staticmethod
    def loss(outputs: Any, labels: Any) -> Any:
        """Cross-entropy over every scored position (a sample, or each token of one)."""
        import torch.nn.functional as F

        return F.cross_entropy(outputs.reshape(-1, outputs.shape[-1]), labels.reshape(-1))

    def evaluate(self, model: Any, data: TaskData) -> tuple[float, float]:
        """Held-out loss and accuracy (per token, for token ids) of ``model`` (in the mode the
        caller set), :attr:`EVAL_BATCH` samples per forward pass."""
        loss_sum, right, count = 0.0, 0, 0
        size = len(data.y_test)
        for lo in range(0, size, self.EVAL_BATCH):
            hi = min(size, lo + self.EVAL_BATCH)
            out = self.forward(model, data.x_test[lo:hi])
            labels = data.y_test[lo:hi]
            loss_sum += float(self.loss(out, labels)) * labels.numel()
            right += int((out.argmax(dim=-1) == labels).sum())
            count += labels.numel()
        return loss_sum / count, right / count


class _Prototyped:
    """Samples ``prototypes[labels[i]] + noise x N(0, 1)``, the noise of sample ``i`` drawn
    from seed ``base + i`` when the sample is read (indexed by a tensor of indices or a
    slice), so any process reads the same sample without holding the set."""

    def __init__(self, prototypes: Any, labels: Any, noise: float, base: int) -> None:
        self.prototypes, self.labels, self.noise, self.base = prototypes, labels, noise, base

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: Any) -> Any:
        import torch

        rows = torch.arange(len(self.labels))[index]
        out = self.prototypes[self.labels[rows]].clone()
        gen = torch.Generator()
        shape = self.prototypes.shape[1:]
        for k, i in enumerate(rows.tolist()):
            gen.manual_seed(self.base + i)
            out[k] += self.noise * torch.randn(shape, generator=gen)
        return out


def _prototypes(gen: Any, classes: int, shape: tuple[int, ...]) -> Any:
    """One prototype per class, of ``shape``, with unit spread: Gaussian for a vector; for an
    image (channels x height x width) a random 4 x 4 pattern per channel, upsampled."""
    import torch
    import torch.nn.functional as F

    if len(shape) == 3:
        small = torch.randn(classes, shape[0], 4, 4, generator=gen)
        protos = F.interpolate(small, size=shape[1:], mode="bilinear", align_corners=False)
    else:
        protos = torch.randn(classes, *shape, generator=gen)
    return protos / protos.std()


def _markov_tokens(gen: Any, tokens: int, rows: int, length: int) -> Any:
    """``rows`` sequences of ``length`` token ids below ``tokens``: each starts at a random
    token and moves to one of its two successors (drawn once) at random."""
    import torch

    successors = torch.randint(tokens, (tokens, 2), generator=gen)
    out = torch.empty(rows, length, dtype=torch.int64)
    out[:, 0] = torch.randint(tokens, (rows,), generator=gen)
    coins = torch.randint(2, (rows, length - 1), generator=gen)
    for i in range(length - 1):
        out[:, i + 1] = successors[out[:, i], coins[:, i]]
    return out


#: A task the sync runtime trains.
Task = TeacherStudent | ZooTask

#: Built-in task name -> its class (built from keyword fields): the tasks named on the command
#: line in place of a model.
TASKS: Registry[type] = Registry("task", "tasks")
TASKS.register("teacher-student", TeacherStudent)

#: Every task class by the ``task`` tag its ``to_json`` writes.
TASK_TYPES: Registry[type] = Registry("task type", "task types")
TASK_TYPES.register(TeacherStudent.name, TeacherStudent)
TASK_TYPES.register(ZooTask.name, ZooTask)


def task_for(name: str, *, image_size: int | None = None, seq_len: int | None = None,
             seed: int = 0) -> Task:
    """The task the sync runtime trains for ``name``: a built-in task (:data:`TASKS`, at its
    defaults; it takes no input sizes), else a :class:`ZooTask` of the zoo model or
    ``file.py:function`` ``name`` at those input sizes."""
    if isinstance(name, str) and name.strip().lower() in TASKS:
        given = [f for f, v in (("image_size", image_size), ("seq_len", seq_len))
                 if v is not None]
        if given:
            raise TrainschedError(f"{given[0]} applies to zoo models; the built-in task "
                                  f"{name!r} makes its own inputs: drop it")
        return TASKS.lookup(name)(seed=seed)
    return ZooTask(model=name, image_size=image_size, seq_len=seq_len, seed=seed)


def task_from_json(data: dict[str, Any]) -> Task:
    """The task written by ``to_json``."""
    fields = dict(data)
    cls = TASK_TYPES.lookup(str(fields.pop("task", "")))
    return cls(**fields)
