"""This rank's place in its process group and the store the ranks talk through.

:class:`Peers` holds the group, the rank and world size, and a key prefix of this wrapper's own
in the store (the n-th wrapper built over the same ranks gets the n-th prefix on every rank,
since construction is collective and in the same order everywhere). Every store read has the
wrapper's timeout and fails as a :class:`~trainsched.errors.TrainschedError` that names what
was awaited. It also does the collective parts of construction: every rank describes its model
and compares, rank 0's parameters and buffers are broadcast, and a gloo group with a chosen
number of worker threads can be built for the gradients.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from trainsched.errors import TrainschedError

__all__ = ["Peers"]

_INSTANCES: dict[tuple[int, ...], int] = {}  # process group ranks -> wrappers built so far


class Peers:
    """The process group (``None``: the default one), this rank, and the store (``None``: the
    default one) under a prefix of this wrapper's own; ``store`` is a client for the training
    thread, :meth:`client` makes one for another thread."""

    def __init__(self, process_group: Any, store: Any, timeout_s: float) -> None:
        self.group = process_group if process_group is not None else dist.group.WORLD
        self.is_world = self.group is dist.group.WORLD  # the job's default group
        self.rank = dist.get_rank(self.group)
        self.world_size = dist.get_world_size(self.group)
        self.ranks = tuple(dist.get_process_group_ranks(self.group))
        self.timeout_s = timeout_s
        count = _INSTANCES.get(self.ranks, 0)
        _INSTANCES[self.ranks] = count + 1
        self.prefix = f"trainsched/sdp/{'-'.join(map(str, self.ranks))}/{count}/"
        self.base_store = (store if store is not None
                           else dist.distributed_c10d._get_default_store())
        self.store = self.client()

    def client(self) -> Any:
        """A store client of our own (its own connection where the store can clone one), so
        that threads never share a connection and our timeout stays ours."""
        base = self.base_store
        with contextlib.suppress(AttributeError, RuntimeError, NotImplementedError):
            base = base.clone()
        client = dist.PrefixStore(self.prefix, base)
        client.set_timeout(timedelta(seconds=self.timeout_s))
        return client

    def get(self, store: Any, key: str, what: str) -> bytes:
        """``store.get(key)``; a timeout or a closed connection says ``what`` never came."""
        try:
            return store.get(key)
        except Exception as exc:  # DistStoreError, RuntimeError: timeout or a closed socket
            raise TrainschedError(f"{what}: nothing within {self.timeout_s:g} s "
                                  f"({type(exc).__name__}: {str(exc).splitlines()[0]}); the "
                                  f"rank that should publish it died or hung") from None

    def check_same_model(self, names: Sequence[str], params: Sequence[torch.Tensor]) -> None:
        """Every rank publishes its parameters' names, shapes and dtypes and compares them with
        every other rank's."""
        described = [[n, list(p.shape), str(p.dtype)]
                     for n, p in zip(names, params, strict=True)]  # fmt: skip
        self.store.set(f"model/{self.rank}", json.dumps(described))
        for r in range(self.world_size):
            if r == self.rank:
                continue
            other = json.loads(self.get(self.store, f"model/{r}",
                                        f"the model description of rank {r}"))
            if other != described:
                first = next((f"{a} vs {b}" for a, b in zip(described, other, strict=False)
                              if a != b), f"{len(described)} vs {len(other)} parameters")
                raise TrainschedError(
                    f"the models differ between rank {self.rank} and rank {r} (parameter "
                    f"name, shape, dtype: {first}); every rank must wrap the same model")

    def broadcast(self, module: nn.Module) -> None:
        """The group's first rank's parameters and buffers, on every rank."""
        if self.world_size == 1:
            return
        with torch.no_grad():
            for t in [*module.parameters(), *module.buffers()]:
                dist.broadcast(t.data, src=self.ranks[0], group=self.group)

    def gloo_group(self, threads: int) -> Any:
        """A gloo process group over our ranks with ``threads`` worker threads, built directly
        (``new_group`` does not pass a thread count on)."""
        if dist.get_backend(self.group) != "gloo":
            raise TrainschedError("comm_threads sets gloo's worker threads; the process group "
                                  f"uses {dist.get_backend(self.group)}")
        gloo = dist.ProcessGroupGloo
        options = gloo._Options()
        options._threads = threads
        options._timeout = timedelta(seconds=self.timeout_s)
        options._devices = [gloo.create_default_device()]
        store = dist.PrefixStore(self.prefix + "gloo/", self.base_store)
        return gloo(store, self.rank, self.world_size, options)
