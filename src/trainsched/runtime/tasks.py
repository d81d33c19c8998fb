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
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

from trainsched.errors import TrainschedError
from trainsched.registry import Registry
from trainsched.units import is_int

__all__ = ["TASKS", "TaskData", "TeacherStudent", "task_from_json"]


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
        import torch

        n = self.train_samples
        out, pos = [], start
        while pos < start + count:
            epoch, offset = divmod(pos, n)
            take = min(n - offset, start + count - pos)
            gen = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch + 7)
            out.append(torch.randperm(n, generator=gen)[offset:offset + take])
            pos += take
        return torch.cat(out)

    @staticmethod
    def loss(outputs: Any, labels: Any) -> Any:
        import torch.nn.functional as F

        return F.cross_entropy(outputs, labels)


#: Built-in task name -> its class (built from keyword fields).
TASKS: Registry[type] = Registry("task", "tasks")
TASKS.register("teacher-student", TeacherStudent)


def task_from_json(data: dict[str, Any]) -> TeacherStudent:
    """The task written by ``to_json``."""
    fields = dict(data)
    cls = TASKS.lookup(str(fields.pop("task", "")))
    return cls(**fields)
