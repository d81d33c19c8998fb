"""Single-device dW slots (``runtime/split/slots.py``): the order they run the work in, the
lazy updates of deferred layers (N steps equal standard training), and the errors."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from trainsched.backprop.deferral import PendingW, slotted
from trainsched.errors import TrainschedError
from trainsched.runtime.split import SlottedModel


def entry(layer: int, seq: int) -> PendingW:
    return PendingW(layer=layer, microbatch=0, seq=seq)


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 8), nn.LayerNorm(8),
                         nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 3)).double()


def cnn() -> nn.Module:
    torch.manual_seed(1)
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                         nn.Conv2d(4, 4, 3, groups=2), nn.ReLU(), nn.Flatten(),
                         nn.Linear(4 * 6 * 6, 5)).double()


def test_slotted_order_holds_deferred_layers_and_runs_the_rest_as_standard():
    order = slotted([1])
    assert order.run_now([entry(2, 0)]) == (0,)
    assert order.run_now([entry(1, 0)]) == ()
    assert order.at_backward_end([entry(1, 0)]) == ()
    assert order.drain([entry(3, 0), entry(1, 1)]) == (1, 0)  # forward order at drain


def _batches(shape: tuple[int, ...], classes: int, n: int) -> list[tuple[torch.Tensor, ...]]:
    g = torch.Generator().manual_seed(7)
    return [(torch.randn(*shape, generator=g, dtype=torch.float64),
             torch.randint(0, classes, (shape[0],), generator=g)) for _ in range(n)]


@pytest.mark.parametrize("opt,kwargs", [(torch.optim.SGD, {"lr": 0.1}),
                                        (torch.optim.SGD, {"lr": 0.05, "momentum": 0.9}),
                                        (torch.optim.Adam, {"lr": 0.01})],
                         ids=["sgd", "momentum", "adam"])
def test_deferred_slots_train_like_standard_backprop_step_by_step(opt, kwargs):
    reference = mlp()
    net = SlottedModel(copy.deepcopy(reference),
                       ["overlap_backward", "inline", "overlap_forward(0)",
                        "overlap_forward(1)"], optimizer=opt, optimizer_kwargs=kwargs)
    ref_opt = opt(reference.parameters(), **kwargs)
    loss_fn = nn.CrossEntropyLoss()
    for x, y in _batches((5, 6), 3, 4):
        expected = loss_fn(reference(x), y)
        expected.backward()
        ref_opt.step()
        ref_opt.zero_grad(set_to_none=True)
        got = loss_fn(net(x), y)
        got.backward()
        net.step()
        net.zero_grad()
        # each step's forward saw the weights standard training had at that step
        assert got.item() == pytest.approx(expected.item(), rel=1e-13, abs=1e-15)
    net.drain()
    for (name, a), b in zip(net.module.named_parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14, msg=name)


def test_a_conv_model_with_batch_norm_and_groups_trains_like_standard_backprop():
    reference = cnn()
    net = SlottedModel(copy.deepcopy(reference), ["inline", "overlap_forward(0)",
                                                  "overlap_forward(1)"],
                       optimizer=torch.optim.SGD, optimizer_kwargs={"lr": 0.1})
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    for x, y in _batches((2, 3, 8, 8), 5, 3):
        nn.functional.cross_entropy(reference(x), y).backward()
        ref_opt.step()
        ref_opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(net(x), y).backward()
        net.step()
        net.zero_grad()
    net.drain()
    for a, b in zip(net.module.state_dict().values(), reference.state_dict().values(),
                    strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)


def test_a_deferred_dw_runs_after_its_launch_layers_forward_in_the_next_step():
    net = SlottedModel(mlp(), ["inline", "overlap_backward", "inline", "overlap_forward(1)"],
                       optimizer=torch.optim.SGD, optimizer_kwargs={"lr": 0.1})
    events: list[tuple[str, int]] = []
    queue = net.split.queue
    execute = queue.executor

    def recording(info, run, params, tensors):
        events.append(("dW", info.layer))
        execute(info, run, params, tensors)

    queue.executor = recording
    linears = [m for m in net.module if isinstance(m, nn.Linear)]
    for i, m in enumerate(linears):
        m.register_forward_pre_hook(lambda mod, args, i=i: events.append(("fwd", i)))
    x, y = _batches((4, 6), 3, 1)[0]
    for step in range(2):
        nn.functional.cross_entropy(net(x), y).backward()
        net.step()
        net.zero_grad()
        if step == 0:
            # backward order: layer 3's dW waits; 2, 1 and 0 run as their dX are done
            assert events == [("fwd", 0), ("fwd", 1), ("fwd", 2), ("fwd", 3),
                              ("dW", 2), ("dW", 1), ("dW", 0)]
            events.clear()
    assert events == [("fwd", 0), ("fwd", 1), ("dW", 3), ("fwd", 2), ("fwd", 3),
                      ("dW", 2), ("dW", 1), ("dW", 0)]
    assert len(queue) == 1 and queue.pending[0].layer == 3  # this step's, for the next
    net.drain()
    assert len(queue) == 0


def test_the_lazy_update_comes_before_the_deferred_layers_forward():
    reference = mlp()
    net = SlottedModel(copy.deepcopy(reference), ["inline", "inline", "inline",
                                                  "overlap_forward(0)"],
                       optimizer=torch.optim.SGD, optimizer_kwargs={"lr": 0.1})
    last = net.module[6]
    seen: list[torch.Tensor] = []
    last.register_forward_pre_hook(lambda mod, args: seen.append(mod.weight.detach().clone()))
    x, y = _batches((4, 6), 3, 1)[0]
    nn.functional.cross_entropy(net(x), y).backward()
    net.step()
    assert last.weight.grad is None  # its dW waits for the next step
    nn.functional.cross_entropy(reference(x), y).backward()
    net(x)
    # SGD at lr 0.1 on the step-0 gradient, applied before the layer's second forward
    torch.testing.assert_close(seen[1], seen[0] - 0.1 * reference[6].weight.grad,
                               rtol=1e-13, atol=1e-15)
    assert last.weight.grad is None  # consumed by the lazy update


def test_on_the_cpu_nothing_overlaps():
    net = SlottedModel(mlp(), ["overlap_backward"] * 4, optimizer=torch.optim.SGD,
                       optimizer_kwargs={"lr": 0.1})
    assert net.overlaps is False


def test_slots_for_another_layer_count_are_refused_and_the_model_is_left_unsplit():
    model = mlp()
    forward = model[0].forward
    with pytest.raises(TrainschedError, match="3 dW slots for a model with 4 split layers"):
        SlottedModel(model, ["inline"] * 3, optimizer=torch.optim.SGD,
                     optimizer_kwargs={"lr": 0.1})
    assert "forward" not in vars(model[0]) and model[0].forward == forward


def test_a_slot_launching_after_its_own_layer_is_refused():
    with pytest.raises(TrainschedError, match=r"use overlap_forward\(j\) with j < 2"):
        SlottedModel(mlp(), ["inline", "inline", "overlap_forward(2)", "inline"],
                     optimizer=torch.optim.SGD)


def test_a_deferred_layer_sharing_its_weight_is_refused():
    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(10, 6)
            self.mid = nn.Linear(6, 6)
            self.out = nn.Linear(6, 10, bias=False)
            self.out.weight = self.emb.weight

        def forward(self, idx):
            return self.out(torch.tanh(self.mid(self.emb(idx))))

    net = SlottedModel(Tied(), ["inline", "inline", "overlap_forward(0)"],
                       optimizer=torch.optim.SGD, optimizer_kwargs={"lr": 0.1})
    out = net(torch.tensor([[1, 2, 3]]))
    out.sum().backward()
    with pytest.raises(TrainschedError, match="layer 0 shares a parameter with deferred layer 2"):
        net.step()
