"""The bubble-filling generators against PyTorch pipelining's own schedule classes.

PyTorch's classes are built with stand-in stage objects (no process group): only the fields
their order computation reads. Orders are compared action for action, leaving out PyTorch's
idle slots and communication; bubbles are PyTorch's orders replayed by our simulator.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from trainsched.backprop.fast_forward import modulo
from trainsched.backprop.interleaved import interleaved_1f1b, interleaved_zero_bubble, zb_h1, zbv
from trainsched.backprop.stages import uniform_stages
from trainsched.plan import Schedule
from trainsched.sim import simulate_pipeline


@pytest.fixture(scope="module")
def pipelining():
    return pytest.importorskip("torch.distributed.pipelining.schedules")


def stand_ins(p: int, stages: list[int], total: int) -> list[SimpleNamespace]:
    """What the classes read of a stage; the zero-bubble ones check that ``submod`` is not a
    compiled module."""
    from torch import nn

    return [SimpleNamespace(num_stages=total, group_size=p, group_rank=0, stage_index=s,
                            is_first=s == 0, is_last=s == total - 1, submod=nn.Identity())
            for s in stages]


def torch_rows(cls, p: int, m: int, stages: list[int], total: int) -> list[str]:
    """PyTorch's pipeline order per rank: compute actions only, space-separated."""
    order = cls(stand_ins(p, stages, total), m).pipeline_order
    return [" ".join(str(a) for a in actions
                     if a is not None and a.computation_type.value in ("F", "I", "W", "B"))
            for _, actions in sorted(order.items())]


def torch_schedule(cls, p: int, m: int, stages: list[int], total: int,
                   stage_to_rank: tuple[int, ...] | None = None) -> Schedule:
    return Schedule.from_text("\n".join(torch_rows(cls, p, m, stages, total)) + "\n",
                              num_stages=total, num_microbatches=m, stage_to_rank=stage_to_rank)


def rows(schedule: Schedule) -> list[str]:
    return schedule.to_text().splitlines()


V_PLACEMENT = (0, 1, 2, 3, 3, 2, 1, 0)  # p = 4: stage s on rank s, then back up


# --- orders ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("p", "m"), [(4, 8), (2, 4), (3, 6), (4, 5), (2, 1)])
def test_zbv_order_is_pytorchs(pipelining, p, m):
    assert rows(zbv(p, m)) == torch_rows(pipelining.ScheduleZBVZeroBubble, p, m,
                                         [0, 2 * p - 1], 2 * p)


@pytest.mark.parametrize(("p", "m", "v"), [(4, 8, 2), (2, 4, 2), (3, 6, 3), (4, 3, 2)])
def test_interleaved_zero_bubble_order_is_pytorchs(pipelining, p, m, v):
    theirs = torch_rows(pipelining.ScheduleInterleavedZeroBubble, p, m,
                        [k * p for k in range(v)], v * p)
    assert rows(interleaved_zero_bubble(p, m, chunks=v)) == theirs


@pytest.mark.parametrize(("p", "m", "v"), [(4, 8, 2), (2, 4, 2), (3, 6, 3), (4, 3, 2)])
def test_interleaved_1f1b_order_is_pytorchs(pipelining, p, m, v):
    theirs = torch_rows(pipelining.ScheduleInterleaved1F1B, p, m, [k * p for k in range(v)],
                        v * p)
    assert rows(interleaved_1f1b(p, m, chunks=v)) == theirs


def test_zb_h1_is_pytorchs_interleaved_zero_bubble_with_one_stage_per_rank(pipelining):
    assert rows(zb_h1(4, 8)) == torch_rows(pipelining.ScheduleInterleavedZeroBubble, 4, 8,
                                           [0], 4)


# --- bubbles at T_F = T_I = T_W = 1 (T_B = 2), no communication: p = 4, m = 8, 2 chunks -------
# Each rank runs 2 stages x 8 micro-batches x (1 + 2) = 48 units. Rank 3 cannot start before
# t = 3 (stages 0..2 forward micro-batch 0 first), so 48 + 3 = 51 is the shortest step: bubble
# 4 x 3 / (4 x 51) = 1/17 = 0.0588, which ZBV and interleaved ZB reach. Interleaved 1F1B's step
# is 57 (PyTorch's order, replayed): 9/57 = 0.1579.

UNIT = uniform_stages(8, 1.0, 1.0, 1.0)


@pytest.mark.parametrize(("ours", "cls", "stages", "placement", "step"), [
    (lambda: interleaved_1f1b(4, 8), "ScheduleInterleaved1F1B", [0, 4], None, 57.0),
    (lambda: interleaved_zero_bubble(4, 8), "ScheduleInterleavedZeroBubble", [0, 4], None, 51.0),
    (lambda: zbv(4, 8), "ScheduleZBVZeroBubble", [0, 7], V_PLACEMENT, 51.0),
], ids=["interleaved-1f1b", "interleaved-zb", "zbv"])
def test_bubble_matches_pytorchs_order_replayed(pipelining, ours, cls, stages, placement, step):
    theirs = torch_schedule(getattr(pipelining, cls), 4, 8, stages, 8, placement)
    mine = simulate_pipeline(UNIT, ours())
    reference = simulate_pipeline(UNIT, theirs)
    assert mine.step_time_s == reference.step_time_s == step
    assert mine.bubble_fraction == pytest.approx((step - 48) / step, rel=1e-12)


def test_bubble_values_of_the_spec():
    assert simulate_pipeline(UNIT, interleaved_1f1b(4, 8)).bubble_fraction == pytest.approx(
        0.158, abs=5e-4)
    for schedule in (interleaved_zero_bubble(4, 8), zbv(4, 8)):
        assert simulate_pipeline(UNIT, schedule).bubble_fraction == pytest.approx(0.059,
                                                                                  abs=5e-4)


# --- CSV through PyTorch's runtime (several stages per rank) -----------------------------------


@pytest.mark.parametrize(("build", "stages"), [
    (lambda: zbv(4, 8), [0, 7]),
    (lambda: interleaved_zero_bubble(4, 8), [0, 4]),
    (lambda: modulo(4, 8, ring=(0, 2, 1, 3)), [0, 4]),
], ids=["zbv", "interleaved-zb", "modulo-ring"])
def test_multi_stage_csv_round_trips_through_pytorchs_runtime(pipelining, tmp_path, build,
                                                              stages):
    ours = build()
    (tmp_path / "ours.csv").write_text(ours.to_csv(), newline="")
    runtime = pipelining._PipelineScheduleRuntime(stand_ins(4, stages, 8), 8)
    runtime._load_csv(str(tmp_path / "ours.csv"))  # PyTorch validates it while loading
    runtime._dump_csv(str(tmp_path / "compute.csv"), format="compute_only")
    assert (tmp_path / "compute.csv").read_bytes() == ours.to_csv().encode()
    # The stage-to-rank mapping PyTorch read from the file is ours.
    assert runtime.stage_index_to_group_rank == dict(enumerate(ours.stage_to_rank))
    runtime._dump_csv(str(tmp_path / "comms.csv"), format="compute_comms")
    lowered = Schedule.from_csv((tmp_path / "comms.csv").read_text(),
                                stage_to_rank=ours.stage_to_rank)
    lowered.validate()
    assert all(lowered.compute_actions(r) == ours.compute_actions(r) for r in range(4))


# --- DualPipeV: PyTorch's fused OVERLAP_F_B slots expanded into their forward and backward -----


def torch_rows_expanded(cls, p: int, m: int, stages: list[int], total: int) -> list[str]:
    """As :func:`torch_rows`, with each ``OVERLAP_F_B`` slot written as its parts in order."""
    order = cls(stand_ins(p, stages, total), m).pipeline_order
    out = []
    for _, actions in sorted(order.items()):
        flat = []
        for a in actions:
            if a is None:
                continue
            parts = a.sub_actions if a.computation_type.value == "OVERLAP_F_B" else (a,)
            flat += [str(b) for b in parts if b.computation_type.value in ("F", "I", "W", "B")]
        out.append(" ".join(flat))
    return out


@pytest.mark.parametrize(("p", "m"), [(4, 8), (2, 4), (3, 6), (4, 11), (2, 9)])
def test_dualpipev_order_is_pytorchs_with_overlaps_expanded(pipelining, p, m):
    from trainsched.backprop.dualpipe import dualpipev

    theirs = torch_rows_expanded(pipelining.ScheduleDualPipeV, p, m, [0, 2 * p - 1], 2 * p)
    assert rows(dualpipev(p, m)) == theirs


def test_dualpipev_has_overlapped_pairs_and_split_backwards():
    from trainsched.backprop.dualpipe import dualpipev

    kinds = {a.kind for r in range(4) for a in dualpipev(4, 8).compute_actions(r)}
    assert kinds == {"F", "B", "I", "W"}


def test_dualpipev_expanded_replays_at_the_shortest_step():
    from trainsched.backprop.dualpipe import dualpipev

    # p = 4, m = 8, T_F = T_I = T_W = 1 (T_B = 2), no communication: each rank runs 2 stages x
    # 8 micro-batches x 3 units = 48, and rank 3 cannot start before t = 3, so 51 is the
    # shortest step (bubble 1/17). Written as separate actions, a pair's forward need not wait
    # for its backward's gradient, and the order reaches it. The spec's 0.111 (a 54-unit step)
    # is for fused slots, each waiting for both parts' inputs, which this format cannot write.
    result = simulate_pipeline(UNIT, dualpipev(4, 8))
    assert result.step_time_s == 51.0
    assert result.bubble_fraction == pytest.approx(3 / 51, rel=1e-12)


def test_dualpipev_needs_two_micro_batches_per_rank():
    from trainsched.backprop.dualpipe import dualpipev
    from trainsched.errors import TrainschedError

    with pytest.raises(TrainschedError, match="at least as many micro-batches as stages: 8"):
        dualpipev(4, 7)
