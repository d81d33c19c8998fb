"""The plans: what one strategy runs, as frozen data the simulator and the runtime both read.

Four kinds, one per way of running a training step:

- :class:`SinglePlan`: every op on one device.
- :class:`PlacedPlan`: ops on several devices (a :class:`~trainsched.plan.Placement`).
- :class:`DataParallelPlan`: ``ranks`` replicas; the gradients are reduced by a communication
  policy object (with its parameters), a collective algorithm and a collective order; ``sync``
  is the synchronisation protocol (BSP for now).
- :class:`PipelinePlan`: the forward ops cut into contiguous stages, a
  :class:`~trainsched.plan.Schedule` and its micro-batches.

Every plan names the model it was made for (:class:`ModelRef`: the model's name, a fingerprint
of its forward ops and the input sizes it was captured at), so a plan cannot silently be applied
to another model. :func:`plan_to_json` / :func:`plan_from_json` write and read the one file
format ``trainsched.plan/1``: sorted keys, exact round trip (``plan_from_json(plan_to_json(p))
== p``), every problem a :class:`TrainschedError` naming the file and field. The document's
``strategy`` object has a ``kind``; a composed plan (a data-parallel pipeline) will be the kind
``"composed"`` holding its parts, which this reader refuses by name until it exists.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from trainsched.comm.policy import COMM_POLICIES, CommPolicy, check_policy, comm_policy
from trainsched.costs import ALGORITHMS
from trainsched.errors import TrainschedError
from trainsched.graph import Graph, atomic_write_text, read_text_file
from trainsched.plan.placement import Placement
from trainsched.plan.schedule import Schedule
from trainsched.units import is_int

if TYPE_CHECKING:
    from trainsched.cluster import Cluster

__all__ = [
    "COLLECTIVE_ORDERS",
    "PLAN_FORMAT",
    "PLAN_KINDS",
    "SYNC_PROTOCOLS",
    "DataParallelPlan",
    "ModelRef",
    "PipelinePlan",
    "PlacedPlan",
    "Plan",
    "Prediction",
    "SinglePlan",
    "default_steps",
    "load_plan",
    "plan_from_json",
    "plan_to_json",
    "read_plan_file",
    "save_plan",
]

PLAN_FORMAT = "trainsched.plan/1"
#: The synchronisation protocols a data-parallel plan may name (more arrive with ``sync/``).
SYNC_PROTOCOLS = ("bsp",)
#: How every rank agrees on the order collectives are issued in (the runtime's ``order``):
#: rank 0 decides each step (``leader``), or an order compiled once (``static``).
COLLECTIVE_ORDERS = ("leader", "static")


@dataclass(frozen=True, kw_only=True)
class ModelRef:
    """The model a plan is for: ``name`` (a zoo name or ``file.py:function``), a
    ``fingerprint`` of its forward ops (their sorted names), their count, and the input sizes
    the runtime rebuilds it with (``None``: the model's default)."""

    name: str
    fingerprint: str
    forward_ops: int
    batch_size: int | None = None
    image_size: int | None = None
    seq_len: int | None = None

    def __post_init__(self) -> None:
        if not (isinstance(self.name, str) and self.name):
            raise TrainschedError(f"plan model: name must be a non-empty string, got "
                                  f"{self.name!r}")
        if not (isinstance(self.fingerprint, str) and self.fingerprint):
            raise TrainschedError(f"plan model: fingerprint must be a non-empty string, got "
                                  f"{self.fingerprint!r}")
        _check_count("plan model: forward_ops", self.forward_ops, 1)
        for field in ("batch_size", "image_size", "seq_len"):
            value = getattr(self, field)
            if value is not None:
                _check_count(f"plan model: {field}", value, 1)

    @classmethod
    def of(cls, graph: Graph) -> ModelRef:
        """The reference of ``graph`` (forward or training graph: only forward ops count)."""
        names = sorted(op.name for op in graph.ops if op.kind == "forward")
        if not names:
            raise TrainschedError("the graph has no forward ops; a plan needs a model graph")
        meta = graph.meta

        def size(key: str) -> int | None:
            value = meta.get(key)
            return int(value) if is_int(value) and value >= 1 else None

        return cls(name=str(meta.get("model", "graph")), fingerprint=_fingerprint(names),
                   forward_ops=len(names), batch_size=size("batch_size"),
                   image_size=size("image_size"), seq_len=size("seq_len"))

    def check(self, graph: Graph) -> None:
        """Raise unless ``graph`` is the model this reference names (same forward ops)."""
        other = ModelRef.of(graph)
        if other.fingerprint != self.fingerprint:
            raise TrainschedError(
                f"the plan was made for model {self.name!r} ({self.forward_ops} forward ops, "
                f"fingerprint {self.fingerprint}), but the graph is {other.name!r} "
                f"({other.forward_ops} forward ops, fingerprint {other.fingerprint}); make a "
                f"plan for this model (trainsched compare writes one per strategy)")


def _fingerprint(names: list[str]) -> str:
    return hashlib.sha256("\n".join(names).encode("utf-8")).hexdigest()[:16]


def _check_count(what: str, value: Any, minimum: int) -> None:
    if not (is_int(value) and value >= minimum):
        raise TrainschedError(f"{what} must be an integer >= {minimum}, got {value!r}")


@dataclass(frozen=True, kw_only=True)
class SinglePlan:
    """Every op on one device: the baseline every speedup is measured against."""

    model: ModelRef
    kind: ClassVar[str] = "single"

    @property
    def devices(self) -> int:
        return 1

    def validate(self, graph: Graph, cluster: Cluster | None = None) -> None:
        self.model.check(graph)


@dataclass(frozen=True, kw_only=True)
class PlacedPlan:
    """Ops on several devices as ``placement`` says (model parallelism)."""

    model: ModelRef
    placement: Placement
    kind: ClassVar[str] = "placed"

    def __post_init__(self) -> None:
        if not isinstance(self.placement, Placement):
            raise TrainschedError(f"placed plan: placement must be a Placement, got "
                                  f"{type(self.placement).__name__}")

    @property
    def devices(self) -> int:
        return len(set(self.placement.device_of.values()))

    def validate(self, graph: Graph, cluster: Cluster | None = None) -> None:
        self.model.check(graph)
        self.placement.validate(graph, cluster)


def default_steps(policy: CommPolicy) -> int:
    """The steps a data-parallel simulation needs for ``policy``'s steady step: 3 for a policy
    whose updates cross the iteration barrier (its gain shows only across steps), else 1."""
    return 3 if policy.cross_barrier else 1


@dataclass(frozen=True, kw_only=True)
class DataParallelPlan:
    """``ranks`` replicas of the whole step; gradients reduced as ``policy`` says.

    ``comm`` is the registered name of the policy (:data:`trainsched.comm.COMM_POLICIES`) and
    ``policy`` the object with its parameters; ``algorithm`` the collective algorithm
    (:data:`trainsched.costs.ALGORITHMS`); ``order`` how the runtime's ranks agree on the
    collective order (:data:`COLLECTIVE_ORDERS`; the simulator needs no agreement); ``sync``
    the synchronisation protocol (:data:`SYNC_PROTOCOLS`). ``steps`` and ``startup_overlap``
    set the simulation: steps replayed (the last period is the step time) and whether
    collectives in flight together overlap their start-up.
    """

    model: ModelRef
    ranks: int
    comm: str
    policy: CommPolicy
    algorithm: str = "ring"
    order: str = "leader"
    sync: str = "bsp"
    steps: int = 1
    startup_overlap: bool = False
    kind: ClassVar[str] = "data"

    def __post_init__(self) -> None:
        _check_count("data-parallel plan: ranks", self.ranks, 1)
        _check_count("data-parallel plan: steps", self.steps, 1)
        if self.comm not in COMM_POLICIES:
            raise TrainschedError(f"data-parallel plan: unknown comm policy {self.comm!r}; "
                                  f"known policies: {', '.join(COMM_POLICIES)}")
        check_policy(self.policy)
        for field, value, known in (("algorithm", self.algorithm, ALGORITHMS),
                                    ("order", self.order, COLLECTIVE_ORDERS),
                                    ("sync", self.sync, SYNC_PROTOCOLS)):
            if value not in known:
                raise TrainschedError(f"data-parallel plan: {field} must be one of "
                                      f"{', '.join(known)}, got {value!r}")
        if not isinstance(self.startup_overlap, bool):
            raise TrainschedError(f"data-parallel plan: startup_overlap must be true or false, "
                                  f"got {self.startup_overlap!r}")

    @property
    def devices(self) -> int:
        return self.ranks

    def validate(self, graph: Graph, cluster: Cluster | None = None) -> None:
        self.model.check(graph)
        if cluster is not None and self.ranks > cluster.num_devices:
            raise TrainschedError(f"the plan has {self.ranks} ranks but cluster "
                                  f"{cluster.name!r} has {cluster.num_devices} devices; use a "
                                  f"larger cluster or a plan with fewer ranks")


@dataclass(frozen=True, kw_only=True)
class PipelinePlan:
    """The forward ops cut into stages, run by ``schedule``.

    ``stages[s]`` lists the forward ops of stage ``s``, contiguous in the graph's topological
    order (each op's backward and optimizer ops go with it); :attr:`cuts` names the first op of
    every stage after the first. ``schedule`` is the per-rank action list (its ``num_stages``
    is ``len(stages)``), ``schedule_name`` the generator that made it (``custom`` for one
    written by hand).
    """

    model: ModelRef
    stages: tuple[tuple[str, ...], ...]
    schedule: Schedule
    schedule_name: str = "custom"
    kind: ClassVar[str] = "pipeline"

    def __post_init__(self) -> None:
        stages = tuple(tuple(s) for s in self.stages) \
            if isinstance(self.stages, list | tuple) and all(
                isinstance(s, list | tuple) for s in self.stages) else None
        if not stages or not all(s and all(isinstance(n, str) and n for n in s)
                                 for s in stages):
            raise TrainschedError(f"pipeline plan: stages must be a list of non-empty lists of "
                                  f"op names, got {self.stages!r}")
        object.__setattr__(self, "stages", stages)
        if not isinstance(self.schedule, Schedule):
            raise TrainschedError(f"pipeline plan: schedule must be a Schedule, got "
                                  f"{type(self.schedule).__name__}")
        if self.schedule.num_stages != len(stages):
            raise TrainschedError(
                f"pipeline plan: the schedule is for {self.schedule.num_stages} stages but the "
                f"plan cuts the model into {len(stages)}; give one op list per stage")
        if not (isinstance(self.schedule_name, str) and self.schedule_name):
            raise TrainschedError(f"pipeline plan: schedule_name must be a non-empty string, "
                                  f"got {self.schedule_name!r}")

    @property
    def cuts(self) -> tuple[str, ...]:
        return tuple(ops[0] for ops in self.stages[1:])

    @property
    def num_stages(self) -> int:
        return self.schedule.num_stages

    @property
    def num_microbatches(self) -> int:
        return self.schedule.num_microbatches

    @property
    def devices(self) -> int:
        return self.schedule.num_ranks

    def validate(self, graph: Graph, cluster: Cluster | None = None) -> None:
        self.model.check(graph)
        order = tuple(n for n in graph.topological_order() if graph.op(n).kind == "forward")
        listed = [n for ops in self.stages for n in ops]
        if tuple(listed) != order:
            where = {name: k for k, name in enumerate(order)}
            unknown = [n for n in listed if n not in where]
            if unknown:
                raise TrainschedError(f"pipeline plan: stage op {unknown[0]!r} is not a forward "
                                      f"op of the graph")
            missing = [n for n in order if n not in set(listed)]
            what = (f"forward op {missing[0]!r} is in no stage" if missing else
                    "the stages do not list the forward ops once each, in the graph's order")
            raise TrainschedError(f"pipeline plan: {what}; cut the graph's forward ops into "
                                  f"contiguous stages")
        self.schedule.validate()
        if cluster is not None and self.schedule.num_ranks > cluster.num_devices:
            raise TrainschedError(f"the pipeline plan runs on {self.schedule.num_ranks} ranks "
                                  f"but cluster {cluster.name!r} has {cluster.num_devices} "
                                  f"devices; use a larger cluster or fewer stages")


Plan = SinglePlan | PlacedPlan | DataParallelPlan | PipelinePlan
PLAN_KINDS: Mapping[str, type] = {cls.kind: cls for cls in
                                  (SinglePlan, PlacedPlan, DataParallelPlan, PipelinePlan)}


@dataclass(frozen=True, kw_only=True)
class Prediction:
    """What the simulator predicted for a plan, kept beside it in the plan file so that a run
    of the plan can print measured beside predicted: the cluster it was simulated on, the step
    time and the samples one step processes."""

    cluster: str
    step_time_s: float
    samples_per_step: int

    def __post_init__(self) -> None:
        if not (isinstance(self.cluster, str) and self.cluster):
            raise TrainschedError(f"prediction: cluster must be a name, got {self.cluster!r}")
        value = self.step_time_s
        if isinstance(value, bool) or not isinstance(value, int | float) or \
                not 0 <= value < math.inf:
            raise TrainschedError(f"prediction: step_time_s must be seconds >= 0, got {value!r}")
        _check_count("prediction: samples_per_step", self.samples_per_step, 1)


# --- JSON ----------------------------------------------------------------------------------------


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
        return {"kind": plan.kind}
    if isinstance(plan, PlacedPlan):
        return {"kind": plan.kind, "num_devices": plan.placement.num_devices,
                "device_of": dict(plan.placement.device_of), "meta": dict(plan.placement.meta)}
    if isinstance(plan, DataParallelPlan):
        return {"kind": plan.kind, "ranks": plan.ranks,
                "comm": {"name": plan.comm, **_policy_doc(plan.policy)},
                "algorithm": plan.algorithm, "order": plan.order, "sync": plan.sync,
                "steps": plan.steps, "startup_overlap": plan.startup_overlap}
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
        r.only("kind")
        return SinglePlan(model=model)
    if kind == "placed":
        r.only("kind", "num_devices", "device_of", "meta")
        placement = Placement(device_of=r.get("device_of", dict),
                              num_devices=r.get("num_devices", int), meta=r.get("meta", dict, {}))
        return PlacedPlan(model=model, placement=placement)
    if kind == "data":
        r.only("kind", "ranks", "comm", "algorithm", "order", "sync", "steps", "startup_overlap")
        comm, policy = _read_policy(r.sub("comm"))
        return DataParallelPlan(model=model, ranks=r.get("ranks", int), comm=comm, policy=policy,
                                algorithm=r.get("algorithm", str, "ring"),
                                order=r.get("order", str, "leader"),
                                sync=r.get("sync", str, "bsp"), steps=r.get("steps", int, 1),
                                startup_overlap=r.get("startup_overlap", bool, False))
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
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        hint = " (the text ends early: truncated?)" if exc.pos >= len(text.rstrip()) else ""
        raise TrainschedError(f"{source}: malformed JSON at line {exc.lineno}, column "
                              f"{exc.colno}: {exc.msg}{hint}") from None
    except RecursionError:
        raise TrainschedError(f"{source}: JSON nested too deeply") from None
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
