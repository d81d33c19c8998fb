"""compare: every strategy on one graph and cluster, ranked by throughput."""

from __future__ import annotations

import json
import re

import pytest

from trainsched.cli import main
from trainsched.cluster import resolve_cluster
from trainsched.compare import Options, compare, strategies
from trainsched.errors import TrainschedError
from trainsched.graph import Edge, Graph, Op, to_training
from trainsched.report.chart import write_chart
from trainsched.sim import simulate_single


def _chain(n: int = 8) -> Graph:
    ops = [Op(name=f"l{i}", compute_s=1e-3 * (i + 1), flops=1e9, param_bytes=4_000_000,
              output_bytes=1_000_000, saved_bytes=1_000_000) for i in range(n)]
    edges = [Edge(src=f"l{i}", dst=f"l{i + 1}", size_bytes=1_000_000) for i in range(n - 1)]
    return to_training(Graph(ops, edges, {"model": "chain", "batch_size": 16}))


def test_every_strategy_is_ranked_by_throughput_against_one_device():
    graph = _chain()
    cluster = resolve_cluster("p3.16xlarge")
    rows, results = compare(graph, cluster, Options(ranks=4, microbatches=8, batch_size=16))
    assert {r.strategy for r in rows} == set(strategies())
    rates = [r.samples_per_s for r in rows]
    assert rates == sorted(rates, reverse=True)
    single = next(r for r in rows if r.strategy == "single")
    assert single.speedup == 1.0 and single.devices == 1
    assert single.step_time_s == simulate_single(graph, cluster).step_time_s
    data = next(r for r in rows if r.strategy == "data-ddp")
    assert data.samples_per_step == 4 * 16
    assert data.speedup == pytest.approx(
        data.samples_per_s / (16 / single.step_time_s), rel=1e-12)
    gpipe = next(r for r in rows if r.strategy == "pipeline-gpipe")
    assert gpipe.samples_per_step == 16 and 0 < gpipe.idle_fraction < 1
    assert set(results) == set(strategies())


def test_compare_is_deterministic_and_checks_its_input():
    graph = _chain()
    cluster = resolve_cluster("p3.16xlarge")
    options = Options(ranks=2, microbatches=4, batch_size=16)
    a, _ = compare(graph, cluster, options)
    b, _ = compare(graph, cluster, options)
    assert [r.to_dict() for r in a] == [r.to_dict() for r in b]
    with pytest.raises(TrainschedError, match="unknown strategy"):
        compare(graph, cluster, options, ["teleport"])
    with pytest.raises(TrainschedError, match="more than"):
        compare(graph, cluster, Options(ranks=64, microbatches=4, batch_size=16))


def test_chart_is_a_png(tmp_path):
    rows, _ = compare(_chain(), resolve_cluster("p3.16xlarge"),
                      Options(ranks=2, microbatches=4, batch_size=16))
    path = tmp_path / "c.png"
    write_chart(str(path), rows, "chain")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_compare_command_writes_table_traces_and_chart(tmp_path, capsys):
    graph_path = tmp_path / "g.json"
    _chain().save(graph_path)
    out = tmp_path / "out"
    assert main(["compare", str(graph_path), "--cluster", "p3.16xlarge", "--ranks", "2",
                 "--out-dir", str(out), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["rows"][0]["strategy"] != "single"
    written = (out / "compare.json").read_text()
    assert json.loads(written) == {k: v for k, v in doc.items() if k != "out_dir"}
    again = tmp_path / "again"
    assert main(["compare", str(graph_path), "--cluster", "p3.16xlarge", "--ranks", "2",
                 "--out-dir", str(again), "--json"]) == 0
    capsys.readouterr()
    for name in ("compare.json", "compare.png", "single.trace.json", "data-ddp.trace.json"):
        assert (again / name).read_bytes() == (out / name).read_bytes()
    assert (out / "compare.png").exists()
    for name in strategies():
        trace = json.loads((out / f"{name}.trace.json").read_text())
        assert trace["traceEvents"]


def test_compare_rejects_bad_widths_before_capturing(tmp_path, capsys):
    assert main(["compare", "mlp", "--cluster", "cpu", "--ranks", "5",
                 "--out-dir", str(tmp_path / "o")]) == 2
    assert "--ranks 5" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_placed_row_is_never_slower_than_one_device():
    from trainsched.placement import place
    from trainsched.sim import predict_placement

    graph = _chain()
    cluster = resolve_cluster("baechi-4x2080")
    rows, results = compare(graph, cluster, Options(ranks=4, microbatches=8, batch_size=16),
                            ["single", "placed-auto"])
    single = next(r for r in rows if r.strategy == "single")
    placed = next(r for r in rows if r.strategy == "placed-auto")
    assert placed.step_time_s <= single.step_time_s
    assert placed.samples_per_step == 16 and 1 <= placed.devices <= 4
    chosen = place(graph, cluster, "auto", predict=predict_placement)
    assert placed.step_time_s == chosen.predicted_step_s
    assert f"{chosen.placer} placement on {placed.devices} of 4 devices" == placed.description
    assert results["placed-auto"].step_time_s == placed.step_time_s


def test_bytescheduler_row_is_the_steady_step_and_beats_fifo_when_communication_bound():
    from trainsched.comm import ByteSchedulerPolicy
    from trainsched.sim import simulate_data_parallel

    graph = _chain()
    cluster = resolve_cluster("v100-tcp-25g:2")  # 16 V100s, 25 Gbit/s between the two nodes
    rows, results = compare(graph, cluster, Options(ranks=16, microbatches=8, batch_size=16),
                            ["single", "data-fifo", "data-ddp", "data-bytescheduler"])
    row = {r.strategy: r for r in rows}
    bs = row["data-bytescheduler"]
    steady = simulate_data_parallel(graph, cluster, ranks=16, policy=ByteSchedulerPolicy(),
                                    steps=3)
    assert bs.step_time_s == steady.step_time_s == results["data-bytescheduler"].step_time_s
    assert bs.samples_per_step == 16 * 16 and bs.devices == 16
    assert bs.description.endswith("bytescheduler gradient communication, steady step of 3")
    assert 0 <= bs.idle_fraction < 1
    assert bs.samples_per_s > row["data-fifo"].samples_per_s
    assert bs.samples_per_s > row["data-ddp"].samples_per_s


def test_tuned_bytescheduler_row_runs_the_tuners_point_and_is_never_behind_the_defaults():
    from trainsched.comm import ByteSchedulerPolicy
    from trainsched.comm.tune import tune, tuned_policy
    from trainsched.sim import simulate_data_parallel
    from trainsched.sim.tune import simulated_objective
    from trainsched.units import format_size

    graph = _chain()
    cluster = resolve_cluster("v100-tcp-25g:2")
    rows, results = compare(graph, cluster, Options(ranks=16, microbatches=8, batch_size=16),
                            ["single", "data-bytescheduler", "data-bytescheduler-tuned"])
    row = {r.strategy: r for r in rows}
    tuned = row["data-bytescheduler-tuned"]
    best = tune(simulated_objective(graph, cluster, 16, steps=3))
    policy = tuned_policy(ByteSchedulerPolicy(), best.partition_bytes, best.credit_bytes)
    expected = simulate_data_parallel(graph, cluster, ranks=16, policy=policy, steps=3)
    assert tuned.step_time_s == expected.step_time_s == best.step_time_s
    assert results["data-bytescheduler-tuned"].step_time_s == tuned.step_time_s
    assert f"partition {format_size(best.partition_bytes)}" in tuned.description
    # The defaults are one point the tuner could have picked; its pick is at least as good
    # here, where the defaults' 4 MiB partitions pay the inter-node ring's start-up often.
    assert tuned.step_time_s <= row["data-bytescheduler"].step_time_s


def test_strategies_that_cannot_be_built_are_skipped_with_the_reason():
    from trainsched.strategies import make_plans, plan_strategies

    graph = _chain(3)  # three forward ops: no pipeline of 4 stages
    cluster = resolve_cluster("p3.16xlarge")
    options = Options(ranks=4, microbatches=8, batch_size=16)
    planned, skipped = plan_strategies(graph, cluster, options)
    pipelines = [n for n in strategies() if n.startswith("pipeline-")]
    assert list(skipped) == pipelines
    # four stages for one chunk per rank, eight for two
    assert all(re.search(r"cannot cut 3 forward op\(s\) into [48] stages", r)
               for r in skipped.values())
    assert list(planned) == [n for n in strategies() if n not in pipelines]
    with pytest.raises(TrainschedError, match=f"strategy '{pipelines[0]}': cannot cut"):
        make_plans(graph, cluster, options)


@pytest.mark.parametrize(("call", "message"), [
    (lambda: Options(ranks="2", microbatches=4, batch_size=16),
     "Options.ranks must be an integer >= 1, got '2'"),
    (lambda: Options(ranks=2, microbatches=0, batch_size=16), "Options.microbatches must be"),
    (lambda: compare(_chain(), resolve_cluster("p3.16xlarge"),
                     Options(ranks=64, microbatches=4, batch_size=16)),
     "^ranks 64 is more than the cluster's 8 devices$"),
    (lambda: compare(_chain(), "p3.16xlarge", Options(ranks=2, microbatches=4, batch_size=16)),
     "the strategies need a Cluster"),
])
def test_library_errors_name_parameters_not_flags(call, message):
    with pytest.raises(TrainschedError, match=message) as raised:
        call()
    assert "--" not in str(raised.value)


def test_pipelines_never_cut_a_batch_into_micro_batches_below_one_sample():
    graph = _chain()  # captured at batch 16
    cluster = resolve_cluster("p3.16xlarge")
    from trainsched.strategies import default_microbatches, plan_strategies

    assert default_microbatches(8, 16) == 16 and default_microbatches(8, 4) == 4
    assert default_microbatches(8, None) == 16
    planned, skipped = plan_strategies(graph, cluster, Options(ranks=4, microbatches=32,
                                                               batch_size=16))
    assert set(skipped) == {n for n in strategies() if n.startswith("pipeline-")}
    assert "32 micro-batches of a batch of 16" in skipped["pipeline-1f1b"]
    assert "data-ddp" in planned


def test_sync_rows_continue_the_data_parallel_bsp_step():
    from trainsched.compare import compare_sync
    from trainsched.sim import simulate_single

    graph = _chain()
    cluster = resolve_cluster("p3.16xlarge")
    single = simulate_single(graph, cluster).step_time_s
    bsp = single + 0.004                       # a data-parallel step with 4 ms of all-reduce
    rows = compare_sync(graph, cluster, ranks=4, batch_size=16, bsp_step_s=bsp, steps=40,
                        noise_cv=0.0)
    assert [r.protocol for r in rows] == ["bsp", "asp", "ssp(s=2)", "k-of-n(k=3)",
                                          "local(h=4)"]
    by = {r.protocol: r for r in rows}
    assert by["bsp"].step_time_s == pytest.approx(bsp)
    assert by["bsp"].speedup == 1.0 and by["bsp"].max_staleness == 0
    # local SGD averages every 4 steps: the all-reduce once per 4 local steps
    assert by["local(h=4)"].step_time_s == pytest.approx(single + 0.004 / 4)


def test_one_rank_has_no_sync_rows():
    from trainsched.compare import compare_sync

    assert compare_sync(_chain(), resolve_cluster("p3.16xlarge"), ranks=1, batch_size=16,
                        bsp_step_s=1.0) == []


@pytest.mark.parametrize(("microbatches", "captured", "note"), [
    ("2", [8, 4], True),  # measured costs: the model timed again at 4 samples
    ("1", [8], False),  # one micro-batch is the batch: nothing to time again
])
def test_measured_pipelines_are_costed_at_their_micro_batch_size(tmp_path, capsys, monkeypatch,
                                                                microbatches, captured, note):
    import trainsched.capture as capturing

    batches: list[int] = []
    real = capturing.capture

    def spy(model, args, *rest, **kwargs):
        batches.append(int(args[0].shape[0]))
        return real(model, args, *rest, **kwargs)

    monkeypatch.setattr(capturing, "capture", spy)
    monkeypatch.chdir(tmp_path)
    assert main(["compare", "mlp", "--cluster", "cpu", "--ranks", "2", "--batch-size", "8",
                 "--microbatches", microbatches, "--costs", "measured"]) == 0
    out = capsys.readouterr().out
    assert batches == captured
    assert ("(costs timed at that size)" in out) is note
    doc = json.loads((tmp_path / "compare-out" / "compare.json").read_text())
    assert doc["microbatch_costs_timed"] is note
