"""Engine gates on hand-worked task graphs: held tasks, releases now and later, owned resources,
watched ends, a never-released task in the stuck error, and no change when a gate holds
nothing."""

from __future__ import annotations

import random

import pytest

from trainsched.errors import TrainschedError
from trainsched.sim import Replay, TaskGraph, run_tasks


class ReleaseAt:
    """Holds ``release_at``'s tasks and releases each, once ready, at its time there (or at the
    flush, if that is later), reporting it as fixed by nothing; logs what it hears."""

    name = "the test gate"

    def __init__(self, release_at: dict[int, float], *, owns: tuple[int, ...] = (),
                 watches: tuple[int, ...] = ()) -> None:
        self.release_at = release_at
        self.held = list(release_at)
        self.resources = list(owns)
        self.watched = list(watches)
        self.ready_log: list[tuple[int, float, int]] = []
        self.end_log: list[tuple[int, float]] = []
        self.waiting: list[int] = []

    def on_ready(self, task: int, now: float, by: int) -> None:
        self.ready_log.append((task, now, by))
        self.waiting.append(task)

    def on_end(self, task: int, now: float) -> None:
        self.end_log.append((task, now))

    def flush(self, now: float) -> list[tuple[int, float, int, bool]]:
        out = [(t, max(now, self.release_at[t]), -1, False) for t in self.waiting]
        self.waiting = []
        return out

    def busy_s(self) -> dict[int, float]:
        return dict.fromkeys(self.resources, 1.5)


def test_a_held_task_without_resources_runs_from_its_release_time():
    g = TaskGraph()
    a = g.add_task("a", 1.0)
    b = g.add_task("b", 2.0)
    g.add_dependency(a, b)
    gate = ReleaseAt({b: 5.0})
    s = run_tasks(g, (gate,))
    assert gate.ready_log == [(b, 1.0, a)]  # told when b became ready, and by whom
    assert (s.start_s[b], s.end_s[b], s.fixed_by[b], s.makespan_s) == (5.0, 7.0, -1, 7.0)


def test_a_task_released_for_later_queues_only_from_then():
    # r is free from 0; h (ready at 0) is released at 3, so z, ready at 2, takes r first.
    g = TaskGraph()
    r = g.add_resource("r", policy="priority")
    h = g.add_task("h", 1.0, (r,), priority=0)
    wait = g.add_task("wait", 2.0)
    z = g.add_task("z", 4.0, (r,), priority=1)
    g.add_dependency(wait, z)
    s = run_tasks(g, (ReleaseAt({h: 3.0}),))
    assert (s.start_s[z], s.start_s[h]) == (2.0, 6.0)
    assert (s.fixed_by[h], s.by_resource[h]) == (z, True)  # it waited for r after its release


def test_a_task_released_now_competes_in_the_same_instant():
    # h and k are both ready at 1 on a priority queue; h, released at 1, is more urgent.
    g = TaskGraph()
    r = g.add_resource("r", policy="priority")
    first = g.add_task("first", 1.0)
    h = g.add_task("h", 1.0, (r,), priority=0)
    k = g.add_task("k", 1.0, (r,), priority=5)
    g.add_dependency(first, h)
    g.add_dependency(first, k)
    s = run_tasks(g, (ReleaseAt({h: 0.0}),))
    assert (s.start_s[h], s.start_s[k]) == (1.0, 2.0)


def test_resources_a_gate_owns_do_not_serialise_and_report_its_busy_time():
    g = TaskGraph()
    wire = g.add_resource("wire", kind="channel")
    p = g.add_task("p", 2.0, (wire,))
    q = g.add_task("q", 2.0, (wire,))
    s = run_tasks(g, (ReleaseAt({p: 1.0, q: 1.0}, owns=(wire,)),))
    assert (s.start_s[p], s.start_s[q]) == (1.0, 1.0)
    assert s.busy_s[wire] == 1.5


def test_a_gate_hears_the_ends_of_the_tasks_it_watches():
    g = TaskGraph()
    a = g.add_task("a", 1.0)
    b = g.add_task("b", 0.5)
    c = g.add_task("c", 2.0)
    g.add_dependency(a, c)
    gate = ReleaseAt({}, watches=(c, b))
    run_tasks(g, (gate,))
    assert gate.end_log == [(b, 0.5), (c, 3.0)]


def test_a_task_never_released_is_named_as_held():
    class Never(ReleaseAt):
        def flush(self, now: float) -> list[tuple[int, float, int, bool]]:
            return []

    g = TaskGraph()
    a = g.add_task("a", 1.0)
    g.add_task("stays", 1.0)
    b = g.add_task("after", 1.0)
    g.add_dependency(a, b)
    with pytest.raises(TrainschedError, match="stays is held by the test gate") as err:
        run_tasks(g, (Never({1: 0.0}),))
    assert "1 of 3 tasks never ran" in str(err.value)


def random_graph(seed: int) -> TaskGraph:
    rng = random.Random(seed)
    g = TaskGraph()
    rs = [g.add_resource(f"r{k}", policy=rng.choice(["fifo", "priority"])) for k in range(3)]
    for i in range(60):
        t = g.add_task(f"t{i}", rng.choice([0.0, 0.5, 1.0, rng.random()]),
                       rng.sample(rs, rng.choice([0, 1, 1, 2])), priority=rng.randint(-3, 9))
        for _ in range(rng.randint(0, 2)) if i else ():
            g.add_dependency(rng.randrange(max(0, i - 10), i), t)
    return g


@pytest.mark.parametrize("seed", range(5))
def test_a_gate_holding_nothing_changes_nothing(seed):
    g = random_graph(seed)
    plain = run_tasks(g)
    gated = run_tasks(g, (ReleaseAt({}, watches=tuple(range(0, 60, 3))),))
    assert isinstance(gated, Replay) and gated == plain
