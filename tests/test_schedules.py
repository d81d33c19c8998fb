"""Pipeline schedule generators: golden orders, validity, memory and bubble, PyTorch agreement."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainsched.backprop.schedules import (
    SCHEDULES,
    bubble_fraction_ideal,
    build_schedule,
    gpipe,
    one_f_one_b,
    stage_ranks,
)
from trainsched.errors import TrainschedError
from trainsched.plan import Schedule

GOLDEN = {
    ("gpipe", 2, 2, False): """\
0F0 0F1 0B0 0B1
1F0 1F1 1B0 1B1
""",
    ("gpipe", 2, 2, True): """\
0F0 0F1 0I0 0W0 0I1 0W1
1F0 1F1 1I0 1W0 1I1 1W1
""",
    ("1f1b", 2, 3, False): """\
0F0 0F1 0B0 0F2 0B1 0B2
1F0 1B0 1F1 1B1 1F2 1B2
""",
    ("1f1b", 2, 3, True): """\
0F0 0F1 0I0 0W0 0F2 0I1 0W1 0I2 0W2
1F0 1I0 1W0 1F1 1I1 1W1 1F2 1I2 1W2
""",
    ("1f1b", 4, 4, False): """\
0F0 0F1 0F2 0F3 0B0 0B1 0B2 0B3
1F0 1F1 1F2 1B0 1F3 1B1 1B2 1B3
2F0 2F1 2B0 2F2 2B1 2F3 2B2 2B3
3F0 3B0 3F1 3B1 3F2 3B2 3F3 3B3
""",
    # Fewer micro-batches than stages: the warm-up is cut to m forwards.
    ("1f1b", 4, 2, False): """\
0F0 0F1 0B0 0B1
1F0 1F1 1B0 1B1
2F0 2F1 2B0 2B1
3F0 3B0 3F1 3B1
""",
}


@pytest.mark.parametrize("case", list(GOLDEN), ids=lambda c: "-".join(map(str, c)))
def test_golden_orders(case):
    name, p, m, split = case
    schedule = build_schedule(name, p, m, split_backward=split)
    assert schedule.to_text() == GOLDEN[case]
    assert Schedule.from_text(GOLDEN[case]) == schedule


def test_registry_and_unknown_names():
    assert SCHEDULES["gpipe"] is gpipe and SCHEDULES["1f1b"] is one_f_one_b
    assert SCHEDULES.tagged("compare") == tuple(SCHEDULES)  # compare shows every schedule
    assert build_schedule("gpipe", 3, 2) == gpipe(3, 2)
    with pytest.raises(TrainschedError, match="unknown pipeline schedule 'zb'; known "
                                              "schedules: gpipe, 1f1b, interleaved-1f1b"):
        build_schedule("zb", 2, 2)


@pytest.mark.parametrize("generator", [gpipe, one_f_one_b, bubble_fraction_ideal])
@pytest.mark.parametrize(("p", "m"), [(0, 1), (1, 0), (2, True), (2.0, 2)])
def test_sizes_are_checked(generator, p, m):
    with pytest.raises(TrainschedError, match="must be an integer >= 1"):
        generator(p, m)


def test_bubble_fraction_ideal():
    assert bubble_fraction_ideal(1, 5) == 0.0
    assert bubble_fraction_ideal(4, 8) == pytest.approx(3 / 11)
    assert bubble_fraction_ideal(8, 1) == pytest.approx(7 / 8)


def in_flight_peak(schedule: Schedule, rank: int) -> int:
    """Most micro-batches whose forward ran and whose backward (B or W) has not, on ``rank``."""
    live = peak = 0
    for a in schedule.compute_actions(rank):
        live += {"F": 1, "B": -1, "W": -1}.get(a.kind, 0)
        peak = max(peak, live)
    return peak


def unit_cost_makespan(schedule: Schedule, cost: dict[str, float]) -> float:
    """End time of ``schedule`` when each kind costs ``cost[kind]``, with no communication.

    Each rank runs its list in order; an action starts when its rank is free and its inputs
    (the same dependencies :meth:`Schedule.validate` uses) are done.
    """
    last = schedule.num_stages - 1
    finish: dict[tuple[int, str, int], float] = {}
    position = [0] * schedule.num_ranks
    free = [0.0] * schedule.num_ranks
    progressed = True
    while progressed:
        progressed = False
        for r in range(schedule.num_ranks):
            for a in schedule.compute_actions(r)[position[r]:]:
                s, m = a.stage, a.microbatch
                needs = {"F": [(s - 1, "F", m)] if s > 0 else [],
                         "W": [(s, "G", m)]}.get(a.kind)  # fmt: skip
                if needs is None:  # I or B
                    needs = [(s, "F", m)] + ([(s + 1, "G", m)] if s < last else [])
                if any(k not in finish for k in needs):
                    break
                end = max([free[r]] + [finish[k] for k in needs]) + cost[a.kind]
                finish[(s, "G" if a.kind in "IB" else a.kind, m)] = free[r] = end
                position[r] += 1
                progressed = True
    assert all(p == len(schedule.compute_actions(r)) for r, p in enumerate(position))
    return max(free)


@settings(max_examples=150, deadline=None)
@given(p=st.integers(1, 6), m=st.integers(1, 12), split=st.booleans(),
       name=st.sampled_from(["1f1b", "gpipe"]))  # fmt: skip
def test_generated_schedules_are_valid_and_complete(p, m, split, name):
    schedule = build_schedule(name, p, m, split_backward=split)
    schedule.validate()
    assert (schedule.num_ranks, schedule.num_stages) == (p, p)
    assert schedule.stage_to_rank == tuple(range(p))
    computes = [a for r in range(p) for a in schedule.compute_actions(r)]
    assert sum(a.kind == "F" for a in computes) == p * m
    assert len(computes) == p * m * (3 if split else 2)
    for rank in range(p):
        peak = in_flight_peak(schedule, rank)
        if name == "1f1b":
            assert peak <= p - rank and peak == min(m, p - rank)  # 1F1B's memory property
        else:
            assert peak == m
    # Equal stage costs (F = I = W = 1, B = 2): the ideal bubble, for both orders. Split, the
    # gradient leaves after I, so each of the p - 1 hand-offs upstream saves one W.
    makespan = unit_cost_makespan(schedule, {"F": 1.0, "B": 2.0, "I": 1.0, "W": 1.0})
    if split:
        assert makespan == 3 * (m + p - 1) - (p - 1)
    else:
        assert 1 - m * 3.0 / makespan == pytest.approx(bubble_fraction_ideal(p, m))


# --- agreement with torch.distributed.pipelining ------------------------------------------------


@pytest.fixture(scope="module")
def pipelining():
    return pytest.importorskip("torch.distributed.pipelining.schedules")


def torch_order(pipelining, cls, p: int, m: int) -> list[str]:
    """PyTorch's pipeline order per rank for a stage-per-rank schedule, without REDUCE_GRAD."""
    schedule = cls(SimpleNamespace(num_stages=p, stage_index=0), m)
    return [" ".join(str(a) for a in actions
                     if a is not None and a.computation_type.value != "REDUCE_GRAD")
            for _, actions in sorted(schedule.pipeline_order.items())]  # fmt: skip


@pytest.mark.parametrize(("p", "m"), [(1, 1), (2, 2), (2, 5), (4, 4), (4, 8), (5, 3)])
def test_orders_match_pytorch(pipelining, p, m):
    assert gpipe(p, m).to_text().splitlines() == torch_order(pipelining, pipelining.ScheduleGPipe,
                                                             p, m)  # fmt: skip
    if m >= p:  # PyTorch's Schedule1F1B refuses fewer micro-batches than stages
        ours = one_f_one_b(p, m).to_text().splitlines()
        theirs = torch_order(pipelining, pipelining.Schedule1F1B, p, m)
        # Schedule1F1B's listing numbers the last rank's forwards from 1 (F1..Fm, an off-by-one
        # in _get_pipeline_order); its _step_microbatches runs F0 B0 F1 B1 ... there, as we do.
        assert ours[:-1] == theirs[:-1]
        assert ours[-1] == " ".join(f"{p - 1}{k}{i}" for i in range(m) for k in "FB")


def torch_runtime(pipelining, p: int, m: int):
    stage = SimpleNamespace(num_stages=p, group_size=p, group_rank=0, stage_index=0,
                            is_first=True, is_last=p == 1)  # fmt: skip
    return pipelining._PipelineScheduleRuntime([stage], m)


@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize(("name", "p", "m"), [("gpipe", 2, 3), ("1f1b", 4, 6), ("1f1b", 3, 2)])
def test_csv_round_trips_through_pytorch(pipelining, tmp_path, name, p, m, split):
    ours = build_schedule(name, p, m, split_backward=split)
    (tmp_path / "ours.csv").write_text(ours.to_csv(), newline="")
    runtime = torch_runtime(pipelining, p, m)
    runtime._load_csv(str(tmp_path / "ours.csv"))  # PyTorch validates it while loading
    runtime._dump_csv(str(tmp_path / "compute.csv"), format="compute_only")
    assert (tmp_path / "compute.csv").read_bytes() == ours.to_csv().encode()
    # PyTorch's lowering adds sends, receives, UNSHARD/RESHARD and REDUCE_GRAD: still valid.
    runtime._dump_csv(str(tmp_path / "comms.csv"), format="compute_comms")
    torch_csv = (tmp_path / "comms.csv").read_bytes().decode()
    lowered = Schedule.from_csv(torch_csv, source="comms.csv")
    lowered.validate()
    assert lowered.to_csv() == torch_csv
    assert "SEND_F" in torch_csv or p == 1
    assert all(lowered.compute_actions(r) == ours.compute_actions(r) for r in range(p))


@pytest.mark.parametrize(("name", "ranks", "expected"), [
    ("1f1b", 3, (0, 1, 2)),
    ("zb-greedy", 2, (0, 1)),
    ("interleaved-1f1b", 2, (0, 1, 0, 1)),  # loop: stage s on rank s mod p
    ("modulo", 3, (0, 1, 2, 0, 1, 2)),
    ("zbv", 2, (0, 1, 1, 0)),  # V: down the ranks and back
    ("zbv", 3, (0, 1, 2, 2, 1, 0)),
])
def test_the_rank_of_each_stage_is_known_before_the_cut(name, ranks, expected):
    assert stage_ranks(name, ranks, 6) == expected
