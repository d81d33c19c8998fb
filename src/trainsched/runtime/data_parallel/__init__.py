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
  no average). The collectives run on a group of the wrapper's own
  (:func:`~.module.gradient_group`), so the training loop's own collectives between steps never
  pair with them.
- **Order.** Every rank must issue collectives in one order, or gradients are silently summed
  with the wrong partners. ``order="leader"`` (default): rank 0 decides, publishing its k-th
  decision of step s as the store key ``<s>/<k>``; the other ranks issue exactly that sequence,
  each collective once its gradients are ready locally and the same credit gate lets it pass
  (it may delay, never reorder). ``order="static"`` ("simulate → compile → execute"): the
  issue order is compiled once from the task table and rank 0's step-0 ready times, by
  replaying the dispatch core on a fake FIFO wire (:func:`~.order.static_issue_order`),
  identically on every rank, and every rank (rank 0 too) issues exactly that sequence each
  step, with no store traffic per decision; it is recompiled when a retune switches the policy.
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
  first gradient of each step rank 0 publishes the policy of the next step s+1 (empty:
  unchanged) as the store key ``cfg/<(s+1) mod 2>``, and every other rank reads
  ``cfg/<s mod 2>`` at the first gradient of step s. Rank 0 wrote that key before it issued
  any collective of step s-1, and a rank cannot start step s before all of step s-1's
  collectives completed, so the read never waits (nor is the key overwritten before every rank
  read it: :mod:`.retune`). At the switch every rank finishes the last step's updates, folds
  the per-partition optimizer state back into whole parameters and rebuilds its collectives,
  so all ranks change at one step.
  An :class:`~trainsched.comm.tune.OnlineTuner` (``tuner=``) drives this from rank 0's step
  times: Bayesian search of partition and credit within one job.

- **Out-of-order backprop** (``backprop_k=k``, ``specs/backprop.md`` §2b): the module's
  backward is split and the weight gradients of the k layers nearest the input run after the
  last input gradient, layer 0 first, each handed to the dispatcher as it is produced; their
  updates are the same lazy per-layer updates (:mod:`.deferred`).

- **Disabled** (``enabled=False``, ``specs/comm.md`` §11: byteps #370 measured a disabled
  scheduler 7% slower than none). A true pass-through with the same training-loop API: stock
  ``DistributedDataParallel`` (default buckets) reduces the gradients, one optimizer over all
  parameters is stepped lazily (at the next forward, or in ``drain``/``close``/``optimizers``,
  after a backward pass), and there are no per-parameter hooks, no threads and no store traffic
  per step.

Call :meth:`ScheduledDataParallel.drain` before evaluation, checkpoints and learning-rate
changes, and :meth:`ScheduledDataParallel.close` at the end: it writes the timeline. At exit a
wrapper still open is drained and stopped, and writes nothing.

One concept per module: :mod:`.options` (the settings), :mod:`.group` (peers and the store),
:mod:`.layout` (parameters, task table, a plan's slices), :mod:`.events` (the dispatcher's
messages), :mod:`.sync` (what both threads share), :mod:`.hooks` (readiness hooks and the
forward gate), :mod:`.order` (leader, static and local issue orders, the order check),
:mod:`.wire` (collectives in flight), :mod:`.units` (optimizers and update units),
:mod:`.retune` (policy switches, online tuning), :mod:`.loop` (the dispatcher thread),
:mod:`.trace` (clock and timeline), :mod:`.deferred` (reverse-first-k: the split backward's
dW queue feeding the hooks), :mod:`.scheduler` (the scheduler assembled),
:mod:`.passthrough` (``enabled=False``) and :mod:`.module` (the wrapper).
"""

from trainsched.runtime.data_parallel.module import ScheduledDataParallel
from trainsched.runtime.data_parallel.options import (
    ORDERS,
    STATIC_WIRE,
    UPDATES,
    DataParallelOptions,
)
from trainsched.runtime.data_parallel.order import static_issue_order
from trainsched.runtime.data_parallel.units import ELEMENTWISE

__all__ = ["ELEMENTWISE", "ORDERS", "STATIC_WIRE", "UPDATES", "DataParallelOptions",
           "ScheduledDataParallel", "static_issue_order"]
