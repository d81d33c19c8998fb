"""Measured costs on a shared host: one thread on the CPU, disturbed phases timed again, and the
spread that is left reported by ``show``."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from trainsched.capture import capture  # noqa: E402
from trainsched.capture import profile as profile_module  # noqa: E402
from trainsched.graph import Graph, Op  # noqa: E402
from trainsched.report.graph_summary import describe_graph, graph_summary  # noqa: E402


def _scripted_clock(monkeypatch, durations):
    """Make the timer see ``durations`` (seconds) for successive timed calls."""
    ticks = []
    now = 0.0
    for d in durations:
        ticks += [now, now + d]
        now += d + 1.0
    it = iter(ticks)
    monkeypatch.setattr(profile_module.time, "perf_counter", lambda: next(it))


def _timed(monkeypatch, durations, repeats=3):
    _scripted_clock(monkeypatch, durations)
    calls = []
    runner = profile_module.StepRunner(None, measure=True, repeats=repeats)
    phase, _ = runner._time_phase(lambda: calls.append(1), profile_module.Phase())
    return runner, phase, len(calls)


def test_a_disturbed_round_is_timed_again_and_the_quieter_round_kept(monkeypatch):
    # Round 1: 1, 1, 5 s (p90/p10 = 5 > 2): timed again; round 2: 0.5 s each.
    runner, phase, calls = _timed(monkeypatch, [1.0, 1.0, 5.0, 0.5, 0.5, 0.5])
    assert (phase.median_s, phase.p10_s, phase.p90_s, phase.samples) == (0.5, 0.5, 0.5, 3)
    assert (runner.remeasured, runner.noisy, calls) == (1, 0, 6)


def test_a_quiet_round_is_timed_once(monkeypatch):
    runner, phase, calls = _timed(monkeypatch, [1.0, 1.0, 1.5])   # p90/p10 = 1.5 <= 2
    assert (phase.median_s, runner.remeasured, runner.noisy, calls) == (1.0, 0, 0, 3)


def test_a_phase_spread_in_every_round_is_counted_noisy(monkeypatch):
    runner, phase, calls = _timed(monkeypatch, [1.0, 1.0, 5.0] * 3)
    assert (phase.median_s, runner.remeasured, runner.noisy, calls) == (1.0, 2, 1, 9)


def _linear():
    torch.manual_seed(0)
    return torch.nn.Linear(8, 4), torch.randn(2, 8)


def test_measured_costs_on_the_cpu_default_to_one_thread_and_restore_torchs():
    before = torch.get_num_threads()
    torch.set_num_threads(2)   # the process's own setting differs from the default chosen
    try:
        model, x = _linear()
        graph = capture(model, x, costs="measured", device="cpu", repeats=1)
        assert graph.meta["threads"] == 1
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    assert {"remeasured_phases", "noisy_phases"} <= set(graph.meta)


def test_an_explicit_thread_count_is_kept():
    model, x = _linear()
    graph = capture(model, x, costs="measured", device="cpu", repeats=1, threads=2)
    assert graph.meta["threads"] == 2


def _spread_graph():
    # a: forward 1.0..1.2 (1.2x), dW 1.0..3.0 (3x); b: forward 2.0..2.2 (1.1x); c: not measured.
    return Graph([Op(name="a", compute_s=1.1, compute_p10_s=1.0, compute_p90_s=1.2,
                     backward_weight_s=2.0, backward_weight_p10_s=1.0,
                     backward_weight_p90_s=3.0, param_bytes=4),
                  Op(name="b", compute_s=2.1, compute_p10_s=2.0, compute_p90_s=2.2),
                  Op(name="c", compute_s=1.0)], [])


def test_show_reports_the_spread_of_measured_phases():
    spread = graph_summary(_spread_graph())["timing_spread"]
    assert spread["phases"] == 3
    assert spread["median_ratio"] == pytest.approx(1.2)
    assert spread["over_limit"] == 1
    assert spread["worst"] == {"op": "a", "phase": "dW", "ratio": pytest.approx(3.0)}


def test_the_spread_line_names_the_widest_phase():
    text = describe_graph(graph_summary(_spread_graph()), top=3)
    assert "p90/p10 median 1.20 over 3 measured phases; 1 above 2x (widest 3.0x: a dW)" in text


def test_a_graph_without_measured_times_has_no_spread():
    graph = Graph([Op(name="c", compute_s=1.0)], [])
    assert graph_summary(graph)["timing_spread"] is None
    assert "timing spread" not in describe_graph(graph_summary(graph), top=1)


@pytest.mark.parametrize(("beside", "line"), [
    (1, "  measured beside  1 other process capturing at once (as the ranks of a job on this "
        "host)"),
    (3, "  measured beside  3 other processes capturing at once (as the ranks of a job on this "
        "host)"),
])
def test_show_says_how_many_processes_captured_beside(beside, line):
    graph = Graph([Op(name="c", compute_s=1.0)], [], meta={"measured_beside": beside})
    assert line in describe_graph(graph_summary(graph), top=1).splitlines()


def test_a_capture_alone_says_nothing_of_others():
    graph = Graph([Op(name="c", compute_s=1.0)], [], meta={"measured_beside": 0})
    assert "measured beside" not in describe_graph(graph_summary(graph), top=1)


def test_show_says_how_many_captures_the_times_are_the_median_of():
    graph = Graph([Op(name="c", compute_s=1.0)], [], meta={"capture_passes": 3})
    assert ("  captured         3 times in a row; each op's times are the medians of its 3"
            in describe_graph(graph_summary(graph), top=1).splitlines())
    one = Graph([Op(name="c", compute_s=1.0)], [], meta={"capture_passes": 1})
    assert "captured " not in describe_graph(graph_summary(one), top=1)
