"""Which process group the scheduled runtime reduces gradients on (``gradient_group``): on gloo
a group of its own, so the training loop's collectives between steps never pair with in-flight
gradients (the real 2-rank check is in ``tests/test_comm_runtime.py``)."""

from __future__ import annotations

import pytest

from trainsched.runtime.data_parallel import module
from trainsched.runtime.data_parallel.module import gradient_group


class FakePeers:
    """The wrapper's group and the gloo groups it was asked to build (by thread count)."""

    def __init__(self, backend: str) -> None:
        self.group = f"{backend}-group"
        self.backend = backend
        self.built: list[int] = []

    def gloo_group(self, threads: int) -> str:
        self.built.append(threads)
        return f"own-gloo-{threads}"


@pytest.fixture
def backend_of(monkeypatch):
    monkeypatch.setattr(module.dist, "get_backend", lambda group: group.split("-")[0])


def test_the_scheduler_on_gloo_reduces_on_a_group_of_its_own_with_gloos_two_threads(backend_of):
    peers = FakePeers("gloo")
    assert gradient_group(peers, None, True) == "own-gloo-2"
    assert peers.built == [2]


def test_comm_threads_sets_the_own_groups_worker_threads(backend_of):
    peers = FakePeers("gloo")
    assert gradient_group(peers, 1, True) == "own-gloo-1"
    assert peers.built == [1]


def test_the_pass_through_keeps_the_wrappers_group(backend_of):
    peers = FakePeers("gloo")
    assert gradient_group(peers, None, False) == "gloo-group"
    assert peers.built == []


def test_another_backend_keeps_the_wrappers_group(backend_of):
    peers = FakePeers("nccl")
    assert gradient_group(peers, None, True) == "nccl-group"
    assert peers.built == []
