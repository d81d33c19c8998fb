"""Every registered schedule runs in the pipeline runtime (one process, a thread per rank) and
gives the gradients of single-process gradient accumulation."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from trainsched.backprop.schedules import SCHEDULES, build_schedule, schedule_stage_count  # noqa: E402
from trainsched.backprop.stages import stage_costs_from_graph  # noqa: E402
from trainsched.capture import capture  # noqa: E402
from trainsched.capture.zoo import build  # noqa: E402
from trainsched.runtime.pipeline import run_local  # noqa: E402
from trainsched.runtime.stage_modules import build_stages, split_microbatches  # noqa: E402

BATCH, RANKS, MICRO = 8, 2, 4


@pytest.fixture(scope="module")
def graph():
    z = build("small-cnn", batch_size=BATCH)
    return capture(z.model, z.args, example_kwargs=z.kwargs, costs="static", name="small-cnn")


@pytest.fixture(scope="module")
def reference():
    z = build("small-cnn", batch_size=BATCH)
    z.model.train()
    for chunk in z.args[0].chunk(MICRO):
        (z.model(chunk).square().mean() / MICRO).backward()
    return {n: p.grad.clone() for n, p in z.model.named_parameters()}


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_schedule_runs_and_matches_gradient_accumulation(graph, reference, name):
    stages = stage_costs_from_graph(graph, schedule_stage_count(name, RANKS), MICRO,
                                    cut="params")
    schedule = build_schedule(name, RANKS, MICRO, stages=stages)
    z = build("small-cnn", batch_size=BATCH)
    micro = split_microbatches(z.args, z.kwargs, MICRO)
    built = build_stages(z.model, stages.ops, *micro[0], num_microbatches=MICRO)
    run_local(built, schedule, micro, timeout_s=60.0)
    got = {n: p.grad for n, p in z.model.named_parameters() if p.grad is not None}
    assert sorted(got) == sorted(reference)
    for n, want in reference.items():
        assert torch.allclose(got[n], want, rtol=1e-4, atol=1e-6), n


# --- real gloo processes, from the plan compare would make ----------------------------------------

FAST = ("1f1b", "zbv")   # the rest take ~15 s each and run with -m slow


@pytest.fixture(scope="module")
def mlp_graph():
    z = build("mlp", batch_size=BATCH)
    return capture(z.model, z.args, example_kwargs=z.kwargs, costs="roofline", name="mlp")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", [n if n in FAST else pytest.param(n, marks=pytest.mark.slow)
                                  for n in SCHEDULES])
def test_schedule_runs_on_two_gloo_processes_from_its_plan(mlp_graph, name):
    from trainsched.cluster import resolve_cluster
    from trainsched.runtime.pipeline import run_pipeline
    from trainsched.strategies import Options, make_plans

    options = Options(ranks=RANKS, microbatches=MICRO, batch_size=BATCH)
    plan = make_plans(mlp_graph, resolve_cluster("cpu"), options, [f"pipeline-{name}"])[
        f"pipeline-{name}"].plan
    result = run_pipeline("mlp", plan.stages, plan.schedule, steps=1, warmup=0,
                          batch_size=BATCH, return_gradients=True, timeout_s=240)
    z = build("mlp", batch_size=BATCH)
    for chunk in z.args[0].chunk(MICRO):
        (z.model(chunk).square().mean() / MICRO).backward()
    want = {n: p.grad for n, p in z.model.named_parameters()}
    assert sorted(result.gradients) == sorted(want)
    for n, g in want.items():
        assert torch.allclose(result.gradients[n], g, rtol=1e-4, atol=1e-6), n


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize(("name", "ranks"), [("zb-h1", 3), ("zbv", 3), ("zb-greedy", 4)])
def test_schedule_runs_on_three_or_four_gloo_processes(mlp_graph, name, ranks):
    from trainsched.cluster import resolve_cluster
    from trainsched.runtime.pipeline import run_pipeline
    from trainsched.strategies import Options, make_plans

    options = Options(ranks=ranks, microbatches=MICRO, batch_size=BATCH)
    plan = make_plans(mlp_graph, resolve_cluster("cpu:4"), options, [f"pipeline-{name}"])[
        f"pipeline-{name}"].plan
    assert plan.schedule.num_ranks == ranks
    result = run_pipeline("mlp", plan.stages, plan.schedule, steps=1, warmup=0,
                          batch_size=BATCH, return_gradients=True, timeout_s=240)
    z = build("mlp", batch_size=BATCH)
    for chunk in z.args[0].chunk(MICRO):
        (z.model(chunk).square().mean() / MICRO).backward()
    for n, p in z.model.named_parameters():
        assert torch.allclose(result.gradients[n], p.grad, rtol=1e-4, atol=1e-6), n
