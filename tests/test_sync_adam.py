"""Adam in the sync runtime: its moments and step counts are part of the state that moves at a
switch, lives with the shards on the servers and goes into checkpoints.

The reference is computed here, independently of the runtime: one process taking full-batch
Adam steps over the same stream samples (BSP step ``t`` of ``N`` workers with batch ``b`` reads
stream samples ``t·N·b .. (t+1)·N·b``); k-of-N with ``k = N`` is BSP on the server.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from sync_reference import full_batch_params  # noqa: E402
from trainsched.runtime.sync import run_sync  # noqa: E402
from trainsched.runtime.sync.state import Replica  # noqa: E402
from trainsched.runtime.tasks import TeacherStudent  # noqa: E402
from trainsched.sync.protocols import Bsp, KOfN  # noqa: E402

TASK = TeacherStudent(input_dim=8, teacher_hidden=16, student_hidden=16, train_samples=512,
                      test_samples=128, seed=3)
N, B, STEPS, LR, WD = 3, 8, 18, 0.01, 1e-3
SAMPLES = STEPS * N * B


def reference() -> torch.Tensor:
    model = TASK.student()
    opt = torch.optim.Adam(model.parameters(), lr=LR, weight_decay=WD)
    return full_batch_params(TASK, model, opt, steps=STEPS, batch=N * B)


def adam_replica() -> Replica:
    return Replica(TASK.student(), lr=LR, momentum=0.0, weight_decay=WD, nesterov=False,
                   optimizer="adam")


def test_the_adam_state_round_trips_with_its_moments_and_step_counts():
    one, two = adam_replica(), adam_replica()
    grad = torch.linspace(-1.0, 1.0, one.numel)
    for samples in range(3):
        one.step(grad, samples=samples)
    # parameters, first and second moments, one step count per tensor (the student's 3 linear
    # layers: 6 tensors)
    assert one.state_numel == 3 * one.numel + 6
    state = one.state_into().clone()
    assert state[3 * one.numel:].tolist() == [3.0] * 6
    two.load_state(state)
    one.step(grad * 0.5, samples=3)
    two.step(grad * 0.5, samples=3)
    # the fourth step needs the moments and the bias correction of step 4: all moved
    assert torch.equal(one.state_into(), two.state_into())


def test_a_restricted_adam_replica_steps_its_shard_like_the_whole_one():
    whole, part = adam_replica(), adam_replica()
    lo, hi = whole.numel // 3, 2 * whole.numel // 3
    part.restrict(lo, hi)
    grad = torch.linspace(-1.0, 1.0, whole.numel)
    for samples in range(3):
        whole.step(grad, samples=samples)
        part.step(grad, samples=samples)
    a, b = whole.state_into().clone(), part.state_into().clone()
    for block in range(3):
        start = block * whole.numel
        assert torch.equal(a[start + lo:start + hi], b[start + lo:start + hi])


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_bsp_then_sharded_k_of_n_then_bsp_with_adam_equals_full_batch_adam():
    # a third of the steps under BSP, a third as k-of-N with k = N on 2 shard servers, a third
    # under BSP again: the last third needs the moments and step counts the shards sent back
    third = SAMPLES // 3
    result = run_sync(TASK, [(Bsp(), third), (KOfN(N), third), (Bsp(), third)], ranks=N,
                      batch_per_rank=B, lr=LR, weight_decay=WD, optimizer="adam", servers=2,
                      return_params=True, timeout_s=30, deadline_s=240)
    params = torch.tensor(result.params, dtype=torch.float32)
    assert float((params - reference()).abs().max()) <= 1e-6
    assert [p.updates for p in result.phases] == [STEPS // 3] * 3
