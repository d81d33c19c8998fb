"""The memory timeline where a workspace is freed the instant it is made, at byte counts that
fit in 64-bit integers and at ones that do not (the two ways the levels are added up)."""

from __future__ import annotations

import pytest

from trainsched.graph import Edge, Graph, Op
from trainsched.sim import simulate_single


def instant_workspace(scale: int) -> Graph:
    # a takes no time and uses 50 units of workspace; b starts when a ends (at 0) and makes
    # 10 units of output that nothing frees.
    return Graph([Op(name="a", compute_s=0.0, temp_bytes=50 * scale),
                  Op(name="b", compute_s=1.0, output_bytes=10 * scale)],
                 [Edge(src="a", dst="b", size_bytes=0)])


@pytest.mark.parametrize("scale", [1, 2**62], ids=["int64", "beyond-int64"])
def test_a_workspace_freed_the_instant_it_is_made_shows_its_high(scale):
    result = simulate_single(instant_workspace(scale), allow_forward_only=True)
    # At 0: a's workspace (+50) and b's output (+10) are made, then a's workspace goes (-50):
    # the high of 60 and then the level 10, both at 0 (no separate resident point at 0).
    assert result.memory_timeline["device0"] == ((0.0, 60 * scale), (0.0, 10 * scale))
    assert result.peak_memory_bytes["device0"] == 60 * scale
    assert result.peak_op["device0"] == "b"


def test_allocations_by_columns_read_back_as_the_allocations_added():
    from trainsched.sim.result import Allocation, Allocations

    allocations = Allocations()
    allocations.append(Allocation(device=1, size_bytes=8, at_task=0, until_tasks=(1, 2)))
    allocations.add(0, 4)
    allocations.extend([0, 1], [2, 3], [1, 2], [(), (2,)])
    assert list(allocations) == [
        Allocation(device=1, size_bytes=8, at_task=0, until_tasks=(1, 2)),
        Allocation(device=0, size_bytes=4),
        Allocation(device=0, size_bytes=2, at_task=1),
        Allocation(device=1, size_bytes=3, at_task=2, until_tasks=(2,))]
    assert allocations[-1] == Allocation(device=1, size_bytes=3, at_task=2, until_tasks=(2,))
    assert len(allocations[1:3]) == 2


def test_the_memory_summary_of_columns_is_that_of_the_allocation_objects():
    from trainsched.sim import TaskGraph, build_result, run_tasks
    from trainsched.sim.result import Allocation, Allocations

    g = TaskGraph()
    r = g.add_resource("r")
    a, b, c = (g.add_task(x, 1.0, (r,)) for x in "abc")
    g.add_dependencies([a, b], [b, c])
    objects = [Allocation(device=0, size_bytes=5),  # resident
               Allocation(device=0, size_bytes=10, at_task=a, until_tasks=(b,)),
               Allocation(device=0, size_bytes=20, at_task=b, until_tasks=(c,)),
               Allocation(device=0, size_bytes=1, at_task=c)]
    columns = Allocations()
    for allocation in objects:
        columns.append(allocation)
    replay = run_tasks(g)
    by_objects = build_result(g, replay, devices=["d"], allocations=objects)
    by_columns = build_result(g, replay, devices=["d"], allocations=columns)
    # a [0,1] makes 10; b [1,2] makes 20 (a's 10 freed at 2); c [2,3] makes 1, b's 20 go at 3
    assert by_columns.memory_timeline["d"] == ((0.0, 15), (1.0, 35), (2.0, 26), (3.0, 6))
    assert by_columns.peak_memory_bytes["d"] == 35 and by_columns.peak_op["d"] == "b"
    assert by_columns.to_json() == by_objects.to_json()
