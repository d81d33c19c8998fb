"""Scheduled data parallelism on ``torch.distributed``: priority, partitions, credit, and each
layer's update as soon as its gradients are reduced.

:class:`ScheduledDataParallel` wraps any ``nn.Module`` (``specs/comm.md`` §3–§6):

- **Readiness.** ``Tensor.register_post_accumulate_grad_hook`` on every trainable parameter
  reports its gradient ready to a dispatcher thread. The first backward pass fixes the task
  table: a parameter's layer index is the position of its module in forward order, its ready
  index the position of its gradient in backward; rank 0's observation is published and every
  rank builds the policy's plan from it (so all ranks hold the same collectives).
- **Dispatch.** The dispatcher thread runs :class:`trainsched.comm.dispatch.Dispatcher` (ready →
  queue → credit) and issues each collective as ``dist.all_reduce(view, async_op=True)`` on a
  zero-copy view of ``grad.view(-1)`` (a partition: a contiguous slice; a bucket of several
  gradients is packed into one buffer and unpacked after). Completion comes back through the
  work's future, returns the credit and divides the reduced slice by the world size (gloo has
  no average).
- **Order.** Every rank must issue collectives in one order, or gradients are silently summed
  with the wrong partners. ``order="leader"`` (default): rank 0 decides, publishing its k-th
  decision of step s as the store key ``<s>/<k>``; the other ranks issue exactly that sequence,
  each collective once its gradients are ready locally and the same credit gate lets it pass
  (it may delay, never reorder). ``order="static"`` ("simulate → compile → execute"): the
  issue order is compiled once from the task table and rank 0's step-0 ready times, by
  replaying the dispatch core on a fake FIFO wire (:func:`static_issue_order`), identically on
  every rank, and every rank (rank 0 too) issues exactly that sequence each step, with no store
  traffic per decision; it is recompiled when a retune switches the policy.
  ``order="local"`` lets every rank decide alone; it exists to
  show the hazard and is caught by ``verify_order_every=N``, which compares a digest of every
  rank's issue sequence through the store before every N-th issue and raises naming both
  ranks' collectives.
- **Crossing the barrier** (the policy's ``cross_barrier``). Each parameter has its own
  optimizer (the user's class and options); when its last collective is done the dispatcher
  steps that optimizer and drops the gradient. A forward pre-hook on every module owning
  parameters waits only for those parameters' updates, so layer l's next forward starts as
  soon as layer l is updated. Without ``cross_barrier`` the
  updates wait for every collective of the step (the baselines' barrier).
- **Faults.** Every wait has a timeout (``timeout_s``) and every failure (a collective that
  fails because a peer died, a leader that publishes nothing, a wrong order) is raised in the
  training thread as :class:`~trainsched.errors.TrainschedError`. Models that differ between
  ranks (parameter names, shapes, dtypes) are rejected at construction.

- **Switching sizes mid-run** (``specs/comm.md`` §7). :meth:`ScheduledDataParallel.retune`
  on rank 0 changes the policy (partition, credit, ...) from a later step on every rank: at the
  first gradient of each step rank 0 publishes the store key ``cfg/<s+1>``, the policy of the
  next step (empty: unchanged), and every other rank reads ``cfg/<s>`` at the first gradient of
  step s. Rank 0 wrote that key before it issued any collective of step s-1, and a rank cannot
  start step s before all of step s-1's collectives completed, so the read never waits. At the
  switch every rank finishes the last step's updates, folds the per-partition optimizer state
  back into whole parameters and rebuilds its collectives, so all ranks change at one step.
  An :class:`~trainsched.comm.tune.OnlineTuner` (``tuner=``) drives this from rank 0's step
  times: Bayesian search of partition and credit within one job.

- **Disabled** (``enabled=False``, ``specs/comm.md`` §11: byteps #370 measured a disabled
  scheduler 7% slower than none). A true pass-through with the same training-loop API: stock
  ``DistributedDataParallel`` (default buckets) reduces the gradients, one optimizer over all
  parameters is stepped lazily (at the next forward, or in ``drain``/``close``/``optimizers``,
  after a backward pass), and there are no per-parameter hooks, no threads and no store traffic
  per step.

Call :meth:`ScheduledDataParallel.drain` before evaluation, checkpoints and learning-rate
changes, and :meth:`ScheduledDataParallel.close` at the end (also run at exit).
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import gc
import hashlib
import heapq
import json
import math
import queue
import threading
import time
import weakref
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from trainsched.comm.dispatch import Dispatcher, check_sizes, partition_spans, replay_fifo_wire
from trainsched.comm.policy import CommPolicy, Gradient, check_plan, comm_policy
from trainsched.comm.timeline import Span, write_timeline
from trainsched.comm.tune import OnlineTuner, tuned_policy
from trainsched.errors import TrainschedError

__all__ = ["ORDERS", "STATIC_WIRE", "ScheduledDataParallel", "static_issue_order"]

ORDERS = ("leader", "static", "local")
#: The fake wire ``order="static"`` compiles on: (α seconds per collective, bytes per second);
#: gloo on loopback, ``specs/comm.md`` §8 (α ≈ 0.5-2 ms, β ≈ 1 GB/s).
STATIC_WIRE = (1e-3, 1e9)
UPDATES = ("auto", "parameter", "partition")
#: Optimizers whose step is elementwise given per-element state: stepping a slice of a
#: parameter equals stepping the whole parameter on that slice (bit for bit; tested).
ELEMENTWISE = (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW, torch.optim.Adagrad,
               torch.optim.RMSprop, torch.optim.Adamax, torch.optim.NAdam)
_INSTANCES: dict[tuple[int, ...], int] = {}  # process group ranks -> wrappers built so far


def _now() -> float:
    return time.perf_counter()


class ScheduledDataParallel(nn.Module):
    """Data-parallel training of ``module`` with gradients reduced as ``policy`` says.

    ``policy``: a :class:`~trainsched.comm.policy.CommPolicy` or a registered name
    (``"fifo"``, ``"ddp"``, ``"priority"``). ``optimizer``: an optimizer class, built once per
    parameter with ``optimizer_kwargs`` (e.g. ``torch.optim.SGD, {"lr": 0.1, "momentum":
    0.9}``), or a callable taking a one-parameter list and returning an optimizer. The
    training loop is ``loss_fn(model(x)).backward()``; there is no optimizer step to call.
    ``timeline``: a directory where ``close()`` writes ``rank<r>.trace.json`` covering steps
    ``timeline_steps`` (first, last; step 0 is the first backward pass). Construction is
    collective: every rank of the group must build its wrapper, in the same order.

    ``update``: ``"parameter"`` steps a parameter's optimizer once all its partitions are
    reduced; ``"partition"`` steps each partition's slice as soon as that partition is reduced
    (an optimizer per slice; only for elementwise optimizers, :data:`ELEMENTWISE`, where it is
    the same computation), so a large layer's update no longer waits for, and follows, its last
    partition; ``"auto"`` (default) picks ``"partition"`` when the optimizer is elementwise.

    ``comm_threads`` (gloo only): reduce gradients on a gloo group of our own with that many
    worker threads (gloo's default is 2; 1 makes the transport one FIFO wire, on which the
    credit and the priority order hold exactly).

    ``tuner``: an :class:`~trainsched.comm.tune.OnlineTuner` that rank 0 feeds with its step
    times (a step: from one forward after a backward pass to the next) and follows with
    :meth:`retune`; the other ranks ignore theirs (pass one everywhere: its
    ``total_steps`` tells every rank when tuning is over). Needs a policy with a partition size
    and a credit (``priority``, ``bytescheduler``) and ``order="leader"`` or ``"static"``.

    ``order``: ``"leader"`` (default), ``"static"`` or ``"local"`` (module docstring).
    ``static_wire``: ``(alpha_s, bytes_per_s)``, the linear cost ``alpha_s + size /
    bytes_per_s`` of one collective on the fake FIFO wire ``order="static"`` compiles its issue
    order on (default :data:`STATIC_WIRE`: gloo on loopback). Only the order is taken from the
    simulation, so the wire needs to be right only in proportion: how many gradients become
    ready while one collective runs.

    ``enabled=False``: a pass-through (module docstring): stock ``DistributedDataParallel``
    and one ``optimizer`` over all parameters (the class with ``optimizer_kwargs``, or a
    factory called with the list of all trainable parameters), stepped at the next forward
    after a backward pass (or in :meth:`drain`, :meth:`close`, :attr:`optimizers`). The
    policy is then unused; a tuner, a timeline, ``verify_order_every``, an ``order`` other than
    ``"leader"``, ``update="partition"`` and :meth:`retune` are refused.
    """

    def __init__(self, module: nn.Module, policy: CommPolicy | str = "priority", *,
                 process_group: Any = None,
                 optimizer: Any = torch.optim.SGD, optimizer_kwargs: dict | None = None,
                 order: str = "leader", verify_order_every: int = 0, timeout_s: float = 300.0,
                 timeline: str | Path | None = None,
                 timeline_steps: tuple[int, int] = (1, 3), store: Any = None,
                 update: str = "auto", comm_threads: int | None = None,
                 tuner: OnlineTuner | None = None,
                 static_wire: tuple[float, float] = STATIC_WIRE,
                 enabled: bool = True) -> None:
        super().__init__()
        if not dist.is_initialized():
            raise TrainschedError("ScheduledDataParallel needs torch.distributed: call "
                                  "torch.distributed.init_process_group first")
        if not isinstance(module, nn.Module):
            raise TrainschedError(f"ScheduledDataParallel wraps an nn.Module, got "
                                  f"{type(module).__name__}")
        self.module = module
        self.policy = comm_policy(policy) if isinstance(policy, str) else policy
        check_sizes(self.policy)
        if order not in ORDERS:
            raise TrainschedError(f"order must be one of {', '.join(ORDERS)}, got {order!r}")
        if update not in UPDATES:
            raise TrainschedError(f"update must be one of {', '.join(UPDATES)}, got "
                                  f"{update!r}")
        if not (isinstance(verify_order_every, int) and verify_order_every >= 0):
            raise TrainschedError(f"verify_order_every must be an integer >= 0, got "
                                  f"{verify_order_every!r}")
        if not (isinstance(timeout_s, int | float) and math.isfinite(timeout_s)
                and timeout_s > 0):
            raise TrainschedError(f"timeout_s must be a positive number, got {timeout_s!r}")
        self._static_wire = _check_static_wire(static_wire)
        if not isinstance(enabled, bool):
            raise TrainschedError(f"enabled must be True or False, got {enabled!r}")
        if not enabled:
            _refuse_when_disabled(order=order, verify_order_every=verify_order_every,
                                  timeline=timeline, tuner=tuner, update=update)
        self.enabled = enabled
        self.order = order
        self.verify_order_every = verify_order_every
        self.timeout_s = float(timeout_s)
        self._group = process_group if process_group is not None else dist.group.WORLD
        self.rank = dist.get_rank(self._group)
        self.world_size = dist.get_world_size(self._group)
        self._group_ranks = tuple(dist.get_process_group_ranks(self._group))
        # Who does what, by order: with "leader" rank 0 decides and publishes every decision
        # (`_publish`) and the others read them (`_reads_decisions`); with "static" every rank
        # issues the compiled order. Both follow a given order in their dispatch core
        # (`_follow`), except the leader itself.
        coordinated = order in ("leader", "static")
        self._follow = (order == "leader" and self.rank != 0) or order == "static"
        self._publish = order == "leader" and self.rank == 0 and self.world_size > 1
        self._reads_decisions = order == "leader" and self.rank != 0
        # Who may switch the policy: rank 0 of a coordinated group, or a lone rank; the switch
        # travels through the store once per step (`cfg/<s>`), not per decision.
        self._decides = self.rank == 0 and (coordinated or self.world_size == 1)
        self._reads_config = coordinated and self.rank != 0
        self._publish_config = coordinated and self.rank == 0 and self.world_size > 1
        if tuner is not None:
            if not isinstance(tuner, OnlineTuner):
                raise TrainschedError(f"tuner must be an OnlineTuner, got {type(tuner).__name__}")
            tuned_policy(self.policy, 4096, 4096)  # a policy without sizes to tune fails here
            if not coordinated and self.world_size > 1:
                raise TrainschedError("online tuning switches every rank at rank 0's word: it "
                                      "needs order='leader' or order='static'")
        self._tuner = tuner if self._decides else None
        if self._tuner is not None:
            self._tuner.begin(self.policy.partition_bytes, self.policy.credit_bytes)
        self._planned: list[tuple[int, CommPolicy]] = [(0, self.policy)]  # rank 0's retunes
        self._switches: list[tuple[int, CommPolicy]] = []  # applied, by the dispatcher

        self._names: list[str] = []
        self._params: list[nn.Parameter] = []
        for name, p in module.named_parameters():
            if p.requires_grad:
                self._names.append(name)
                self._params.append(p)
        if not self._params:
            raise TrainschedError("the module has no parameter that requires a gradient")
        if enabled:
            self._check_partition_alignment(self.policy)

        self._store_prefix = self._agree_prefix()
        self._store = self._make_store(store)
        self._check_same_model()
        if enabled:
            self._broadcast_state()  # disabled: DDP broadcasts them itself
        self._data_group = self._group
        if comm_threads is not None:
            self._data_group = self._gloo_group(comm_threads)
        self._optimizer_spec = (optimizer, optimizer_kwargs)
        if not enabled:
            self._init_pass_through()
            return
        self._optimizers = [self._make_optimizer(optimizer, optimizer_kwargs, [p],
                                                 f"parameter {n!r}")
                            for n, p in zip(self._names, self._params, strict=True)]
        self._slice_optimizers: list[torch.optim.Optimizer] = []  # update="partition"
        elementwise = all(type(o) in ELEMENTWISE for o in self._optimizers)
        if update == "partition" and not elementwise:
            odd = next(type(o).__name__ for o in self._optimizers if type(o) not in ELEMENTWISE)
            raise TrainschedError(f"update='partition' steps slices of a parameter, which is "
                                  f"only exact for elementwise optimizers "
                                  f"({', '.join(c.__name__ for c in ELEMENTWISE)}), not {odd}; "
                                  f"use update='parameter'")
        self.update = "partition" if update != "parameter" and elementwise else "parameter"

        # State shared by the training thread and the dispatcher thread (under _cv).
        self._cv = threading.Condition()
        self._posted = [0] * len(self._params)  # gradients handed to the dispatcher
        self._applied = [0] * len(self._params)  # updates done
        self._grads: list[torch.Tensor | None] = [None] * len(self._params)
        self._error: TrainschedError | None = None
        self._closed = False
        self._max_in_flight = 0.0

        # Training-thread state.
        self._t0 = _now()
        self._backwards = 0  # completed backward passes (= the next forward's step)
        self._forward_step = -1  # the step whose first forward ran last
        self._step_start = 0.0
        self._in_backward = False
        self._seen: set[int] = set()
        self._forward_order: list[int] = []  # parameters by first use in forward 0
        self._ready_log: list[int] = []  # parameters in gradient order in backward 0
        self._ready_times: list[float] = []  # ... and when each became ready (s, from _t0)
        self._last_ready_s = 0.0
        self._fwd_start: dict[int, float] = {}
        self._timeline_dir = Path(timeline) if timeline is not None else None
        if self._timeline_dir is not None and not self._timeline_dir.is_dir():
            raise TrainschedError(f"timeline directory {self._timeline_dir} does not exist")
        self._timeline_steps = timeline_steps
        self._spans: list[Span] = []  # the training thread's (FWD, BWD, WAIT)
        self._comm_spans: list[Span] = []  # the dispatcher thread's (QUEUE, COMM, UPDATE)
        self._owner: list[str] = [""] * len(self._params)
        self._layer_of: dict[int, int] = {}
        self._hooks: list[Any] = []
        self._install_hooks()

        # The dispatcher side.
        self._inbox: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        self._reader_inbox: queue.SimpleQueue[tuple[int, int] | None] = queue.SimpleQueue()
        self._dispatch = _Dispatch(self)
        self._dispatcher = threading.Thread(target=self._run, name="trainsched-dispatcher",
                                            daemon=True)
        self._dispatcher.start()
        self._reader: threading.Thread | None = None
        if self._reads_decisions:
            self._reader = threading.Thread(target=self._read_decisions, daemon=True,
                                            name="trainsched-decisions")
            self._reader.start()
        self_ref = weakref.ref(self)
        atexit.register(_close_at_exit, self_ref)

    # -- construction helpers ---------------------------------------------------------------

    def _check_partition_alignment(self, policy: CommPolicy) -> None:
        partition = getattr(policy, "partition_bytes", None)
        if partition is None:
            return
        for name, p in zip(self._names, self._params, strict=True):
            size = p.element_size()
            if partition % size:
                raise TrainschedError(
                    f"partition size {partition} B is not a multiple of the element size of "
                    f"parameter {name!r} ({size} B, {p.dtype}); use a multiple such as "
                    f"{max(1, partition // size) * size} B")

    def _agree_prefix(self) -> str:
        key = self._group_ranks
        count = _INSTANCES.get(key, 0)
        _INSTANCES[key] = count + 1
        return f"trainsched/sdp/{'-'.join(map(str, key))}/{count}/"

    def _make_store(self, store: Any) -> Any:
        base = store if store is not None else dist.distributed_c10d._get_default_store()
        self._base_store = base
        return self._client()

    def _client(self) -> Any:
        """A store client of our own (its own connection where the store can clone one), so
        that threads never share a connection and our timeout stays ours."""
        base = self._base_store
        with contextlib.suppress(AttributeError, RuntimeError, NotImplementedError):
            base = base.clone()
        client = dist.PrefixStore(self._store_prefix, base)
        client.set_timeout(timedelta(seconds=self.timeout_s))
        return client

    def _store_get(self, store: Any, key: str, what: str) -> bytes:
        try:
            return store.get(key)
        except Exception as exc:  # DistStoreError, RuntimeError: timeout or a closed socket
            raise TrainschedError(f"{what}: nothing within {self.timeout_s:g} s "
                                  f"({type(exc).__name__}: {str(exc).splitlines()[0]}); the "
                                  f"rank that should publish it died or hung") from None

    def _check_same_model(self) -> None:
        described = [[n, list(p.shape), str(p.dtype)]
                     for n, p in zip(self._names, self._params, strict=True)]  # fmt: skip
        text = json.dumps(described)
        self._store.set(f"model/{self.rank}", text)
        for r in range(self.world_size):
            if r == self.rank:
                continue
            other = json.loads(self._store_get(self._store, f"model/{r}",
                                               f"the model description of rank {r}"))
            if other != described:
                first = next((f"{a} vs {b}" for a, b in zip(described, other, strict=False)
                              if a != b), f"{len(described)} vs {len(other)} parameters")
                raise TrainschedError(
                    f"the models differ between rank {self.rank} and rank {r} (parameter "
                    f"name, shape, dtype: {first}); every rank must wrap the same model")

    def _gloo_group(self, threads: Any) -> Any:
        """A gloo process group over our ranks with ``threads`` worker threads, built directly
        (``new_group`` does not pass a thread count on)."""
        if not (isinstance(threads, int) and not isinstance(threads, bool) and threads >= 1):
            raise TrainschedError(f"comm_threads must be a positive integer, got {threads!r}")
        if dist.get_backend(self._group) != "gloo":
            raise TrainschedError("comm_threads sets gloo's worker threads; the process group "
                                  f"uses {dist.get_backend(self._group)}")
        gloo = dist.ProcessGroupGloo
        options = gloo._Options()
        options._threads = threads
        options._timeout = timedelta(seconds=self.timeout_s)
        options._devices = [gloo.create_default_device()]
        store = dist.PrefixStore(self._store_prefix + "gloo/", self._base_store)
        return gloo(store, self.rank, self.world_size, options)

    def _broadcast_state(self) -> None:
        if self.world_size == 1:
            return
        source = self._group_ranks[0]
        with torch.no_grad():
            for t in [*self.module.parameters(), *self.module.buffers()]:
                dist.broadcast(t.data, src=source, group=self._group)

    @staticmethod
    def _make_optimizer(optimizer: Any, kwargs: dict | None, params: list[torch.Tensor],
                        what: str) -> torch.optim.Optimizer:
        """The user's optimizer over ``params`` (``what`` names them in errors)."""
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

    def _init_pass_through(self) -> None:
        """``enabled=False``: stock DDP around the module and one optimizer over all
        parameters; no hooks, no threads (the class docstring)."""
        self._closed = False
        self._stepped = 0  # optimizer steps so far: the backward passes applied
        self._max_in_flight = 0.0
        self._decides = False
        self._optimizers = [self._make_optimizer(*self._optimizer_spec, list(self._params),
                                                 "all parameters")]
        self._slice_optimizers = []
        self.update = "parameter"
        # Not a registered submodule: the wrapper's state_dict stays the module's alone.
        self.__dict__["_ddp"] = nn.parallel.DistributedDataParallel(
            self.module, process_group=self._data_group)

    def _step_if_due(self) -> None:
        """Pass-through: step the optimizer if a backward pass left gradients since the last
        step, then drop them (DDP has averaged them over the ranks)."""
        if any(p.grad is not None for p in self._params):
            opt = self._optimizers[0]
            opt.step()
            opt.zero_grad(set_to_none=True)
            self._stepped += 1

    def _install_hooks(self) -> None:
        index = {id(p): k for k, p in enumerate(self._params)}
        for k, p in enumerate(self._params):
            self._hooks.append(p.register_post_accumulate_grad_hook(
                lambda param, k=k: self._on_grad(k)))
        self._gates: list[list[int]] = []
        for path, m in self.module.named_modules(remove_duplicate=False):
            own = [index[id(p)] for p in m._parameters.values()
                   if p is not None and id(p) in index]  # fmt: skip
            if not own:
                continue
            g = len(self._gates)
            self._gates.append(own)
            label = path or "<root>"
            for k in own:
                self._owner[k] = self._owner[k] or label
            self._hooks.append(m.register_forward_pre_hook(
                lambda mod, args, g=g, label=label: self._gate(g, label)))
            if self._timeline_dir is not None:
                self._hooks.append(m.register_forward_hook(
                    lambda mod, args, out, g=g, label=label: self._forward_done(g, label)))
        self._hooks.append(self.module.register_forward_pre_hook(
            lambda mod, args: self._before_forward(), prepend=True))
        self._hooks.append(self.module.register_forward_hook(
            lambda mod, args, out: self._after_forward()))

    # -- public --------------------------------------------------------------------------------

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if not self.enabled:
            if self._closed:
                raise TrainschedError("this ScheduledDataParallel was closed")
            self._step_if_due()
            return self._ddp(*args, **kwargs)
        return self.module(*args, **kwargs)

    @property
    def optimizers(self) -> tuple[torch.optim.Optimizer, ...]:
        """The per-parameter optimizers, in parameter order, after a :meth:`drain`. With
        ``update="partition"`` the state of each partition's optimizer is first copied into
        its parameter's optimizer, so these hold the whole state (for checkpoints). With
        ``enabled=False``: the one optimizer over all parameters."""
        self.drain()
        if self.enabled:
            self._dispatch.fold_slices()
        return tuple(self._optimizers)

    @property
    def static_order(self) -> tuple[str, ...]:
        """``order="static"``: the compiled issue order of a step (collective names), the one
        every rank issues, after a :meth:`drain`; empty before the first backward pass ends
        (the order is compiled from it) and recompiled at every policy switch."""
        if self.order != "static" or not self.enabled:
            raise TrainschedError(f"static_order is the order compiled with order='static'; "
                                  f"this wrapper uses order={self.order!r}"
                                  + ("" if self.enabled else " and enabled=False"))
        self.drain()
        d = self._dispatch
        return tuple(d.names[c] for c in d.static)

    @property
    def switches(self) -> tuple[tuple[int, CommPolicy], ...]:
        """Every policy switch this rank made: (step, the policy from that step on). The same
        on every rank."""
        return tuple(self._switches)

    def policy_at(self, step: int) -> CommPolicy:
        """The policy rank 0 has planned for ``step`` (rank 0; elsewhere: the last one
        switched to)."""
        planned = self._planned if self._decides else [(0, self.policy), *self._switches]
        return next(policy for first, policy in reversed(planned) if first <= step)

    def retune(self, policy: CommPolicy | None = None, *, at_step: int | None = None,
               **changes: Any) -> int:
        """Rank 0: run ``policy`` (the same class as the current one), or the current policy
        with ``changes`` to its fields (``partition_bytes=``, ``credit_bytes=``, ...), from
        step ``at_step`` on, on every rank. The earliest step, and the default, is
        ``steps + 1``: the next backward pass after the one about to run. Call it between
        steps (not from inside backward). Returns the step at which the switch happens."""
        if not self.enabled:
            raise TrainschedError("retune switches the scheduler's policy, but this wrapper was "
                                  "built with enabled=False (stock DDP reduces the gradients); "
                                  "build it with enabled=True to retune")
        if not self._decides:
            raise TrainschedError(
                f"retune is rank 0's call (with order='leader' or 'static'); rank {self.rank} "
                f"follows at the same step" if self.order != "local" else
                "retune needs order='leader' or 'static': with order='local' no rank can tell "
                "the others when to switch")
        if self._in_backward:
            raise TrainschedError("retune between steps, not during a backward pass")
        if self._closed:
            raise TrainschedError("this ScheduledDataParallel was closed")
        earliest = self._backwards + 1
        step = earliest if at_step is None else at_step
        if not (isinstance(step, int) and not isinstance(step, bool) and step >= earliest):
            raise TrainschedError(f"at_step must be an integer >= {earliest} (the next backward "
                                  f"pass that can still switch), got {at_step!r}")
        current = self.policy_at(step)
        if policy is None:
            try:
                policy = dataclasses.replace(current, **changes)
            except TypeError as exc:
                raise TrainschedError(f"retune: {type(current).__name__} has no such field "
                                      f"({exc})") from None
        elif changes:
            raise TrainschedError("retune takes a policy or field changes, not both")
        if type(policy) is not type(current) or not dataclasses.is_dataclass(policy):
            raise TrainschedError(f"retune keeps the policy's kind: {type(current).__name__}, "
                                  f"got {type(policy).__name__}")
        check_sizes(policy)
        self._check_partition_alignment(policy)
        json.dumps(_policy_fields(policy))  # what the other ranks will read
        self._planned = [(s, p) for s, p in self._planned if s < step] + [(step, policy)]
        self._inbox.put(("retune", step, policy))
        return step

    @property
    def steps(self) -> int:
        """Backward passes completed so far."""
        if not self.enabled:
            return self._stepped + int(any(p.grad is not None for p in self._params))
        return self._backwards

    @property
    def max_in_flight_bytes(self) -> float:
        """The most bytes this rank ever had in flight (the credit invariant's witness)."""
        return self._max_in_flight

    def drain(self, timeout_s: float | None = None) -> None:
        """Wait until every gradient handed over so far is reduced and applied (before
        evaluation, checkpoints, learning-rate changes and exit). With ``enabled=False``: step
        the optimizer if a backward pass is not yet applied."""
        if not self.enabled:
            self._step_if_due()
            return
        deadline = _now() + (self.timeout_s if timeout_s is None else timeout_s)
        with self._cv:
            while True:
                self._raise_error()
                behind = [k for k in range(len(self._params))
                          if self._applied[k] < self._posted[k]]  # fmt: skip
                if not behind:
                    return
                left = deadline - _now()
                if left <= 0:
                    raise TrainschedError(
                        f"drain: {len(behind)} parameter(s) still not updated after "
                        f"{self.timeout_s if timeout_s is None else timeout_s:g} s (first: "
                        f"{self._names[behind[0]]!r}); a rank died or hung")
                self._cv.wait(min(left, 0.5))

    def set_lr(self, lr: float) -> None:
        """Drain, then set the learning rate of every per-parameter optimizer."""
        self.drain()
        for opt in (*self._optimizers, *self._slice_optimizers):
            for group in opt.param_groups:
                group["lr"] = lr

    def close(self, timeout_s: float | None = None) -> None:
        """Drain, stop the threads, remove the hooks and write the timeline. Safe to call
        twice; a failure found while draining is raised after cleaning up."""
        if self._closed:
            return
        if not self.enabled:
            self._step_if_due()
            self._closed = True
            # Drop DDP now (its reducer's autograd hooks with it), so that the module can be
            # wrapped again without two reducers.
            del self.__dict__["_ddp"]
            gc.collect()
            return
        failure = None
        try:
            if self._error is None:
                self.drain(timeout_s)
        except TrainschedError as exc:
            failure = exc
        self._closed = True
        self._inbox.put(("stop",))
        self._reader_inbox.put(None)
        wait = 5.0 if timeout_s is None else max(0.1, timeout_s)
        self._dispatcher.join(wait)
        if self._reader is not None:
            self._reader.join(0.1)  # may sit in a store read; it is a daemon thread
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
        if self._timeline_dir is not None:
            write_timeline(self._timeline_dir / f"rank{self.rank}.trace.json",
                           [*self._spans, *self._comm_spans],
                           rank=self.rank, title="trainsched run",
                           meta={"policy": repr(self.policy), "world_size": self.world_size,
                                 "steps": list(self._timeline_steps)})
        if failure is not None:
            raise failure

    def __enter__(self) -> ScheduledDataParallel:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- training thread -------------------------------------------------------------------------

    def _raise_error(self) -> None:
        if self._error is not None:
            raise TrainschedError(str(self._error))

    def _in_window(self, step: int) -> bool:
        first, last = self._timeline_steps
        return self._timeline_dir is not None and first <= step <= last

    def _before_forward(self) -> None:
        self._raise_error()
        if self._closed:
            raise TrainschedError("this ScheduledDataParallel was closed")
        n = self._backwards
        if n == self._forward_step:
            return  # a second forward in one step (evaluation): not a new step
        now = _now()
        if self._tuner is not None and n >= 1 and self._forward_step == n - 1:
            switch = self._tuner.observe(n - 1, now - self._step_start)
            if switch is not None:
                step, (partition, credit) = switch
                self.retune(tuned_policy(self.policy_at(step), partition, credit), at_step=step)
        self._forward_step = n
        self._step_start = now

    def _after_forward(self) -> None:
        self._last_ready_s = _now() - self._t0  # where the first BWD slice starts

    def _gate(self, g: int, label: str) -> None:
        """Forward pre-hook of a module owning parameters: wait for their updates."""
        own = self._gates[g]
        if self._backwards == 0:
            for k in own:
                if k not in self._layer_of:
                    self._layer_of[k] = len(self._forward_order)
                    self._forward_order.append(k)
        start = _now()
        deadline = start + self.timeout_s
        with self._cv:
            while any(self._applied[k] < self._posted[k] for k in own):
                self._raise_error()
                left = deadline - _now()
                if left <= 0:
                    late = next(k for k in own if self._applied[k] < self._posted[k])
                    raise TrainschedError(
                        f"layer {label}: parameter {self._names[late]!r} was not updated "
                        f"within {self.timeout_s:g} s after step {self._backwards - 1}; a "
                        f"rank died or hung, or its all-reduce is stuck")
                self._cv.wait(min(left, 0.5))
            self._raise_error()
        end = _now()
        if self._in_window(self._backwards):
            if end - start > 1e-4:
                self._spans.append(Span(track="compute", phase="WAIT", label=label,
                                        start_s=start - self._t0, end_s=end - self._t0,
                                        step=self._backwards, args={"layer": label}))
            self._fwd_start[g] = end - self._t0

    def _forward_done(self, g: int, label: str) -> None:
        start = self._fwd_start.pop(g, None)
        if start is not None and self._in_window(self._backwards):
            self._spans.append(Span(track="compute", phase="FWD", label=label, start_s=start,
                                    end_s=_now() - self._t0, step=self._backwards,
                                    args={"layer": label}))

    def _on_grad(self, k: int) -> None:
        """Post-accumulate-grad hook: hand the gradient to the dispatcher."""
        self._raise_error()
        t = _now() - self._t0
        if not self._in_backward:
            self._in_backward = True
            self._seen = set()
            torch.autograd.Variable._execution_engine.queue_callback(self._backward_end)
        name = self._names[k]
        if k in self._seen:
            raise TrainschedError(
                f"parameter {name!r} received a gradient twice in one backward pass; "
                f"accumulating gradients over several backward passes is not supported")
        p = self._params[k]
        with self._cv:
            if self._applied[k] < self._posted[k]:
                raise TrainschedError(
                    f"parameter {name!r} got a new gradient before its last update was applied: "
                    f"it is used outside the module that owns it (the forward gate never ran "
                    f"for it), which ScheduledDataParallel cannot schedule")
            grad = p.grad
            assert grad is not None
            if not grad.is_contiguous():
                grad = grad.contiguous()
                p.grad = grad
            self._grads[k] = grad
            self._posted[k] += 1
        self._seen.add(k)
        if self._backwards == 0:
            self._ready_log.append(k)
            self._ready_times.append(t)
        self._inbox.put(("ready", k, t))
        if self._in_window(self._backwards):
            label = self._owner[k]
            last = self._spans[-1] if self._spans else None
            if (last is not None and last.phase == "BWD" and last.label == label
                    and last.step == self._backwards):
                self._spans[-1] = Span(track="compute", phase="BWD", label=label,
                                       start_s=last.start_s, end_s=t, step=self._backwards,
                                       args=last.args)
            else:
                self._spans.append(Span(track="compute", phase="BWD", label=label,
                                        start_s=self._last_ready_s, end_s=t,
                                        step=self._backwards, args={"layer": label}))
        self._last_ready_s = t

    def _backward_end(self) -> None:
        """Runs once at the end of each backward pass (an autograd final callback)."""
        self._in_backward = False
        missing = [self._names[k] for k in range(len(self._params)) if k not in self._seen]
        if missing:
            more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
            error = TrainschedError(
                f"parameter(s) {', '.join(map(repr, missing[:3]))}{more} got no gradient in "
                f"step {self._backwards}: every trainable parameter must take part in every "
                f"step (a static used set); freeze unused ones with requires_grad_(False)")
            self._fail(error)
            raise error
        if self._backwards == 0:
            self._inbox.put(("plan", *self._task_table()))
        self._backwards += 1

    def _task_table(self) -> tuple[tuple[Gradient, ...], dict[str, float]]:
        """Rank 0's layer and ready order, and when each gradient became ready in step 0
        (seconds from the first; ``order="static"`` compiles from them), published as one
        JSON message; every rank, rank 0 too, builds from the parsed message (JSON floats
        round-trip exactly, so every rank holds the same numbers)."""
        key = "plan"
        if self.rank == 0:
            ready = {k: n for n, k in enumerate(self._ready_log)}
            when = dict(zip(self._ready_log, self._ready_times, strict=True))
            first = self._ready_times[0]
            late = len(self._forward_order)
            table = [[self._names[k], self._layer_of.get(k, late + k), ready[k],
                      when[k] - first] for k in range(len(self._params))]  # fmt: skip
            text = json.dumps(table)
            self._store.set(key, text)
        else:
            text = self._store_get(self._store, key, "the task table of rank 0")
        table = json.loads(text)
        sizes = [p.numel() * p.element_size() for p in self._params]
        if [row[0] for row in table] != self._names:
            raise TrainschedError("rank 0's parameters differ from this rank's")
        gradients = tuple(Gradient(name=name, size_bytes=sizes[k], layer_index=layer,
                                   ready_index=ready)
                          for k, (name, layer, ready, _) in enumerate(table))  # fmt: skip
        return gradients, {row[0]: row[3] for row in table}

    def _fail(self, error: TrainschedError) -> None:
        with self._cv:
            if self._error is None:
                self._error = error
            self._cv.notify_all()

    # -- dispatcher thread ---------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._dispatch.loop()
        except TrainschedError as exc:
            self._fail(exc)
        except Exception as exc:  # a bug or a torch error: still reach the training thread
            self._fail(TrainschedError(f"the dispatcher thread of rank {self.rank} failed: "
                                       f"{type(exc).__name__}: {exc}"))

    def _read_decisions(self) -> None:
        """Follower: read rank 0's decisions of each step the dispatcher asks for."""
        store = self._client()
        try:
            while True:
                item = self._reader_inbox.get()
                if item is None:
                    return
                step, count = item
                for k in range(count):
                    value = self._store_get(store, f"{step}/{k}",
                                            f"rank 0's decision {k} of step {step}")
                    self._inbox.put(("decision", int(value)))
        except TrainschedError as exc:
            if not self._closed:
                self._inbox.put(("error", exc))


def static_issue_order(policy: CommPolicy, gradients: Sequence[Gradient],
                       ready_s: dict[str, float],
                       wire: tuple[float, float] = STATIC_WIRE) -> tuple[str, ...]:
    """The issue order ``order="static"`` compiles: ``policy``'s collectives of ``gradients``
    (names), in the order the dispatch core hands them to a fake FIFO wire on which gradient
    ``name`` becomes ready at ``ready_s[name]`` (seconds) and a collective of ``size`` bytes
    takes ``alpha_s + size / bytes_per_s`` (``wire = (alpha_s, bytes_per_s)``).

    This is :func:`~trainsched.comm.dispatch.replay_fifo_wire`, the same replay the simulator
    is checked against, so the order is the one the policy would produce at those ready
    times: a collective that is ready while the wire is idle goes first even if a more urgent
    one follows shortly, and queued collectives leave by priority (and credit). A pure
    function of its arguments: every rank that calls it with the same task table and times
    gets the same order."""
    alpha_s, bytes_per_s = _check_static_wire(wire)
    records, _ = replay_fifo_wire(
        lambda transport: Dispatcher.for_policy(policy, gradients, transport, follow=False),
        ready_s, lambda size: alpha_s + size / bytes_per_s)
    order = tuple(r.name for r in records)
    assert len(set(order)) == len(order), "the fake wire ran a collective twice"
    return order


def _check_static_wire(wire: Any) -> tuple[float, float]:
    """``(alpha_s, bytes_per_s)``: α finite and >= 0, bandwidth > 0."""
    ok = (isinstance(wire, tuple | list) and len(wire) == 2
          and all(isinstance(v, int | float) and not isinstance(v, bool) for v in wire))
    if ok:
        alpha_s, bytes_per_s = float(wire[0]), float(wire[1])
        ok = math.isfinite(alpha_s) and alpha_s >= 0 and bytes_per_s > 0
    if not ok:
        raise TrainschedError(f"static_wire must be (alpha_s, bytes_per_s): the start-up "
                              f"seconds of one collective (>= 0) and the bandwidth in bytes/s "
                              f"(> 0), e.g. {STATIC_WIRE}; got {wire!r}")
    return alpha_s, bytes_per_s


def _refuse_when_disabled(*, order: str, verify_order_every: int, timeline: Any, tuner: Any,
                          update: str) -> None:
    """``enabled=False`` hands the gradients to stock DDP: refuse what only the scheduler
    does."""
    asked = [what for what, given in (
        ("a tuner (it retunes the scheduler's partition and credit)", tuner is not None),
        ("a timeline (it records the scheduler's queue, collectives and updates)",
         timeline is not None),
        ("verify_order_every (it checks the scheduler's collective order)",
         verify_order_every != 0),
        (f"order={order!r} (DDP orders its own buckets)", order != "leader"),
        ("update='partition' (one optimizer steps all parameters)", update == "partition"),
    ) if given]
    if asked:
        raise TrainschedError(f"enabled=False is a pass-through to DistributedDataParallel; "
                              f"it refuses {'; '.join(asked)}: drop "
                              f"{'them' if len(asked) > 1 else 'it'} or use enabled=True")


def _policy_fields(policy: CommPolicy) -> dict[str, Any]:
    return {f.name: getattr(policy, f.name) for f in dataclasses.fields(policy)}


def _slice_state(value: Any, p: torch.Tensor, lo: int, hi: int) -> Any:
    """Elements ``lo:hi`` of one optimizer state entry of parameter ``p`` (a copy): per-element
    tensors are sliced, anything else (Adam's step count) is copied whole."""
    if torch.is_tensor(value) and value.shape == p.shape:
        return value.detach().reshape(-1)[lo:hi].clone()
    return value.clone() if torch.is_tensor(value) else value


def _close_at_exit(ref: weakref.ref) -> None:
    sdp = ref()
    if sdp is not None and not sdp._closed:
        with contextlib.suppress(TrainschedError):
            sdp.close(timeout_s=5.0)


class _Transport:
    """Issues collectives with torch.distributed for the dispatcher thread."""

    def __init__(self, owner: _Dispatch) -> None:
        self.owner = owner

    def issue(self, index: int) -> None:
        self.owner.issue(index)


class _Dispatch:
    """The dispatcher thread's state: one :class:`Dispatcher` core per step, the collectives'
    tensors, the leader's publishing (or the compiled static order), order checks and the
    updates."""

    def __init__(self, sdp: ScheduledDataParallel) -> None:
        self.sdp = sdp
        self.store = sdp._client()
        self.core: Dispatcher | None = None
        self.step = -1
        self.position = 0  # issues so far in this step
        self.readies = 0  # gradients ready so far in this step
        self.early: list[tuple[int, float]] = []  # ready before the task table exists
        # Units waiting for their optimizer step: (layer, collective or -1 for the whole
        # parameter, parameter); without cross_barrier they wait in `deferred` for the step.
        self.updates: list[tuple[int, int, int]] = []
        self.deferred: list[tuple[int, int, int]] = []
        self.works: dict[int, Any] = {}
        self.tensors: dict[int, torch.Tensor] = {}  # in flight: the view or packed buffer
        # Per bucket, its flat buffer, reused every step: a fresh one each step would cost a
        # page fault per 4 KiB (buffers this large are mmapped and unmapped again). The
        # members' gradients are views into it from the all-reduce to their updates, which
        # come before the next forward of their module and so before the next packing.
        self.buffers: dict[int, torch.Tensor] = {}
        self.issued_s: dict[int, float] = {}
        self.queued_s: dict[int, float] = {}
        self.missing: list[int] = []  # per collective: members not ready yet in this step
        self.sequence = 0  # issues since the start, for the order check
        self.digest = hashlib.sha1(b"trainsched")
        self.checks = 0
        self.gradients: tuple[Gradient, ...] = ()
        self.ready_s: dict[str, float] = {}  # rank 0's step-0 ready times (the task table's)
        self.static: tuple[int, ...] = ()  # order="static": the compiled issue order
        self.pending: dict[int, CommPolicy] = {}  # rank 0: retunes not yet published
        self.switch_at: dict[int, CommPolicy] = {}  # the policy to switch to at a step
        self.slices: dict[int, tuple[torch.Tensor, torch.optim.Optimizer]] = {}

    # -- setup ---------------------------------------------------------------------------------

    def build(self, gradients: Sequence[Gradient]) -> None:
        sdp = self.sdp
        self.gradients = tuple(gradients)
        policy = sdp.policy
        plan = tuple(policy.plan(gradients))
        check_plan(gradients, plan, f"comm policy {type(policy).__name__}")
        self.core = Dispatcher(plan, queue=policy.queue, credit_bytes=policy.credit_bytes,
                               credit_mode=policy.credit_mode,
                               ordered_issue=policy.ordered_issue, transport=_Transport(self),
                               follow=sdp._follow,
                               backfill=bool(getattr(policy, "backfill", False)))
        spans = partition_spans(gradients, plan)
        index = {n: k for k, n in enumerate(sdp._names)}
        self.index = index
        self.layer = {index[g.name]: g.layer_index for g in gradients}
        self.parts: list[list[tuple[int, int, int]]] = []  # per collective: (param, lo, hi)
        self.buffers = {}  # a new plan numbers its collectives anew
        self.holders: dict[int, list[int]] = {}
        for c, coll in enumerate(plan):
            row = []
            for name, (a, b) in spans[coll.name].items():
                k = index[name]
                size = sdp._params[k].element_size()
                row.append((k, a // size, b // size))
                self.holders.setdefault(k, []).append(c)
            if len(row) > 1 and len({sdp._params[k].dtype for k, _, _ in row}) > 1:
                raise TrainschedError(f"collective {coll.name!r} mixes gradient dtypes; "
                                      f"use a policy that reduces them separately")
            self.parts.append(row)
        self.names = [c.name for c in plan]
        if sdp.order == "static":
            order = static_issue_order(policy, gradients, self.ready_s, sdp._static_wire)
            self.static = tuple(self.core.index[name] for name in order)
        self.tracks = [f"comm/{sdp._names[row[0][0]]}" if len(row) == 1 else f"comm/{name}"
                       for row, name in zip(self.parts, self.names, strict=True)]
        # update="partition": every part of a split, contiguous parameter is stepped alone,
        # through a detached view and an optimizer of its own, which starts from that part of
        # the parameter optimizer's hyperparameters and state (set_lr may have run, a switch
        # may have folded the last plan's partitions back into it).
        self.slices = {}
        slice_optimizers = []
        self.units = [1] * len(sdp._params)  # update units per parameter
        if sdp.update == "partition":
            optimizer, kwargs = sdp._optimizer_spec
            for k, cs in self.holders.items():
                p = sdp._params[k]
                if len(cs) < 2 or not p.is_contiguous():
                    continue
                self.units[k] = len(cs)
                whole = sdp._optimizers[k]
                state = whole.state.get(p, {})
                for c in cs:
                    (_, lo, hi), = self.parts[c]
                    view = p.detach().view(-1)[lo:hi]
                    opt = sdp._make_optimizer(optimizer, kwargs, [view],
                                              f"partition {self.names[c]!r}")
                    for key, value in whole.param_groups[0].items():
                        if key != "params":
                            opt.param_groups[0][key] = value
                    if state:
                        opt.state[view] = {key: _slice_state(value, p, lo, hi)
                                           for key, value in state.items()}  # fmt: skip
                    self.slices[c] = (view, opt)
                    slice_optimizers.append(opt)
        sdp._slice_optimizers = slice_optimizers
        self.units_left = list(self.units)

    def fold_slices(self) -> None:
        """Copy every partition optimizer's state into its parameter's optimizer (only
        between steps: nothing may be updating)."""
        sdp = self.sdp
        by_param: dict[int, list[int]] = {}
        for c in self.slices:
            by_param.setdefault(self.parts[c][0][0], []).append(c)
        for k, cs in by_param.items():
            p = sdp._params[k]
            whole: dict[str, Any] = {}
            for c in cs:
                view, opt = self.slices[c]
                _, lo, hi = self.parts[c][0]
                for key, value in opt.state.get(view, {}).items():
                    if torch.is_tensor(value) and value.shape == view.shape:
                        if key not in whole:
                            whole[key] = torch.empty(p.shape, dtype=value.dtype)
                        whole[key].view(-1)[lo:hi].copy_(value)
                    elif key not in whole:  # per-parameter scalars (Adam's step): all equal
                        whole[key] = value.clone() if torch.is_tensor(value) else value
            if whole:
                sdp._optimizers[k].state[p] = whole

    def switch(self, step: int, policy: CommPolicy) -> None:
        """Run ``policy`` from ``step`` on: at the first gradient of that step, with the last
        step's collectives all done."""
        sdp = self.sdp
        while self.updates:  # the last step's updates first: they belong to the old plan
            self.update(*heapq.heappop(self.updates))
        self.fold_slices()
        sdp.policy = policy
        self.build(self.gradients)
        sdp._switches.append((step, policy))
        if sdp._in_window(step):
            t = _now() - sdp._t0
            sdp._comm_spans.append(Span(track="update", phase="SWITCH", label="switch",
                                        start_s=t, end_s=t, step=step,
                                        args=_policy_fields(policy)))

    # -- the loop ------------------------------------------------------------------------------

    def loop(self) -> None:
        inbox = self.sdp._inbox
        while True:
            events = [] if self.updates else [inbox.get()]
            while True:
                try:
                    events.append(inbox.get_nowait())
                except queue.Empty:
                    break
            for event in events:
                if event[0] == "stop":
                    return
                self.handle(event)
            if self.core is not None:
                self.core.pump()
            if self.updates:
                self.update(*heapq.heappop(self.updates))

    def handle(self, event: tuple[Any, ...]) -> None:
        kind = event[0]
        if kind == "ready":
            _, k, t = event
            if self.core is None:
                self.early.append((k, t))
                return
            self.ready(k, t)
        elif kind == "plan":
            self.ready_s = event[2]
            self.build(event[1])
            for k, t in self.early:
                self.ready(k, t)
            self.early.clear()
        elif kind == "retune":
            _, step, policy = event
            if step <= self.step + 1:
                raise TrainschedError(f"internal: a retune for step {step} arrived at step "
                                      f"{self.step}")
            self.pending[step] = policy
        elif kind == "decision":
            assert self.core is not None
            self.core.decide(event[1])
        elif kind == "done":
            self.done(event[1], event[2], event[3])
        elif kind == "error":
            raise event[1]

    def ready(self, k: int, t: float) -> None:
        core = self.core
        assert core is not None
        sdp = self.sdp
        if self.readies == 0:
            if self.step >= 0 and not core.finished:
                raise TrainschedError("a new step began before the last one was reduced")
            self.step_boundary(self.step + 1)
            core = self.core
            core.new_step()
            self.step += 1
            self.position = 0
            self.missing = [len(row) for row in self.parts]
            if sdp._reads_decisions:
                sdp._reader_inbox.put((self.step, len(core.plan)))
            for c in self.static:  # order="static": the whole step's sequence, known already
                core.decide(c)
        self.readies = (self.readies + 1) % len(sdp._params)
        core.ready([sdp._names[k]])
        for c in self.holders[k]:
            self.missing[c] -= 1
            if not self.missing[c]:
                self.queued_s[c] = t

    def step_boundary(self, step: int) -> None:
        """The first gradient of ``step``: switch if this step's policy changes, and (rank 0)
        publish the next step's policy."""
        sdp = self.sdp
        policy = self.switch_at.pop(step, None)
        if sdp._reads_config and step >= 1:
            text = sdp._store_get(self.store, f"cfg/{step}", f"rank 0's policy for step {step}")
            if text:
                fields = json.loads(text)
                policy = type(sdp.policy)(**fields)
        if policy is not None:
            self.switch(step, policy)
        if sdp._decides:
            upcoming = self.pending.pop(step + 1, None)
            if upcoming is not None:
                self.switch_at[step + 1] = upcoming
            if sdp._publish_config:
                text = "" if upcoming is None else json.dumps(_policy_fields(upcoming))
                self.store.set(f"cfg/{step + 1}", text)
                if step >= 2:
                    self.store.delete_key(f"cfg/{step - 2}")

    # -- issuing -------------------------------------------------------------------------------

    def issue(self, c: int) -> None:
        sdp = self.sdp
        if sdp._publish:
            self.store.set(f"{self.step}/{self.position}", str(c))
            if self.step >= 2:
                self.store.delete_key(f"{self.step - 2}/{self.position}")
        self.position += 1
        if sdp.verify_order_every:
            self.check_order(c)
        row = self.parts[c]
        if len(row) == 1:
            k, lo, hi = row[0]
            grad = sdp._grads[k]
            assert grad is not None
            tensor = grad.view(-1)[lo:hi]
        else:
            members = [sdp._grads[k].view(-1)[lo:hi] for k, lo, hi in row]
            tensor = self.buffers.get(c)
            if tensor is None:
                tensor = self.buffers[c] = torch.cat(members)
            else:
                torch.cat(members, out=tensor)
        self.tensors[c] = tensor
        sdp._max_in_flight = max(sdp._max_in_flight, self.core.max_in_flight_bytes)
        t = _now() - sdp._t0
        self.issued_s[c] = t
        work = dist.all_reduce(tensor, group=sdp._data_group, async_op=True)
        self.works[c] = work
        inbox = sdp._inbox
        work.get_future().add_done_callback(
            lambda fut, c=c: inbox.put(("done", c, fut, _now() - sdp._t0)))

    def check_order(self, c: int) -> None:
        """Compare a digest of every rank's issue sequence, every N-th issue."""
        sdp = self.sdp
        name = self.names[c]
        self.digest.update(name.encode() + b"\0")
        self.sequence += 1
        if self.sequence % sdp.verify_order_every:
            return
        mine = [self.digest.hexdigest(), name]
        key = f"order/{self.checks}"
        self.store.set(f"{key}/{sdp.rank}", json.dumps(mine))
        for r in range(sdp.world_size):
            if r == sdp.rank:
                continue
            theirs = json.loads(self.sdp._store_get(self.store, f"{key}/{r}",
                                                    f"rank {r}'s order check {self.checks}"))
            if theirs != mine:
                raise TrainschedError(
                    f"collective order differs between ranks at issue {self.sequence} (step "
                    f"{self.step}): rank {sdp.rank} issues {name!r}, rank {r} issues "
                    f"{theirs[1]!r} (or an earlier issue differed); the ranks would sum "
                    f"unrelated gradients. Use order='leader' or order='static'")
        if self.checks >= 2:
            self.store.delete_key(f"order/{self.checks - 2}/{sdp.rank}")
        self.checks += 1

    # -- completion and updates ----------------------------------------------------------------

    def done(self, c: int, fut: Any, t: float) -> None:
        sdp = self.sdp
        core = self.core
        assert core is not None
        try:
            fut.wait()
        except Exception as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            raise TrainschedError(
                f"the all-reduce of {self.names[c]!r} failed on rank {sdp.rank} "
                f"({type(exc).__name__}: {first}); another rank probably died or timed "
                f"out") from None
        self.works.pop(c, None)
        tensor = self.tensors.pop(c)
        if sdp.world_size > 1:
            tensor.div_(sdp.world_size)  # the average, while the partition is hot in cache
        if len(self.parts[c]) > 1:  # unpack a bucket
            offset = 0
            for k, lo, hi in self.parts[c]:
                grad = sdp._grads[k]
                assert grad is not None
                reduced = tensor[offset:offset + hi - lo]
                if hi - lo == grad.numel():  # a whole gradient: its slice of the bucket
                    sdp._grads[k] = reduced.view(grad.shape)  # is the gradient (no copy)
                else:
                    grad.view(-1)[lo:hi].copy_(reduced)
                offset += hi - lo
        if sdp._in_window(self.step):
            track = self.tracks[c]
            args = {"task": self.names[c], "bytes": core.sizes[c]}
            if c in self.queued_s:
                sdp._comm_spans.append(Span(track=track, phase="QUEUE", label=self.names[c],
                                       start_s=self.queued_s.pop(c), end_s=self.issued_s[c],
                                       step=self.step, args=args))
            sdp._comm_spans.append(Span(track=track, phase="COMM", label=self.names[c],
                                   start_s=self.issued_s[c], end_s=t, step=self.step,
                                   args=args))
        units = []
        if c in self.slices:
            k = self.parts[c][0][0]
            units.append((self.layer[k], c, k))
        for name in core.done(c):
            k = self.index[name]
            if self.units[k] == 1:
                units.append((self.layer[k], -1, k))
        if sdp.policy.cross_barrier:
            for unit in units:
                heapq.heappush(self.updates, unit)
        else:
            self.deferred += units
            if core.finished:
                for unit in self.deferred:
                    heapq.heappush(self.updates, unit)
                self.deferred.clear()

    def update(self, layer: int, c: int, k: int) -> None:
        """Step the optimizer of a unit: part ``c`` of parameter ``k``, or all of it."""
        sdp = self.sdp
        p = sdp._params[k]
        grad = sdp._grads[k]
        assert grad is not None
        start = _now()
        if c >= 0:
            view, opt = self.slices[c]
            _, lo, hi = self.parts[c][0]
            view.grad = grad.view(-1)[lo:hi]
            opt.step()
            view.grad = None
        else:
            p.grad = grad
            sdp._optimizers[k].step()
        end = _now()
        if sdp._in_window(self.step):
            args = {"layer": sdp._owner[k], "param": sdp._names[k]}
            if c >= 0:
                args["task"] = self.names[c]
            sdp._comm_spans.append(Span(track="update", phase="UPDATE", label=sdp._owner[k],
                                        start_s=start - sdp._t0, end_s=end - sdp._t0,
                                        step=self.step, args=args))
        self.units_left[k] -= 1
        if self.units_left[k]:
            return
        self.units_left[k] = self.units[k]
        p.grad = None
        sdp._grads[k] = None
        with sdp._cv:
            sdp._applied[k] += 1
            sdp._cv.notify_all()
