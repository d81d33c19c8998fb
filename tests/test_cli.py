"""The command line: results, --json, and one clear line with exit code 2 for every user error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainsched.cli import main
from trainsched.graph import Edge, Graph, Op

HAS_TORCH = True
try:
    import torch  # noqa: F401
except ImportError:  # pragma: no cover
    HAS_TORCH = False
needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="capture needs torch")


def run_cli(*argv: str) -> subprocess.CompletedProcess:
    """The CLI in its own process, as a user runs it."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "trainsched.cli", *argv], capture_output=True,
                          text=True, timeout=240, env=env)


def assert_user_error(result: subprocess.CompletedProcess, *needles: str) -> None:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines and lines[-1].startswith("trainsched"), result.stderr
    for needle in needles:
        assert needle in result.stderr, result.stderr


def _graph(tmp_path: Path) -> Path:
    g = Graph([Op(name="a", compute_s=1e-3, param_bytes=400, flops=10.0),
               Op(name="b", compute_s=2e-3, flops=20.0),
               Op(name="c", compute_s=3e-3, param_bytes=800, flops=30.0)],
              [Edge(src="a", dst="b", size_bytes=100), Edge(src="b", dst="c", size_bytes=100)],
              {"model": "hand"})
    path = tmp_path / "g.json"
    g.save(path)
    return path


def test_show_prints_counts_critical_path_and_heaviest(tmp_path, capsys):
    path = _graph(tmp_path)
    assert main(["show", str(path), "--top", "2"]) == 0
    out = capsys.readouterr().out
    assert "3 (3 forward" in out
    assert "6.00 ms" in out          # total compute and the critical path of the chain
    assert "a -> b -> c" in out
    assert out.index("  c ") < out.index("  b ")   # heaviest first


def test_show_json_is_machine_readable(tmp_path, capsys):
    path = _graph(tmp_path)
    assert main(["show", str(path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["ops"] == 3 and doc["param_bytes"] == 1200
    assert doc["critical_path"] == ["a", "b", "c"]
    assert doc["critical_path_s"] == pytest.approx(6e-3)
    assert [h["name"] for h in doc["heaviest"]] == ["c", "b", "a"]


def test_cluster_preset_nodes_and_json(capsys):
    assert main(["cluster", "p3.16xlarge:2", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["nodes"] == 2 and doc["device"]["count"] == 8


def test_cluster_from_flags(capsys):
    assert main(["cluster", "--devices", "4", "--memory", "8GiB", "--bandwidth", "5.7GB/s",
                 "--latency", "134us", "--comm", "sequential"]) == 0
    out = capsys.readouterr().out
    assert "4" in out and "8.00 GiB" in out and "sequential" in out


def test_cluster_list(capsys):
    assert main(["cluster", "--list"]) == 0
    out = capsys.readouterr().out
    for name in ("baechi-4x2080", "p3.16xlarge", "dgx-a100", "dgx-h100", "k80-ps"):
        assert name in out


@pytest.mark.parametrize("argv, needles", [
    (["cluster", "nosuch-preset"], ["nosuch-preset"]),
    (["cluster", "--devices", "4", "--memory=-3GB", "--bandwidth", "5GB/s", "--latency", "1us"],
     ["-3GB"]),
    (["cluster", "--devices", "4", "--memory", "12XB", "--bandwidth", "5GB/s", "--latency",
      "1us"], ["12XB"]),
    (["cluster", "--devices", "4"], ["--memory"]),
    (["show", "does-not-exist.json"], ["does-not-exist.json"]),
])
def test_user_errors_exit_2_with_one_line(argv, needles, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("trainsched: error:") and err.count("\n") == 1
    for needle in needles:
        assert needle in err


def test_bad_graph_files_exit_2_without_traceback(tmp_path):
    truncated = tmp_path / "truncated.json"
    truncated.write_text(_graph(tmp_path).read_text()[:50])
    assert_user_error(run_cli("show", str(truncated)), "truncated.json", "JSON")

    wrong = tmp_path / "wrong.json"
    doc = json.loads(_graph(tmp_path).read_text())
    doc["format"] = "trainsched.graph/99"
    wrong.write_text(json.dumps(doc))
    assert_user_error(run_cli("show", str(wrong)), "trainsched.graph/1")

    cyclic = tmp_path / "cyclic.json"
    doc = json.loads(_graph(tmp_path).read_text())
    doc["edges"].append({"src": "c", "dst": "a", "size_bytes": 1, "tensor": "c"})
    cyclic.write_text(json.dumps(doc))
    assert_user_error(run_cli("show", str(cyclic)), "cycle", "a -> b -> c -> a")


@needs_torch
def test_profile_writes_a_graph_that_show_reads(tmp_path):
    out = tmp_path / "mlp.json"
    r = run_cli("profile", "mlp", "--batch-size", "8", "--costs", "static", "-o", str(out),
                "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["ops"] == 8 and doc["graph"] == str(out)
    g = Graph.load(out)
    assert g.meta["model"] == "mlp" and g.meta["batch_size"] == 8
    r = run_cli("show", str(out))
    assert r.returncode == 0 and "mlp" in r.stdout


@needs_torch
def test_profile_user_errors_leave_no_output_file(tmp_path):
    out = tmp_path / "never.json"
    assert_user_error(run_cli("profile", "resnet5000", "-o", str(out)), "resnet5000")
    assert_user_error(run_cli("profile", "gpt2", "--seq-len", "5000", "-o", str(out)),
                      "5000")
    bad = tmp_path / "bad_model.py"
    bad.write_text(
        "import torch\n"
        "def build():\n"
        "    return torch.nn.Linear(8, 4), (torch.randn(2, 5),)\n")
    assert_user_error(run_cli("profile", f"{bad}:build", "-o", str(out)), "bad_model")
    assert not out.exists()
    assert not list(tmp_path.glob(".never.json*"))


@needs_torch
def test_profile_a_model_from_a_python_file(tmp_path):
    src = tmp_path / "my_models.py"
    src.write_text(
        "import torch\n"
        "def build(batch_size=4):\n"
        "    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),\n"
        "                                torch.nn.Linear(16, 2))\n"
        "    return model, (torch.randn(batch_size, 8),)\n")
    out = tmp_path / "g.json"
    r = run_cli("profile", f"{src}:build", "--batch-size", "3", "--costs", "static",
                "-o", str(out), "--json")
    assert r.returncode == 0, r.stderr
    g = Graph.load(out)
    assert g.op("input").output_bytes == 3 * 8 * 4
    assert g.totals().flops == 2 * 3 * (8 * 16 + 16 * 2)


def test_cluster_file_errors_name_file_and_field(tmp_path, capsys):
    good = tmp_path / "lab.toml"
    good.write_text('format = "trainsched.cluster/1"\nname = "lab"\nnodes = 1\n'
                    'comm = "sequential"\n[device]\nkind = "RTX2080"\ncount = 4\n'
                    '[intra_node]\nbandwidth = "5.7GB/s"\nlatency = "134us"\n')
    assert main(["cluster", str(good), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["device"]["count"] == 4 and doc["comm"] == "sequential"

    bad = tmp_path / "bad.toml"
    bad.write_text(good.read_text().replace('"RTX2080"\n', '"RTX2080"\nmemory = "12XB"\n'))
    assert main(["cluster", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "bad.toml" in err and "memory" in err and "12XB" in err

    truncated = tmp_path / "cut.toml"
    truncated.write_text(good.read_text()[:40])
    assert main(["cluster", str(truncated)]) == 2
    assert "cut.toml" in capsys.readouterr().err


def test_profile_into_a_missing_directory_fails_before_capturing(tmp_path, capsys):
    target = tmp_path / "no" / "such" / "g.json"
    assert main(["profile", "mlp", "-o", str(target)]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_simulate_single_is_the_serial_sum_of_the_training_graph(tmp_path, capsys):
    from trainsched.training import to_training

    path = _graph(tmp_path)
    trace = tmp_path / "t.json"
    assert main(["simulate", str(path), "--cluster", "p3.16xlarge", "--json",
                 "--trace", str(trace)]) == 0
    doc = json.loads(capsys.readouterr().out)
    expected = to_training(Graph.load(path)).totals().compute_s
    assert doc["step_time_s"] == pytest.approx(expected, rel=1e-12)
    events = json.loads(trace.read_text())["traceEvents"]
    assert any(e.get("ph") == "X" for e in events)


def test_simulate_data_and_pipeline_and_placed(tmp_path, capsys):
    from trainsched.plan import Placement

    path = _graph(tmp_path)
    assert main(["simulate", str(path), "--cluster", "p3.16xlarge", "--parallelism", "data",
                 "--ranks", "4", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["step_time_s"] > 0 and data["exposed_comm_s"] >= 0
    assert main(["simulate", str(path), "--cluster", "p3.16xlarge", "--parallelism",
                 "pipeline", "--ranks", "3", "--microbatches", "4", "--schedule", "gpipe",
                 "--json"]) == 0
    pipe = json.loads(capsys.readouterr().out)
    assert 0 < pipe["bubble_fraction"] < 1
    placement = tmp_path / "p.json"
    from trainsched.training import to_training

    train = to_training(Graph.load(path))
    Placement(device_of={op.name: 0 for op in train.ops}, num_devices=1).save(placement)
    assert main(["simulate", str(path), "--cluster", "p3.16xlarge", "--parallelism", "placed",
                 "--placement", str(placement), "--json"]) == 0
    placed = json.loads(capsys.readouterr().out)
    assert placed["step_time_s"] == pytest.approx(train.totals().compute_s, rel=1e-12)


def test_simulate_user_errors(tmp_path, capsys):
    path = _graph(tmp_path)
    assert main(["simulate", str(path), "--cluster", "p3.16xlarge", "--parallelism",
                 "placed"]) == 2
    assert "--placement" in capsys.readouterr().err
    assert main(["simulate", str(path), "--cluster", "no-such-cluster"]) == 2
    assert "no-such-cluster" in capsys.readouterr().err


@needs_torch
@pytest.mark.timeout(240)
def test_calibrate_writes_a_cluster_file_that_simulate_reads(tmp_path):
    out = tmp_path / "local.json"
    r = run_cli("calibrate", "--repeats", "2", "--timeout", "200", "-o", str(out), "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    link = doc["cluster"]["intra_node"]
    assert link["bandwidth"] > 0 and link["latency"] > 0
    from trainsched.cluster import resolve_cluster

    assert resolve_cluster(str(out)).num_devices == 2
    r = run_cli("simulate", str(_graph(tmp_path)), "--cluster", str(out), "--parallelism",
                "data", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["step_time_s"] > 0
