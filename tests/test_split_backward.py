"""Split backward (``trainsched.runtime.split``): gradients equal standard autograd for every
supported layer kind and both backends, in any dW order; tied weights; micro-batches; the dX
phase runs no weight-gradient kernel; bytes held by hand count; refusals."""

from __future__ import annotations

import copy
import subprocess
import sys
import textwrap

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from trainsched.backprop.deferral import PendingW, memory_capped, reverse_first_k
from trainsched.errors import TrainschedError
from trainsched.runtime.launch import worker_env
from trainsched.runtime.split import split_backward

F64 = torch.float64

# (name, module factory, input factory); every input but the Embedding's requires grad
LAYERS = {
    "linear": (lambda: nn.Linear(6, 5), lambda g: torch.randn(4, 6, generator=g)),
    "linear-3d-input": (lambda: nn.Linear(6, 5), lambda g: torch.randn(2, 3, 6, generator=g)),
    "linear-no-bias": (lambda: nn.Linear(6, 5, bias=False),
                       lambda g: torch.randn(4, 6, generator=g)),
    "conv1d-stride-padding": (lambda: nn.Conv1d(3, 4, 3, stride=2, padding=1),
                              lambda g: torch.randn(2, 3, 9, generator=g)),
    "conv1d-same-dilated": (lambda: nn.Conv1d(3, 4, 4, padding="same", dilation=2),
                            lambda g: torch.randn(2, 3, 9, generator=g)),
    "conv2d-grouped-no-bias": (lambda: nn.Conv2d(4, 6, 3, groups=2, bias=False),
                               lambda g: torch.randn(2, 4, 7, 7, generator=g)),
    "conv2d-depthwise": (lambda: nn.Conv2d(4, 4, 3, groups=4, padding=1),
                         lambda g: torch.randn(2, 4, 6, 6, generator=g)),
    "conv2d-same-even-kernel": (lambda: nn.Conv2d(3, 2, (2, 4), padding="same"),
                                lambda g: torch.randn(2, 3, 5, 6, generator=g)),
    "conv2d-valid-dilation-stride": (lambda: nn.Conv2d(3, 2, 3, stride=(1, 2), dilation=2,
                                                       padding="valid"),
                                     lambda g: torch.randn(2, 3, 9, 9, generator=g)),
    "conv2d-reflect": (lambda: nn.Conv2d(3, 2, 3, padding=1, padding_mode="reflect"),
                       lambda g: torch.randn(2, 3, 5, 5, generator=g)),
    "conv2d-unbatched": (lambda: nn.Conv2d(3, 2, 3), lambda g: torch.randn(3, 5, 5, generator=g)),
    "conv3d-circular": (lambda: nn.Conv3d(2, 3, 2, stride=2, padding=1, padding_mode="circular"),
                        lambda g: torch.randn(2, 2, 4, 4, 4, generator=g)),
    "embedding": (lambda: nn.Embedding(7, 5, padding_idx=2),
                  lambda g: torch.randint(0, 7, (3, 4), generator=g)),
    "embedding-scaled": (lambda: nn.Embedding(7, 5, scale_grad_by_freq=True),
                         lambda g: torch.tensor([[1, 1, 3], [1, 6, 0]])),
    "embedding-max-norm": (lambda: nn.Embedding(7, 5, max_norm=0.5),
                           lambda g: torch.tensor([[1, 1, 3], [4, 6, 0]])),
}
TOLERANCE = {torch.float64: {"rtol": 0, "atol": 1e-12},
             torch.float32: {"rtol": 1e-5, "atol": 1e-6}}


def reference_and_split(layer: str, dtype: torch.dtype, backend: str, order="fifo"):
    make, data = LAYERS[layer]
    torch.manual_seed(0)
    ref = make().to(dtype)
    model = copy.deepcopy(ref)
    x = data(torch.Generator().manual_seed(1))
    if x.is_floating_point():
        x = x.to(dtype).requires_grad_(True)
    return ref, model, split_backward(model, backend=backend, order=order), x


def loss_of(y: torch.Tensor) -> torch.Tensor:
    weights = torch.linspace(-1, 2, y.numel(), dtype=y.dtype).reshape(y.shape)
    return (y * weights).sum()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["fp64", "fp32"])
@pytest.mark.parametrize("backend", ["function", "graph"])
@pytest.mark.parametrize("layer", list(LAYERS))
def test_gradients_equal_autograd(layer, backend, dtype):
    ref, model, split, x = reference_and_split(layer, dtype, backend)
    x_ref = x.detach().clone().requires_grad_(x.requires_grad)
    loss_of(ref(x_ref)).backward()
    loss_of(split(x)).backward()
    assert all(p.grad is None for p in model.parameters())  # fifo: dW waits for the drain
    split.drain()
    tol = TOLERANCE[dtype]
    for (name, p_ref), p in zip(ref.named_parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(p.grad, p_ref.grad, **tol, msg=name)
    if x.requires_grad:
        torch.testing.assert_close(x.grad, x_ref.grad, **tol)


def test_the_layers_found_and_their_backends():
    model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.Flatten(),
                          nn.Sequential(nn.Linear(8, 4), nn.PReLU()),
                          nn.Embedding(3, 3, sparse=True))
    split = split_backward(model)
    assert [(a.path, a.kind, a.backend) for a in split.layers] == [
        ("0", "Conv2d", "function"), ("3.0", "Linear", "function"), ("3.1", "PReLU", "graph"),
        ("4", "Embedding", "graph")]


class Mlp(nn.Module):
    """Four layers of three kinds, a norm that stays whole and a graph-split one."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(2, 3, 3, padding=1)
        self.fc1 = nn.Linear(15, 8)
        self.norm = nn.LayerNorm(8)
        self.act = nn.PReLU(8)
        self.fc2 = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.tanh(self.conv(x)).flatten(1)
        return self.fc2(self.act(self.norm(self.fc1(y))))


class Permuted:
    """A dW order that runs everything at drain, in a given permutation of arrival."""

    name = "permuted"

    def __init__(self, perm: list[int]) -> None:
        self.perm = perm

    def run_now(self, pending: list[PendingW]) -> tuple[int, ...]:
        return ()

    def at_backward_end(self, pending: list[PendingW]) -> tuple[int, ...]:
        return ()

    def drain(self, pending: list[PendingW]) -> tuple[int, ...]:
        return tuple(self.perm)


@settings(max_examples=25, deadline=None)
@given(perm=st.permutations(range(8)), backend=st.sampled_from(["auto", "graph"]))
def test_any_dw_order_gives_the_autograd_gradients(perm, backend):
    torch.manual_seed(0)
    ref = Mlp().double()
    model = copy.deepcopy(ref)
    split = split_backward(model, backend=backend, order=Permuted(perm))
    for mb in range(2):  # two micro-batches of four layers: eight entries
        x = torch.randn(3, 2, 5, dtype=F64, generator=torch.Generator().manual_seed(mb))
        loss_of(ref(x)).backward()
        loss_of(split(x)).backward()
    assert sorted((e.layer, e.microbatch) for e in split.queue.pending) == [
        (a, b) for a in range(4) for b in range(2)]
    split.drain()
    for (name, p_ref), p in zip(ref.named_parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(p.grad, p_ref.grad, rtol=0, atol=1e-12, msg=name)


class TiedLm(nn.Module):
    """An embedding tied to the output projection."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(11, 6)
        self.mix = nn.Linear(6, 6)
        self.out = nn.Linear(6, 11, bias=False)
        self.out.weight = self.emb.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.mix(self.emb(idx))))


class SelfTied(nn.Module):
    """One weight used twice inside one graph-split module (nested join points)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(5, 5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x @ self.w.t()) @ self.w.t()


@pytest.mark.parametrize("backend", ["function", "graph"])
def test_tied_embedding_and_output_weight_counts_each_use_once(backend):
    torch.manual_seed(0)
    ref = TiedLm().double()
    model = copy.deepcopy(ref)
    assert model.out.weight is model.emb.weight
    split = split_backward(model, backend=backend, order="fifo")
    idx = torch.tensor([[1, 4, 4, 9], [0, 2, 10, 4]])
    loss_of(ref(idx)).backward()
    loss_of(split(idx)).backward()
    split.drain()
    for (name, p_ref), p in zip(ref.named_parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(p.grad, p_ref.grad, rtol=0, atol=1e-12, msg=name)


def test_a_weight_used_twice_inside_one_graph_split_module():
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(5, 5), SelfTied()).double()
    model = copy.deepcopy(ref)
    split = split_backward(model, order="fifo")
    x = torch.randn(4, 5, dtype=F64)
    loss_of(ref(x)).backward()
    loss_of(split(x)).backward()
    split.drain()
    torch.testing.assert_close(model[1].w.grad, ref[1].w.grad, rtol=0, atol=1e-12)


def test_micro_batches_accumulate_into_one_gradient():
    torch.manual_seed(0)
    ref = Mlp().double()
    model = copy.deepcopy(ref)
    split = split_backward(model, order="fifo")
    for mb in range(3):
        x = torch.randn(2, 2, 5, dtype=F64, generator=torch.Generator().manual_seed(mb))
        loss_of(ref(x)).backward()
        loss_of(split(x)).backward()
    assert [e.microbatch for e in split.queue.pending if e.layer == 0] == [0, 1, 2]
    split.drain()
    for (name, p_ref), p in zip(ref.named_parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(p.grad, p_ref.grad, rtol=0, atol=1e-12, msg=name)


def test_standard_order_needs_no_drain_and_reverse_first_k_runs_at_the_end_of_backward():
    torch.manual_seed(0)
    ref = Mlp().double()
    x = torch.randn(2, 2, 5, dtype=F64)
    loss_of(ref(x)).backward()
    for order in ("standard", "reverse_first_k"):
        model = copy.deepcopy(ref)
        model.zero_grad(set_to_none=True)
        # k = 4: every layer's dW, the graph-split PReLU's too, after the last dX
        split = split_backward(model, order=order if order == "standard"
                               else reverse_first_k(4))
        loss_of(split(x)).backward()
        assert len(split.queue) == 0 and split.queue.ran_count == 4
        for (name, p_ref), p in zip(ref.named_parameters(), model.parameters(), strict=True):
            torch.testing.assert_close(p.grad, p_ref.grad, rtol=0, atol=1e-12, msg=name)


class Counter(TorchDispatchMode):
    """Counts matrix products and convolution backwards (with their output masks)."""

    def __init__(self) -> None:
        super().__init__()
        self.mm = 0
        self.conv_masks: list[tuple[bool, ...]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in ("mm", "addmm", "bmm"):
            self.mm += 1
        elif name == "convolution_backward":
            self.conv_masks.append(tuple(args[10]))
        return func(*args, **(kwargs or {}))


class ConvLinear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(2, 3, 3)
        self.conv2 = nn.Conv2d(3, 3, 3)
        self.fc1 = nn.Linear(12, 6)
        self.fc2 = nn.Linear(6, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.conv2(torch.relu(self.conv1(x)))).flatten(1)
        return self.fc2(torch.relu(self.fc1(y)))


@pytest.mark.parametrize("backend", ["function", "graph"])
def test_the_dx_phase_runs_no_weight_gradient_kernel(backend):
    torch.manual_seed(0)
    model = ConvLinear()
    split = split_backward(model, backend=backend, order="fifo")
    x = torch.randn(2, 2, 6, 6)  # needs no gradient: conv1 has no dX
    loss = loss_of(split(x))
    with Counter() as dx_phase:
        loss.backward()
    with Counter() as dw_phase:
        split.drain()
    # dX: one product per linear layer (gy @ W), conv2's input gradient only
    assert dx_phase.mm == 2
    assert dx_phase.conv_masks == [(True, False, False)]
    # dW: one product per linear layer, both convs' weight and bias only
    assert dw_phase.mm == 2
    assert sorted(dw_phase.conv_masks) == [(False, True, True), (False, True, True)]


def test_stock_autograd_computes_weight_kernels_in_backward():
    """The counter sees weight kernels where they are (so the test above can fail)."""
    torch.manual_seed(0)
    model = ConvLinear()
    loss = loss_of(model(torch.randn(2, 2, 6, 6)))
    with Counter() as phase:
        loss.backward()
    assert phase.mm == 4
    assert sorted(phase.conv_masks) == [(False, True, True), (True, True, True)]


def test_held_bytes_equal_a_hand_count_with_a_shared_input_counted_once():
    torch.manual_seed(0)

    class TwoHeads(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q = nn.Linear(8, 3)
            self.k = nn.Linear(8, 5)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.cat([self.q(x), self.k(x)], dim=1)

    split = split_backward(TwoHeads().double(), order="fifo")
    x = torch.randn(4, 8, dtype=F64, requires_grad=True)
    loss_of(split(x)).backward()
    # x: 4*8 doubles once (both heads read it); gy of q: 4*3, gy of k: 4*5 (slices of cat's
    # backward are views of one 4*8 gradient: one storage)
    assert split.queue.held_bytes == 8 * (4 * 8 + 4 * 8)
    sizes = sorted(e.size_bytes for e in split.queue.pending)
    assert sizes == [8 * 64, 8 * 64]
    split.drain()
    assert split.queue.held_bytes == 0


@pytest.mark.parametrize("backend", ["function", "graph"])
def test_held_bytes_of_a_two_layer_mlp(backend):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 6), nn.Tanh(), nn.Linear(6, 4)).double()
    split = split_backward(model, backend=backend, order="fifo")
    x = torch.randn(5, 8, dtype=F64)
    loss_of(split(x)).backward()
    # layer 0: x (5*8) and its gy (5*6); layer 1: tanh's output (5*6) and gy (5*4)
    assert split.queue.held_bytes == 8 * (5 * 8 + 5 * 6 + 5 * 6 + 5 * 4)
    assert split.queue.peak_held_bytes == split.queue.held_bytes


def test_memory_capped_order_keeps_held_bytes_under_the_cap():
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(8, 6), nn.Tanh(), nn.Linear(6, 4)).double()
    model = copy.deepcopy(ref)
    split = split_backward(model, order=memory_capped(8 * 80))
    x = torch.randn(5, 8, dtype=F64)
    loss_of(ref(x)).backward()
    loss_of(split(x)).backward()
    # layer 1 (50 doubles) fits the 80; with layer 0 (70 more) the oldest, layer 1, runs
    assert [e.layer for e in split.queue.pending] == [0]
    assert split.queue.peak_held_bytes == 8 * 70
    split.drain()
    torch.testing.assert_close(model[0].weight.grad, ref[0].weight.grad, rtol=0, atol=1e-12)


# -- refusals ------------------------------------------------------------------------------------


def test_function_backend_names_a_module_it_cannot_split():
    model = nn.Sequential(nn.Linear(3, 3), nn.PReLU())
    with pytest.raises(TrainschedError, match=r"module '1' \(PReLU\) owns parameters .* "
                                              r"backend='auto'"):
        split_backward(model, backend="function")


def test_compiled_modules_are_refused():
    with pytest.raises(TrainschedError, match=r"module '0' \(OptimizedModule\) is "
                                              r"torch.compile'd"):
        split_backward(nn.Sequential(torch.compile(nn.Linear(3, 3))))
    inplace = nn.Linear(3, 3)
    inplace.compile()
    with pytest.raises(TrainschedError, match=r"'<root>' \(Linear\) is torch.compile'd"):
        split_backward(inplace)


def test_graph_backend_refuses_an_output_it_cannot_carry():
    class Odd(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.ones(2))

        def forward(self, x: torch.Tensor) -> object:
            return {"y": x * self.w, "extra": object()}

    split = split_backward(nn.Sequential(Odd()))
    with pytest.raises(TrainschedError, match=r"module '0' \(Odd\) returns a object"):
        split(torch.ones(2))


def test_drain_inside_a_backward_pass_is_refused():
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    split = split_backward(model, order="fifo")
    # layer 1's dW is queued when the gradient reaches layer 0's output
    def hook(module: nn.Module, args: tuple, out: torch.Tensor) -> None:
        out.register_hook(lambda g: split.drain())

    model[0].register_forward_hook(hook)
    with pytest.raises(TrainschedError, match="not inside one"):
        split(torch.ones(1, 2)).sum().backward()


def test_unsplit_restores_the_stock_forward():
    model = nn.Linear(2, 2)
    split = split_backward(model, order="fifo")
    split(torch.ones(1, 2)).sum().backward()
    assert model.weight.grad is None
    assert split.unsplit() is model
    assert model.weight.grad is not None  # unsplit drains
    model.zero_grad()
    model(torch.ones(1, 2)).sum().backward()
    assert model.weight.grad.tolist() == [[1.0, 1.0], [1.0, 1.0]]


DDP_SCRIPT = textwrap.dedent("""
    import torch, torch.distributed as dist
    from torch import nn
    from trainsched.errors import TrainschedError
    from trainsched.runtime.launch import free_port
    from trainsched.runtime.split import split_backward
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0,
                            world_size=1)
    split = split_backward(nn.Sequential(nn.Linear(4, 4)))
    for target in (split, split.module):
        try:
            nn.parallel.DistributedDataParallel(target)
            print("accepted")
        except TrainschedError as exc:
            print("refused:", exc)
    nn.parallel.DistributedDataParallel(split.unsplit())
    print("unsplit accepted")
    dist.destroy_process_group()
""")


def test_stock_ddp_refuses_a_split_model_in_a_real_gloo_group():
    result = subprocess.run([sys.executable, "-c", DDP_SCRIPT], capture_output=True, text=True,
                            timeout=120, env=worker_env())
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 3
    for line in lines[:2]:
        assert line.startswith("refused: this model's backward is split")
        assert "ScheduledDataParallel" in line
    assert lines[2] == "unsplit accepted"


@pytest.mark.parametrize(("name", "options"), [
    ("tiny-gpt2", {"batch_size": 2, "seq_len": 8}),  # transformers: Conv1D, tied lm_head
    ("mobilenet_v3_large", {"batch_size": 2, "image_size": 32}),  # depthwise convs, BN
])
def test_zoo_models_split_to_the_autograd_gradients(name, options):
    from trainsched.capture.zoo import build

    zoo = build(name, **options)
    ref = zoo.model.double().train()
    model = copy.deepcopy(ref)
    args = tuple(a.double() if a.is_floating_point() else a for a in zoo.args)

    def loss(out) -> torch.Tensor:
        logits = out if isinstance(out, torch.Tensor) else out.logits
        return loss_of(logits)

    split = split_backward(model, order="fifo")
    for net in (ref, split):
        torch.manual_seed(5)  # the same dropout masks
        loss(net(*args, **zoo.kwargs)).backward()
    assert len(split.queue) == len(split.layers)
    split.drain()
    for (n, p_ref), p in zip(ref.named_parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(p.grad, p_ref.grad, rtol=0, atol=1e-12, msg=n)


def test_graph_backend_refuses_a_gradient_hidden_in_a_container_argument():
    class Pair(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.ones(2))

        def forward(self, pair: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
            return pair[0] * self.w + pair[1]

    split = split_backward(nn.Sequential(Pair()))
    x = torch.ones(2, requires_grad=True)
    with pytest.raises(TrainschedError, match=r"module '0' \(Pair\) takes a tensor that "
                                              r"requires a gradient inside a container"):
        split((x, x))
    split((torch.ones(2), torch.ones(2))).sum().backward()  # no gradient inside: fine
    assert split.module[0].w.grad.tolist() == [1.0, 1.0]
