"""Every registered schedule through ``trainsched simulate --parallelism pipeline``: the model
is cut into the schedule's stage count (two per rank for the interleaved and V schedules)."""

from __future__ import annotations

import itertools
import json

import pytest

from trainsched.backprop.schedules import SCHEDULES
from trainsched.cli import main
from trainsched.graph import Edge, Graph, Op


@pytest.fixture(scope="module")
def graph_path(tmp_path_factory):
    names = [f"l{k}" for k in range(6)]
    g = Graph([Op(name=n, compute_s=1e-3 * (k + 1), param_bytes=400, flops=10.0)
               for k, n in enumerate(names)],
              [Edge(src=a, dst=b, size_bytes=100) for a, b in itertools.pairwise(names)],
              {"model": "chain"})
    path = tmp_path_factory.mktemp("g") / "g.json"
    g.save(path)
    return path


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_simulate_runs_every_schedule(graph_path, capsys, name):
    assert main(["simulate", str(graph_path), "--cluster", "p3.16xlarge", "--parallelism",
                 "pipeline", "--ranks", "2", "--microbatches", "4", "--schedule", name,
                 "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["parallelism"] == "pipeline"
    assert 0 < result["bubble_fraction"] < 1


def test_interleaved_schedule_needs_two_stages_per_rank_from_the_graph(graph_path, capsys):
    # 6 forward ops: 3 ranks x 2 chunks fit, 4 ranks x 2 chunks do not.
    assert main(["simulate", str(graph_path), "--cluster", "p3.16xlarge", "--parallelism",
                 "pipeline", "--ranks", "3", "--microbatches", "3", "--schedule", "zbv"]) == 0
    capsys.readouterr()
    assert main(["simulate", str(graph_path), "--cluster", "p3.16xlarge", "--parallelism",
                 "pipeline", "--ranks", "4", "--microbatches", "4", "--schedule", "zbv"]) == 2
    assert "cannot cut 6 forward op(s) into 8 stages" in capsys.readouterr().err
