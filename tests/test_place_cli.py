"""`trainsched place`: JSON and table output, the placement file, its re-simulation, errors."""

from __future__ import annotations

import json

import pytest

from trainsched.cli import main
from trainsched.graph import Edge, Graph, Op
from trainsched.plan import Placement


def forward_graph(path, layers: int = 12, param_bytes: int = 4 << 20):
    """A small CNN-like chain with a skip connection every 3 layers."""
    ops = [Op(name="input", compute_s=1e-4, output_bytes=1 << 20)]
    edges = []
    for i in range(layers):
        name = f"layer{i}"
        ops.append(Op(name=name, compute_s=2e-3, flops=1e9, param_bytes=param_bytes,
                      output_bytes=1 << 22, saved_bytes=1 << 22, temp_bytes=1 << 20))
        prev = "input" if i == 0 else f"layer{i - 1}"
        edges.append(Edge(src=prev, dst=name, size_bytes=1 << 22))
        if i >= 3 and i % 3 == 0:
            edges.append(Edge(src=f"layer{i - 3}", dst=name, size_bytes=1 << 22))
    Graph(ops, edges, {"model": "toy"}).save(path)
    return path


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_place_json_and_resimulation_round_trip(tmp_path, capsys):
    graph = forward_graph(tmp_path / "g.json")
    out = tmp_path / "placement.json"
    code, text, _ = run(capsys, "place", graph, "--cluster", "baechi-4x2080", "-o", out,
                        "--json")
    assert code == 0
    doc = json.loads(text)
    for key in ("placement_s", "predicted_step_s", "peak_bytes", "ops_before", "ops_after",
                "placer", "candidates", "lower_bound_s"):
        assert key in doc
    assert doc["algorithm"] == "auto" and len(doc["candidates"]) >= 7
    assert doc["ops_before"] > doc["ops_after"] >= 1
    assert set(doc["peak_bytes"]) == {"gpu0", "gpu1", "gpu2", "gpu3"}
    placement = Placement.load(out)
    assert placement.meta["placer"] == doc["placer"]
    assert len(placement.device_of) == doc["ops_before"]  # the training graph's ops
    code, text, _ = run(capsys, "simulate", graph, "--cluster", "baechi-4x2080",
                        "--parallelism", "placed", "--placement", out, "--json")
    assert code == 0
    simulated = json.loads(text)
    assert simulated["step_time_s"] == doc["predicted_step_s"]
    used = {k: v for k, v in doc["peak_bytes"].items() if v}
    assert {k: v for k, v in simulated["peak_memory_bytes"].items() if v} == used


def test_place_writes_the_same_bytes_twice(tmp_path, capsys):
    graph = forward_graph(tmp_path / "g.json")
    texts = []
    for k in range(2):
        out = tmp_path / f"p{k}.json"
        assert run(capsys, "place", graph, "--cluster", "baechi-4x2080", "-o", out)[0] == 0
        texts.append(out.read_bytes())
    assert texts[0] == texts[1]


def test_place_table_and_options(tmp_path, capsys):
    graph = forward_graph(tmp_path / "g.json")
    out = tmp_path / "p.json"
    code, text, _ = run(capsys, "place", graph, "--cluster", "baechi-4x2080", "--algorithm",
                        "m-etf", "--comm", "parallel", "--no-fusion", "--no-coplacement",
                        "--no-forward-only", "-o", out)
    assert code == 0
    assert "toy on baechi-4x2080 (4 devices, parallel channels): m-etf" in text
    assert "predicted step" in text and "gpu3" in text and f"wrote {out}" in text
    meta = Placement.load(out).meta
    assert meta["algorithm"] == meta["placer"] == "m-etf"
    assert (meta["comm"], meta["fusion"], meta["coplacement"], meta["forward_only"]) == \
        ("parallel", False, False, False)
    assert meta["ops_after"] == meta["ops_before"]  # nothing reduced


def test_place_errors_are_one_line(tmp_path, capsys):
    graph = forward_graph(tmp_path / "g.json", param_bytes=3 << 30)
    code, out, err = run(capsys, "place", graph, "--cluster", "baechi-4x2080")
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "does not fit" in err and "needs at least" in err
    code, _, err = run(capsys, "place", tmp_path / "none.json", "--cluster", "baechi-4x2080")
    assert code == 2 and "no such graph file" in err and err.count("\n") == 1
    small = forward_graph(tmp_path / "s.json")
    code, _, err = run(capsys, "place", small, "--cluster", "no-such-cluster")
    assert code == 2 and "unknown cluster" in err and err.count("\n") == 1


def test_place_rejects_an_unknown_algorithm(tmp_path, capsys):
    graph = forward_graph(tmp_path / "g.json")
    with pytest.raises(SystemExit) as info:
        main(["place", str(graph), "--cluster", "baechi-4x2080", "--algorithm", "m-best"])
    assert info.value.code == 2
    assert "invalid choice: 'm-best'" in capsys.readouterr().err


def test_sct_threshold_flag_reaches_m_sct_and_is_checked(tmp_path, capsys):
    graph = forward_graph(tmp_path / "g.json", layers=6)
    out = tmp_path / "p.json"
    code, _, _ = run(capsys, "place", graph, "--cluster", "baechi-4x2080", "--algorithm",
                     "m-sct", "--sct-threshold", "0.1", "-o", out, "--json")
    assert code == 0
    assert Placement.load(out).meta["sct_threshold"] == 0.1
    code, _, _ = run(capsys, "place", graph, "--cluster", "baechi-4x2080", "--algorithm",
                     "m-sct", "-o", out, "--json")
    assert code == 0 and Placement.load(out).meta["sct_threshold"] == 0.5  # the default
    code, _, err = run(capsys, "place", graph, "--cluster", "baechi-4x2080",
                       "--sct-threshold", "2")
    assert code == 2 and "sct_threshold must be in [0, 1], got 2.0" in err


def test_the_placement_file_carries_the_order_simulate_replays(tmp_path, capsys):
    graph = forward_graph(tmp_path / "g.json")
    out = tmp_path / "p.json"
    code, _, _ = run(capsys, "place", graph, "--cluster", "baechi-4x2080", "--algorithm",
                     "m-etf", "-o", out, "--json")
    assert code == 0
    placement = Placement.load(out)
    assert placement.order is not None and set(placement.order) == set(placement.device_of)
    # Without its order (a file from before orders were stored) it still loads and simulates.
    old = Placement(device_of=placement.device_of, num_devices=placement.num_devices)
    old.save(tmp_path / "old.json")
    code, _, _ = run(capsys, "simulate", graph, "--cluster", "baechi-4x2080", "--parallelism",
                     "placed", "--placement", tmp_path / "old.json", "--json")
    assert code == 0
