"""Collectives on the wire: ``dist.all_reduce(..., async_op=True)`` and their completion.

A collective of one gradient's part is reduced in place on a zero-copy view of
``grad.view(-1)``; a bucket of several gradients is packed into a flat buffer of its own,
reused every step (a fresh one each step would cost a page fault per 4 KiB: buffers this
large are mmapped and unmapped again). Completion comes back through the work's future as a
:class:`~.events.Done` on the dispatcher's inbox; :meth:`Wire.finish` then divides the reduced
values by the world size (gloo has no average) and unpacks a bucket: a member reduced whole
takes its slice of the buffer as its gradient (no copy), from the all-reduce to its update,
which comes before the next forward of its module and so before the next packing.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from trainsched.comm.timeline import Span
from trainsched.errors import TrainschedError
from trainsched.runtime.data_parallel.events import Done, Inbox
from trainsched.runtime.data_parallel.layout import Layout
from trainsched.runtime.data_parallel.sync import Progress
from trainsched.runtime.data_parallel.trace import Recorder

__all__ = ["Wire"]


class Wire:
    """Issues and completes this rank's collectives on ``group`` (dispatcher thread), with
    the gradients of ``progress``, and records their ``QUEUE`` and ``COMM`` spans."""

    def __init__(self, *, group: Any, rank: int, world_size: int, progress: Progress,
                 inbox: Inbox, recorder: Recorder) -> None:
        self._group = group
        self._rank = rank
        self._world_size = world_size
        self._progress = progress
        self._inbox = inbox
        self._recorder = recorder
        self._works: dict[int, Any] = {}
        self._tensors: dict[int, torch.Tensor] = {}  # in flight: the view or packed buffer
        self._buffers: dict[int, torch.Tensor] = {}  # per bucket, reused every step
        self._issued_s: dict[int, float] = {}
        self._queued_s: dict[int, float] = {}

    def new_plan(self) -> None:
        """A new plan numbers its collectives anew: forget the buckets' buffers."""
        self._buffers = {}

    def queued(self, collective: int, t: float) -> None:
        """Every member of ``collective`` is ready (at ``t``)."""
        self._queued_s[collective] = t

    def start(self, c: int, layout: Layout) -> None:
        """Pack collective ``c`` of ``layout`` if a bucket and start its all-reduce."""
        grads = self._progress.grads
        row = layout.parts[c]
        if len(row) == 1:
            k, lo, hi = row[0]
            grad = grads[k]
            assert grad is not None
            tensor = grad.view(-1)[lo:hi]
        else:
            members = [grads[k].view(-1)[lo:hi] for k, lo, hi in row]  # type: ignore[union-attr]
            tensor = self._buffers.get(c)
            if tensor is None:
                tensor = self._buffers[c] = torch.cat(members)
            else:
                torch.cat(members, out=tensor)
        self._tensors[c] = tensor
        recorder, inbox = self._recorder, self._inbox
        self._issued_s[c] = recorder.now()
        work = dist.all_reduce(tensor, group=self._group, async_op=True)
        self._works[c] = work
        work.get_future().add_done_callback(
            lambda fut, c=c: inbox.put(Done(c, fut, recorder.now())))

    def finish(self, done: Done, layout: Layout, step: int) -> None:
        """``done``'s collective completed: raise its failure, or average and unpack it."""
        c = done.collective
        try:
            done.future.wait()
        except Exception as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            raise TrainschedError(
                f"the all-reduce of {layout.names[c]!r} failed on rank {self._rank} "
                f"({type(exc).__name__}: {first}); another rank probably died or timed "
                f"out") from None
        self._works.pop(c, None)
        tensor = self._tensors.pop(c)
        if self._world_size > 1:
            tensor.div_(self._world_size)  # the average, while the partition is hot in cache
        grads = self._progress.grads
        if len(layout.parts[c]) > 1:  # unpack a bucket
            offset = 0
            for k, lo, hi in layout.parts[c]:
                grad = grads[k]
                assert grad is not None
                reduced = tensor[offset:offset + hi - lo]
                if hi - lo == grad.numel():  # a whole gradient: its slice of the bucket
                    grads[k] = reduced.view(grad.shape)  # is the gradient (no copy)
                else:
                    grad.view(-1)[lo:hi].copy_(reduced)
                offset += hi - lo
        if self._recorder.in_window(step):
            self._record(c, layout, step, done.t)

    def _record(self, c: int, layout: Layout, step: int, end_s: float) -> None:
        track, name = layout.tracks[c], layout.names[c]
        args = {"task": name, "bytes": layout.plan[c].size_bytes}
        spans = self._recorder.comm
        if c in self._queued_s:
            spans.append(Span(track=track, phase="QUEUE", label=name,
                              start_s=self._queued_s.pop(c), end_s=self._issued_s[c],
                              step=step, args=args))
        spans.append(Span(track=track, phase="COMM", label=name, start_s=self._issued_s[c],
                          end_s=end_s, step=step, args=args))
