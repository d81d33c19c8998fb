"""The command line accepts nothing silently or wrongly: a flag that does not apply to the
chosen mode, a count of 0, a learning rate that is not a number, a result that is not a finite
number each exit 2 with one line naming the problem; and the small things a user reads (rows
that cannot be built, huge values, node counts, sizes in the tuner's flags, too many ranks)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from trainsched.cli import main
from trainsched.graph import Edge, Graph, Op, to_training
from trainsched.strategies import strategies

HAS_TORCH = True
try:
    import torch  # noqa: F401
except ImportError:  # pragma: no cover
    HAS_TORCH = False
needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="the model zoo needs torch")


def refused(capsys: pytest.CaptureFixture[str], argv: list[str], *needles: str) -> str:
    """Run ``argv``: exit 2, one line on stderr holding every needle, no result on stdout."""
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("trainsched: error: "), captured.err
    for needle in needles:
        assert needle in lines[0], lines[0]
    if captured.out.strip():  # --json on an error: a JSON error object, nothing else
        assert "error" in strict_json(captured.out)
    return lines[0]


def strict_json(text: str) -> object:
    """``text`` parsed as strict JSON: NaN and Infinity are not JSON."""
    def no_constant(name: str) -> object:
        raise AssertionError(f"{name} in JSON output")
    return json.loads(text, parse_constant=no_constant)


def chain(tmp_path: Path, name: str = "g", compute_s: tuple[float, ...] = (1e-3, 2e-3, 3e-3),
          training: bool = False) -> str:
    """A chain of ops with parameters, saved as ``name.json`` (a training graph if asked)."""
    ops = [Op(name=f"l{k}", compute_s=c, param_bytes=4 << 20, flops=1e6)
           for k, c in enumerate(compute_s)]
    edges = [Edge(src=f"l{k}", dst=f"l{k + 1}", size_bytes=1 << 20)
             for k in range(len(ops) - 1)]
    graph = Graph(ops, edges, {"model": name, "batch_size": 4})
    path = tmp_path / f"{name}.json"
    (to_training(graph) if training else graph).save(path)
    return str(path)


# -- counts -------------------------------------------------------------------------------------
@pytest.mark.parametrize(("flags", "message"), [
    (["--ranks", "0"], "--ranks 0: give at least 1"),
    (["--parallelism", "data", "--ranks", "0"], "--ranks 0: give at least 1"),
    (["--parallelism", "pipeline", "--ranks", "-2"], "--ranks -2: give at least 1"),
    (["--parallelism", "data", "--ranks", "9"],
     "--ranks 9: give 1 to 8 (the cluster p3.16xlarge has 8 devices)"),
    (["--parallelism", "pipeline", "--microbatches", "0"], "--microbatches 0: give at least 1"),
])
def test_simulate_refuses_counts_below_one_or_above_the_devices(tmp_path, capsys, flags,
                                                                 message):
    refused(capsys, ["simulate", chain(tmp_path), "--cluster", "p3.16xlarge", *flags], message)


# -- flags that do not apply --------------------------------------------------------------------
@pytest.mark.parametrize(("flags", "message"), [
    (["--ranks", "2"], "--ranks does not apply with --parallelism single: it applies only with "
                       "--parallelism data or pipeline"),
    (["--parallelism", "data", "--placement", "p.json", "--microbatches", "4", "--schedule",
      "gpipe"], "--placement, --schedule, --microbatches do not apply with --parallelism data: "
                "--placement only with --parallelism placed; --schedule, --microbatches only "
                "with --parallelism pipeline"),
    (["--parallelism", "pipeline", "--comm-policy", "ddp"],
     "--comm-policy does not apply with --parallelism pipeline"),
    (["--parallelism", "data", "--tune-trials", "3"],
     "--tune-trials does not apply without --autotune"),
    (["--parallelism", "data", "--algorithm", "ring", "--plan", "x.plan.json"],
     "--parallelism, --algorithm do not apply with --plan FILE"),
])
def test_simulate_refuses_every_flag_its_mode_does_not_use(tmp_path, capsys, flags, message):
    refused(capsys, ["simulate", chain(tmp_path), "--cluster", "p3.16xlarge", *flags], message)


def test_optimizer_does_not_apply_to_a_training_graph(tmp_path, capsys):
    path = chain(tmp_path, training=True)
    refused(capsys, ["simulate", path, "--cluster", "p3.16xlarge", "--optimizer", "adam"],
            "--optimizer does not apply to a training graph")
    refused(capsys, ["place", path, "--cluster", "p3.16xlarge", "--optimizer", "adam"],
            "--optimizer does not apply to a training graph")


@pytest.mark.parametrize(("flags", "message"), [
    (["--batch-size", "8"], "--batch-size does not apply to a graph file"),
    (["--costs", "static", "--seq-len", "8"],
     "--seq-len, --costs do not apply to a graph file"),
    (["--steps", "3"], "--steps does not apply without --run: it applies only with --run"),
    (["--calibration", "c.json"], "--calibration does not apply without --run"),
])
def test_compare_refuses_what_a_graph_file_or_no_run_does_not_use(tmp_path, capsys, flags,
                                                                  message):
    out = tmp_path / "out"
    refused(capsys, ["compare", chain(tmp_path), "--cluster", "p3.16xlarge", "--out-dir",
                     str(out), *flags], message)


@needs_torch
@pytest.mark.parametrize(("argv", "message"), [
    (["profile", "resnet50", "--seq-len", "64"],
     "--seq-len does not apply to model 'resnet50': it applies only to gpt2, bert-base, "
     "tiny-gpt2 and model files"),
    (["profile", "gpt2", "--image-size", "64"],
     "--image-size does not apply to model 'gpt2': it applies only to resnet50"),
    (["compare", "resnet50", "--cluster", "p3.16xlarge", "--seq-len", "64"],
     "--seq-len does not apply to model 'resnet50'"),
    (["train", "mlp", "--seq-len", "64"], "--seq-len does not apply to model 'mlp'"),
    (["profile", "mlp", "--module-depth", "2"],
     "--module-depth does not apply with --granularity op: it applies only with --granularity "
     "module"),
    (["profile", "mlp", "--costs", "static", "--repeats", "3", "--device-kind", "A100"],
     "--device-kind, --repeats do not apply with --costs static"),
])
def test_model_flags_apply_to_the_models_that_take_them(tmp_path, monkeypatch, capsys, argv,
                                                         message):
    monkeypatch.chdir(tmp_path)  # nothing may be written; if it were, it would be here
    refused(capsys, argv, message)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("lr", ["nan", "inf", "-inf", "0", "-0.1"])
def test_train_refuses_a_learning_rate_that_is_not_a_positive_number(capsys, lr):
    refused(capsys, ["train", "mlp", f"--lr={lr}"], f"--lr {float(lr)}: give a finite learning "
                                                    "rate > 0")


@pytest.mark.parametrize(("argv", "message"), [
    (["cluster", "p3.16xlarge", "--devices", "4", "--name", "x"],
     "--devices, --name do not apply to p3.16xlarge: --devices, --name only to a cluster built "
     "from flags"),
    (["cluster", "--list", "--nodes", "2"], "--nodes does not apply with --list"),
    (["cluster", "p3.16xlarge", "--nodes", "0"], "--nodes 0: give at least 1"),
])
def test_cluster_refuses_flags_its_source_does_not_use(capsys, argv, message):
    refused(capsys, argv, message)


# -- strict JSON --------------------------------------------------------------------------------
def test_costs_whose_sum_overflows_are_refused_when_the_graph_is_read(tmp_path, capsys):
    doc = json.loads(Path(chain(tmp_path)).read_text())
    doc["ops"]["compute_s"][:2] = [1e308, 1e308]  # each finite, the two together not
    path = tmp_path / "overflow.json"
    path.write_text(json.dumps(doc))
    refused(capsys, ["show", str(path), "--json"], "overflow.json",
            "the ops' compute_s add up to more than the largest number")


def test_json_never_holds_infinity(tmp_path, capsys):
    # The graph's sums are finite, but three steps of it are not: refused, not "Infinity".
    path = chain(tmp_path, "edge", compute_s=(3e307, 1e-3))
    refused(capsys, ["simulate", path, "--cluster", "p3.16xlarge", "--parallelism", "data",
                     "--comm-policy", "priority", "--steps", "3", "--json"],
            "the result holds a value that is not a finite number (dependency_bound_s)")


def test_huge_values_are_valid_json_and_engineering_notation_in_text(tmp_path, capsys):
    path = chain(tmp_path, "huge", compute_s=(1e300, 1e-3))
    assert main(["simulate", path, "--cluster", "p3.16xlarge", "--json"]) == 0
    doc = strict_json(capsys.readouterr().out)
    assert doc["step_time_s"] == pytest.approx(2e300)  # forward and backward input and weight
    assert main(["simulate", path, "--cluster", "p3.16xlarge"]) == 0
    out = capsys.readouterr().out
    assert "step time        2.00e300 s" in out
    assert not re.search(r"\d{12}", out)


# -- small things -------------------------------------------------------------------------------
def test_compare_shows_the_strategies_it_can_build_and_why_not_the_others(tmp_path, capsys):
    out = tmp_path / "out"
    # 16 devices, but 3 ops: no pipeline of 16 stages; every other strategy still runs.
    assert main(["compare", chain(tmp_path), "--cluster", "p3.16xlarge:2", "--out-dir",
                 str(out)]) == 0
    text = capsys.readouterr().out
    # 16 stages for one chunk per rank, 32 for two
    reason = r"cannot cut 3 forward op\(s\) into (16|32) stages"
    pipelines = [n for n in strategies() if n.startswith("pipeline-")]
    for name in pipelines:
        assert re.search(rf"^  {name} +not built: {reason}", text, re.M), text
        assert not (out / f"{name}.trace.json").exists()
    assert (out / "data-ddp.trace.json").exists() and (out / "single.plan.json").exists()
    doc = strict_json((out / "compare.json").read_text())
    assert [s["strategy"] for s in doc["skipped"]] == pipelines
    assert all(re.search(reason, s["reason"]) for s in doc["skipped"])
    assert {r["strategy"] for r in doc["rows"]}.isdisjoint(pipelines)
    assert "single" in {r["strategy"] for r in doc["rows"]}


def test_reports_keep_the_clusters_node_count(tmp_path, capsys):
    path = chain(tmp_path)
    assert main(["simulate", path, "--cluster", "p3.16xlarge:4", "--parallelism", "data"]) == 0
    assert capsys.readouterr().out.startswith("g on p3.16xlarge:4, data:")
    assert main(["simulate", path, "--cluster", "p3.16xlarge:4", "--json"]) == 0
    assert strict_json(capsys.readouterr().out)["cluster"] == "p3.16xlarge:4"
    out = tmp_path / "out"
    assert main(["compare", path, "--cluster", "p3.16xlarge:2", "--ranks", "2", "--out-dir",
                 str(out)]) == 0
    assert "on p3.16xlarge:2, 2 devices" in capsys.readouterr().out
    assert strict_json((out / "compare.json").read_text())["cluster"] == "p3.16xlarge:2"


def test_the_tuners_flags_show_sizes_in_binary_units(tmp_path, capsys):
    path = chain(tmp_path)
    assert main(["simulate", path, "--cluster", "p3.16xlarge:2", "--parallelism", "data",
                 "--autotune", "--tune-trials", "3", "--tune-partition", "1MiB-8MiB",
                 "--tune-credit", "1MiB-16MiB"]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if "best of 3 trials" in x)
    match = re.search(r"--partition (\S+) --credit (\S+) ", line)
    assert match, line
    assert all(re.fullmatch(r"[\d.]+(KiB|MiB|GiB)", size) for size in match.groups()), line


def test_train_warns_when_ranks_far_outnumber_the_cores(monkeypatch, capsys):
    monkeypatch.setattr(os, "cpu_count", lambda: 1)
    # The credit is refused before any process starts: the warning comes first.
    bad = ["--partition", "4MiB", "--credit", "1MiB", "--credit-mode", "strict"]
    assert main(["train", "mlp", "--ranks", "3", *bad]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2
    assert lines[0] == ("trainsched: warning: --ranks 3 runs 3 processes on 1 cores; the step "
                        "times will measure their contention")
    assert lines[1].startswith("trainsched: error: ")
    assert main(["train", "mlp", "--ranks", "2", *bad]) == 2  # 2 x the cores: no warning
    assert len(capsys.readouterr().err.splitlines()) == 1


def test_simulate_refuses_micro_batches_smaller_than_one_sample(tmp_path, capsys):
    from trainsched.graph import Edge, Graph, Op

    ops = [Op(name=f"l{k}", compute_s=1e-3, flops=1e9, param_bytes=1 << 20) for k in range(4)]
    edges = [Edge(src=f"l{k}", dst=f"l{k + 1}", size_bytes=1 << 10) for k in range(3)]
    path = tmp_path / "g.json"
    Graph(ops, edges, {"model": "chain", "batch_size": 4}).save(path)
    base = ["simulate", str(path), "--cluster", "p3.16xlarge", "--parallelism", "pipeline",
            "--ranks", "2"]
    assert main([*base, "--microbatches", "8"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "--microbatches 8: the graph's batch has 4 samples" in err
    assert main([*base, "--json"]) == 0  # the default: 2 x 2 stages = 4, one sample each
    assert json.loads(capsys.readouterr().out)["step_time_s"] > 0


def test_simulate_refuses_costs_of_another_device_and_names_the_tier(tmp_path, capsys):
    from trainsched.graph import Edge, Graph, Op

    ops = [Op(name=f"l{k}", compute_s=1e-3, flops=1e9, param_bytes=1 << 20) for k in range(3)]
    edges = [Edge(src=f"l{k}", dst=f"l{k + 1}", size_bytes=1 << 10) for k in range(2)]
    path = tmp_path / "g.json"
    Graph(ops, edges, {"model": "chain", "tier": "measured", "device": "cpu"}).save(path)
    assert main(["simulate", str(path), "--cluster", "p3.16xlarge"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "costs are measured on cpu, but cluster p3.16xlarge has V100-16GB devices" in err
    # the command that makes fitting costs, for the model the graph names
    assert "trainsched profile chain --costs roofline --device-kind V100-16GB" in err
    assert main(["simulate", str(path), "--cluster", "cpu"]) == 0
    assert "costs            measured on cpu, fp32" in capsys.readouterr().out
