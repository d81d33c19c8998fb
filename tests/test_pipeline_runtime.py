"""The pipeline runtime: a Schedule's actions run on stages cut from the exported program.

Every gradient check compares the first step's gradients with plain-torch gradient accumulation
on the unsplit model (the batch chunked along dim 0, each chunk's mean-square loss divided by
the number of micro-batches), computed here without the runtime. Schedules run in one process
(a thread per rank) and on real gloo processes (2 or 3 ranks).
"""

from __future__ import annotations

import itertools

import pytest
import torch
from torch import nn

from trainsched.backprop.schedules import gpipe, one_f_one_b
from trainsched.backprop.stages import stage_costs_from_graph
from trainsched.capture import build, capture
from trainsched.errors import TrainschedError
from trainsched.plan import Schedule
from trainsched.runtime.pipeline import FAULT_ENV, run_local, run_pipeline
from trainsched.runtime.stage_modules import build_stages, split_microbatches

BATCH = 8
# small-cnn cut so that the first block's output (relu, read again by the residual add) crosses
# stage 1 untouched: stage 0 ends at relu, stage 1 is conv2d_1 alone.
CNN_SKIP_CUT = ["conv2d_1", "_native_batch_norm_legit_functional_1"]
SCHEDULES = {"gpipe": lambda p, m: gpipe(p, m), "1f1b": lambda p, m: one_f_one_b(p, m),
             "1f1b-split": lambda p, m: one_f_one_b(p, m, split_backward=True)}


@pytest.fixture(scope="module")
def graphs() -> dict:
    out = {}
    for name in ("mlp", "small-cnn"):
        z = build(name, batch_size=BATCH)
        out[name] = capture(z.model, z.args, example_kwargs=z.kwargs, costs="static", name=name)
    return out


def _cut(graph, num_stages: int, cut="params") -> tuple[tuple[str, ...], ...]:
    return stage_costs_from_graph(graph, num_stages, 1, cut=cut).ops


def _reference(model: nn.Module, x: torch.Tensor, m: int) -> dict[str, torch.Tensor]:
    """Gradient accumulation on the whole model: the mean square of each chunk's output / m."""
    model.train()
    for chunk in x.chunk(m):
        (model(chunk).square().mean() / m).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def _zoo_reference(name: str, m: int) -> dict[str, torch.Tensor]:
    z = build(name, batch_size=BATCH)
    return _reference(z.model, z.args[0], m)


def _assert_same(got: dict, want: dict) -> None:
    assert sorted(got) == sorted(want)
    for name in want:
        assert torch.allclose(got[name], want[name], rtol=1e-4, atol=1e-6), name


def _run_locally(name: str, stages, schedule: Schedule) -> dict[str, torch.Tensor]:
    z = build(name, batch_size=BATCH)
    micro = split_microbatches(z.args, z.kwargs, schedule.num_microbatches)
    built = build_stages(z.model, stages, *micro[0], num_microbatches=schedule.num_microbatches)
    run_local(built, schedule, micro)
    return {n: p.grad for n, p in z.model.named_parameters() if p.grad is not None}


# --- cutting ------------------------------------------------------------------------------------


def test_each_stage_receives_what_the_previous_one_sends_and_owns_its_parameters(graphs):
    z = build("mlp", batch_size=BATCH)
    stages = build_stages(z.model, _cut(graphs["mlp"], 3), z.args[:1])
    assert stages[0].input_names == ("x",)
    for before, after in itertools.pairwise(stages):
        assert after.input_names == before.output_names and len(before.output_names) == 1
    assert stages[-1].output_names == ()
    owned = [n for s in stages for n in s.parameters]
    assert sorted(owned) == sorted(n for n, _ in z.model.named_parameters())


def test_a_skip_tensor_is_passed_through_the_stage_it_skips(graphs):
    z = build("small-cnn", batch_size=BATCH)
    stages = build_stages(z.model, _cut(graphs["small-cnn"], 3, CNN_SKIP_CUT), z.args)
    assert "relu" in stages[1].input_names and "relu" in stages[1].output_names
    assert "relu" in stages[2].input_names


@pytest.mark.parametrize(("name", "p", "m", "cut"), [
    ("mlp", 2, 2, "params"), ("small-cnn", 3, 4, CNN_SKIP_CUT), ("small-cnn", 4, 2, "params")])
@pytest.mark.parametrize("kind", list(SCHEDULES))
def test_one_process_run_gives_the_gradients_of_gradient_accumulation(graphs, name, p, m, cut,
                                                                      kind):
    got = _run_locally(name, _cut(graphs[name], p, cut), SCHEDULES[kind](p, m))
    _assert_same(got, _zoo_reference(name, m))


def test_two_stages_per_rank_hand_tensors_over_in_memory(graphs):
    schedule = Schedule.from_text("0F0 0F1 2F0 2F1 2I0 2W0 2B1 0B0 0B1\n"
                                  "1F0 1F1 3F0 3F1 3B0 3B1 1I0 1I1 1W1 1W0\n")
    assert schedule.stage_to_rank == (0, 1, 0, 1)
    got = _run_locally("small-cnn", _cut(graphs["small-cnn"], 4), schedule)
    _assert_same(got, _zoo_reference("small-cnn", 2))


def test_explicit_send_and_receive_actions_are_skipped(graphs):
    schedule = Schedule.from_text("0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0RECV_B1 0B1\n"
                                  "1RECV_F0 1F0 1RECV_F1 1F1 1B0 1SEND_B0 1B1 1SEND_B1\n")
    got = _run_locally("mlp", _cut(graphs["mlp"], 2), schedule)
    _assert_same(got, _zoo_reference("mlp", 2))


class Twice(nn.Module):
    """One linear layer applied twice in a row: its parameters have two readers."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(torch.relu(self.a(x)))))


def _twice_stages() -> list[list[str]]:
    ops = [op.name for op in capture(Twice(), (torch.randn(4, 8),), costs="static").ops]
    return [ops[:-1], ops[-1:]]   # both uses of ``a`` in stage 0


def test_a_parameter_read_twice_in_one_stage_gets_its_whole_gradient_with_split_backward():
    x = torch.randn(BATCH, 8)
    torch.manual_seed(1)
    want = _reference(Twice(), x, 2)
    torch.manual_seed(1)
    model = Twice()
    micro = split_microbatches((x,), {}, 2)
    stages = build_stages(model, _twice_stages(), *micro[0], num_microbatches=2)
    run_local(stages, one_f_one_b(2, 2, split_backward=True), micro)
    _assert_same({n: p.grad for n, p in model.named_parameters()}, want)


def test_the_weight_pass_repeats_no_activation_gradient(graphs):
    z = build("mlp", batch_size=BATCH)
    (stage,) = build_stages(z.model, [[op.name for op in graphs["mlp"].ops]], z.args)
    stage.forward(0, z.args)

    def kernels(run) -> set[str]:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            run()
        return {event.name for event in prof.events()}

    input_pass = kernels(lambda: stage.backward_input(0, []))
    weight_pass = kernels(lambda: stage.backward_weight(0))
    assert "aten::threshold_backward" in input_pass      # ReLU's gradient: activations only
    assert "aten::threshold_backward" not in weight_pass
    assert all(p.grad is not None for p in z.model.parameters())


# --- bad input ----------------------------------------------------------------------------------


def _stages_error(graphs, stages) -> str:
    z = build("mlp", batch_size=BATCH)
    with pytest.raises(TrainschedError) as info:
        build_stages(z.model, stages, z.args)
    return str(info.value)


def test_an_unknown_op_name_is_refused_by_name(graphs):
    stages = [list(s) for s in _cut(graphs["mlp"], 2)]
    stages[1].append("conv2d_99")
    assert "'conv2d_99'" in _stages_error(graphs, stages)


def test_stages_that_leave_an_op_out_are_refused(graphs):
    stages = [list(s) for s in _cut(graphs["mlp"], 2)]
    dropped = stages[1].pop()
    text = _stages_error(graphs, stages)
    assert "leave 1 forward op" in text and repr(dropped) in text


def test_an_op_in_two_stages_is_refused(graphs):
    stages = [list(s) for s in _cut(graphs["mlp"], 2)]
    stages[0].append(stages[1][0])
    assert "more than one stage" in _stages_error(graphs, stages)


def test_stages_against_the_data_flow_are_refused(graphs):
    stages = list(_cut(graphs["mlp"], 2))
    assert "follow the data flow" in _stages_error(graphs, stages[::-1])


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.a(x)) @ self.a.weight


def test_a_parameter_read_in_two_stages_is_refused():
    x = torch.randn(4, 8)
    ops = [op.name for op in capture(Tied(), (x,), costs="static").ops]
    with pytest.raises(TrainschedError, match=r"'a\.weight' is read by ops in stages"):
        build_stages(Tied(), [ops[:-1], ops[-1:]], (x,))


def test_a_batch_that_does_not_split_evenly_is_refused():
    with pytest.raises(TrainschedError, match="batch size 6 is not divisible by 4"):
        split_microbatches((torch.randn(6, 3),), {}, 4)


def test_run_pipeline_checks_its_arguments_before_starting_processes(graphs):
    stages = _cut(graphs["mlp"], 2)
    with pytest.raises(TrainschedError, match="1 stage"):
        run_pipeline("mlp", stages[:1], gpipe(2, 2))
    with pytest.raises(TrainschedError, match="batch size 6 is not divisible by 4"):
        run_pipeline("mlp", stages, gpipe(2, 4), batch_size=6)
    with pytest.raises(TrainschedError, match="optimizer"):
        run_pipeline("mlp", stages, gpipe(2, 2), optimizer="lamb")


# --- real processes -----------------------------------------------------------------------------


@pytest.mark.timeout(300)
def test_two_ranks_with_split_backward_match_gradient_accumulation(graphs):
    result = run_pipeline("mlp", _cut(graphs["mlp"], 2), one_f_one_b(2, 4, split_backward=True),
                          steps=2, warmup=1, batch_size=BATCH, return_gradients=True,
                          timeout_s=240)
    want = _zoo_reference("mlp", 4)
    _assert_same(result.gradients, want)
    z = build("mlp", batch_size=BATCH)
    with torch.no_grad():
        whole_batch_loss = float(z.model(z.args[0]).square().mean())
    assert result.losses[0] == pytest.approx(whole_batch_loss, rel=1e-5)
    assert len(result.step_times_s) == 2 and len(result.losses) == 3
    assert result.p10_s <= result.median_s <= result.p90_s


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_three_ranks_run_gpipe_across_a_residual(graphs):
    result = run_pipeline("small-cnn", _cut(graphs["small-cnn"], 3, CNN_SKIP_CUT), gpipe(3, 2),
                          steps=1, warmup=0, batch_size=BATCH, optimizer="momentum",
                          return_gradients=True, timeout_s=240)
    _assert_same(result.gradients, _zoo_reference("small-cnn", 2))


@pytest.mark.timeout(300)
def test_two_ranks_holding_two_stages_each_match_gradient_accumulation(graphs):
    schedule = Schedule.from_text("0F0 0F1 2F0 2F1 2I0 2W0 2B1 0B0 0B1\n"
                                  "1F0 1F1 3F0 3F1 3B0 3B1 1I0 1I1 1W1 1W0\n")
    result = run_pipeline("small-cnn", _cut(graphs["small-cnn"], 4), schedule, steps=1,
                          warmup=0, batch_size=BATCH, return_gradients=True, timeout_s=240)
    _assert_same(result.gradients, _zoo_reference("small-cnn", 2))


@pytest.mark.timeout(300)
def test_a_rank_that_dies_fails_the_run_instead_of_hanging(graphs, monkeypatch):
    monkeypatch.setenv(FAULT_ENV, "1:1")   # rank 1 exits before its second action
    with pytest.raises(TrainschedError, match="rank 1 exited with status 3"):
        run_pipeline("mlp", _cut(graphs["mlp"], 2), gpipe(2, 2), steps=1, warmup=0,
                     batch_size=BATCH, timeout_s=240)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_worker_error_is_raised_with_its_message(graphs):
    stages = [list(s) for s in _cut(graphs["mlp"], 2)]
    stages[1].append("linear_99")
    with pytest.raises(TrainschedError, match=r"rank [01]: .*'linear_99'"):
        run_pipeline("mlp", stages, gpipe(2, 2), steps=1, warmup=0, batch_size=BATCH,
                     timeout_s=240)
