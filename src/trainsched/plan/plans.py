"""The plans: what one strategy runs, as frozen data the simulator and the runtime both read.

Four kinds, one per way of running a training step:

- :class:`SinglePlan`: every op on one device; ``slots`` say where each layer's weight gradient
  runs (in program order, or on a second stream: out-of-order backprop on one device).
- :class:`PlacedPlan`: ops on several devices (a :class:`~trainsched.plan.Placement`).
- :class:`DataParallelPlan`: ``ranks`` replicas; the gradients are reduced by a communication
  policy object (with its parameters), a collective algorithm and a collective order; ``sync``
  is the sync policy's text (``bsp``, ``bsp:0.125,asp:0.875``: :mod:`trainsched.sync.policy`);
  ``backprop`` and ``k`` the backprop order (in-order, or reverse-first-k:
  :mod:`trainsched.backprop.reorder`).
- :class:`PipelinePlan`: the forward ops cut into contiguous stages, a
  :class:`~trainsched.plan.Schedule` and its micro-batches.

Every plan names the model it was made for (:class:`ModelRef`: the model's name, a fingerprint
of its forward ops and the input sizes it was captured at), so a plan cannot silently be applied
to another model. The plan file is :mod:`trainsched.plan.files`.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import operator
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from trainsched.backprop.reorder import BACKPROP_ORDERS, Slot, check_k, check_slots, parse_slot
from trainsched.comm.policy import COMM_POLICIES, CommPolicy, check_policy
from trainsched.costs import ALGORITHMS
from trainsched.errors import TrainschedError
from trainsched.graph import Graph
from trainsched.plan.placement import Placement
from trainsched.plan.schedule import Schedule
from trainsched.sync.policy import SyncPolicy, format_policy, parse_policy
from trainsched.sync.protocols import PROTOCOLS
from trainsched.units import is_int

if TYPE_CHECKING:
    from trainsched.cluster import Cluster

__all__ = [
    "COLLECTIVE_ORDERS",
    "PLAN_KINDS",
    "SERVER_PLACEMENTS",
    "SYNC_PROTOCOLS",
    "DataParallelPlan",
    "ModelRef",
    "PipelinePlan",
    "PlacedPlan",
    "Plan",
    "Prediction",
    "SinglePlan",
    "default_steps",
]

#: The synchronisation protocols a data-parallel plan's sync policy may name (their text forms
#: are :func:`trainsched.sync.format_protocol`'s).
SYNC_PROTOCOLS = tuple(PROTOCOLS)
#: How every rank agrees on the order collectives are issued in (the runtime's ``order``):
#: rank 0 decides each step (``leader``), or an order compiled once (``static``).
COLLECTIVE_ORDERS = ("leader", "static")
#: Where a data-parallel plan's parameter servers run: on hosts of their own behind the
#: cluster's parameter-server link (``dedicated``), or shard j on worker j's host, sharing its
#: network link (``colocated``).
SERVER_PLACEMENTS = ("dedicated", "colocated")


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
        # the names of the forward ops, picked out in C (a million-op graph)
        names = sorted(itertools.compress(graph.column("name"), map(
            operator.eq, graph.column("kind"), itertools.repeat("forward"))))
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
    """Every op on one device: the baseline every speedup is measured against.

    ``slots`` holds one :class:`~trainsched.backprop.reorder.Slot` per layer with a weight
    gradient (layer order), or nothing: every dW inline, in program order. Strings
    (``"overlap_forward(3)"``) are read as slots."""

    model: ModelRef
    slots: tuple[Slot, ...] = ()
    kind: ClassVar[str] = "single"

    def __post_init__(self) -> None:
        if not isinstance(self.slots, list | tuple):
            raise TrainschedError(f"single plan: slots must be a list of dW slots, got "
                                  f"{self.slots!r}")
        object.__setattr__(self, "slots", tuple(
            s if isinstance(s, Slot) else parse_slot(s) for s in self.slots))

    @property
    def devices(self) -> int:
        return 1

    def validate(self, graph: Graph, cluster: Cluster | None = None) -> None:
        self.model.check(graph)
        if self.slots:
            check_slots(graph, self.slots)


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
    the sync policy as text (``bsp``, ``bsp:0.125,asp:0.875``, ``bsp;straggler(exclude)``),
    checked and kept in its canonical form (:func:`trainsched.sync.format_policy`; the object
    is :attr:`sync_policy`). ``servers`` and ``server_placement``: the parameter servers of a
    policy with a server phase (ASP, SSP, k-of-N, or ``straggler(relax)``): how many (one shard
    of the parameters each) and where (:data:`SERVER_PLACEMENTS`; ``colocated`` puts shard j on
    worker j's host, so at most ``ranks`` of them); a policy without one keeps the defaults (1,
    ``dedicated``). ``steps`` and ``startup_overlap``
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
    backprop: str = "inorder"
    k: int = 0
    servers: int = 1
    server_placement: str = "dedicated"
    kind: ClassVar[str] = "data"

    def __post_init__(self) -> None:
        _check_count("data-parallel plan: ranks", self.ranks, 1)
        _check_count("data-parallel plan: steps", self.steps, 1)
        if self.comm not in COMM_POLICIES:
            raise TrainschedError(f"data-parallel plan: unknown comm policy {self.comm!r}; "
                                  f"known policies: {', '.join(COMM_POLICIES)}")
        check_policy(self.policy)
        if not isinstance(self.sync, str):
            raise TrainschedError(f"data-parallel plan: sync must be a sync policy's text "
                                  f"(e.g. bsp or bsp:0.125,asp:0.875), got {self.sync!r}")
        try:
            policy = parse_policy(self.sync)
            for protocol in policy.protocols:
                protocol.effective_batch(self.ranks, 1)  # refuses k-of-n with k > ranks
        except TrainschedError as exc:
            raise TrainschedError(f"data-parallel plan: {exc}") from None
        object.__setattr__(self, "sync", format_policy(policy))
        self._check_servers(policy)
        for field, value, known in (("algorithm", self.algorithm, ALGORITHMS),
                                    ("order", self.order, COLLECTIVE_ORDERS)):
            if value not in known:
                raise TrainschedError(f"data-parallel plan: {field} must be one of "
                                      f"{', '.join(known)}, got {value!r}")
        if not isinstance(self.startup_overlap, bool):
            raise TrainschedError(f"data-parallel plan: startup_overlap must be true or false, "
                                  f"got {self.startup_overlap!r}")
        if self.backprop not in BACKPROP_ORDERS:
            raise TrainschedError(f"data-parallel plan: unknown backprop order "
                                  f"{self.backprop!r}; known: {', '.join(BACKPROP_ORDERS)}")
        _check_count("data-parallel plan: k", self.k, 0)
        if self.backprop == "inorder" and self.k:
            raise TrainschedError(f"data-parallel plan: k = {self.k} with in-order backprop; "
                                  f"k counts the layers out-of-order backprop defers (backprop "
                                  f"'ooo'), in-order backprop has k = 0")
        if self.backprop != "inorder" and not self.policy.cross_barrier:
            raise TrainschedError(
                f"data-parallel plan: backprop {self.backprop!r} updates the deferred layers "
                f"lazily, just before their next forward, which needs a comm policy whose "
                f"updates cross the step barrier; {self.comm!r} does not (use one of "
                f"{', '.join(_cross_barrier_policies())})")

    def _check_servers(self, policy: SyncPolicy) -> None:
        _check_count("data-parallel plan: servers", self.servers, 1)
        if self.server_placement not in SERVER_PLACEMENTS:
            raise TrainschedError(f"data-parallel plan: server_placement must be one of "
                                  f"{', '.join(SERVER_PLACEMENTS)}, got "
                                  f"{self.server_placement!r}")
        if not policy.uses_servers and (self.servers, self.server_placement) != (1,
                                                                                 "dedicated"):
            raise TrainschedError(f"data-parallel plan: servers and server_placement apply to "
                                  f"a sync policy with a parameter-server phase (asp, ssp, "
                                  f"k-of-n, or straggler(relax)); {self.sync!r} has none: "
                                  f"drop them or use such a policy")
        if self.server_placement == "colocated" and self.servers > self.ranks:
            raise TrainschedError(f"data-parallel plan: {self.servers} colocated servers on "
                                  f"{self.ranks} ranks; colocated shard j shares worker j's "
                                  f"host, so give at most {self.ranks} servers (or place them "
                                  f"dedicated)")

    @property
    def devices(self) -> int:
        return self.ranks

    @property
    def sync_policy(self) -> SyncPolicy:
        """The sync policy ``sync`` writes."""
        return parse_policy(self.sync)

    def validate(self, graph: Graph, cluster: Cluster | None = None) -> None:
        self.model.check(graph)
        check_k(graph, self.k, "data-parallel plan: k")
        if cluster is not None and self.ranks > cluster.num_devices:
            raise TrainschedError(f"the plan has {self.ranks} ranks but cluster "
                                  f"{cluster.name!r} has {cluster.num_devices} devices; use a "
                                  f"larger cluster or a plan with fewer ranks")


def _cross_barrier_policies() -> list[str]:
    """The registered comm policies whose updates cross the step barrier (at defaults)."""
    names = []
    for name in COMM_POLICIES:
        try:
            if COMM_POLICIES[name]().cross_barrier:
                names.append(name)
        except TypeError:  # a policy that needs arguments: not listed
            continue
    return names


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
