"""``trainsched simulate --microbatch-graph FILE``: a pipeline's micro-batches costed by the
model profiled at their size, not by the batch's graph divided.

The graphs are built by hand so that every step is worked out below: an input the stage needs
a gradient of, then two layers on two stages; the batch's graph (4 samples) costs 4 s of
forward, dX and dW per layer; profiled at 2 samples each phase costs 3 s, at 1 sample 2 s (a
small batch costs more per sample, as measured on a CPU). Nothing crosses the stage boundary
and the link has no latency, so GPipe on 2 ranks takes (m + 1)(F + I + W) per step: with the
batch's graph divided, (2 + 1)(3 x 2) = 18 s at m = 2; with the 2-sample graph
(2 + 1)(3 x 3) = 27 s; with the 1-sample graph at m = 4, (4 + 1)(3 x 2) = 30 s.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainsched.cli import main
from trainsched.graph import Edge, Graph, Op


def _graph(path: Path, phase_s: float, batch: int | None) -> str:
    ops = [Op(name="x", target="input")]
    ops += [Op(name=f"l{k}", compute_s=phase_s, backward_input_s=phase_s,
               backward_weight_s=phase_s, param_bytes=10, saved_bytes=400, output_bytes=0)
            for k in range(2)]  # fmt: skip
    edges = [Edge(src="x", dst="l0", size_bytes=0), Edge(src="l0", dst="l1", size_bytes=0)]
    meta = {"model": "hand", "grad_inputs": ["x"]}
    if batch is not None:
        meta["batch_size"] = batch
    Graph(ops, edges, meta).save(path)
    return str(path)


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    cluster = {"format": "trainsched.cluster/1", "name": "two", "nodes": 1,
               "device": {"count": 2, "kind": "cpu", "memory": 1 << 30,
                          "peak_flops": {"fp32": 1e11}},
               "intra_node": {"bandwidth": 1e9, "latency": 0},
               "inter_node": {"bandwidth": 1e9, "latency": 0}}
    (tmp_path / "two.json").write_text(json.dumps(cluster))
    return {"cluster": str(tmp_path / "two.json"),
            "batch": _graph(tmp_path / "b4.json", 4.0, 4),
            "half": _graph(tmp_path / "b2.json", 3.0, 2),
            "one": _graph(tmp_path / "b1.json", 2.0, 1),
            "three": _graph(tmp_path / "b3.json", 3.0, 3),
            "unsized": _graph(tmp_path / "bx.json", 3.0, None)}


def _simulate(files: dict[str, str], *flags: str) -> list[str]:
    return ["simulate", files["batch"], "--cluster", files["cluster"], "--parallelism",
            "pipeline", "--ranks", "2", *flags]


def _json(capsys, argv: list[str]) -> dict:
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_micro_batch_graph_sets_the_count_and_its_costs(files, capsys):
    divided = _json(capsys, _simulate(files, "--schedule", "gpipe", "--microbatches", "2"))
    assert divided["step_time_s"] == pytest.approx(18.0)
    assert divided["pipeline"] == {"schedule": "gpipe", "stages": 2, "microbatches": 2,
                                   "microbatch_samples": 2, "microbatch_costs": "divided"}
    sized = _json(capsys, _simulate(files, "--schedule", "gpipe",
                                    "--microbatch-graph", files["half"]))
    assert sized["step_time_s"] == pytest.approx(27.0)
    assert sized["pipeline"]["microbatches"] == 2
    assert sized["pipeline"]["microbatch_costs"] == "graph"


def test_the_report_names_the_schedule_the_micro_batches_and_their_costs(files, capsys):
    assert main(_simulate(files, "--schedule", "gpipe", "--microbatch-graph",
                          files["half"])) == 0
    out = capsys.readouterr().out
    assert ("pipeline         gpipe, 2 stages, 2 micro-batches of 2 samples; costs of the "
            "micro-batch graph") in out
    assert "  batch            4 samples\n" in out  # the graph's batch, no sequence


def test_the_report_says_a_data_parallel_batch_is_per_rank(files, capsys):
    assert main(["simulate", files["batch"], "--cluster", files["cluster"], "--parallelism",
                 "data"]) == 0
    assert "  batch            4 samples per rank\n" in capsys.readouterr().out
    doc = _json(capsys, ["simulate", files["batch"], "--cluster", files["cluster"]])
    assert doc["batch"] == {"samples": 4, "seq_len": None}


def test_auto_tries_the_counts_of_the_graphs_given(files, capsys):
    doc = _json(capsys, _simulate(files, "--schedule", "auto", "--microbatch-graph",
                                  files["half"], "--microbatch-graph", files["one"]))
    gpipe = {c["microbatches"]: c["step_time_s"] for c in doc["choice"]["candidates"]
             if c["schedule"] == "gpipe"}
    assert gpipe == pytest.approx({2: 27.0, 4: 30.0})
    chosen = doc["choice"]["microbatches"]
    assert doc["pipeline"]["microbatches"] == chosen
    assert doc["pipeline"]["microbatch_costs"] == "graph"


def _save_plan(files: dict[str, str], path: Path, kind: str) -> str:
    """A plan file as ``compare`` writes one: GPipe over 2 stages and 2 micro-batches, or
    DDP on 2 ranks."""
    from trainsched.backprop.schedules import build_schedule
    from trainsched.backprop.stages import stage_costs_from_graph
    from trainsched.plan import DataParallelPlan, ModelRef, PipelinePlan, save_plan

    graph = Graph.load(files["batch"])
    if kind == "data":
        from trainsched.comm import comm_policy

        plan = DataParallelPlan(model=ModelRef.of(graph), ranks=2, comm="ddp",
                                policy=comm_policy("ddp"))
    else:
        stages = stage_costs_from_graph(graph, 2, 2)
        plan = PipelinePlan(model=ModelRef.of(graph), stages=stages.ops,
                            schedule=build_schedule("gpipe", 2, 2, stages=stages),
                            schedule_name="gpipe")
    save_plan(plan, path)
    return str(path)


def test_a_pipeline_plan_file_is_simulated_with_the_graph_of_its_count(files, tmp_path,
                                                                         capsys):
    plan = _save_plan(files, tmp_path / "plan.json", "pipeline")
    base = ["simulate", files["batch"], "--cluster", files["cluster"], "--plan", plan]
    assert _json(capsys, base)["step_time_s"] == pytest.approx(18.0)
    doc = _json(capsys, [*base, "--microbatch-graph", files["half"]])
    assert doc["step_time_s"] == pytest.approx(27.0)
    assert doc["pipeline"]["microbatch_costs"] == "graph"
    assert main([*base, "--microbatch-graph", files["one"]]) == 2
    assert "runs 2 micro-batches; give the one graph of 1/2 of the batch" in \
        capsys.readouterr().err


def test_a_plan_of_another_kind_refuses_it(files, tmp_path, capsys):
    plan = _save_plan(files, tmp_path / "plan.json", "data")
    assert main(["simulate", files["batch"], "--cluster", files["cluster"], "--plan", plan,
                 "--microbatch-graph", files["half"]]) == 2
    assert "is a data plan; micro-batch graphs cost a pipeline's" in capsys.readouterr().err


@pytest.mark.parametrize(("extra", "message"), [
    (["--schedule", "gpipe", "--microbatch-graph", "{unsized}"],
     "does not record its batch size"),
    (["--schedule", "gpipe", "--microbatch-graph", "{three}"],
     "batch of 3 does not divide the graph's batch of 4"),
    (["--schedule", "gpipe", "--microbatch-graph", "{half}", "--microbatch-graph", "{one}"],
     "give one, or several with --schedule auto"),
    (["--schedule", "gpipe", "--microbatch-graph", "{half}", "--microbatch-graph", "{half}"],
     "a second graph of 1/2 of the batch"),
    (["--schedule", "gpipe", "--microbatches", "4", "--microbatch-graph", "{half}"],
     "drop --microbatches (the graph sets the count)"),
    (["--schedule", "auto", "--microbatches", "4", "--microbatch-graph", "{half}"],
     "no micro-batch graph for 4 micro-batches"),
])
def test_graphs_that_do_not_fit_the_run_are_refused(files, capsys, extra, message):
    argv = _simulate(files, *[a.format(**files) for a in extra])
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_it_applies_to_pipelines_only(files, capsys):
    assert main(["simulate", files["batch"], "--cluster", files["cluster"], "--parallelism",
                 "data", "--microbatch-graph", files["half"]]) == 2
    assert "--microbatch-graph" in capsys.readouterr().err


def test_a_sequence_model_names_its_tokens(tmp_path, files, capsys):
    graph = Graph.load(files["batch"])
    Graph(graph.ops, graph.edges, {**graph.meta, "seq_len": 128}).save(tmp_path / "seq.json")
    assert main(["simulate", str(tmp_path / "seq.json"), "--cluster", files["cluster"]]) == 0
    assert "  batch            4 samples x 128 tokens\n" in capsys.readouterr().out


def test_measured_costs_divided_get_a_note_saying_how_to_cost_them(tmp_path, files, capsys):
    graph = Graph.load(files["batch"])
    Graph(graph.ops, graph.edges, {**graph.meta, "tier": "measured", "device": "cpu"}).save(
        tmp_path / "measured.json")
    argv = ["simulate", str(tmp_path / "measured.json"), "--cluster", files["cluster"],
            "--parallelism", "pipeline", "--ranks", "2", "--schedule", "gpipe"]
    assert main([*argv, "--microbatches", "2"]) == 0
    assert "pass --microbatch-graph FILE" in capsys.readouterr().out
    assert main([*argv, "--microbatch-graph", files["half"]]) == 0  # costed at its size
    assert "pass --microbatch-graph FILE" not in capsys.readouterr().out
    assert main([*argv, "--microbatches", "1"]) == 0  # nothing divided
    assert "pass --microbatch-graph FILE" not in capsys.readouterr().out
