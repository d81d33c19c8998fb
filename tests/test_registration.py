"""A new communication policy is one registration: it then appears in simulate, compare and
train with no other edit (the registries are the only lists of names)."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest

from trainsched.cli import main
from trainsched.cluster import resolve_cluster
from trainsched.comm.policy import COMM_POLICIES, Collective, Gradient
from trainsched.compare import Options, compare, strategies
from trainsched.errors import TrainschedError
from trainsched.graph import Edge, Graph, Op, to_training
from trainsched.plan import DataParallelPlan, ModelRef, plan_from_json, plan_to_json
from trainsched.sim import simulate

NAME = "layer-order"


@dataclass(frozen=True, kw_only=True)
class LayerOrderPolicy:
    """Whole tensors issued in forward-layer order once the one before was issued: layer 0's
    gradient (the last one backward makes) goes first, so nothing is sent before backward
    ends. A policy no registry entry describes, written for this test."""

    cross_barrier: bool = False
    queue: ClassVar[str] = "fifo"
    credit_bytes: ClassVar[float | None] = None
    credit_mode: ClassVar[str] = "strict"
    ordered_issue: ClassVar[bool] = True

    def plan(self, gradients: Sequence[Gradient]) -> tuple[Collective, ...]:
        return tuple(Collective(name=g.name, members=(g.name,), size_bytes=g.size_bytes,
                                priority=g.layer_index)
                     for g in sorted(gradients, key=lambda g: g.layer_index))  # fmt: skip


@pytest.fixture
def registered():
    COMM_POLICIES.register(NAME, LayerOrderPolicy, compare=True)
    try:
        yield
    finally:
        COMM_POLICIES.unregister(NAME)


def chain() -> Graph:
    ops = [Op(name=f"l{k}", compute_s=2e-3, param_bytes=(k + 1) << 20, flops=1e9)
           for k in range(4)]  # fmt: skip
    edges = [Edge(src=f"l{k}", dst=f"l{k + 1}", size_bytes=1 << 20) for k in range(3)]
    return Graph(ops, edges, {"model": "chain", "batch_size": 4})


def test_a_registered_name_is_taken_once_and_can_be_removed(registered):
    with pytest.raises(TrainschedError, match="'layer-order' is registered already"):
        COMM_POLICIES.register(NAME, LayerOrderPolicy)
    assert COMM_POLICIES.tagged("compare")[-1] == NAME
    COMM_POLICIES.unregister(NAME)
    assert NAME not in COMM_POLICIES
    COMM_POLICIES.register(NAME, LayerOrderPolicy)  # the fixture removes it again


def test_the_new_policy_is_a_compare_row_and_runs_in_layer_order(registered):
    graph, cluster = to_training(chain()), resolve_cluster("p3.16xlarge")
    assert f"data-{NAME}" in strategies()
    rows, results = compare(graph, cluster, Options(ranks=2, microbatches=4, batch_size=4))
    assert f"data-{NAME}" in {r.strategy for r in rows}
    comms = sorted((t for t in results[f"data-{NAME}"].tasks if t.category == "comm"),
                   key=lambda t: t.start_s)
    assert [t.name for t in comms] == ["l0:grad", "l1:grad", "l2:grad", "l3:grad"]
    last_backward = max(t.end_s for t in results[f"data-{NAME}"].tasks
                        if t.category == "backward_weight")
    assert comms[0].start_s >= last_backward  # ordered issue: layer 0 is ready last


def test_the_new_policy_round_trips_in_a_plan_file(registered):
    graph = to_training(chain())
    plan = DataParallelPlan(model=ModelRef.of(graph), ranks=2, comm=NAME,
                            policy=LayerOrderPolicy())
    assert plan_from_json(plan_to_json(plan)) == plan
    assert simulate(plan, graph, resolve_cluster("p3.16xlarge")).step_time_s > 0


def test_simulate_takes_the_new_policy_by_name(registered, tmp_path, capsys):
    path = tmp_path / "chain.json"
    chain().save(path)
    assert main(["simulate", str(path), "--cluster", "p3.16xlarge", "--parallelism", "data",
                 "--comm-policy", NAME, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["policy"]["class"] == "LayerOrderPolicy"
    with pytest.raises(SystemExit):
        main(["simulate", "--help"])
    assert NAME in capsys.readouterr().out


def test_train_runs_the_new_policy_on_real_ranks(registered, monkeypatch, capsys):
    # The workers rebuild the policy from its class, so this test module must be importable.
    here = str(Path(__file__).parent)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        p for p in (here, os.environ.get("PYTHONPATH")) if p))
    assert main(["train", "mlp", "--comm", NAME, "--nproc", "2", "--steps", "2", "--warmup",
                 "1", "--batch-size", "8", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["comm"] == NAME and len(doc["segments"][0]["step_times_s"]) == 2
