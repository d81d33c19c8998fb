"""The gradients and where a plan's collectives lie in them.

- :class:`Trainable`: the wrapped module's trainable parameters, in ``named_parameters``
  order (parameter ``k`` everywhere in this package is the k-th of them).
- :class:`FirstStep` and :func:`task_table`: what the first backward pass showed (the layer
  order of forward, the ready order and times of backward); rank 0's is published through the
  store and every rank, rank 0 too, builds from the parsed message, so every rank holds the
  same numbers (JSON floats round-trip exactly).
- :class:`Layout`: one plan's collectives as slices of the flat gradients, which collectives
  hold each parameter, and their timeline tracks.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from trainsched.comm.dispatch import partition_spans
from trainsched.comm.policy import Collective, CommPolicy, Gradient
from trainsched.errors import TrainschedError
from trainsched.runtime.data_parallel.events import TaskTable
from trainsched.runtime.data_parallel.group import Peers

__all__ = ["FirstStep", "Layout", "Trainable", "owning_modules", "task_table"]


@dataclass(frozen=True, eq=False)
class Trainable:
    """The parameters that require a gradient, their names, and the module owning each (its
    path, ``"<root>"`` for the wrapped module: the parameter's layer in the timeline)."""

    names: tuple[str, ...]
    tensors: tuple[nn.Parameter, ...]
    labels: tuple[str, ...]

    @classmethod
    def of(cls, module: nn.Module) -> Trainable:
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        if not named:
            raise TrainschedError("the module has no parameter that requires a gradient")
        tensors = tuple(p for _, p in named)
        labels = [""] * len(tensors)
        for label, _, own in owning_modules(module, tensors):
            for k in own:
                labels[k] = labels[k] or label
        return cls(names=tuple(n for n, _ in named), tensors=tensors, labels=tuple(labels))

    def __len__(self) -> int:
        return len(self.tensors)

    def check_alignment(self, policy: CommPolicy) -> None:
        """A partition must cut every parameter between elements."""
        partition = getattr(policy, "partition_bytes", None)
        if partition is None:
            return
        for name, p in zip(self.names, self.tensors, strict=True):
            size = p.element_size()
            if partition % size:
                raise TrainschedError(
                    f"partition size {partition} B is not a multiple of the element size of "
                    f"parameter {name!r} ({size} B, {p.dtype}); use a multiple such as "
                    f"{max(1, partition // size) * size} B")


def owning_modules(module: nn.Module, tensors: Sequence[torch.Tensor],
                   ) -> list[tuple[str, nn.Module, list[int]]]:
    """Every module of ``module`` (shared ones at each path) that owns some of ``tensors``
    itself: its path, the module, and which of ``tensors`` (by position) it owns."""
    index = {id(p): k for k, p in enumerate(tensors)}
    found = []
    for path, m in module.named_modules(remove_duplicate=False):
        own = [index[id(p)]
               for _, p in m.named_parameters(recurse=False, remove_duplicate=False)
               if id(p) in index]  # fmt: skip
        if own:
            found.append((path or "<root>", m, own))
    return found


@dataclass(kw_only=True)
class FirstStep:
    """The first step as this rank saw it: each parameter's layer (its module's position in
    forward), and the parameters in gradient order with their ready times (seconds)."""

    layer_of: dict[int, int] = field(default_factory=dict)
    ready_log: list[int] = field(default_factory=list)
    ready_times: list[float] = field(default_factory=list)


def task_table(peers: Peers, trainable: Trainable, first: FirstStep) -> TaskTable:
    """Rank 0's layer and ready order, and when each gradient became ready in step 0 (seconds
    from the first; ``order="static"`` compiles from them), published as one JSON message,
    parsed by every rank (training thread, at the end of the first backward pass)."""
    key = "plan"
    names = trainable.names
    if peers.rank == 0:
        ready = {k: n for n, k in enumerate(first.ready_log)}
        when = dict(zip(first.ready_log, first.ready_times, strict=True))
        start = first.ready_times[0]
        late = len(first.layer_of)
        rows = [[names[k], first.layer_of.get(k, late + k), ready[k], when[k] - start]
                for k in range(len(names))]  # fmt: skip
        text = json.dumps(rows)
        peers.store.set(key, text)
    else:
        text = peers.get(peers.store, key, "the task table of rank 0")
    rows = json.loads(text)
    sizes = [p.numel() * p.element_size() for p in trainable.tensors]
    if [row[0] for row in rows] != list(names):
        raise TrainschedError("rank 0's parameters differ from this rank's")
    gradients = tuple(Gradient(name=name, size_bytes=sizes[k], layer_index=layer,
                               ready_index=ready)
                      for k, (name, layer, ready, _) in enumerate(rows))  # fmt: skip
    return TaskTable(gradients=gradients, ready_s={row[0]: row[3] for row in rows})


class Layout:
    """``policy``'s collectives ``plan`` of ``gradients`` laid over ``trainable``'s gradients:
    per collective its name, timeline track and ``parts`` (parameter, first element, end
    element); per parameter its layer and the collectives holding it (``holders``)."""

    def __init__(self, policy: CommPolicy, plan: Sequence[Collective],
                 gradients: Sequence[Gradient], trainable: Trainable) -> None:
        self.policy = policy
        self.plan = tuple(plan)
        self.param_names = trainable.names
        spans = partition_spans(gradients, plan)
        self.index = {n: k for k, n in enumerate(trainable.names)}  # parameter name -> k
        self.layer = {self.index[g.name]: g.layer_index for g in gradients}
        self.parts: list[list[tuple[int, int, int]]] = []  # per collective: (param, lo, hi)
        self.holders: dict[int, list[int]] = {}
        params = trainable.tensors
        for c, coll in enumerate(plan):
            row = []
            for name, (a, b) in spans[coll.name].items():
                k = self.index[name]
                size = params[k].element_size()
                row.append((k, a // size, b // size))
                self.holders.setdefault(k, []).append(c)
            if len(row) > 1 and len({params[k].dtype for k, _, _ in row}) > 1:
                raise TrainschedError(f"collective {coll.name!r} mixes gradient dtypes; "
                                      f"use a policy that reduces them separately")
            self.parts.append(row)
        self.names = [c.name for c in plan]
        self.position = {name: c for c, name in enumerate(self.names)}
        self.tracks = [f"comm/{trainable.names[row[0][0]]}" if len(row) == 1
                       else f"comm/{name}"
                       for row, name in zip(self.parts, self.names, strict=True)]
