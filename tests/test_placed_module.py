"""PlacedModule on the CPU: every placement computes exactly what the unplaced model computes.

Each logical device is the CPU here, so a placement changes where the runtime *says* each op
runs, which copies it makes and in what order it launches segments; the loss, every gradient and
every BatchNorm statistic must still equal the unplaced model's bit for bit.
"""

from __future__ import annotations

import copy
import itertools
import random
from dataclasses import dataclass

import pytest
import torch
from torch import nn

from trainsched.capture import capture, zoo
from trainsched.errors import TrainschedError
from trainsched.graph import Graph
from trainsched.plan import Placement
from trainsched.runtime import PlacedModule


@dataclass
class Reference:
    loss: torch.Tensor
    grads: dict[str, torch.Tensor]
    buffers: dict[str, torch.Tensor]


@dataclass
class Case:
    name: str
    model: nn.Module
    args: tuple
    kwargs: dict
    graph: Graph
    reference: Reference


def _loss(output: object) -> torch.Tensor:
    logits = getattr(output, "logits", output)
    assert isinstance(logits, torch.Tensor)
    return logits.sum()


def _train_step(model: nn.Module, run: nn.Module, args: tuple, kwargs: dict) -> Reference:
    loss = _loss(run(*args, **kwargs))
    loss.backward()
    return Reference(loss=loss.detach(),
                     grads={n: p.grad for n, p in model.named_parameters()},
                     buffers={n: b.clone() for n, b in model.named_buffers()})


def _without_dropout(model: nn.Module) -> nn.Module:
    for m in model.modules():
        if isinstance(m, nn.Dropout):
            m.p = 0.0
    return model


def _case(name: str, model: nn.Module, args: tuple, kwargs: dict) -> Case:
    model.train()
    graph = capture(model, args, example_kwargs=kwargs, costs="static")
    ref_model = copy.deepcopy(model)
    return Case(name, model, args, kwargs, graph, _train_step(ref_model, ref_model, args, kwargs))


def _zoo_case(name: str, **kw: object) -> Case:
    z = zoo.build(name, **kw)
    return _case(name, _without_dropout(z.model), z.args, z.kwargs)


@pytest.fixture(scope="module")
def mlp() -> Case:
    return _zoo_case("mlp", batch_size=4)


@pytest.fixture(scope="module")
def cnn() -> Case:
    return _zoo_case("small-cnn", batch_size=4)


@pytest.fixture(scope="module")
def gpt() -> Case:
    return _zoo_case("tiny-gpt2", batch_size=2, seq_len=16)


@pytest.fixture(scope="module")
def resnet18() -> Case:
    import torchvision

    torch.manual_seed(0)
    return _case("resnet18", torchvision.models.resnet18(weights=None),
                 (torch.randn(2, 3, 64, 64),), {})


# --- placements ---------------------------------------------------------------------------------


def _with_groups(graph: Graph, device_of: dict[str, int]) -> dict[str, int]:
    """Every op of a co-location group on the device of the group's first op."""
    first: dict[str, int] = {}
    out = {}
    for name in graph.topological_order():
        group = graph.op(name).group
        out[name] = first.setdefault(group, device_of[name]) if group else device_of[name]
    return out


def round_robin(graph: Graph, n: int) -> Placement:
    order = graph.topological_order()
    return Placement(device_of=_with_groups(graph, {v: i % n for i, v in enumerate(order)}),
                     num_devices=n)


def halves(graph: Graph) -> Placement:
    order = graph.topological_order()
    half = len(order) // 2
    return Placement(device_of=_with_groups(graph, {v: int(i >= half) for i, v in
                                                    enumerate(order)}), num_devices=2)


def random_placement(graph: Graph, n: int, seed: int) -> Placement:
    rng = random.Random(seed)
    return Placement(device_of=_with_groups(graph, {v: rng.randrange(n) for v in
                                                    graph.topological_order()}), num_devices=n)


PLACEMENTS = {
    "single": lambda g: Placement.single(g),
    "round-robin-2": lambda g: round_robin(g, 2),
    "round-robin-4": lambda g: round_robin(g, 4),
    "halves": halves,
    "random-3": lambda g: random_placement(g, 3, seed=1),
}


def _expected_transfers(graph: Graph, placement: Placement) -> int:
    """Distinct (tensor, destination device) pairs whose edge crosses devices."""
    dev = placement.device_of
    return len({(e.tensor or e.src, dev[e.dst]) for e in graph.edges if dev[e.src] != dev[e.dst]})


def _check(case: Case, placement: Placement, **kw: object) -> PlacedModule:
    """Run one training step placed; assert loss, gradients and buffers equal the reference."""
    model = copy.deepcopy(case.model)
    placed = PlacedModule(model, placement, example_args=case.args, example_kwargs=case.kwargs,
                          **kw)
    got = _train_step(model, placed, case.args, case.kwargs)
    ref = case.reference
    assert torch.equal(got.loss, ref.loss), (got.loss, ref.loss)
    assert got.grads.keys() == ref.grads.keys()
    for name, grad in ref.grads.items():
        assert got.grads[name] is not None, name
        assert torch.equal(got.grads[name], grad), name
    for name, buffer in ref.buffers.items():
        assert torch.equal(got.buffers[name], buffer), name
    return placed


# --- equality with the unplaced model -------------------------------------------------------


@pytest.mark.parametrize(("case_name", "kind"), [
    *((c, k) for c in ("mlp", "cnn") for k in PLACEMENTS),
    *(("gpt", k) for k in ("single", "round-robin-4", "random-3"))])
def test_placed_step_equals_unplaced(case_name, kind, request):
    case = request.getfixturevalue(case_name)
    placement = PLACEMENTS[kind](case.graph)
    placed = _check(case, placement)
    assert placed.last_step is not None
    assert placed.last_step.transfers == _expected_transfers(case.graph, placement)
    assert placed.summary()["transfers"] == placed.last_step.transfers
    if kind == "single":
        assert placed.last_step.copies == placed.last_step.bytes_moved == 0
    else:
        assert placed.last_step.transfers > 0 and placed.last_step.bytes_moved > 0


@pytest.mark.slow
def test_resnet18_placed_step_equals_unplaced(resnet18):
    placement = random_placement(resnet18.graph, 4, seed=2)
    placed = _check(resnet18, placement)
    assert placed.last_step.transfers == _expected_transfers(resnet18.graph, placement)


@pytest.mark.parametrize(("case_name", "depth"), [("cnn", None), ("gpt", 3)])
def test_module_granularity_placement(case_name, depth, request):
    case = request.getfixturevalue(case_name)
    graph = capture(case.model, case.args, example_kwargs=case.kwargs, costs="static",
                    granularity="module", module_depth=depth)
    placement = round_robin(graph, 3)
    placed = _check(case, placement, module_depth=depth)
    assert placed.granularity == "module"
    assert placed.last_step.transfers == _expected_transfers(graph, placement) > 0
    # every op of one module call is on that module's device
    for coarse in graph.ops:
        for member in coarse.members or (coarse.name,):
            assert placed.device_of[member] == placement.device_of[coarse.name]
    if depth is not None:
        assert "transformer.h.0" in placement.device_of  # a block, not its layers
        with pytest.raises(TrainschedError, match="module granularity, module depth 2"):
            PlacedModule(copy.deepcopy(case.model), placement, example_args=case.args,
                         example_kwargs=case.kwargs, module_depth=2)


def test_real_copies_between_logical_devices(mlp, cnn):
    """With copy_same_device every transfer is a real differentiable copy; these models read no
    tensor three times, so autograd sums nothing in a new order and the result stays exact."""
    for case in (mlp, cnn):
        placement = round_robin(case.graph, 3)
        placed = _check(case, placement, copy_same_device=True)
        assert placed.last_step.copies > 0


def test_real_copies_change_only_summation_order(gpt):
    """GPT-2's GELU reads one tensor three times; a copy node changes the order autograd sums
    those gradients, so gradients agree to float32 rounding, not bit for bit."""
    model = copy.deepcopy(gpt.model)
    placed = PlacedModule(model, round_robin(gpt.graph, 3), example_args=gpt.args,
                          example_kwargs=gpt.kwargs, copy_same_device=True)
    got = _train_step(model, placed, gpt.args, gpt.kwargs)
    assert torch.equal(got.loss, gpt.reference.loss)  # the forward has no sums of copies
    for name, grad in gpt.reference.grads.items():
        torch.testing.assert_close(got.grads[name], grad, rtol=1e-5, atol=1e-5 * grad.abs().max())


def test_tied_weight_split_across_devices(gpt):
    """lm_head.weight is tied to the token embedding; placed apart, one device keeps the master
    and the other reads a copy each step; the gradient still sums both uses exactly."""
    order = gpt.graph.topological_order()
    device_of = {name: 0 if i < len(order) // 2 else 1 for i, name in enumerate(order)}
    tied = [op.name for op in gpt.graph.ops if op.group]
    assert len(tied) == 2
    device_of[tied[0]], device_of[tied[1]] = 0, 1
    placed = _check(gpt, Placement(device_of=device_of, num_devices=2), copy_same_device=True)
    assert placed.last_step.state_copies >= 1
    assert placed.state_device["lm_head.weight"] == 0


def test_dropout_masks_do_not_depend_on_the_placement():
    """Ops launch in program order whatever the placement, so random ops draw the same numbers."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Dropout(0.5), nn.Linear(64, 64),
                          nn.Dropout(0.3), nn.Linear(64, 4)).train()
    args = (torch.randn(8, 32),)
    graph = capture(model, args, costs="static")
    assert sum(op.target.startswith("aten.native_dropout") for op in graph.ops) == 2
    results = []
    for placement in (Placement.single(graph), round_robin(graph, 3)):
        copied = copy.deepcopy(model)
        placed = PlacedModule(copied, placement, example_args=args)
        torch.manual_seed(123)
        results.append(_train_step(copied, placed, args, {}))
    assert torch.equal(results[0].loss, results[1].loss)
    for name in results[0].grads:
        assert torch.equal(results[0].grads[name], results[1].grads[name]), name


class _Scaled(nn.Module):
    """An int argument (export bakes it in) and a non-persistent buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 2)
        self.register_buffer("shift", torch.full((8,), 0.5), persistent=False)

    def forward(self, x: torch.Tensor, scale: int = 2) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)) * scale + self.shift)


def test_non_tensor_argument_and_non_persistent_buffer():
    torch.manual_seed(0)
    case = _case("scaled", _Scaled(), (torch.randn(4, 8), 3), {})
    assert "scale" not in case.graph.topological_order()
    placed = _check(case, round_robin(case.graph, 2))
    with pytest.raises(TrainschedError, match="'scale' is 4, but the model was exported with 3"):
        placed(case.args[0], 4)


@pytest.fixture(scope="module")
def resnet50() -> Case:
    import torchvision

    torch.manual_seed(0)
    return _case("resnet50", torchvision.models.resnet50(weights=None),
                 (torch.randn(2, 3, 64, 64),), {})


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(PLACEMENTS))
def test_resnet50_placed_step_equals_unplaced(resnet50, kind):
    placement = PLACEMENTS[kind](resnet50.graph)
    placed = _check(resnet50, placement)
    assert placed.last_step.transfers == _expected_transfers(resnet50.graph, placement)


# --- training with an optimizer -----------------------------------------------------------------


def test_parameters_are_the_models_and_an_optimizer_trains_them(cnn):
    model, ref = copy.deepcopy(cnn.model), copy.deepcopy(cnn.model)
    placed = PlacedModule(model, random_placement(cnn.graph, 3, seed=7),
                          example_args=cnn.args)
    assert [id(p) for p in placed.parameters()] == [id(p) for p in model.parameters()]
    assert [n for n, _ in placed.named_parameters()] == [
        f"module.{n}" for n, _ in model.named_parameters()]
    opt = torch.optim.SGD(placed.parameters(), lr=0.1, momentum=0.9)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    for _ in range(3):
        for o, m in ((opt, placed), (ref_opt, ref)):
            o.zero_grad()
            _loss(m(*cnn.args)).backward()
            o.step()
    for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        assert torch.equal(p, q), name
    for (name, b), c in zip(model.named_buffers(), ref.buffers(), strict=True):
        assert torch.equal(b, c), name
    assert int(model.bn1.num_batches_tracked) == 3


# --- structure ----------------------------------------------------------------------------------


def test_segments_are_maximal_runs_in_program_order(cnn, mlp):
    steps = [n for n in cnn.graph.topological_order() if cnn.graph.op(n).target != "input"]
    for placement in (random_placement(cnn.graph, 2, seed=3), round_robin(cnn.graph, 2),
                      Placement.single(cnn.graph)):
        placed = PlacedModule(copy.deepcopy(cnn.model), placement, example_args=cnn.args)
        segments = placed.segments
        assert [op for s in segments for op in s.ops] == steps
        assert all(a.device != b.device for a, b in itertools.pairwise(segments))
        assert all(placement.device_of[op] == s.device for s in segments for op in s.ops)
        assert [s.index for s in segments] == list(range(len(segments)))
    placed = PlacedModule(copy.deepcopy(mlp.model), halves(mlp.graph), example_args=mlp.args)
    assert [s.device for s in placed.segments] == [0, 1]


def test_transfers_leave_after_their_producer(cnn):
    placement = round_robin(cnn.graph, 3)
    placed = PlacedModule(copy.deepcopy(cnn.model), placement, example_args=cnn.args)
    segment_of = {op: s.index for s in placed.segments for op in s.ops}
    for t in placed.transfers:
        assert t.src != t.dst
        if not t.state:
            assert t.after == segment_of.get(t.tensor, -1)
            assert t.src == placement.device_of[t.tensor]
    # the copies run once per step and count what the plan lists
    placed(*cnn.args)
    summary = placed.summary()
    assert (summary["copies"], summary["bytes_moved"]) == (placed.last_step.copies,
                                                           placed.last_step.bytes_moved)


def test_bytes_moved_are_the_tensors_sizes(mlp):
    placement = round_robin(mlp.graph, 2)
    placed = PlacedModule(copy.deepcopy(mlp.model), placement, example_args=mlp.args)
    placed(*mlp.args)
    dev = placement.device_of
    crossing = {(e.tensor or e.src, dev[e.dst]) for e in mlp.graph.edges
                if dev[e.src] != dev[e.dst]}
    assert placed.last_step.bytes_moved == sum(mlp.graph.op(t).output_bytes for t, _ in crossing)


def test_measure_step_on_cpu(mlp):
    placed = PlacedModule(copy.deepcopy(mlp.model), round_robin(mlp.graph, 2),
                          example_args=mlp.args)
    opt = torch.optim.SGD(placed.parameters(), lr=0.01)
    timing = placed.measure_step(*mlp.args, optimizer=opt, repeats=3, warmup=1)
    assert timing.device == "cpu" and len(timing.step_s) == 3
    assert all(t > 0 for t in timing.step_s) and timing.median_step_s > 0
    assert timing.peak_memory_bytes is None and timing.forward_busy_s is None
    assert timing.stats == placed.last_step
    assert timing.to_dict()["stats"]["transfers"] == placed.last_step.transfers


# --- user errors --------------------------------------------------------------------------------


def test_missing_op_is_named(mlp):
    device_of = dict(Placement.single(mlp.graph).device_of)
    dropped = mlp.graph.topological_order()[3]
    del device_of[dropped]
    with pytest.raises(TrainschedError, match=rf"no device: '{dropped}'.*same example inputs"):
        PlacedModule(copy.deepcopy(mlp.model), device_of, example_args=mlp.args)


def test_unknown_op_is_named(mlp):
    device_of = dict(Placement.single(mlp.graph).device_of) | {"not_an_op": 0}
    with pytest.raises(TrainschedError, match=r"not in the model: 'not_an_op'.*capture"):
        PlacedModule(copy.deepcopy(mlp.model), device_of, example_args=mlp.args)


def test_placement_of_another_batch_shape_is_rejected(cnn):
    other = capture(cnn.model, (torch.randn(4, 3, 32, 32),), costs="static")
    placement = Placement.single(other)
    placed = PlacedModule(copy.deepcopy(cnn.model), placement, example_args=cnn.args)
    with pytest.raises(TrainschedError, match=r"exported with \(4, 3, 32, 32\)"):
        placed(torch.randn(2, 3, 32, 32))


def test_device_index_beyond_devices(mlp):
    placement = round_robin(mlp.graph, 3)
    with pytest.raises(TrainschedError, match=r"on device 2, but 2 device\(s\) were given"):
        PlacedModule(copy.deepcopy(mlp.model), placement, ["cpu", "cpu"], example_args=mlp.args)


def test_other_user_errors(mlp):
    placement = Placement.single(mlp.graph)
    with pytest.raises(TrainschedError, match="comm mode"):
        PlacedModule(copy.deepcopy(mlp.model), placement, example_args=mlp.args, comm="fast")
    with pytest.raises(TrainschedError, match="granularity"):
        PlacedModule(copy.deepcopy(mlp.model), placement, example_args=mlp.args,
                     granularity="layer")
    with pytest.raises(TrainschedError, match="all CPUs or all CUDA"):
        PlacedModule(copy.deepcopy(mlp.model), placement, ["meta"], example_args=mlp.args)
    placed = PlacedModule(copy.deepcopy(mlp.model), placement, example_args=mlp.args)
    with pytest.raises(TrainschedError, match="structured unlike"):
        placed(*mlp.args, mlp.args[0])
    placed.eval()
    with pytest.raises(TrainschedError, match="training-mode program"):
        placed(*mlp.args)


def test_runtime_package_import_stays_torch_free():
    """``trainsched.runtime`` exports PlacedModule lazily: importing the package (as the CLI
    does for calibrate) must not import torch."""
    import subprocess
    import sys

    code = ("import sys\nsys.modules['torch'] = None\nimport trainsched.runtime as r\n"
            "assert 'trainsched.runtime.placed' not in sys.modules\nprint(r.__all__)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    assert "PlacedModule" in result.stdout


# --- the order ----------------------------------------------------------------------------------


class TwoBranch(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a(x).relu() + self.b(x).tanh()


@pytest.fixture(scope="module")
def two_branch() -> Case:
    torch.manual_seed(0)
    return _case("two-branch", TwoBranch(), (torch.randn(4, 8),), {})


def test_runs_the_stored_order_not_program_order(two_branch):
    graph = two_branch.graph
    program = [n for n in graph.topological_order() if graph.op(n).target != "input"]
    inputs = [n for n in graph.topological_order() if graph.op(n).target == "input"]
    # program order runs branch a (linear, relu) first; the stored order runs branch b first
    branch_a = [n for n in program if graph.op(n).module_path.startswith("a")]
    branch_b = [n for n in program if graph.op(n).module_path.startswith("b")]
    rest = [n for n in program if n not in branch_a and n not in branch_b]
    assert branch_a and branch_b and rest and program.index(branch_a[0]) < program.index(
        branch_b[0])
    order = [*inputs, *branch_b, *branch_a, *rest]
    device_of = {n: 0 for n in graph.topological_order()} | dict.fromkeys(branch_b, 1)
    placement = Placement(device_of=device_of, num_devices=2, order=order)
    placement.validate(graph)
    placed = _check(two_branch, placement)
    assert placed.last_order == (*branch_b, *branch_a, *rest)
    assert [s.ops for s in placed.segments] == [tuple(branch_b), (*branch_a, *rest)]
    assert [s.device for s in placed.segments] == [1, 0]
    # without an order: program order, as before
    plain = _check(two_branch, Placement(device_of=device_of, num_devices=2))
    assert plain.last_order == tuple(program)


def test_runs_the_order_a_placer_stored(cnn):
    from trainsched.cluster import cluster_from_flags
    from trainsched.placement import place

    cluster = cluster_from_flags(devices=3, memory="1TB", bandwidth="1GB/s", latency="0s")
    placement = place(cnn.graph, cluster, "m-etf", fusion=False, coplacement=False).placement
    assert placement.order is not None
    placed = _check(cnn, placement)
    steps = set(placed.device_of) & {n for n in cnn.graph.topological_order()
                                     if cnn.graph.op(n).target != "input"}
    assert placed.last_order == tuple(n for n in placement.order if n in steps)
    for device, ops in enumerate(placement.device_orders()):
        ran = [n for n in placed.last_order if placed.device_of[n] == device]
        assert ran == [n for n in ops if n in steps]


def test_an_order_against_the_dependencies_is_refused(two_branch):
    graph = two_branch.graph
    order = list(reversed(graph.topological_order()))
    placement = Placement(device_of=dict.fromkeys(order, 0), num_devices=1, order=order)
    with pytest.raises(TrainschedError, match=r"order runs .* before"):
        PlacedModule(copy.deepcopy(two_branch.model), placement, example_args=two_branch.args)
