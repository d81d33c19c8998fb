"""Update units: each parameter's own optimizer, stepped as soon as its gradient is reduced.

Every trainable parameter has an optimizer of its own (the user's class and options). With
``update="partition"`` (elementwise optimizers only, :data:`ELEMENTWISE`, where it is the same
computation) every part of a split, contiguous parameter is stepped alone, through a detached
view and an optimizer of its own, as soon as that part's collective is done; a switch of plan
folds those optimizers' state back into the parameter's first (:meth:`Updates.fold`).

The whole parameters one collective reduces together (a bucket, a fused group) are stepped
together, by one optimizer over all of them (a *group*), when the optimizer is an elementwise
class: one optimizer step per collective instead of one per parameter, the same computation
(the group's optimizer shares each parameter's state dict with the parameter's own, so
:attr:`Updates.whole` always holds the whole state).

A *unit* is what one optimizer step covers: a parameter, one part of it, or a group. Units
wait in a heap by layer, so the dispatcher steps the layer the next forward needs first;
without the policy's ``cross_barrier`` they wait until every collective of the step is done.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from trainsched.errors import TrainschedError
from trainsched.runtime.data_parallel.layout import Layout, Trainable

__all__ = ["ELEMENTWISE", "Unit", "Updates", "make_optimizer"]

#: Optimizers whose step is elementwise given per-element state: stepping a slice of a
#: parameter equals stepping the whole parameter on that slice (bit for bit; tested).
ELEMENTWISE = (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW, torch.optim.Adagrad,
               torch.optim.RMSprop, torch.optim.Adamax, torch.optim.NAdam)


class Unit(NamedTuple):
    """One optimizer step waiting: ``layer`` first (the heap's order), the collective whose
    part or group it steps (-1: the whole parameter), the parameter (-1: the collective's
    group)."""

    layer: int
    collective: int
    param: int


@dataclass(frozen=True, eq=False)
class _Slice:
    """Elements ``lo:hi`` of parameter ``param``, stepped by ``optimizer`` through ``view``."""

    view: torch.Tensor
    optimizer: torch.optim.Optimizer
    param: int
    lo: int
    hi: int


@dataclass(frozen=True, eq=False)
class _Group:
    """The whole parameters ``params`` of one collective, stepped together by ``optimizer``;
    ``layer``: the lowest of their layers."""

    params: tuple[int, ...]
    optimizer: torch.optim.Optimizer
    layer: int


def make_optimizer(optimizer: Any, kwargs: dict | None, params: list[torch.Tensor],
                   what: str) -> torch.optim.Optimizer:
    """The user's optimizer over ``params`` (``what`` names them in errors): a class built
    with ``kwargs``, or a factory called with ``params``."""
    if isinstance(optimizer, type) and issubclass(optimizer, torch.optim.Optimizer):
        if issubclass(optimizer, torch.optim.LBFGS):
            raise TrainschedError("optimizers that need a closure (LBFGS) cannot be "
                                  "stepped by ScheduledDataParallel (it steps them itself, "
                                  "without a closure); use SGD, Adam or similar")
        try:
            opt = optimizer(params, **(kwargs or {}))
        except (TypeError, ValueError) as exc:
            raise TrainschedError(f"optimizer {optimizer.__name__}: {exc}") from None
    elif callable(optimizer):
        if kwargs:
            raise TrainschedError("optimizer_kwargs go with an optimizer class, not with "
                                  "a factory function")
        opt = optimizer(params)
    else:
        raise TrainschedError(f"optimizer must be an optimizer class or a factory, got "
                              f"{optimizer!r}")
    if not isinstance(opt, torch.optim.Optimizer):
        raise TrainschedError(f"the optimizer factory returned {type(opt).__name__} for "
                              f"{what}, not a torch.optim.Optimizer")
    return opt


class Updates:
    """The optimizers of ``trainable`` (``optimizer`` with ``kwargs``, per parameter; per
    part too with ``update="partition"``) and the units waiting for their step."""

    def __init__(self, trainable: Trainable, optimizer: Any, kwargs: dict | None,
                 update: str) -> None:
        self.trainable = trainable
        self._spec = (optimizer, kwargs)
        self.whole = [make_optimizer(optimizer, kwargs, [p], f"parameter {n!r}")
                      for n, p in zip(trainable.names, trainable.tensors, strict=True)]
        elementwise = all(type(o) in ELEMENTWISE for o in self.whole)
        if update == "partition" and not elementwise:
            odd = next(type(o).__name__ for o in self.whole if type(o) not in ELEMENTWISE)
            raise TrainschedError(f"update='partition' steps slices of a parameter, which is "
                                  f"only exact for elementwise optimizers "
                                  f"({', '.join(c.__name__ for c in ELEMENTWISE)}), not {odd}; "
                                  f"use update='parameter'")
        self.mode = "partition" if update != "parameter" and elementwise else "parameter"
        # parameters of one collective are stepped by one optimizer of the user's class
        self._groupable = elementwise and isinstance(optimizer, type)
        self.slices: dict[int, _Slice] = {}  # collective -> the part it steps alone
        self.groups: dict[int, _Group] = {}  # collective -> its whole parameters, together
        self.units = [1] * len(trainable)  # units per parameter in the current plan
        self._left = list(self.units)  # units per parameter not yet stepped this step
        self._heap: list[Unit] = []
        self._deferred: list[Unit] = []  # without cross_barrier: until the step is reduced

    # -- optimizers ----------------------------------------------------------------------------

    def build(self, layout: Layout) -> None:
        """Units for a new plan: with ``update="partition"`` every part of a split, contiguous
        parameter gets an optimizer that starts from that part of the parameter optimizer's
        hyperparameters and state (``set_lr`` may have run, a switch may have folded the last
        plan's parts back into it)."""
        self.slices = {}
        self.units = [1] * len(self.trainable)
        if self.mode == "partition":
            optimizer, kwargs = self._spec
            for k, cs in layout.holders.items():
                p = self.trainable.tensors[k]
                if len(cs) < 2 or not p.is_contiguous():
                    continue
                self.units[k] = len(cs)
                whole = self.whole[k]
                state = whole.state.get(p, {})
                for c in cs:
                    (_, lo, hi), = layout.parts[c]
                    view = p.detach().view(-1)[lo:hi]
                    opt = make_optimizer(optimizer, kwargs, [view],
                                         f"partition {layout.names[c]!r}")
                    for key, value in whole.param_groups[0].items():
                        if key != "params":
                            opt.param_groups[0][key] = value
                    if state:
                        opt.state[view] = {key: _slice_state(value, p, lo, hi)
                                           for key, value in state.items()}  # fmt: skip
                    self.slices[c] = _Slice(view, opt, k, lo, hi)
        self._build_groups(layout)
        self._left = list(self.units)

    def _build_groups(self, layout: Layout) -> None:
        """A group per collective holding two or more whole parameters that no other
        collective holds: one optimizer over them, with the parameters' hyperparameters and
        their very state dicts (so both optimizers see every update of the state)."""
        self.groups = {}
        if not self._groupable:
            return
        optimizer, kwargs = self._spec
        for c, row in enumerate(layout.parts):
            members = tuple(k for k, _, _ in row
                            if self.units[k] == 1 and layout.holders[k] == [c])
            if len(members) < 2:
                continue
            tensors = [self.trainable.tensors[k] for k in members]
            opt = make_optimizer(optimizer, kwargs, tensors, f"collective {layout.names[c]!r}")
            for key, value in self.whole[members[0]].param_groups[0].items():
                if key != "params":
                    opt.param_groups[0][key] = value
            for k, p in zip(members, tensors, strict=True):
                opt.state[p] = self.whole[k].state[p]  # the same dict: one state
            self.groups[c] = _Group(members, opt, min(layout.layer[k] for k in members))

    def fold(self) -> None:
        """Copy every part's optimizer state into its parameter's optimizer (only between
        steps: nothing may be updating)."""
        by_param: dict[int, list[_Slice]] = {}
        for part in self.slices.values():
            by_param.setdefault(part.param, []).append(part)
        for k, parts in by_param.items():
            p = self.trainable.tensors[k]
            whole: dict[str, Any] = {}
            for part in parts:
                for key, value in part.optimizer.state.get(part.view, {}).items():
                    if torch.is_tensor(value) and value.shape == part.view.shape:
                        if key not in whole:
                            whole[key] = torch.empty(p.shape, dtype=value.dtype)
                        whole[key].view(-1)[part.lo:part.hi].copy_(value)
                    elif key not in whole:  # per-parameter scalars (Adam's step): all equal
                        whole[key] = value.clone() if torch.is_tensor(value) else value
            if whole:
                self.whole[k].state[p] = whole

    def every_optimizer(self) -> tuple[torch.optim.Optimizer, ...]:
        """The parameters' optimizers, then the parts' and the groups'."""
        return (*self.whole, *(part.optimizer for part in self.slices.values()),
                *(group.optimizer for group in self.groups.values()))

    def params_of(self, unit: Unit) -> tuple[int, ...]:
        """The parameters ``unit`` steps (a group's, or its one parameter)."""
        return self.groups[unit.collective].params if unit.param < 0 else (unit.param,)

    # -- the units -------------------------------------------------------------------------------

    def due(self, collective: int, whole: Iterable[int], layer: Mapping[int, int]) -> list[Unit]:
        """The units ``collective``'s completion makes ready: its part, if stepped alone, and
        every parameter of ``whole`` (all its collectives done) stepped whole."""
        units = []
        part = self.slices.get(collective)
        if part is not None:
            units.append(Unit(layer[part.param], collective, part.param))
        group = self.groups.get(collective)
        if group is not None:
            units.append(Unit(group.layer, collective, -1))
        grouped = group.params if group is not None else ()
        units += [Unit(layer[k], -1, k) for k in whole
                  if self.units[k] == 1 and k not in grouped]
        return units

    def queue(self, units: list[Unit], *, cross_barrier: bool, step_reduced: bool) -> None:
        """Queue ``units``: now with ``cross_barrier``, else once the step is reduced."""
        if cross_barrier:
            for unit in units:
                heapq.heappush(self._heap, unit)
            return
        self._deferred += units
        if step_reduced:
            for unit in self._deferred:
                heapq.heappush(self._heap, unit)
            self._deferred.clear()

    def __bool__(self) -> bool:
        """Units are waiting for their step."""
        return bool(self._heap)

    def pop(self) -> Unit:
        """The waiting unit of the lowest layer."""
        return heapq.heappop(self._heap)

    def step(self, unit: Unit, grads: list[torch.Tensor | None]) -> None:
        """Step ``unit``'s optimizer with ``grads`` (per parameter, the reduced gradient)."""
        tensors = self.trainable.tensors
        if unit.param < 0:
            group = self.groups[unit.collective]
            for k in group.params:
                tensors[k].grad = grads[k]
            group.optimizer.step()
            return
        grad = grads[unit.param]
        assert grad is not None
        if unit.collective >= 0:
            part = self.slices[unit.collective]
            part.view.grad = grad.view(-1)[part.lo:part.hi]
            part.optimizer.step()
            part.view.grad = None
        else:
            tensors[unit.param].grad = grad
            self.whole[unit.param].step()

    def finish(self, k: int) -> bool:
        """One unit of parameter ``k`` was stepped; ``True`` (and its gradient dropped) when
        that was its last this step."""
        self._left[k] -= 1
        if self._left[k]:
            return False
        self._left[k] = self.units[k]
        self.trainable.tensors[k].grad = None
        return True


def _slice_state(value: Any, p: torch.Tensor, lo: int, hi: int) -> Any:
    """Elements ``lo:hi`` of one optimizer state entry of parameter ``p`` (a copy): per-element
    tensors are sliced, anything else (Adam's step count) is copied whole."""
    if torch.is_tensor(value) and value.shape == p.shape:
        return value.detach().reshape(-1)[lo:hi].clone()
    return value.clone() if torch.is_tensor(value) else value
