"""Which process group the scheduled runtime reduces gradients on (``gradient_group``): a group
of its own, so the training loop's collectives between steps never pair with in-flight
gradients (the real 2-rank check, over the default group, is in ``tests/test_comm_runtime.py``)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from trainsched.runtime.data_parallel import module
from trainsched.runtime.data_parallel.module import gradient_group


class FakePeers:
    """The wrapper's group (the default one, or a subgroup) and the gloo groups it was asked to
    build, by thread count."""

    def __init__(self, backend: str, world: bool) -> None:
        self.group = f"{backend}-{'world' if world else 'subgroup'}"
        self.is_world = world
        self.timeout_s = 42.0
        self.built: list[int] = []

    def gloo_group(self, threads: int) -> str:
        self.built.append(threads)
        return f"own-gloo-{threads}"


@pytest.fixture
def new_groups(monkeypatch) -> list[dict]:
    """``dist.new_group`` calls (their keyword arguments); ``get_backend`` reads the name."""
    calls: list[dict] = []

    def new_group(**kwargs):
        calls.append(kwargs)
        return "new-group"

    monkeypatch.setattr(module.dist, "new_group", new_group)
    monkeypatch.setattr(module.dist, "get_backend", lambda group: group.split("-")[0])
    return calls


@pytest.mark.parametrize("backend", ["gloo", "nccl"])
def test_over_the_default_group_the_scheduler_makes_a_new_group(new_groups, backend):
    peers = FakePeers(backend, world=True)
    assert gradient_group(peers, None, True) == "new-group"
    assert new_groups == [{"timeout": timedelta(seconds=42.0)}]
    assert peers.built == []


def test_over_a_gloo_subgroup_it_builds_a_gloo_group_with_gloos_two_threads(new_groups):
    peers = FakePeers("gloo", world=False)
    assert gradient_group(peers, None, True) == "own-gloo-2"
    assert (peers.built, new_groups) == ([2], [])


def test_over_a_subgroup_of_another_backend_it_keeps_the_subgroup(new_groups):
    peers = FakePeers("nccl", world=False)
    assert gradient_group(peers, None, True) == "nccl-subgroup"
    assert (peers.built, new_groups) == ([], [])


@pytest.mark.parametrize("enabled", [True, False])
def test_comm_threads_builds_a_gloo_group_with_that_many_threads(new_groups, enabled):
    peers = FakePeers("gloo", world=True)
    assert gradient_group(peers, 1, enabled) == "own-gloo-1"
    assert (peers.built, new_groups) == ([1], [])


def test_the_pass_through_keeps_the_wrappers_group(new_groups):
    peers = FakePeers("gloo", world=True)
    assert gradient_group(peers, None, False) == "gloo-world"
    assert (peers.built, new_groups) == ([], [])
