"""The plan file ``trainsched.plan/1``: one JSON object per plan, exact round trip.

:func:`plan_to_json` / :func:`plan_from_json` write and read it: sorted keys, two-space indent,
``plan_from_json(plan_to_json(p)) == p`` and equal plans give equal bytes; every problem is a
:class:`TrainschedError` naming the file and the field. The document's ``strategy`` object has
a ``kind``; a composed plan (a data-parallel pipeline) will be the kind ``"composed"`` holding
its parts, which this reader refuses by name until it exists. Fields added later (a data plan's
``backprop`` and ``k``, its ``servers`` and ``server_placement``, a single plan's ``slots``)
default when a file lacks them, so older files still load; the servers are written only for a
sync policy that has them. ``predicted`` optionally keeps
what the simulator predicted for the plan (:class:`~trainsched.plan.plans.Prediction`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any

from trainsched.backprop.reorder import format_slot
from trainsched.comm.policy import CommPolicy, comm_policy
from trainsched.errors import TrainschedError
from trainsched.graph import atomic_write_text, nesting_guard, parse_json, read_text_file
from trainsched.plan.placement import Placement
from trainsched.plan.plans import (
    PLAN_KINDS,
    DataParallelPlan,
    ModelRef,
    PipelinePlan,
    PlacedPlan,
    Plan,
    Prediction,
    SinglePlan,
)
from trainsched.plan.schedule import Schedule

__all__ = ["PLAN_FORMAT", "load_plan", "plan_from_json", "plan_to_json", "read_plan_file",
           "save_plan"]

PLAN_FORMAT = "trainsched.plan/1"



def _policy_doc(policy: CommPolicy) -> dict[str, Any]:
    """The policy's constructor fields (an unlimited credit as ``"inf"``) and its class."""
    if not dataclasses.is_dataclass(policy):
        raise TrainschedError(f"comm policy {type(policy).__name__} is not a dataclass; a plan "
                              f"file stores a policy by its fields")
    fields = {}
    for f in dataclasses.fields(policy):
        value = getattr(policy, f.name)
        fields[f.name] = "inf" if value == math.inf else value
    return {"class": type(policy).__name__, "fields": fields}


def _strategy_doc(plan: Plan) -> dict[str, Any]:
    if isinstance(plan, SinglePlan):
        if plan.slots:
            return {"kind": plan.kind, "slots": [format_slot(s) for s in plan.slots]}
        return {"kind": plan.kind}
    if isinstance(plan, PlacedPlan):
        doc = {"kind": plan.kind, "num_devices": plan.placement.num_devices,
               "device_of": dict(plan.placement.device_of), "meta": dict(plan.placement.meta)}
        if plan.placement.order is not None:  # plans written before orders were stored: none
            doc["order"] = list(plan.placement.order)
        return doc
    if isinstance(plan, DataParallelPlan):
        return {"kind": plan.kind, "ranks": plan.ranks,
                "comm": {"name": plan.comm, **_policy_doc(plan.policy)},
                "algorithm": plan.algorithm, "order": plan.order, "sync": plan.sync,
                "steps": plan.steps, "startup_overlap": plan.startup_overlap,
                "backprop": plan.backprop, "k": plan.k,
                **({"servers": plan.servers, "server_placement": plan.server_placement}
                   if plan.sync_policy.uses_servers else {})}
    if isinstance(plan, PipelinePlan):
        schedule = plan.schedule
        return {"kind": plan.kind, "stages": [list(ops) for ops in plan.stages],
                "schedule_name": plan.schedule_name,
                "num_stages": schedule.num_stages,
                "num_microbatches": schedule.num_microbatches,
                "stage_to_rank": list(schedule.stage_to_rank),
                "actions": schedule.to_text().splitlines()}
    raise TrainschedError(f"not a plan: {type(plan).__name__}")


def plan_to_json(plan: Plan, prediction: Prediction | None = None) -> str:
    """The ``trainsched.plan/1`` text: sorted keys, two-space indent, byte-identical for equal
    plans; ``prediction``, when given, is kept under ``predicted``."""
    doc: dict[str, Any] = {"format": PLAN_FORMAT, "model": dataclasses.asdict(plan.model),
                           "strategy": _strategy_doc(plan)}
    if prediction is not None:
        doc["predicted"] = dataclasses.asdict(prediction)
    try:
        return json.dumps(doc, indent=2, sort_keys=True, allow_nan=False) + "\n"
    except (TypeError, ValueError) as exc:
        raise TrainschedError(f"the plan is not JSON-serialisable: {exc}") from None


class _Reader:
    """Typed access to one JSON object, errors naming ``source`` and the field's path."""

    def __init__(self, doc: Any, source: str, where: str) -> None:
        if not isinstance(doc, dict):
            raise TrainschedError(f"{source}: {where or 'the file'}: expected a JSON object, got "
                                  f"{type(doc).__name__}")
        self.doc, self.source, self.where = doc, source, where

    def path(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def fail(self, key: str, message: str) -> TrainschedError:
        return TrainschedError(f"{self.source}: {self.path(key)}: {message}")

    def only(self, *known: str) -> None:
        unknown = sorted(set(self.doc) - set(known))
        if unknown:
            raise self.fail(unknown[0], f"unknown field (known: {', '.join(known)})")

    def get(self, key: str, types: type | tuple[type, ...], default: Any = ...) -> Any:
        if key not in self.doc:
            if default is ...:
                raise TrainschedError(f"{self.source}: missing field {self.path(key)}")
            return default
        value = self.doc[key]
        if isinstance(value, bool) and bool not in (types if isinstance(types, tuple)
                                                    else (types,)):
            raise self.fail(key, f"expected {_type_names(types)}, got {value!r}")
        if not isinstance(value, types):
            raise self.fail(key, f"expected {_type_names(types)}, got {value!r}")
        return value

    def sub(self, key: str) -> _Reader:
        return _Reader(self.get(key, dict), self.source, self.path(key))


def _type_names(types: type | tuple[type, ...]) -> str:
    names = {int: "an integer", str: "a string", bool: "true or false", list: "a list",
             dict: "an object", float: "a number", type(None): "null"}
    items = types if isinstance(types, tuple) else (types,)
    return " or ".join(names.get(t, t.__name__) for t in items)


def _read_policy(r: _Reader) -> tuple[str, CommPolicy]:
    r.only("name", "class", "fields")
    name = r.get("name", str)
    fields = dict(r.get("fields", dict))
    if fields.get("credit_bytes") == "inf":
        fields["credit_bytes"] = math.inf
    try:
        policy = comm_policy(name, **fields)
    except TrainschedError as exc:
        raise TrainschedError(f"{r.source}: {r.where}: {exc}") from None
    expected = r.get("class", str)
    if type(policy).__name__ != expected:
        raise r.fail("class", f"the comm policy registered as {name!r} is a "
                              f"{type(policy).__name__}, not a {expected}; this plan was made "
                              f"with another definition of {name!r}")
    return name, policy


def _read_strategy(r: _Reader, model: ModelRef) -> Plan:
    kind = r.get("kind", str)
    if kind == "composed":
        raise r.fail("kind", "composed plans (a data-parallel pipeline) are not supported yet")
    if kind not in PLAN_KINDS:
        raise r.fail("kind", f"unknown plan kind {kind!r}; known: {', '.join(PLAN_KINDS)}")
    if kind == "single":
        r.only("kind", "slots")
        slots = r.get("slots", list, [])
        if not all(isinstance(s, str) for s in slots):
            raise r.fail("slots", "expected a list of strings (inline, overlap_backward, "
                                  "overlap_forward(j)), one per layer")
        return SinglePlan(model=model, slots=tuple(slots))
    if kind == "placed":
        r.only("kind", "num_devices", "device_of", "meta", "order")
        placement = Placement(device_of=r.get("device_of", dict),
                              num_devices=r.get("num_devices", int), meta=r.get("meta", dict, {}),
                              order=r.get("order", list, None))
        return PlacedPlan(model=model, placement=placement)
    if kind == "data":
        r.only("kind", "ranks", "comm", "algorithm", "order", "sync", "steps", "startup_overlap",
               "backprop", "k", "servers", "server_placement")
        comm, policy = _read_policy(r.sub("comm"))
        return DataParallelPlan(model=model, ranks=r.get("ranks", int), comm=comm, policy=policy,
                                algorithm=r.get("algorithm", str, "ring"),
                                order=r.get("order", str, "leader"),
                                sync=r.get("sync", str, "bsp"), steps=r.get("steps", int, 1),
                                startup_overlap=r.get("startup_overlap", bool, False),
                                backprop=r.get("backprop", str, "inorder"),
                                k=r.get("k", int, 0), servers=r.get("servers", int, 1),
                                server_placement=r.get("server_placement", str, "dedicated"))
    r.only("kind", "stages", "schedule_name", "num_stages", "num_microbatches", "stage_to_rank",
           "actions")
    actions = r.get("actions", list)
    if not all(isinstance(line, str) for line in actions):
        raise r.fail("actions", "expected a list of strings, one rank's actions each")
    schedule = Schedule.from_text("".join(f"{line}\n" for line in actions),
                                  num_stages=r.get("num_stages", int),
                                  num_microbatches=r.get("num_microbatches", int),
                                  stage_to_rank=r.get("stage_to_rank", list, None),
                                  source=f"{r.source}: {r.path('actions')}")
    return PipelinePlan(model=model, stages=tuple(r.get("stages", list)), schedule=schedule,
                        schedule_name=r.get("schedule_name", str, "custom"))


def plan_from_json(text: str, source: str = "<string>") -> Plan:
    """Parse :func:`plan_to_json`'s text; every problem names ``source`` and the field."""
    return _parse(text, source)[0]


def _parse(text: str, source: str) -> tuple[Plan, Prediction | None]:
    with nesting_guard(source):
        return _parse_doc(parse_json(text, source), source)


def _parse_doc(doc: Any, source: str) -> tuple[Plan, Prediction | None]:
    r = _Reader(doc, source, "")
    if doc.get("format") != PLAN_FORMAT:
        found = f"format {doc['format']!r}" if "format" in doc else "no 'format' field"
        raise TrainschedError(f"{source}: {found}; this reader supports {PLAN_FORMAT!r} (is this "
                              f"a plan file? trainsched compare writes them)")
    r.only("format", "model", "strategy", "predicted")
    m = r.sub("model")
    m.only("name", "fingerprint", "forward_ops", "batch_size", "image_size", "seq_len")
    try:
        model = ModelRef(name=m.get("name", str), fingerprint=m.get("fingerprint", str),
                         forward_ops=m.get("forward_ops", int),
                         batch_size=m.get("batch_size", (int, type(None)), None),
                         image_size=m.get("image_size", (int, type(None)), None),
                         seq_len=m.get("seq_len", (int, type(None)), None))
        plan = _read_strategy(r.sub("strategy"), model)
        prediction = None
        if "predicted" in doc:
            q = r.sub("predicted")
            q.only("cluster", "step_time_s", "samples_per_step")
            prediction = Prediction(cluster=q.get("cluster", str),
                                    step_time_s=q.get("step_time_s", (int, float)),
                                    samples_per_step=q.get("samples_per_step", int))
        return plan, prediction
    except TrainschedError as exc:
        message = str(exc)
        raise TrainschedError(message if message.startswith(source)
                              else f"{source}: {message}") from None


def save_plan(plan: Plan, path: str | os.PathLike[str],
              prediction: Prediction | None = None) -> None:
    """Write the plan file atomically (never a partial file)."""
    atomic_write_text(path, plan_to_json(plan, prediction))


def read_plan_file(path: str | os.PathLike[str]) -> tuple[Plan, Prediction | None]:
    """The plan in a plan file and the prediction kept with it (``None`` if none)."""
    return _parse(read_text_file(path, "plan"), str(path))


def load_plan(path: str | os.PathLike[str]) -> Plan:
    """Read a plan file written by :func:`save_plan` (or by hand, ``docs/plans.md``)."""
    return read_plan_file(path)[0]
