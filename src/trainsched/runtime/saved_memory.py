"""Measure the activation memory a pipeline rank holds: :class:`SavedTensorMeter`.

The pipeline simulator predicts, per rank, the bytes of saved activations held over the step
(``F`` adds a micro-batch's, ``W`` or ``B`` frees them). On a CPU torch keeps no allocator
statistics, so the runtime counts the same thing directly: every tensor autograd saves during
a stage's forward goes through :func:`torch.autograd.graph.saved_tensors_hooks`; the meter
adds its storage's bytes when the first saved tensor on that storage is packed and subtracts
them when the last one is released (autograd drops saved tensors when the backward that needs
them has run without ``retain_graph``, or when the stage lets go of the micro-batch's graph
after ``W``). Storages are counted once however many ops save views of them; parameters and
buffers (resident all step) are left out. ``peak_bytes`` is the largest total seen since the
last :meth:`reset_peak`.

Held alongside, between ``I`` and ``W``: the gradients at the outputs of the weight nodes
(:class:`~trainsched.runtime.stage_modules.PipelineStage` keeps them for ``W``). They are
counted too (:meth:`hold`), deduplicated the same way, as they are the ``gy`` that deferring a
weight gradient keeps alive.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

import torch

__all__ = ["SavedTensorMeter"]


class _Held:
    """A saved tensor as autograd stores it; releasing it tells the meter."""

    __slots__ = ("key", "meter", "tensor")

    def __init__(self, meter: SavedTensorMeter, key: int, tensor: torch.Tensor) -> None:
        self.meter, self.key, self.tensor = meter, key, tensor

    def __del__(self) -> None:
        self.meter._release(self.key)


class SavedTensorMeter:
    """Bytes of saved activations alive on one rank, by storage, and their peak."""

    def __init__(self, exclude: Iterable[torch.Tensor] = ()) -> None:
        self._excluded = {t.untyped_storage().data_ptr() for t in exclude}
        self._live: dict[int, list[int]] = {}   # storage pointer -> [references, bytes]
        self.bytes = 0
        self.peak_bytes = 0

    def reset_peak(self) -> None:
        """Start a new peak from what is alive now (e.g. at the start of a step)."""
        self.peak_bytes = self.bytes

    def _add(self, tensor: torch.Tensor) -> int | None:
        storage = tensor.untyped_storage()
        key = storage.data_ptr()
        if key == 0 or key in self._excluded:
            return None
        entry = self._live.get(key)
        if entry is None:
            entry = self._live[key] = [0, storage.nbytes()]
            self.bytes += entry[1]
            self.peak_bytes = max(self.peak_bytes, self.bytes)
        entry[0] += 1
        return key

    def _release(self, key: int | None) -> None:
        if key is None:
            return
        entry = self._live[key]
        entry[0] -= 1
        if entry[0] == 0:
            del self._live[key]
            self.bytes -= entry[1]

    def _pack(self, tensor: torch.Tensor) -> Any:
        # Detached: a saved output holding its own grad_fn would make a reference cycle, and
        # the graph would outlive the micro-batch until the garbage collector ran.
        return _Held(self, self._add(tensor), tensor.detach())  # type: ignore[arg-type]

    @staticmethod
    def _unpack(held: Any) -> torch.Tensor:
        return held.tensor

    @contextlib.contextmanager
    def saving(self) -> Iterator[None]:
        """Count the tensors autograd saves inside this block (a stage's forward)."""
        with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
            yield

    def hold(self, tensors: Iterable[Any]) -> list[Any]:
        """Count ``tensors`` (``None`` s skipped) while the returned handles are kept."""
        return [None if t is None else self._pack(t) for t in tensors]
