"""Choosing a pipeline schedule and micro-batch count by simulation (sim/pipeline_choice.py).

The graph is built by hand so that every step and peak is worked out below: an input the
stage needs a gradient of, then two layers, each costing 4 s of forward, dX and dW for the
whole batch of 4 (per micro-batch of 1/m of it: 4/m each), saving 400 bytes (400/m per
micro-batch) and holding 10 bytes of parameters and 10 of gradients (plain SGD). The two
stages are [x, l0] and [l1]; nothing crosses the boundary, communication is free.

GPipe and 1F1B on 2 ranks: step (m + 1)(F + B) = (m + 1) 12/m, so 24, 18, 15 s for m = 1, 2,
4. Rank 0's peak: 20 resident + (micro-batches in flight) x 400/m: GPipe holds all m (420 for
every m), 1F1B min(m, 2): 420, 420, 220.
"""

from __future__ import annotations

import pytest

from trainsched.cluster import cluster_from_flags
from trainsched.errors import TrainschedError
from trainsched.graph import Edge, Graph, Op
from trainsched.sim.pipeline_choice import choose_pipeline, microbatch_candidates


def _graph() -> Graph:
    ops = [Op(name="x", target="input")]
    ops += [Op(name=f"l{k}", compute_s=4.0, backward_input_s=4.0, backward_weight_s=4.0,
               param_bytes=10, saved_bytes=400, output_bytes=0) for k in range(2)]
    edges = [Edge(src="x", dst="l0", size_bytes=0), Edge(src="l0", dst="l1", size_bytes=0)]
    return Graph(ops, edges, {"batch_size": 4, "grad_inputs": ["x"]})


CLUSTER = cluster_from_flags(devices=2, memory="1GiB", bandwidth="1GB/s", latency="0s")
TWO = ["gpipe", "1f1b"]


def test_the_candidates_are_the_divisors_of_the_batch():
    assert microbatch_candidates(12, 2) == (1, 2, 3, 4, 6, 12)
    assert microbatch_candidates(None, 3) == (1, 3, 6, 12)


def test_every_candidate_is_listed_with_its_step_and_peak():
    choice = choose_pipeline(_graph(), CLUSTER, 2, schedules=TWO)
    got = [(c.schedule, c.num_microbatches, c.step_time_s, c.peak_memory_bytes)
           for c in choice.candidates]
    assert got == [("gpipe", 1, 24.0, 420), ("gpipe", 2, 18.0, 420), ("gpipe", 4, 15.0, 420),
                   ("1f1b", 1, 24.0, 420), ("1f1b", 2, 18.0, 420), ("1f1b", 4, 15.0, 220)]


def test_a_tie_on_step_time_goes_to_the_smaller_peak():
    choice = choose_pipeline(_graph(), CLUSTER, 2, schedules=TWO)
    assert (choice.schedule_name, choice.num_microbatches) == ("1f1b", 4)
    assert choice.result.step_time_s == 15.0
    assert "1f1b with 4 micro-batches" in choice.reason


def test_the_memory_limit_rules_out_what_does_not_fit():
    choice = choose_pipeline(_graph(), CLUSTER, 2, schedules=TWO, memory_limit_bytes=300)
    assert [c.fits for c in choice.candidates] == [False] * 5 + [True]
    assert (choice.schedule_name, choice.num_microbatches) == ("1f1b", 4)


def test_a_limit_no_schedule_meets_names_the_smallest_that_works():
    with pytest.raises(TrainschedError, match=r"smallest limit that works is 220 B \(1f1b "
                                              r"with 4 micro-batches\)"):
        choose_pipeline(_graph(), CLUSTER, 2, schedules=TWO, memory_limit_bytes=200)


def test_a_tie_on_step_and_peak_goes_to_the_schedule_tried_first():
    # m = 2: both take 18 s and peak at 420 bytes; 1f1b is tried first here
    choice = choose_pipeline(_graph(), CLUSTER, 2, schedules=["1f1b", "gpipe"],
                             microbatches=[1, 2], memory_limit_bytes=420)
    assert (choice.schedule_name, choice.num_microbatches) == ("1f1b", 2)


def test_auto_tries_every_registered_schedule():
    from trainsched.backprop.schedules import SCHEDULES

    choice = choose_pipeline(_graph(), CLUSTER, 2, microbatches=[2])
    assert [c.schedule for c in choice.candidates] == list(SCHEDULES)


def test_more_microbatches_than_samples_are_refused():
    with pytest.raises(TrainschedError, match="at least one sample"):
        choose_pipeline(_graph(), CLUSTER, 2, schedules=TWO, microbatches=[8])


# --- the command line ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def graph_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("g") / "g.json"
    _graph().save(path)
    return path


def _simulate(graph_path, *extra: str) -> list[str]:
    return ["simulate", str(graph_path), "--cluster", "cpu", "--parallelism", "pipeline",
            "--ranks", "2", "--schedule", "auto", *extra]


def test_simulate_auto_reports_every_candidate_and_the_winner(graph_path, capsys):
    import json

    from trainsched.backprop.schedules import SCHEDULES
    from trainsched.cli import main

    assert main([*_simulate(graph_path, "--memory-limit", "300B"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert len(doc["choice"]["candidates"]) == 3 * len(SCHEDULES)   # m in 1, 2, 4
    # ZB-H1 at m = 4 (F = I = W = 1 s): 3m slots of work plus its bubble (p - 1)(F + I - W)
    # = 1 s, 13 s in all, at 1F1B's peak of 220 bytes; ZB-H2 is as fast but holds 3 micro-
    # batches (320 bytes), GPipe and 1F1B take 15 s.
    assert (doc["choice"]["schedule"], doc["choice"]["microbatches"]) == ("zb-h1", 4)
    assert doc["step_time_s"] == pytest.approx(13.0)
    assert max(doc["peak_memory_bytes"].values()) == 220


def test_simulate_auto_text_lists_the_candidates(graph_path, capsys):
    from trainsched.cli import main

    assert main(_simulate(graph_path, "--memory-limit", "300B")) == 0
    out = capsys.readouterr().out
    assert "schedules tried (memory limit 300 B per device)" in out
    assert "chosen: " in out
    assert out.count("over the memory limit") >= 1


def test_simulate_auto_under_an_impossible_limit_names_the_smallest_one(graph_path, capsys):
    from trainsched.cli import main

    assert main(_simulate(graph_path, "--memory-limit", "100B")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "the smallest limit that works is" in err[0]


def test_a_memory_limit_without_auto_is_refused(graph_path, capsys):
    from trainsched.cli import main

    args = _simulate(graph_path, "--memory-limit", "1GiB")
    args[args.index("auto")] = "1f1b"
    assert main(args) == 2
    assert "--schedule auto" in capsys.readouterr().err


def test_a_roofline_graphs_launches_stop_the_count_growing():
    # 1 s of each 4 s phase is its op's launch, paid once per micro-batch: a phase costs
    # 3/m + 1, so GPipe's step is (m + 1) x 3 x (3/m + 1): 24, 22.5 and 26.25 s for m = 1, 2,
    # 4 (15 s at m = 4 when everything divides).
    graph = _graph()
    graph = Graph(graph.ops, graph.edges, {**graph.meta, "tier": "roofline",
                                           "launch_overhead_s": 1.0})
    choice = choose_pipeline(graph, CLUSTER, 2, schedules=["gpipe"])
    assert [c.step_time_s for c in choice.candidates] == [24.0, 22.5, 26.25]
    assert choice.num_microbatches == 2


def _chain(costs: list[float]) -> Graph:
    """A chain of layers, each costing its entry (s) of forward, dX and dW for the batch."""
    ops = [Op(name="x", target="input")]
    ops += [Op(name=f"l{k}", compute_s=c, backward_input_s=c, backward_weight_s=c,
               param_bytes=10, saved_bytes=40, output_bytes=0) for k, c in enumerate(costs)]
    edges = [Edge(src="x", dst="l0", size_bytes=0)]
    edges += [Edge(src=f"l{k}", dst=f"l{k + 1}", size_bytes=0) for k in range(len(costs) - 1)]
    return Graph(ops, edges, {"batch_size": 4, "grad_inputs": ["x"]})


def _spy(graph: Graph, calls: list) -> object:
    from trainsched.backprop.stages import stage_costs_from_graph

    def costs_of(count, m, cut):
        calls.append(cut)
        return stage_costs_from_graph(graph, count, m, cut=cut if cut == "compute" else list(cut))
    return costs_of


def _step(graph: Graph, name: str, cut) -> float:
    from trainsched.backprop.schedules import build_schedule
    from trainsched.backprop.stages import stage_costs_from_graph
    from trainsched.sim.pipeline import simulate_pipeline

    stages = stage_costs_from_graph(graph, 4, 4, cut=cut if cut == "compute" else list(cut))
    return simulate_pipeline(stages, build_schedule(name, 2, 4, stages=stages),
                             CLUSTER).step_time_s


def test_several_stages_per_rank_try_the_cuts_that_balance_the_ranks():
    from trainsched.sim.pipeline_choice import schedule_cuts

    # ZBV on 2 ranks holds stages 0 and 3 on rank 0. Each layer weighs 3x its cost: by stage
    # [x l0-l4 | l5 | l6 | l7] loads rank 0 with 15 + 15 and rank 1 with 6; cut by rank,
    # [x l0 | l1-l5 | l6 | l7], 18 and 18 (the input x costs nothing).
    graph = _chain([1.0] * 7 + [5.0])
    assert schedule_cuts(graph, "zbv", 2, 4) == ("compute", (2, 7, 8))
    assert schedule_cuts(graph, "1f1b", 2, 4) == ("compute",)  # one stage per rank


def test_the_fastest_cut_is_kept():
    from trainsched.sim.pipeline_choice import plan_stages, schedule_cuts

    graph, calls = _chain([1.0] * 7 + [5.0]), []
    cuts = schedule_cuts(graph, "zbv", 2, 4)
    stages, _, result = plan_stages(_spy(graph, calls), "zbv", 2, 4, CLUSTER, cuts=cuts)
    assert calls == list(cuts)  # each simulated once, in order
    steps = [_step(graph, "zbv", cut) for cut in cuts]
    assert steps[1] < steps[0] and result.step_time_s == steps[1]
    assert stages.ops == (("x", "l0"), ("l1", "l2", "l3", "l4", "l5"), ("l6",), ("l7",))


def test_a_rank_balanced_cut_that_is_slower_is_not_kept():
    from trainsched.sim.pipeline_choice import plan_stages, schedule_cuts

    # Interleaved 1F1B, loop placement (per phase, s): by stage [x l0 l1 | l2 l3 | l4 l5 | l6]
    # = 7 | 10 | 10 | 3 loads the ranks 7 + 10 = 17 and 10 + 3 = 13; cuts more even by rank
    # hold a longer stage that every micro-batch waits on.
    graph = _chain([4.0, 3.0, 4.0, 6.0, 4.0, 6.0, 3.0])
    cuts = schedule_cuts(graph, "interleaved-1f1b", 2, 4)
    assert len(cuts) > 1
    steps = [_step(graph, "interleaved-1f1b", cut) for cut in cuts]
    assert steps[0] < min(steps[1:])
    stages, _, result = plan_stages(_spy(graph, []), "interleaved-1f1b", 2, 4, CLUSTER,
                                    cuts=cuts)
    assert stages.ops == (("x", "l0", "l1"), ("l2", "l3"), ("l4", "l5"), ("l6",))
    assert result.step_time_s == steps[0]


def test_no_cut_to_try_is_an_error():
    from trainsched.sim.pipeline_choice import plan_stages

    with pytest.raises(TrainschedError, match="at least one cut"):
        plan_stages(_spy(_chain([1.0, 2.0]), []), "1f1b", 2, 4, CLUSTER, cuts=())


def test_progress_hears_every_candidate_and_the_end():
    heard: list = []
    choose_pipeline(_graph(), CLUSTER, 2, schedules=TWO,
                    progress=lambda done, total, item: heard.append((done, total, item)))
    assert heard == [(0, 6, "gpipe, 1 micro-batch"), (1, 6, "gpipe, 2 micro-batches"),
                     (2, 6, "gpipe, 4 micro-batches"), (3, 6, "1f1b, 1 micro-batch"),
                     (4, 6, "1f1b, 2 micro-batches"), (5, 6, "1f1b, 4 micro-batches"),
                     (6, 6, "")]


def test_a_cut_that_fits_the_memory_limit_beats_a_faster_one_that_does_not():
    from trainsched.backprop.stages import uniform_stages
    from trainsched.sim.pipeline_choice import plan_stages

    # Two made-up cuts of 2 stages on 2 ranks: "fast" (1 s phases, 400 bytes kept per
    # micro-batch) and "lean" (2 s phases, 10 bytes). GPipe holds all 4 micro-batches: peaks
    # 1600 and 40 bytes.
    stages = {"fast": uniform_stages(2, 1.0, 1.0, 1.0, saved_bytes=400),
              "lean": uniform_stages(2, 2.0, 2.0, 2.0, saved_bytes=10)}

    def costs_of(count, m, cut):
        return stages[cut]

    fastest, _, result = plan_stages(costs_of, "gpipe", 2, 4, CLUSTER, cuts=["fast", "lean"])
    assert fastest is stages["fast"] and result.step_time_s == 15.0  # (4 + 1) x 3 s
    fitting, _, result = plan_stages(costs_of, "gpipe", 2, 4, CLUSTER, cuts=["fast", "lean"],
                                     memory_limit_bytes=100)
    assert fitting is stages["lean"] and result.step_time_s == 30.0  # (4 + 1) x 6 s
