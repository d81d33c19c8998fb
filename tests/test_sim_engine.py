"""The discrete-event engine on hand-worked task graphs: queues, multi-resource tasks, errors."""

from __future__ import annotations

import math

import pytest

from trainsched.errors import TrainschedError
from trainsched.sim import TaskGraph, build_result, longest_path_s, run_tasks


def close(actual: float, expected: float) -> bool:
    return math.isclose(actual, expected, rel_tol=1e-9, abs_tol=1e-15)


def queue_example(policy: str) -> tuple[TaskGraph, dict[str, int]]:
    """A holds r on [0, 1]; B, C, D become ready at 0.2, 0.5, 0.7 (delays with no resource)
    and wait for r. Priority keys: B 3, C 1, D 2."""
    g = TaskGraph()
    r = g.add_resource("r", policy=policy)
    ids = {"A": g.add_task("A", 1.0, (r,), priority=0)}
    for name, delay, key in (("B", 0.2, 3), ("C", 0.5, 1), ("D", 0.7, 2)):
        wait = g.add_task(f"wait {name}", delay)
        ids[name] = g.add_task(name, 1.0, (r,), priority=key)
        g.add_dependency(wait, ids[name])
    return g, ids


def starts(g: TaskGraph, ids: dict[str, int]) -> dict[str, float]:
    s = run_tasks(g)
    return {name: s.start_s[t] for name, t in ids.items()}


def test_fifo_queue_serves_in_ready_order():
    g, ids = queue_example("fifo")
    assert starts(g, ids) == {"A": 0.0, "B": 1.0, "C": 2.0, "D": 3.0}


def test_priority_queue_serves_by_key():
    g, ids = queue_example("priority")
    assert starts(g, ids) == {"A": 0.0, "C": 1.0, "D": 2.0, "B": 3.0}


def test_priority_chooses_among_all_tasks_ready_at_one_instant():
    # Two producers end at t=1 (X first, by its key); their consumers reach r at that instant.
    # The priority queue must pick the consumer with the smaller key, not the first to arrive.
    g = TaskGraph()
    r = g.add_resource("r", policy="priority")
    x = g.add_task("X", 1.0, priority=0)
    y = g.add_task("Y", 1.0, priority=1)
    late = g.add_task("after X", 1.0, (r,), priority=9)
    early = g.add_task("after Y", 1.0, (r,), priority=2)
    g.add_dependency(x, late)
    g.add_dependency(y, early)
    s = run_tasks(g)
    assert (s.start_s[early], s.start_s[late]) == (1.0, 2.0)


def test_fifo_ties_break_by_arrival():
    g = TaskGraph()
    r = g.add_resource("r")
    first = g.add_task("first", 1.0, (r,), priority=5)
    second = g.add_task("second", 1.0, (r,), priority=1)
    s = run_tasks(g)
    assert (s.start_s[first], s.start_s[second]) == (0.0, 1.0)


def test_task_needing_two_resources_waits_for_both():
    g = TaskGraph()
    r1, r2 = g.add_resource("r1"), g.add_resource("r2")
    a = g.add_task("A", 2.0, (r1,))
    b = g.add_task("B", 3.0, (r2,))
    both = g.add_task("both", 1.0, (r1, r2))
    s = run_tasks(g)
    assert (s.start_s[both], s.end_s[both]) == (3.0, 4.0)
    assert s.fixed_by[both] == b and s.by_resource[both]
    assert s.busy_s == (3.0, 4.0)
    assert (s.start_s[a], s.makespan_s) == (0.0, 4.0)


def test_a_free_resource_is_not_held_for_a_blocked_task():
    # "both" waits for r2 until 3; "solo" (queued behind it on r1) takes r1 at 2 meanwhile.
    g = TaskGraph()
    r1, r2 = g.add_resource("r1"), g.add_resource("r2")
    g.add_task("A", 2.0, (r1,))
    g.add_task("B", 3.0, (r2,))
    both = g.add_task("both", 1.0, (r1, r2))
    solo = g.add_task("solo", 0.5, (r1,))
    s = run_tasks(g)
    assert (s.start_s[solo], s.start_s[both]) == (2.0, 3.0)


def test_task_without_resources_takes_its_duration():
    g = TaskGraph()
    r = g.add_resource("r")
    a = g.add_task("A", 1.5, (r,))
    latency = g.add_task("latency", 0.25)
    b = g.add_task("B", 1.0, (r,))
    g.add_dependency(a, latency)
    g.add_dependency(latency, b)
    s = run_tasks(g)
    assert (s.start_s[latency], s.end_s[latency], s.start_s[b]) == (1.5, 1.75, 1.75)
    assert s.fixed_by[b] == latency and not s.by_resource[b]


def test_capacity_two_runs_two_at_once():
    g = TaskGraph()
    r = g.add_resource("pair", capacity=2)
    for k in range(3):
        g.add_task(f"t{k}", 1.0, (r,))
    s = run_tasks(g)
    assert s.start_s == (0.0, 0.0, 1.0) and s.makespan_s == 2.0 and s.busy_s == (3.0,)


def test_zero_duration_tasks_chain_at_one_instant():
    g = TaskGraph()
    r = g.add_resource("r")
    a = g.add_task("A", 0.0, (r,))
    b = g.add_task("B", 0.0, (r,))
    c = g.add_task("C", 2.0, (r,))
    g.add_dependency(a, b)
    g.add_dependency(b, c)
    s = run_tasks(g)
    assert s.end_s == (0.0, 0.0, 2.0) and s.events == 3


def test_empty_graph():
    s = run_tasks(TaskGraph())
    assert s.makespan_s == 0.0 and s.events == 0


def test_repeated_dependency_counts_twice():
    g = TaskGraph()
    a = g.add_task("A", 1.0)
    b = g.add_task("B", 1.0)
    g.add_dependency(a, b)
    g.add_dependency(a, b)
    assert run_tasks(g).start_s[b] == 1.0


@pytest.mark.timeout(10)
def test_cycle_raises_with_blocked_tasks_instead_of_hanging():
    g = TaskGraph()
    r = g.add_resource("r")
    ok = g.add_task("ok", 1.0, (r,))
    a = g.add_task("a", 1.0, (r,))
    b = g.add_task("b", 1.0, (r,))
    g.add_dependency(ok, a)
    g.add_dependency(a, b)
    g.add_dependency(b, a)
    with pytest.raises(TrainschedError) as err:
        run_tasks(g)
    message = str(err.value)
    assert "2 of 3 tasks never ran" in message
    assert "a waits for b" in message and "b waits for a" in message
    with pytest.raises(TrainschedError, match="a waits for b"):
        longest_path_s(g)


def test_bad_tasks_and_resources_are_user_errors():
    g = TaskGraph()
    with pytest.raises(TrainschedError, match="queue policy"):
        g.add_resource("r", policy="lifo")
    with pytest.raises(TrainschedError, match="capacity"):
        g.add_resource("r", capacity=0)
    r = g.add_resource("r")
    with pytest.raises(TrainschedError, match="duration"):
        g.add_task("t", -1.0, (r,))
    with pytest.raises(TrainschedError, match="duration"):
        g.add_task("t", math.nan, (r,))
    with pytest.raises(TrainschedError, match="distinct"):
        g.add_task("t", 1.0, (r, r))
    with pytest.raises(TrainschedError, match="distinct"):
        g.add_task("t", 1.0, (7,))


def test_longest_path_ignores_resources():
    g = TaskGraph()
    r = g.add_resource("r")
    a = g.add_task("a", 1.0, (r,))
    b = g.add_task("b", 2.0, (r,))
    g.add_task("c", 4.0, (r,))
    g.add_dependency(a, b)
    assert longest_path_s(g) == 4.0
    assert run_tasks(g).makespan_s == 7.0


def test_critical_path_walks_dependencies_and_resources():
    # a [0,1] -> b [1,3] on r; c waits for r behind b: [3,4]; d depends on c: [4,4.5].
    g = TaskGraph()
    r = g.add_resource("r", policy="priority")
    a = g.add_task("a", 1.0, (r,), priority=0)
    b = g.add_task("b", 2.0, (r,), priority=1)
    c = g.add_task("c", 1.0, (r,), priority=2)
    d = g.add_task("d", 0.5, priority=3)
    g.add_dependency(a, b)
    g.add_dependency(a, c)
    g.add_dependency(c, d)
    result = build_result(g, run_tasks(g), devices=())
    path = [(p.name, p.via, p.wait_s) for p in result.critical_path]
    assert path == [("a", "start", 0.0), ("b", "dependency", 0.0), ("c", "resource", 0.0),
                    ("d", "dependency", 0.0)]
    assert result.step_time_s == 4.5 and result.dependency_bound_s == 3.0
    total = sum(p.end_s - p.start_s + p.wait_s for p in result.critical_path)
    assert close(total, result.step_time_s)


def test_long_queue_lets_single_tasks_pass_a_blocked_head():
    # r2 is held on [0, 10]; 35 two-resource tasks queue on r1 ahead of 5 one-resource tasks.
    # When r1 frees at 1, the singles run [1, 6]; the pairs wait for r2, then run [10, 45].
    g = TaskGraph()
    r1, r2 = g.add_resource("r1"), g.add_resource("r2")
    g.add_task("A", 1.0, (r1,))
    g.add_task("H", 10.0, (r2,))
    pairs = [g.add_task(f"M{i}", 1.0, (r1, r2)) for i in range(35)]
    singles = [g.add_task(f"S{j}", 1.0, (r1,)) for j in range(5)]
    s = run_tasks(g)
    assert [s.start_s[t] for t in singles] == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert [s.start_s[t] for t in pairs] == [10.0 + i for i in range(35)]
    assert s.makespan_s == 45.0


def test_float_priorities_are_ranked():
    g = TaskGraph()
    r = g.add_resource("r", policy="priority")
    late = g.add_task("late", 1.0, (r,), priority=2.5)
    early = g.add_task("early", 1.0, (r,), priority=-0.5)
    s = run_tasks(g)
    assert (s.start_s[early], s.start_s[late]) == (0.0, 1.0)
