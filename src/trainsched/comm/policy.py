"""Communication policies: which collectives reduce a step's gradients, and in what order.

A data-parallel step produces one **gradient** per ``backward_weight`` op (:class:`Gradient`:
its size, its layer and when it becomes ready in backward). A **policy** turns them into
**collectives** (:class:`Collective`: whole tensors, buckets of several, or chunks of one) and
says how they are issued and queued. The simulator and the runtime read the same objects.

The model every policy is run under (``specs/comm.md`` §3, the dispatch loop):

1. **Issue.** A collective is *issued* once all its member gradients are ready; with
   ``ordered_issue`` also only after the collective before it in the plan was issued (PyTorch
   DDP launches its buckets in index order). Across ranks a collective is issued when the last
   rank issues it (rendezvous).
2. **Queue.** Issued collectives wait in the rank's queue: ``"fifo"`` (issue time, then position
   in the plan) or ``"priority"`` (:attr:`Collective.priority`, smaller first, then position).
3. **Credit.** The head of the queue is handed to the wire (*dispatched*) when nothing is in
   flight, or when the credit allows it (:func:`may_dispatch`); bytes *in flight* are those
   dispatched and not yet done. ``credit_bytes=None`` means no credit window: one collective at
   a time, so the queue alone sets the order (plain FIFO, plain priority). ``math.inf``
   dispatches every collective on issue, and the wire's FIFO order (issue order) decides
   whatever the queue ("unlimited credit = issue on ready", ``specs/comm.md`` §3).
4. **Wire.** A rank's wire runs the dispatched collectives one at a time in dispatch order; a
   running collective is never preempted (preemption happens only between partitions).
5. **Optimizer.** With ``cross_barrier`` each optimizer op waits only for the collectives that
   hold its gradient; without it (the baselines: ``optimizer.step()`` after ``backward()``,
   which DDP returns only once every bucket is reduced) every optimizer op waits for all of them.

Policies here: :class:`FifoPolicy` (one collective per gradient, in ready order),
:class:`DdpBucketPolicy` (PyTorch DDP's buckets), :class:`ReadyBucketPolicy` (the same buckets
crossing the barrier, on the scheduled runtime), :class:`PriorityPolicy` (layer priority,
optional partitions and credit: TicTac with whole tensors, P3 with partitions) and
:class:`ByteSchedulerPolicy` (priority, partitions, fusion of small tensors, overdraft credit,
crossing the barrier; its partition and credit are tuned by :mod:`trainsched.comm.tune`), all
registered in :data:`COMM_POLICIES`, with ``tictac`` and ``p3`` as named settings of
:class:`PriorityPolicy`.
"""

from __future__ import annotations

import dataclasses
import functools
import heapq
import importlib
import math
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, runtime_checkable

from trainsched.errors import TrainschedError
from trainsched.graph import Graph, param_tensor_record
from trainsched.registry import Registry
from trainsched.units import is_int

__all__ = [
    "COMM_POLICIES",
    "CREDIT_MODES",
    "DDP_BUCKET_ORDERS",
    "P3_SLICE_BYTES",
    "QUEUES",
    "ByteSchedulerPolicy",
    "Collective",
    "CommPolicy",
    "DdpBucketPolicy",
    "FifoPolicy",
    "Gradient",
    "PriorityPolicy",
    "ReadyBucketPolicy",
    "check_plan",
    "check_policy",
    "comm_policy",
    "ddp_buckets",
    "dispatches_in_plan_order",
    "gradient_sources",
    "gradient_tensors",
    "gradients_with_sources",
    "graph_gradients",
    "may_dispatch",
    "memory_passes",
    "policy_from_json",
    "policy_to_json",
    "produces_gradient",
    "scheduled_passes",
    "take_dispatchable",
]

MiB = 1 << 20
QUEUES = ("fifo", "priority")
CREDIT_MODES = ("strict", "overdraft")
DDP_BUCKET_ORDERS = ("ready", "reverse_layer")


@dataclass(frozen=True, kw_only=True)
class Gradient:
    """A gradient tensor a ``backward_weight`` op produces: ``name`` is its tensor
    (``<forward op>:grad``, see :func:`gradient_tensors`), ``size_bytes`` the parameter's size,
    ``layer_index`` its layer (earlier = more urgent) and ``ready_index`` its position in the
    order gradients become ready in backward (0 first)."""

    name: str
    size_bytes: int
    layer_index: int
    ready_index: int

    def __post_init__(self) -> None:
        if not (isinstance(self.name, str) and self.name):
            raise TrainschedError(f"a gradient needs a name, got {self.name!r}")
        for field, minimum in (("size_bytes", 0), ("layer_index", None), ("ready_index", 0)):
            value = getattr(self, field)
            if not is_int(value) or (minimum is not None and value < minimum):
                bound = f" >= {minimum}" if minimum is not None else ""
                raise TrainschedError(f"gradient {self.name!r}: {field} must be an "
                                      f"integer{bound}, got {value!r}")


@dataclass(frozen=True, kw_only=True)
class Collective:
    """One all-reduce: ``size_bytes`` of the gradients ``members`` (names), queued by
    ``priority`` (smaller first) on a priority queue."""

    name: str
    members: tuple[str, ...]
    size_bytes: int
    priority: int = 0

    def __post_init__(self) -> None:
        if not (isinstance(self.name, str) and self.name):
            raise TrainschedError(f"a collective needs a name, got {self.name!r}")
        members = tuple(self.members) if isinstance(self.members, list | tuple) else None
        if not members or not all(isinstance(m, str) and m for m in members):
            raise TrainschedError(f"collective {self.name!r}: members must be a non-empty tuple "
                                  f"of gradient names, got {self.members!r}")
        if len(set(members)) != len(members):
            raise TrainschedError(f"collective {self.name!r} lists a gradient twice: {members}")
        object.__setattr__(self, "members", members)
        if not (is_int(self.size_bytes) and self.size_bytes >= 0):
            raise TrainschedError(f"collective {self.name!r}: size_bytes must be an integer "
                                  f">= 0, got {self.size_bytes!r}")
        if not is_int(self.priority):
            raise TrainschedError(f"collective {self.name!r}: priority must be an integer, "
                                  f"got {self.priority!r}")


@runtime_checkable
class CommPolicy(Protocol):
    """What the simulator (and later the runtime) needs from a communication policy.

    ``plan`` maps the step's gradients to collectives, listed in plan order (the issue order
    with ``ordered_issue``, the tie-break of both queues). The other members set the issue rule,
    the queue and the credit (module docstring). Optionally, ``memory_passes(collective)``
    says which passes over a collective's bytes the policy's runtime makes on the rank, before
    and after its all-reduce (:func:`memory_passes`; the simulator charges them).
    """

    @property
    def queue(self) -> str: ...  # "fifo" or "priority"

    @property
    def credit_bytes(self) -> float | None: ...  # None: one at a time; math.inf: no limit

    @property
    def credit_mode(self) -> str: ...  # "strict" or "overdraft"

    @property
    def ordered_issue(self) -> bool: ...  # issue in plan order (DDP) or on ready

    @property
    def cross_barrier(self) -> bool: ...  # optimizer waits for its own collectives only

    def plan(self, gradients: Sequence[Gradient]) -> tuple[Collective, ...]: ...


def memory_passes(policy: CommPolicy, collective: Collective) -> tuple[bool, bool]:
    """Whether ``policy``'s runtime makes a pass over ``collective``'s bytes on the rank
    before its all-reduce and after it (its optional ``memory_passes`` method; a policy
    without one makes none)."""
    passes = getattr(policy, "memory_passes", None)
    return passes(collective) if passes is not None else (False, False)


def scheduled_passes(collective: Collective) -> tuple[bool, bool]:
    """The passes over ``collective``'s bytes that trainsched's scheduled runtime makes on the
    rank: a group of several gradients is packed into one buffer before its all-reduce (its
    members then take their slices of it, no copy back), and every collective is divided by
    the world size after it (gloo has no average)."""
    return len(collective.members) > 1, True


class _ScheduledRuntimePasses:
    """``memory_passes`` of a policy run by the scheduled runtime: :func:`scheduled_passes`,
    or none where its ``runtime_passes`` is False."""

    runtime_passes: bool

    def memory_passes(self, collective: Collective) -> tuple[bool, bool]:
        return scheduled_passes(collective) if self.runtime_passes else (False, False)


class _BucketCopyPasses:
    """``memory_passes`` of a bucket policy: its ``bucket_copies``, before and after."""

    bucket_copies: bool

    def memory_passes(self, collective: Collective) -> tuple[bool, bool]:
        return self.bucket_copies, self.bucket_copies


def may_dispatch(in_flight_bytes: float, size_bytes: float, credit_bytes: float | None,
                 credit_mode: str = "strict") -> bool:
    """Whether a collective of ``size_bytes`` may be handed to the wire now.

    Always when nothing is in flight (so a collective larger than the credit never deadlocks);
    otherwise ``strict``: ``in_flight + size <= credit``; ``overdraft`` (ByteScheduler):
    ``in_flight < credit``. ``credit_bytes=None``: only when nothing is in flight.
    """
    if in_flight_bytes <= 0:
        return True
    if credit_bytes is None:
        return False
    if credit_mode == "overdraft":
        return in_flight_bytes < credit_bytes
    return in_flight_bytes + size_bytes <= credit_bytes


def take_dispatchable(waiting: list[tuple[Any, int]], sizes: Sequence[float],
                      in_flight_bytes: float, credit_bytes: float | None, credit_mode: str,
                      backfill: bool = False) -> int | None:
    """Pop from the heap ``waiting`` (entries ``(queue key, collective)``, most urgent first)
    the collective to dispatch now and return it, or ``None`` when nothing may go.

    The head goes when :func:`may_dispatch` allows it. With ``backfill`` (``strict`` credit
    only) a head that does not fit lets the most urgent waiting collective that does fit go
    first: the credit is used, priority is not exact (``specs/comm.md`` §3).
    """
    if not waiting:
        return None
    if may_dispatch(in_flight_bytes, sizes[waiting[0][1]], credit_bytes, credit_mode):
        return heapq.heappop(waiting)[1]
    if not backfill or credit_bytes is None:
        return None
    room = credit_bytes - in_flight_bytes
    fits = [j for j, (_, c) in enumerate(waiting) if sizes[c] <= room]
    if not fits:
        return None
    j = min(fits, key=lambda j: waiting[j])
    c = waiting[j][1]
    waiting[j] = waiting[-1]
    waiting.pop()
    heapq.heapify(waiting)
    return c


def _check_backfill(owner: str, backfill: Any, credit_bytes: Any, credit_mode: str) -> None:
    if not isinstance(backfill, bool):
        raise TrainschedError(f"{owner}: backfill must be True or False, got {backfill!r}")
    if backfill and (credit_mode != "strict" or credit_bytes is None
                     or credit_bytes == math.inf):
        raise TrainschedError(f"{owner}: backfill lets a smaller collective use credit the "
                              f"head of the queue cannot; it needs credit_mode 'strict' and a "
                              f"finite credit_bytes (got {credit_mode!r}, {credit_bytes!r})")


def _check_credit(owner: str, credit_bytes: Any, credit_mode: Any) -> None:
    number = isinstance(credit_bytes, numbers.Real) and not isinstance(credit_bytes, bool)
    if credit_bytes is not None and not (
            number and credit_bytes >= 0 and (is_int(credit_bytes) or credit_bytes == math.inf)):
        raise TrainschedError(f"{owner}: credit_bytes must be None, an integer >= 0 or "
                              f"math.inf, got {credit_bytes!r}")
    if credit_mode not in CREDIT_MODES:
        raise TrainschedError(f"{owner}: credit_mode must be one of {', '.join(CREDIT_MODES)}, "
                              f"got {credit_mode!r}")


def _check_bytes(owner: str, field: str, value: Any, *, optional: bool = False) -> None:
    if optional and value is None:
        return
    if not (is_int(value) and value > 0):
        none = " or None" if optional else ""
        raise TrainschedError(f"{owner}: {field} must be a positive integer{none}, "
                              f"got {value!r}")


@dataclass(frozen=True, kw_only=True)
class FifoPolicy(_ScheduledRuntimePasses):
    """One collective per gradient, issued as soon as it is ready, so the wire sees ready order
    (the naive baseline). ``priority`` is the layer index (unused by the FIFO queue).
    ``runtime_passes``: the scheduled runtime's passes over each collective's bytes
    (:func:`scheduled_passes`), charged by the simulator; False charges none."""

    cross_barrier: bool = False
    runtime_passes: bool = True
    queue: ClassVar[str] = "fifo"
    credit_bytes: ClassVar[float | None] = None
    credit_mode: ClassVar[str] = "strict"
    ordered_issue: ClassVar[bool] = False

    def plan(self, gradients: Sequence[Gradient]) -> tuple[Collective, ...]:
        return tuple(Collective(name=g.name, members=(g.name,), size_bytes=g.size_bytes,
                                priority=g.layer_index)
                     for g in sorted(gradients, key=lambda g: g.ready_index))  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class DdpBucketPolicy(_BucketCopyPasses):
    """PyTorch DDP's gradient buckets, as its C++ reducer builds and launches them.

    Gradients are packed in ``order``: ``"ready"`` (default) is the order they became ready,
    which is what DDP uses from the second iteration on (``Reducer::rebuild_buckets`` calls
    ``compute_bucket_assignment_by_size`` with the step-1 ready order, limits
    ``[first_bucket_bytes, bucket_bytes]``); ``"reverse_layer"`` is reverse registration order,
    DDP's assignment before that rebuild. With in-order backprop the two agree. A gradient is
    added to the open bucket first and the bucket closes once it holds ``>=`` its limit, so a
    bucket may exceed its cap by its last gradient; the first bucket's limit is
    ``first_bucket_bytes`` (DDP: 1 MiB, only with the default ``bucket_cap_mb``; pass
    ``first_bucket_bytes=bucket_bytes`` for a custom cap), the others ``bucket_bytes``
    (25 MiB). Buckets are launched in index order (``Reducer::mark_bucket_ready``): bucket i
    once its gradients are ready and bucket i-1 was launched (``ordered_issue``).
    ``bucket_copies`` (DDP's default, ``gradient_as_bucket_view=False``): each gradient is
    copied into its bucket's flat buffer before the all-reduce and back after it; the
    simulator charges both copies to the rank's compute stream at the device's memory
    bandwidth. ``buffer_sync`` (DDP's default, ``broadcast_buffers=True``): before each
    forward rank 0 broadcasts the model's buffers; the simulator charges the device's
    ``buffer_sync_s`` plus the buffers' bytes over the collective link at the start of each
    step of a model that has buffers.
    """

    bucket_bytes: int = 25 * MiB
    first_bucket_bytes: int = 1 * MiB
    order: str = "ready"
    cross_barrier: bool = False
    bucket_copies: bool = True
    buffer_sync: bool = True
    queue: ClassVar[str] = "fifo"
    credit_bytes: ClassVar[float | None] = None
    credit_mode: ClassVar[str] = "strict"
    ordered_issue: ClassVar[bool] = True

    def __post_init__(self) -> None:
        _check_bytes("ddp policy", "bucket_bytes", self.bucket_bytes)
        _check_bytes("ddp policy", "first_bucket_bytes", self.first_bucket_bytes)
        if self.order not in DDP_BUCKET_ORDERS:
            raise TrainschedError(f"ddp policy: order must be one of "
                                  f"{', '.join(DDP_BUCKET_ORDERS)}, got {self.order!r}")
        if not isinstance(self.buffer_sync, bool):
            raise TrainschedError(f"ddp policy: buffer_sync must be True or False, got "
                                  f"{self.buffer_sync!r}")

    def plan(self, gradients: Sequence[Gradient]) -> tuple[Collective, ...]:
        if self.order == "ready":
            ordered = sorted(gradients, key=lambda g: g.ready_index)
        else:
            ordered = sorted(gradients, key=lambda g: (-g.layer_index, g.ready_index))
        return ddp_buckets(ordered, self.first_bucket_bytes, self.bucket_bytes)


def ddp_buckets(ordered: Sequence[Gradient], first_bucket_bytes: int,
                bucket_bytes: int) -> tuple[Collective, ...]:
    """DDP's bucket assignment of ``ordered`` (gradients in the order they are packed):
    each gradient joins the open bucket, which closes once it holds ``>=`` its limit
    (``first_bucket_bytes`` for the first bucket, ``bucket_bytes`` after); buckets are named
    ``bucket0``, ``bucket1``, ... and carry their most urgent member's layer as priority."""
    buckets: list[list[Gradient]] = []
    current: list[Gradient] = []
    size = 0
    for g in ordered:
        current.append(g)
        size += g.size_bytes
        if size >= (first_bucket_bytes if not buckets else bucket_bytes):
            buckets.append(current)
            current, size = [], 0
    if current:
        buckets.append(current)
    return tuple(Collective(name=f"bucket{i}", members=tuple(g.name for g in bucket),
                            size_bytes=sum(g.size_bytes for g in bucket),
                            priority=min(g.layer_index for g in bucket))
                 for i, bucket in enumerate(buckets))  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class ReadyBucketPolicy(_BucketCopyPasses):
    """DDP's buckets on the scheduled runtime: the cheap schedule where communication is light.

    The plan is :class:`DdpBucketPolicy`'s with ``order="ready"``: gradients packed into
    buckets in the order they become ready (first bucket ``first_bucket_bytes``, then
    ``bucket_bytes``, DDP's 1 MiB and 25 MiB), each bucket issued once its gradients are
    ready and the bucket before it was issued (``ordered_issue``), and handed to the wire at
    once (unlimited credit), as DDP launches its buckets. What it adds to DDP is crossing the
    barrier (``cross_barrier``): each parameter is updated as soon as its bucket is reduced,
    and a layer's next forward waits only for its own update. Its dispatch order is the plan
    order on every rank whatever the ready times (:func:`dispatches_in_plan_order`), so the
    runtime needs no agreement on the order per step. ``bucket_copies``: the runtime packs
    each bucket into one flat buffer and divides it by the world size after its all-reduce,
    two passes over its bytes on the rank's compute, which the simulator charges as it
    charges DDP's copy in and back (its members then take their slices without a copy).
    """

    bucket_bytes: int = 25 * MiB
    first_bucket_bytes: int = 1 * MiB
    cross_barrier: bool = True
    bucket_copies: bool = True
    queue: ClassVar[str] = "fifo"
    credit_bytes: ClassVar[float | None] = math.inf
    credit_mode: ClassVar[str] = "strict"
    ordered_issue: ClassVar[bool] = True

    def __post_init__(self) -> None:
        _check_bytes("buckets policy", "bucket_bytes", self.bucket_bytes)
        _check_bytes("buckets policy", "first_bucket_bytes", self.first_bucket_bytes)
        for field in ("cross_barrier", "bucket_copies"):
            if not isinstance(getattr(self, field), bool):
                raise TrainschedError(f"buckets policy: {field} must be True or False, got "
                                      f"{getattr(self, field)!r}")

    def plan(self, gradients: Sequence[Gradient]) -> tuple[Collective, ...]:
        ordered = sorted(gradients, key=lambda g: g.ready_index)
        return ddp_buckets(ordered, self.first_bucket_bytes, self.bucket_bytes)


def dispatches_in_plan_order(policy: CommPolicy, plan: Sequence[Collective]) -> bool:
    """Whether ``policy`` hands ``plan``'s collectives to the wire in plan order on every
    rank, whatever the ready times: a plan of at most one collective, or issue in plan order
    (``ordered_issue``) into a FIFO queue without backfill (a FIFO queue keeps issue order,
    and ordered issue makes issue order the plan order). Then ranks need not agree on the
    order at run time."""
    if len(plan) <= 1:
        return True
    return (policy.ordered_issue and policy.queue == "fifo"
            and not getattr(policy, "backfill", False))


@dataclass(frozen=True, kw_only=True)
class PriorityPolicy(_ScheduledRuntimePasses):
    """Layer priority: gradients issued on ready into a priority queue (earlier layer first).

    A gradient larger than ``partition_bytes`` becomes ``⌈S/p⌉`` chunks ``name/0``,
    ``name/1``, ... (``p`` bytes each, the last one the rest), each its own collective with the
    layer's priority (chunks of one layer go in chunk order), so a more urgent gradient can
    overtake between chunks. ``credit_bytes`` / ``credit_mode``: see :func:`may_dispatch`;
    with no credit one collective is in flight at a time (whole tensors: TicTac; partitions:
    P3). ``backfill`` (strict credit only): when the most urgent collective does not fit in
    the credit left, the most urgent one that does goes first (:func:`take_dispatchable`).
    ``runtime_passes``: as :class:`FifoPolicy`'s.
    """

    partition_bytes: int | None = None
    credit_bytes: float | None = None
    credit_mode: str = "strict"
    cross_barrier: bool = False
    backfill: bool = False
    runtime_passes: bool = True
    queue: ClassVar[str] = "priority"
    ordered_issue: ClassVar[bool] = False

    def __post_init__(self) -> None:
        _check_bytes("priority policy", "partition_bytes", self.partition_bytes, optional=True)
        _check_credit("priority policy", self.credit_bytes, self.credit_mode)
        _check_backfill("priority policy", self.backfill, self.credit_bytes, self.credit_mode)

    def plan(self, gradients: Sequence[Gradient]) -> tuple[Collective, ...]:
        out = []
        p = self.partition_bytes
        for g in sorted(gradients, key=lambda g: (g.layer_index, g.ready_index)):
            if p is None or g.size_bytes <= p:
                out.append(Collective(name=g.name, members=(g.name,), size_bytes=g.size_bytes,
                                      priority=g.layer_index))
                continue
            chunks = -(-g.size_bytes // p)
            out += [Collective(name=f"{g.name}/{i}", members=(g.name,),
                               size_bytes=min(p, g.size_bytes - i * p), priority=g.layer_index)
                    for i in range(chunks)]  # fmt: skip
        return tuple(out)


@dataclass(frozen=True, kw_only=True)
class ByteSchedulerPolicy(_ScheduledRuntimePasses):
    """ByteScheduler (``specs/comm.md`` §2): layer priority, partitions, fusion of small
    tensors, a credit window (overdraft by default) and each layer's update as soon as its
    gradients are reduced (``cross_barrier``).

    The plan walks the gradients in priority order (layer, then ready order). A gradient of
    ``fusion_bytes`` or more is a task of its own, split into ``⌈S/p⌉`` partitions ``name/0``,
    ``name/1``, ... of ``partition_bytes`` when larger (as :class:`PriorityPolicy`).
    Neighbours below ``fusion_bytes`` are merged greedily into one task while the group stays
    within ``partition_bytes``; the group is named after its first (most urgent) member plus
    the count of the others (``conv1:grad+2``) and carries that member's priority. A fused
    group is issued once its last member is ready, which in backward is its most urgent one
    anyway. ``fusion_bytes=0`` fuses nothing. ``backfill``: as :class:`PriorityPolicy`'s
    (``credit_mode="strict"`` only). ``runtime_passes``: as :class:`FifoPolicy`'s.
    """

    partition_bytes: int = 4 * MiB
    credit_bytes: float | None = 16 * MiB
    credit_mode: str = "overdraft"
    fusion_bytes: int = 1 * MiB
    cross_barrier: bool = True
    backfill: bool = False
    runtime_passes: bool = True
    queue: ClassVar[str] = "priority"
    ordered_issue: ClassVar[bool] = False

    def __post_init__(self) -> None:
        owner = "bytescheduler policy"
        _check_bytes(owner, "partition_bytes", self.partition_bytes)
        _check_credit(owner, self.credit_bytes, self.credit_mode)
        _check_backfill(owner, self.backfill, self.credit_bytes, self.credit_mode)
        if not (is_int(self.fusion_bytes) and self.fusion_bytes >= 0):
            raise TrainschedError(f"{owner}: fusion_bytes must be an integer >= 0 (0: no "
                                  f"fusion), got {self.fusion_bytes!r}")
        if (self.credit_mode == "strict" and self.credit_bytes is not None
                and self.credit_bytes < self.partition_bytes):
            raise TrainschedError(f"{owner}: with credit_mode 'strict' the credit "
                                  f"({self.credit_bytes} bytes) must hold one partition "
                                  f"({self.partition_bytes} bytes); raise credit_bytes or "
                                  f"use credit_mode 'overdraft'")

    def plan(self, gradients: Sequence[Gradient]) -> tuple[Collective, ...]:
        p = self.partition_bytes
        units: list[list[Gradient]] = []  # a gradient of its own, or a fused run
        open_bytes = -1  # size of the fused run still open; -1: none
        for g in sorted(gradients, key=lambda g: (g.layer_index, g.ready_index)):
            if not (g.size_bytes < self.fusion_bytes and g.size_bytes <= p):
                units.append([g])
                open_bytes = -1
            elif open_bytes >= 0 and open_bytes + g.size_bytes <= p:
                units[-1].append(g)
                open_bytes += g.size_bytes
            else:
                units.append([g])
                open_bytes = g.size_bytes
        out: list[Collective] = []
        for unit in units:
            g = unit[0]
            if len(unit) > 1:
                out.append(Collective(name=f"{g.name}+{len(unit) - 1}",
                                      members=tuple(x.name for x in unit),
                                      size_bytes=sum(x.size_bytes for x in unit),
                                      priority=g.layer_index))
            elif g.size_bytes <= p:
                out.append(Collective(name=g.name, members=(g.name,), size_bytes=g.size_bytes,
                                      priority=g.layer_index))
            else:
                out += [Collective(name=f"{g.name}/{i}", members=(g.name,),
                                   size_bytes=min(p, g.size_bytes - i * p),
                                   priority=g.layer_index)
                        for i in range(-(-g.size_bytes // p))]  # fmt: skip
        return tuple(out)


#: The slice size of the ``p3`` baseline (ours, not P3's; override with ``partition_bytes``).
P3_SLICE_BYTES = 1 * MiB

#: Policy name -> the callable (called with the policy's options) that builds it; tags:
#: ``compare`` (a row of ``trainsched compare``), ``tuned`` (also a row at the partition and
#: credit the tuner picks on the simulator). ``tictac``
#: and ``p3`` are :class:`PriorityPolicy` with the published systems' settings: one collective
#: in flight at a time in layer priority, each layer's next forward waiting only for its own
#: update; whole tensors (TicTac, Hashemi et al., MLSys 2019) or fixed slices (P3, Jayarajan
#: et al., SysML 2019). Options given by name override those settings.
COMM_POLICIES: Registry[Callable[..., CommPolicy]] = Registry("comm policy", "policies")
COMM_POLICIES.register("fifo", FifoPolicy, compare=True)
COMM_POLICIES.register("ddp", DdpBucketPolicy, compare=True)
COMM_POLICIES.register("priority", PriorityPolicy)
COMM_POLICIES.register("bytescheduler", ByteSchedulerPolicy, compare=True, tuned=True)
COMM_POLICIES.register("buckets", ReadyBucketPolicy, compare=True)
COMM_POLICIES.register("tictac", functools.partial(
    PriorityPolicy, partition_bytes=None, credit_bytes=None, cross_barrier=True))
COMM_POLICIES.register("p3", functools.partial(
    PriorityPolicy, partition_bytes=P3_SLICE_BYTES, credit_bytes=None, cross_barrier=True))


def comm_policy(name: str, **options: Any) -> CommPolicy:
    """The registered policy called ``name`` (case-insensitive), built with ``options``."""
    build = COMM_POLICIES.lookup(name)
    key = name.strip().lower()
    try:
        return build(**options)
    except TypeError as exc:
        raise TrainschedError(f"comm policy {key!r}: {exc}") from None


def policy_to_json(policy: CommPolicy) -> dict[str, Any]:
    """``policy`` as JSON data: its class (``"module:QualName"``) and its constructor fields,
    an unlimited credit as ``"inf"`` (what travels to the runtime's worker processes)."""
    if not dataclasses.is_dataclass(policy):
        raise TrainschedError(f"comm policy {type(policy).__name__} is not a dataclass; it "
                              f"travels to the workers by its fields")
    fields = {f.name: getattr(policy, f.name) for f in dataclasses.fields(policy)}
    fields = {k: "inf" if v == math.inf else v for k, v in fields.items()}
    cls = type(policy)
    return {"class": f"{cls.__module__}:{cls.__qualname__}", "fields": fields}


def policy_from_json(doc: dict[str, Any]) -> CommPolicy:
    """The policy :func:`policy_to_json` wrote."""
    module, _, name = doc["class"].partition(":")
    fields = {k: math.inf if v == "inf" else v for k, v in doc["fields"].items()}
    return getattr(importlib.import_module(module), name)(**fields)


def check_policy(policy: Any) -> None:
    """Raise :class:`TrainschedError` unless ``policy`` has what :class:`CommPolicy` needs."""
    if not isinstance(policy, CommPolicy):
        raise TrainschedError(f"a comm policy needs queue, credit_bytes, credit_mode, "
                              f"ordered_issue, cross_barrier and plan(); got "
                              f"{type(policy).__name__}")
    owner = f"comm policy {type(policy).__name__}"
    if policy.queue not in QUEUES:
        raise TrainschedError(f"{owner}: queue must be one of {', '.join(QUEUES)}, "
                              f"got {policy.queue!r}")
    _check_credit(owner, policy.credit_bytes, policy.credit_mode)


def check_plan(gradients: Sequence[Gradient], collectives: Sequence[Collective],
               owner: str = "comm policy") -> None:
    """A plan must name each collective once, name only known gradients and reduce every
    gradient (a gradient may be split over several collectives)."""
    known = {g.name for g in gradients}
    seen: set[str] = set()
    covered: set[str] = set()
    for c in collectives:
        if not isinstance(c, Collective):
            raise TrainschedError(f"{owner}: plan() must return Collectives, got "
                                  f"{type(c).__name__}")
        if c.name in seen:
            raise TrainschedError(f"{owner}: two collectives are called {c.name!r}")
        seen.add(c.name)
        unknown = [m for m in c.members if m not in known]
        if unknown:
            raise TrainschedError(f"{owner}: collective {c.name!r} names unknown gradient(s) "
                                  f"{', '.join(unknown)}")
        covered.update(c.members)
    missing = [g.name for g in gradients if g.name not in covered]
    if missing:
        more = f", ... ({len(missing)} in all)" if len(missing) > 5 else ""
        raise TrainschedError(f"{owner}: no collective reduces gradient(s) "
                              f"{', '.join(missing[:5])}{more}")


def produces_gradient(op: Any) -> bool:
    """Whether ``op`` is a ``backward_weight`` op with a gradient of its own to reduce: the dW
    of an op reading only tied weights (``output_bytes`` 0) adds into its owners' gradients."""
    return op.kind == "backward_weight" and op.output_bytes > 0


def gradient_tensors(graph: Graph, op: Any) -> tuple[tuple[str, int], ...]:
    """The gradient tensors ``backward_weight`` op ``op`` produces, as ``(name, bytes)``: one
    per trainable parameter its forward op owns, in the order the captured op reads
    them (all become ready within the one dW op; the runtime logs its own order).

    Capture records an op owning two or more parameters (a linear layer's weight and bias) in
    ``graph.meta["param_tensors"]`` (forward op -> ``[[parameter, bytes], ...]``, the
    parameter named relative to its module); the runtime reduces each parameter as a tensor
    of its own, so the simulator does too. ``name`` is ``<forward op>:grad.<parameter>`` for
    those and ``<forward op>:grad`` (``<op>:grad`` without ``forward_op``) for an op with one
    tensor or no record; a record whose sizes do not add up to the op's ``output_bytes`` (a
    graph transformed after capture) is not used. An op that :func:`produces_gradient` not
    gives none.
    """
    if not produces_gradient(op):
        return ()
    base = f"{op.forward_op or op.name}:grad"
    rows = param_tensor_record(graph.meta, op.forward_op) if op.forward_op else None
    if not rows or sum(size for _, size in rows) != op.output_bytes:
        return ((base, op.output_bytes),)
    return tuple((f"{base}.{name}", size) for name, size in rows)


def graph_gradients(graph: Graph, order: Sequence[str] | None = None) -> tuple[Gradient, ...]:
    """The gradients of a training graph in ready order: the :func:`gradient_tensors` of each
    ``backward_weight`` op that :func:`produces_gradient` (tied readers' dW add into their
    owners' instead), in the order those ops come in ``order`` (the compute order of one
    device; default the graph's topological order, which is program order: in-order
    backprop); :func:`gradient_sources` names the op each comes from.

    ``size_bytes`` is the parameter's size. ``layer_index`` is the op's; if some op has none,
    every gradient gets instead the rank of its forward op (``forward_op``, else itself) in the
    graph's topological order.
    """
    return gradients_with_sources(graph, order)[0]


def gradient_sources(graph: Graph, order: Sequence[str] | None = None) -> tuple[str, ...]:
    """The ``backward_weight`` op each of :func:`graph_gradients` ``(graph, order)`` comes
    from, position by position."""
    return gradients_with_sources(graph, order)[1]


def gradients_with_sources(graph: Graph, order: Sequence[str] | None = None,
                           ) -> tuple[tuple[Gradient, ...], tuple[str, ...]]:
    """:func:`graph_gradients` and :func:`gradient_sources` of ``(graph, order)`` at once."""
    order = graph.topological_order() if order is None else tuple(order)
    ops = [graph.op(name) for name in order if produces_gradient(graph.op(name))]
    if any(op.layer_index is None for op in ops):
        topo = {name: k for k, name in enumerate(graph.topological_order())}

        def key(op: Any) -> tuple[int, str]:
            source = op.forward_op if op.forward_op in topo else op.name
            return topo[source], op.name

        layer = {op.name: k for k, op in enumerate(sorted(ops, key=key))}
    else:
        layer = {op.name: op.layer_index for op in ops}
    rows = [(name, size, op.name) for op in ops for name, size in gradient_tensors(graph, op)]
    names = [name for name, _, _ in rows]
    if len(set(names)) < len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        raise TrainschedError(f"several backward_weight ops produce gradient(s) "
                              f"{', '.join(twice)}; each forward op may have one")
    gradients = tuple(Gradient(name=name, size_bytes=size, layer_index=layer[source],
                               ready_index=k)
                      for k, (name, size, source) in enumerate(rows))  # fmt: skip
    return gradients, tuple(source for _, _, source in rows)
