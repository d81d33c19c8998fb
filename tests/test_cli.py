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
    for column, value in (("src", 2), ("dst", 0), ("size_bytes", 1)):  # an edge c -> a
        doc["edges"][column].append(value)
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
    from trainsched.graph import to_training

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
    from trainsched.graph import to_training

    train = to_training(Graph.load(path))
    Placement(device_of={op.name: 0 for op in train.ops}, num_devices=1).save(placement)
    assert main(["simulate", str(path), "--cluster", "p3.16xlarge", "--parallelism", "placed",
                 "--placement", str(placement), "--json"]) == 0
    placed = json.loads(capsys.readouterr().out)
    assert placed["step_time_s"] == pytest.approx(train.totals().compute_s, rel=1e-12)


def _comm_graph(tmp_path: Path) -> Path:
    """A chain whose gradients are large enough for partitions and credit to matter."""
    sizes = [32, 4, 16, 64]  # MiB of parameters per op
    ops = [Op(name=f"l{k}", compute_s=5e-3, param_bytes=mib << 20, flops=1e9)
           for k, mib in enumerate(sizes)]  # fmt: skip
    edges = [Edge(src=f"l{k}", dst=f"l{k + 1}", size_bytes=1 << 20) for k in range(3)]
    path = tmp_path / "comm.json"
    Graph(ops, edges, {"model": "chain"}).save(path)
    return path


def test_simulate_data_policies_and_their_flags(tmp_path, capsys):
    from trainsched.comm import PriorityPolicy, comm_policy
    from trainsched.graph import to_training
    from trainsched.sim import simulate_data_parallel

    path = _comm_graph(tmp_path)
    base = ["simulate", str(path), "--cluster", "p3.16xlarge:2", "--parallelism", "data",
            "--json"]
    train = to_training(Graph.load(path))
    from trainsched.cluster import resolve_cluster

    cluster = resolve_cluster("p3.16xlarge:2")
    docs = {}
    for name in ("ddp", "fifo", "tictac", "p3", "bytescheduler"):
        assert main([*base, "--comm-policy", name]) == 0
        docs[name] = doc = json.loads(capsys.readouterr().out)
        policy = comm_policy(name)
        steps = 3 if policy.cross_barrier else 1  # the steady step of policies that cross
        assert doc["steps"] == steps and doc["ranks"] == 16 and doc["algorithm"] == "ring"
        expected = simulate_data_parallel(train, cluster, ranks=16, policy=policy, steps=steps)
        assert doc["step_time_s"] == expected.step_time_s
        assert doc["crossing_bound_s"] <= doc["step_time_s"] * (1 + 1e-9)
        assert doc["crossing_bound_gradient"] in {f"l{k}:grad" for k in range(4)}
    assert docs["p3"]["policy"] == {"class": "PriorityPolicy", "partition_bytes": 1 << 20,
                                    "credit_bytes": None, "credit_mode": "strict",
                                    "cross_barrier": True, "backfill": False,
                                    "runtime_passes": True}
    # Flags set the policy's fields; an unlimited credit is "inf" in JSON.
    assert main([*base, "--comm-policy", "priority", "--partition", "2MiB", "--credit", "inf",
                 "--credit-mode", "overdraft", "--steps", "2", "--algorithm", "tree"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["policy"]["partition_bytes"] == 2 << 20 and doc["policy"]["credit_bytes"] == "inf"
    assert (doc["steps"], doc["algorithm"]) == (2, "tree")
    expected = simulate_data_parallel(
        train, cluster, ranks=16, algorithm="tree", steps=2,
        policy=PriorityPolicy(partition_bytes=2 << 20, credit_bytes=float("inf"),
                              credit_mode="overdraft"))
    assert doc["step_time_s"] == expected.step_time_s
    assert main(["simulate", str(path), "--cluster", "p3.16xlarge:2", "--parallelism", "data",
                 "--comm-policy", "p3"]) == 0
    out = capsys.readouterr().out
    assert "partition 1.00 MiB, one collective in flight, crossing the barrier" in out
    assert "steady step of 3" in out and "crossing bound" in out


def test_simulate_autotune_picks_the_best_trial_and_simulates_it(tmp_path, capsys):
    from trainsched.cluster import resolve_cluster
    from trainsched.comm.tune import tune
    from trainsched.graph import to_training
    from trainsched.sim.tune import simulated_objective

    path = _comm_graph(tmp_path)
    assert main(["simulate", str(path), "--cluster", "p3.16xlarge:2", "--parallelism", "data",
                 "--autotune", "--tune-trials", "12", "--tune-partition", "1MiB-64MiB",
                 "--tune-credit", "1MiB-128MiB", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    tuned = doc["autotune"]
    assert len(tuned["trials"]) == 12
    assert tuned["step_time_s"] == min(t["step_time_s"] for t in tuned["trials"])
    # The reported step is the simulation of exactly the tuned policy the trials ran.
    assert doc["step_time_s"] == tuned["step_time_s"]
    assert doc["policy"]["class"] == "ByteSchedulerPolicy" and doc["steps"] == 3
    assert doc["policy"]["partition_bytes"] == tuned["partition_bytes"]
    assert doc["policy"]["fusion_bytes"] == tuned["partition_bytes"]
    assert 1 << 20 <= tuned["partition_bytes"] <= 64 << 20
    # The library's tuner with the same seed finds the same point.
    objective = simulated_objective(to_training(Graph.load(path)),
                                    resolve_cluster("p3.16xlarge:2"), 16, steps=3)
    same = tune(objective, partition_range=(1 << 20, 64 << 20),
                credit_range=(1 << 20, 128 << 20), startup_trials=10, guided_trials=2)
    assert (same.partition_bytes, same.credit_bytes) == (tuned["partition_bytes"],
                                                         tuned["credit_bytes"])
    # The tuned point beats the defaults on this graph's slow inter-node ring, or ties them.
    assert main(["simulate", str(path), "--cluster", "p3.16xlarge:2", "--parallelism", "data",
                 "--comm-policy", "bytescheduler", "--json"]) == 0
    assert doc["step_time_s"] <= json.loads(capsys.readouterr().out)["step_time_s"]


@pytest.mark.parametrize("flags, message", [
    (["--parallelism", "data", "--comm-policy", "ddp", "--partition", "4MiB"],
     "--partition: --comm-policy ddp has no partition or credit"),
    (["--parallelism", "data", "--comm-policy", "horovod"], "unknown comm policy 'horovod'"),
    (["--steps", "3"], "--steps does not apply with --parallelism single: it applies only "
                       "with --parallelism data"),
    (["--parallelism", "single", "--autotune"],
     "--autotune does not apply with --parallelism single"),
    (["--parallelism", "data", "--steps", "0"], "--steps must be >= 1"),
    (["--parallelism", "data", "--autotune", "--comm-policy", "fifo"],
     "--autotune tunes the bytescheduler policy"),
    (["--parallelism", "data", "--autotune", "--partition", "4MiB"],
     "--partition does not apply with --autotune: it applies only with --parallelism data, "
     "without --autotune (the tuner picks them)"),
    (["--parallelism", "data", "--autotune", "--tune-credit", "8MiB"],
     "--tune-credit takes LOW-HIGH"),
    (["--parallelism", "data", "--autotune", "--tune-trials", "0"], "--tune-trials must be >= 1"),
    (["--parallelism", "data", "--comm-policy", "priority", "--partition=-3MiB"], "-3MiB"),
    (["--parallelism", "data", "--comm-policy", "bytescheduler", "--credit-mode", "strict",
      "--credit", "1MiB"], "must hold one partition"),
])
def test_simulate_data_bad_flags_exit_2_with_one_line(tmp_path, capsys, flags, message):
    path = _comm_graph(tmp_path)
    assert main(["simulate", str(path), "--cluster", "p3.16xlarge", *flags]) == 2
    captured = capsys.readouterr()
    assert message in captured.err and captured.err.count("\n") == 1
    assert captured.out == ""


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
