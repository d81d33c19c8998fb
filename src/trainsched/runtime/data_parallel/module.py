"""The wrapper itself: :class:`ScheduledDataParallel`, an ``nn.Module`` around the user's.

It checks what it is given, does the collective parts of construction (every rank compares
its model, rank 0's state is broadcast) and hands the rest to one of two engines: the
scheduler (:class:`~.scheduler.Scheduler`) or, with ``enabled=False``, the pass-through to
stock DDP (:class:`~.passthrough.PassThrough`). The package docstring says how it works.
"""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import nn

from trainsched.comm.dispatch import check_sizes
from trainsched.comm.policy import CommPolicy, comm_policy
from trainsched.errors import TrainschedError
from trainsched.runtime.calibration import GLOO_THREADS
from trainsched.runtime.data_parallel.deferred import check_backprop_k
from trainsched.runtime.data_parallel.group import Peers
from trainsched.runtime.data_parallel.layout import Trainable
from trainsched.runtime.data_parallel.options import DataParallelOptions
from trainsched.runtime.data_parallel.passthrough import PassThrough, refuse_disabled
from trainsched.runtime.data_parallel.retune import check_tuner
from trainsched.runtime.data_parallel.scheduler import Scheduler

__all__ = ["ScheduledDataParallel", "gradient_group"]


class _Engine(Protocol):
    """What the wrapper asks of the scheduler or the pass-through."""

    @property
    def policy(self) -> CommPolicy: ...
    @property
    def update(self) -> str: ...
    @property
    def steps(self) -> int: ...
    @property
    def max_in_flight_bytes(self) -> float: ...
    @property
    def dw_peak_held_bytes(self) -> int: ...
    @property
    def switches(self) -> tuple[tuple[int, CommPolicy], ...]: ...

    def forward(self, *args: Any, **kwargs: Any) -> Any: ...
    def optimizers(self) -> tuple[torch.optim.Optimizer, ...]: ...
    def static_order(self) -> tuple[str, ...]: ...
    def policy_at(self, step: int) -> CommPolicy: ...
    def retune(self, policy: CommPolicy | None, at_step: int | None,
               changes: dict[str, Any]) -> int: ...
    def drain(self, timeout_s: float | None = None) -> None: ...
    def set_lr(self, lr: float) -> None: ...
    def close(self, timeout_s: float | None = None) -> None: ...


def gradient_group(peers: Peers, threads: int | None, enabled: bool) -> Any:
    """The group the gradients are reduced on. The scheduler issues them from its own thread
    and they may still be in flight when ``backward()`` returns, so they get a group of their
    own: a collective the training loop runs on its group between steps (a loss all-reduced
    for logging, a barrier) then never pairs with a gradient's.

    ``threads`` given: a gloo group of ours with that many worker threads. Otherwise the
    pass-through (stock DDP, whose collectives end inside ``backward()``) keeps the wrapper's
    group; the scheduler over the default group gets ``new_group()`` of the default backend
    (every rank builds its wrapper, so every rank takes part), over a gloo subgroup a gloo
    group of ours built directly (gloo's default 2 threads), over a subgroup of another backend
    the subgroup itself (``new_group`` would need every rank of the job to call it)."""
    if threads is not None:
        return peers.gloo_group(threads)
    if not enabled:
        return peers.group
    if peers.is_world:
        return dist.new_group(timeout=timedelta(seconds=peers.timeout_s))
    if dist.get_backend(peers.group) == "gloo":
        return peers.gloo_group(GLOO_THREADS)
    return peers.group


class ScheduledDataParallel(nn.Module):
    """Data-parallel training of ``module`` with gradients reduced as ``policy`` says.

    ``policy``: a :class:`~trainsched.comm.policy.CommPolicy` or a registered name
    (``"fifo"``, ``"ddp"``, ``"priority"``). ``optimizer``: an optimizer class, built once per
    parameter with ``optimizer_kwargs`` (e.g. ``torch.optim.SGD, {"lr": 0.1, "momentum":
    0.9}``), or a callable taking a one-parameter list and returning an optimizer. The
    training loop is ``loss_fn(model(x)).backward()``; there is no optimizer step to call.
    ``timeline``: a directory where ``close()`` writes ``rank<r>.trace.json`` covering steps
    ``timeline_steps`` (first, last; step 0 is the first backward pass); a wrapper left open
    at exit is drained and stopped but writes nothing. Construction is collective: every rank
    of the group must build its wrapper, in the same order.

    The settings (``order``, ``verify_order_every``, ``timeout_s``, ``timeline``,
    ``timeline_steps``, ``update``, ``comm_threads``, ``static_wire``, ``enabled``,
    ``backprop_k``, ``split_backend``, ``link_hold``) are the
    fields of :class:`~.options.DataParallelOptions`: pass them as keyword arguments, or as
    ``options=`` (keyword arguments then override its fields).

    ``update``: ``"parameter"`` steps a parameter's optimizer once all its partitions are
    reduced; ``"partition"`` steps each partition's slice as soon as that partition is reduced
    (an optimizer per slice; only for elementwise optimizers, :data:`~.units.ELEMENTWISE`,
    where it is the same computation), so a large layer's update no longer waits for, and
    follows, its last partition; ``"auto"`` (default) picks ``"partition"`` when the optimizer
    is elementwise.

    ``comm_threads`` (gloo only): the number of worker threads of the gloo group of our own
    that the gradients are reduced on (default gloo's 2; 1 makes the transport one FIFO wire,
    on which the credit and the priority order hold exactly). The scheduler reduces on a group
    of its own (:func:`gradient_group`), so the training loop may run its own collectives on
    its group between steps; only over a subgroup of a backend other than gloo does it share
    the subgroup: call :meth:`drain` before a collective of your own on it.

    ``tuner``: an :class:`~trainsched.comm.tune.OnlineTuner` that rank 0 feeds with its step
    times (a step: from one forward after a backward pass to the next) and follows with
    :meth:`retune`; the other ranks ignore theirs (pass one everywhere: its
    ``total_steps`` tells every rank when tuning is over). Needs a policy with a partition size
    and a credit (``priority``, ``bytescheduler``) and ``order="leader"`` or ``"static"``.

    ``order``: ``"leader"`` (default), ``"static"`` or ``"local"`` (package docstring).
    ``static_wire``: ``(alpha_s, bytes_per_s)``, the linear cost ``alpha_s + size /
    bytes_per_s`` of one collective on the fake FIFO wire ``order="static"`` compiles its issue
    order on (default :data:`~.options.STATIC_WIRE`: gloo on loopback). Only the order is
    taken from the simulation, so the wire needs to be right only in proportion: how many
    gradients become ready while one collective runs.

    ``backprop_k``: out-of-order backprop, reverse-first-k (:mod:`.deferred`). ``0`` (default)
    is in-order backprop, the runtime unchanged. ``k > 0`` splits the module's backward in
    place (:func:`trainsched.runtime.split.split_backward` with ``split_backend``: ``"auto"``,
    ``"function"`` or ``"graph"``): the weight gradients of the k split layers nearest the
    input (in forward order; norm layers are not split and not counted) are computed after
    the last input gradient, layer 0 first, and handed to the dispatcher one by one; their
    updates wait, in the next step, just before that layer's forward. ``k`` above the number
    of split layers is refused. :meth:`close` puts the module's own forwards back.

    ``link_hold``: fault injection, a delayed link (the sync runtime's ``RANK:DELAY@link``):
    called with the step before this rank issues the step's first collective (with
    ``enabled=False``: before DDP's first bucket, in a comm hook); it may sleep.

    ``enabled=False``: a pass-through (package docstring): stock ``DistributedDataParallel``
    and one ``optimizer`` over all parameters (the class with ``optimizer_kwargs``, or a
    factory called with the list of all trainable parameters), stepped at the next forward
    after a backward pass (or in :meth:`drain`, :meth:`close`, :attr:`optimizers`). The
    policy is then unused; a tuner, a timeline, ``verify_order_every``, an ``order`` other than
    ``"leader"``, ``update="partition"`` and :meth:`retune` are refused.
    """

    def __init__(self, module: nn.Module, policy: CommPolicy | str = "priority", *,
                 options: DataParallelOptions | None = None, process_group: Any = None,
                 optimizer: Any = torch.optim.SGD, optimizer_kwargs: dict | None = None,
                 store: Any = None, tuner: Any = None, **settings: Any) -> None:
        super().__init__()
        if not dist.is_initialized():
            raise TrainschedError("ScheduledDataParallel needs torch.distributed: call "
                                  "torch.distributed.init_process_group first")
        if not isinstance(module, nn.Module):
            raise TrainschedError(f"ScheduledDataParallel wraps an nn.Module, got "
                                  f"{type(module).__name__}")
        self.module = module
        policy = comm_policy(policy) if isinstance(policy, str) else policy
        check_sizes(policy)
        known = [f.name for f in dataclasses.fields(DataParallelOptions)]
        unknown = sorted(set(settings) - set(known))
        if unknown:
            raise TypeError(f"ScheduledDataParallel got unexpected keyword argument(s) "
                            f"{', '.join(unknown)}; its settings are {', '.join(known)}")
        self.options = (DataParallelOptions(**settings) if options is None
                        else dataclasses.replace(options, **settings))
        enabled = self.options.enabled
        if not enabled:
            refuse_disabled(self.options, tuner)
        peers = Peers(process_group, store, self.options.timeout_s)
        self._peers = peers
        if tuner is not None:
            check_tuner(tuner, policy, self.options.coordinated, peers.world_size)
        trainable = Trainable.of(module)
        if self.options.backprop_k:
            check_backprop_k(module, self.options.backprop_k, self.options.split_backend)
        if enabled:
            trainable.check_alignment(policy)
        peers.check_same_model(trainable.names, trainable.tensors)
        if enabled:
            peers.broadcast(module)  # disabled: DDP broadcasts them itself
        data_group = gradient_group(peers, self.options.comm_threads, enabled)
        self._engine: _Engine
        if enabled:
            self._engine = Scheduler(module, policy, trainable=trainable, peers=peers,
                                     options=self.options, optimizer=optimizer,
                                     kwargs=optimizer_kwargs, tuner=tuner,
                                     data_group=data_group)
        else:
            self._engine = PassThrough(module, policy, trainable, optimizer,
                                       optimizer_kwargs, data_group,
                                       hold=self.options.link_hold)

    # -- settings and where this rank stands ---------------------------------------------------

    @property
    def policy(self) -> CommPolicy:
        """The policy in force (it changes at a switch)."""
        return self._engine.policy

    @property
    def enabled(self) -> bool:
        return self.options.enabled

    @property
    def order(self) -> str:
        return self.options.order

    @property
    def verify_order_every(self) -> int:
        return self.options.verify_order_every

    @property
    def timeout_s(self) -> float:
        return self.options.timeout_s

    @property
    def update(self) -> str:
        """What one optimizer step covers: ``"partition"`` or ``"parameter"`` (``"auto"``
        resolved)."""
        return self._engine.update

    @property
    def rank(self) -> int:
        return self._peers.rank

    @property
    def world_size(self) -> int:
        return self._peers.world_size

    # -- the training loop's API ---------------------------------------------------------------

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self._engine.forward(*args, **kwargs)

    @property
    def optimizers(self) -> tuple[torch.optim.Optimizer, ...]:
        """The per-parameter optimizers, in parameter order, after a :meth:`drain`. With
        ``update="partition"`` the state of each partition's optimizer is first copied into
        its parameter's optimizer, so these hold the whole state (for checkpoints). With
        ``enabled=False``: the one optimizer over all parameters."""
        return self._engine.optimizers()

    @property
    def static_order(self) -> tuple[str, ...]:
        """``order="static"``: the compiled issue order of a step (collective names), the one
        every rank issues, after a :meth:`drain`; empty before the first backward pass ends
        (the order is compiled from it) and recompiled at every policy switch."""
        return self._engine.static_order()

    @property
    def switches(self) -> tuple[tuple[int, CommPolicy], ...]:
        """Every policy switch this rank made: (step, the policy from that step on). The same
        on every rank."""
        return self._engine.switches

    def policy_at(self, step: int) -> CommPolicy:
        """The policy rank 0 has planned for ``step`` (rank 0; elsewhere: the last one
        switched to)."""
        return self._engine.policy_at(step)

    def retune(self, policy: CommPolicy | None = None, *, at_step: int | None = None,
               **changes: Any) -> int:
        """Rank 0: run ``policy`` (the same class as the current one), or the current policy
        with ``changes`` to its fields (``partition_bytes=``, ``credit_bytes=``, ...), from
        step ``at_step`` on, on every rank. The earliest step, and the default, is
        ``steps + 1``: the next backward pass after the one about to run. Call it between
        steps (not from inside backward). Returns the step at which the switch happens."""
        return self._engine.retune(policy, at_step, changes)

    @property
    def steps(self) -> int:
        """Backward passes completed so far."""
        return self._engine.steps

    @property
    def max_in_flight_bytes(self) -> float:
        """The most bytes this rank ever had in flight (the credit invariant's witness)."""
        return self._engine.max_in_flight_bytes

    @property
    def dw_peak_held_bytes(self) -> int:
        """With ``backprop_k > 0``: the most bytes the deferred weight gradients kept alive at
        once (their inputs and output gradients, each storage once; parameters not counted);
        0 otherwise."""
        return self._engine.dw_peak_held_bytes

    def drain(self, timeout_s: float | None = None) -> None:
        """Wait until every gradient handed over so far is reduced and applied (before
        evaluation, checkpoints, learning-rate changes and exit). With ``enabled=False``: step
        the optimizer if a backward pass is not yet applied."""
        self._engine.drain(timeout_s)

    def set_lr(self, lr: float) -> None:
        """Drain, then set the learning rate of every per-parameter optimizer."""
        self._engine.set_lr(lr)

    def close(self, timeout_s: float | None = None) -> None:
        """Drain, stop the threads, remove the hooks and write the timeline. Safe to call
        twice; a failure found while draining is raised after cleaning up."""
        self._engine.close(timeout_s)

    def __enter__(self) -> ScheduledDataParallel:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- test instrumentation (not API) --------------------------------------------------------

    @property
    def _dispatch(self) -> Any:
        """The dispatcher loop (``tests/comm_jobs.py`` wraps its ``issue`` to log issues)."""
        assert isinstance(self._engine, Scheduler)
        return self._engine.loop

    @property
    def _store_prefix(self) -> str:
        """This wrapper's key prefix in the store (``tests/comm_jobs.py`` reads its keys)."""
        return self._peers.prefix
