"""The sync runtime on zoo models: the data a :class:`ZooTask` generates (no processes), then
real gloo runs: k-of-N with k = N equals full-batch SGD (BSP's algebra) on the zoo's MLP, and a
run switching through every protocol on the zoo's small CNN (BatchNorm) with sharded servers.

The equivalence's reference is computed here, independently of the runtime: one process taking
full-batch SGD steps over the same stream samples (BSP step ``t`` of ``N`` workers with batch
``b`` reads stream samples ``t·N·b .. (t+1)·N·b``), as for the teacher-student task.
"""

from __future__ import annotations

import pytest

from trainsched.errors import TrainschedError
from trainsched.runtime.tasks import ZooTask, task_for, task_from_json

torch = pytest.importorskip("torch")

from sync_reference import full_batch_params  # noqa: E402
from trainsched.runtime.sync import run_sync  # noqa: E402
from trainsched.sync.protocols import Asp, Bsp, KOfN, LocalSgd, Ssp  # noqa: E402

# --- the data (one process) ------------------------------------------------------------------


def test_without_noise_every_sample_is_its_class_prototype():
    data = ZooTask(model="mlp", noise=0.0, train_samples=64, test_samples=16).data()
    x, y = data.x_train[torch.arange(64)], data.y_train
    assert x.shape == (64, 256) and set(y.tolist()) <= set(range(10))
    for i in range(64):
        for j in range(64):
            assert torch.equal(x[i], x[j]) == (int(y[i]) == int(y[j]))


def test_a_sample_is_the_same_whichever_batch_reads_it():
    data = ZooTask(model="small-cnn", train_samples=32, test_samples=8, seed=4).data()
    pair = data.x_train[torch.tensor([5, 1])]
    assert pair.shape == (2, 3, 32, 32)
    assert torch.equal(pair[0], data.x_train[torch.tensor([5])][0])
    assert torch.equal(pair[1], data.x_train[torch.tensor([7, 1])][1])


def test_another_seed_draws_other_data():
    a = ZooTask(model="mlp", train_samples=16, test_samples=4, seed=1).data()
    b = ZooTask(model="mlp", train_samples=16, test_samples=4, seed=2).data()
    assert not torch.equal(a.x_train[torch.arange(16)], b.x_train[torch.arange(16)])


def test_token_ids_are_labelled_with_the_next_token_of_a_two_successor_chain():
    data = ZooTask(model="tiny-gpt2", seq_len=12, classes=6, train_samples=40,
                   test_samples=8).data()
    x, y = data.x_train, data.y_train
    assert x.shape == y.shape == (40, 12) and x.dtype == torch.int64
    assert torch.equal(y[:, :-1], x[:, 1:])  # the label of position i is the token at i + 1
    assert int(x.max()) < 6 and int(y.max()) < 6
    successors: dict[int, set[int]] = {}
    for a, b in zip(x.reshape(-1).tolist(), y.reshape(-1).tolist(), strict=True):
        successors.setdefault(a, set()).add(b)
    assert max(len(s) for s in successors.values()) <= 2


def test_more_classes_than_the_model_scores_are_refused():
    with pytest.raises(TrainschedError, match="mlp scores 10 classes; the task uses 11"):
        ZooTask(model="mlp", classes=11).check()


def test_a_zoo_task_round_trips_through_json_and_a_task_name():
    task = ZooTask(model="small-cnn", classes=4, noise=0.5, seed=9)
    assert task_from_json(task.to_json()) == task
    assert task_for("mlp", seed=2) == ZooTask(model="mlp", seed=2)
    assert task_for("teacher-student").name == "teacher-student"


# --- real gloo runs ----------------------------------------------------------------------------

N, B, STEPS, LR = 2, 8, 10, 0.05
MLP = ZooTask(model="mlp", train_samples=256, test_samples=64, seed=3)


def full_batch_reference() -> torch.Tensor:
    """Full-batch SGD (momentum 0.9, weight decay 1e-3) on N·B stream samples per step."""
    from trainsched.capture.zoo import build

    model = build("mlp", seed=3).model
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9, weight_decay=1e-3)
    return full_batch_params(MLP, model, opt, steps=STEPS, batch=N * B)


@pytest.mark.timeout(300)
def test_k_of_n_with_k_equal_n_on_a_zoo_model_equals_bsp():
    result = run_sync(MLP, [(KOfN(N), STEPS * N * B)], ranks=N, batch_per_rank=B, lr=LR,
                      momentum=0.9, weight_decay=1e-3, return_params=True, timeout_s=30,
                      deadline_s=240)
    expected = full_batch_reference()
    got = torch.tensor(result.params, dtype=torch.float32)
    assert got.shape == expected.shape
    assert float((got - expected).abs().max()) <= 1e-6
    (phase,) = result.phases
    assert (phase.updates, phase.gradients, phase.dropped) == (STEPS, STEPS * N, 0)
    assert phase.staleness == ((STEPS,),) * N  # every gradient on the current version


@pytest.mark.timeout(400)
def test_a_zoo_cnn_switches_through_every_protocol_on_sharded_servers():
    task = ZooTask(model="small-cnn", train_samples=512, test_samples=128, seed=1)
    phases = [(Bsp(), 160), (Asp(), 96), (Ssp(1), 64), (KOfN(1), 48), (LocalSgd(2), 64),
              (Bsp(), 64)]
    result = run_sync(task, phases, ranks=N, batch_per_rank=B, lr=0.1, momentum=0.9,
                      servers=2, timeout_s=60, deadline_s=360)
    # samples are the clock: N·b per BSP or local round, b per ASP / SSP / 1-of-N update
    assert [p.samples for p in result.phases] == [160, 96, 64, 48, 64, 64]
    assert [p.updates for p in result.phases] == [10, 12, 8, 6, 4, 4]
    assert [s.samples for s in result.switches] == [160, 256, 320, 368, 432]
    assert result.total_samples == 496
    # the learning rate follows each protocol's effective batch (b of N·b: halved)
    assert [p.lr for p in result.phases] == [0.1, 0.05, 0.05, 0.05, 0.1, 0.1]
    assert result.final_loss < 0.95 * result.curve[0].loss  # ln 10 = 2.30 untrained


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_zoo_language_model_learns_the_chain_through_a_switch():
    task = ZooTask(model="tiny-gpt2", seq_len=8, train_samples=256, test_samples=32)
    # no momentum: with momentum 0.9 the stale ASP updates can undo what BSP learned
    result = run_sync(task, [(Bsp(), 768), (Asp(), 768)], ranks=N, batch_per_rank=B, lr=0.5,
                      timeout_s=60, deadline_s=360)
    assert [(p.samples, p.updates) for p in result.phases] == [(768, 48), (768, 96)]
    # untrained: about ln 1000 = 6.9 per token; knowing the chain's 10 tokens: ln 10 = 2.3
    assert result.curve[0].loss > 6.0 and result.final_loss < 4.0
