"""The pipeline executor against closed forms; memory of GPipe vs 1F1B; errors; determinism."""

from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import sys
import textwrap
from dataclasses import replace

import pytest

from trainsched.backprop.schedules import bubble_fraction_ideal, gpipe, one_f_one_b
from trainsched.backprop.stages import uniform_stages
from trainsched.cluster import Link, cluster_from_flags
from trainsched.costs import p2p_s
from trainsched.errors import TrainschedError
from trainsched.graph import Graph, Op
from trainsched.plan import Schedule
from trainsched.sim import (
    PipelineResult,
    SimResult,
    bubble_fraction,
    chrome_trace,
    simulate_pipeline,
    simulate_single,
    trace_json,
)

MB = 1_000_000  # 1 ms on a 1 GB/s link


def close(actual: float, expected: float) -> bool:
    return math.isclose(actual, expected, rel_tol=1e-9, abs_tol=1e-15)


def free_cluster(devices: int):
    """Communication costs (next to) nothing: huge bandwidth, zero latency."""
    cluster = cluster_from_flags(devices=devices, memory="1TiB", bandwidth="1GB/s", latency="0s")
    return replace(cluster, intra_node=Link(bandwidth_bytes_per_s=1e30, latency_s=0.0))


def make_cluster(devices: int, comm: str = "parallel", latency: str = "10us"):
    return cluster_from_flags(devices=devices, memory="1GiB", bandwidth="1GB/s", latency=latency,
                              comm=comm)


def task(result, name):
    return next(t for t in result.tasks if t.name == name)


# --- closed forms ----------------------------------------------------------------------------


@pytest.mark.parametrize("build", [gpipe, one_f_one_b])
@pytest.mark.parametrize("p", [2, 4])
@pytest.mark.parametrize("m", [1, 4, 8])
def test_fill_drain_closed_form(build, p, m):
    f, b = 1.25e-3, 2.5e-3  # B = I + W = 1e-3 + 1.5e-3
    stages = uniform_stages(p, f, 1e-3, 1.5e-3)
    for cluster in (free_cluster(p), None):
        result = simulate_pipeline(stages, build(p, m), cluster)
        assert isinstance(result, PipelineResult) and isinstance(result, SimResult)
        assert close(result.step_time_s, (m + p - 1) * (f + b))
        assert close(result.bubble_fraction, (p - 1) / (m + p - 1))
        assert close(result.bubble_fraction, bubble_fraction_ideal(p, m))
        assert close(bubble_fraction(result), result.bubble_fraction)
        assert all(close(busy, m * (f + b)) for busy in result.rank_busy_s)
        assert all(close(idle, (p - 1) * (f + b)) for idle in result.rank_idle_s)
        assert result.dependency_bound_s <= result.step_time_s * (1 + 1e-12)


def test_split_backward_hand_worked_p2_m2():
    # 1F1B split, p = 2, m = 2, F = 1, I = 2, W = 3 (ms), free communication:
    #   rank 0: 0F0 0F1 0I0 0W0 0I1 0W1      rank 1: 1F0 1I0 1W0 1F1 1I1 1W1
    #   rank 1: F0 [1,2] I0 [2,4] W0 [4,7] F1 [7,8] I1 [8,10] W1 [10,13]
    #   rank 0: F0 [0,1] F1 [1,2] I0 [4,6] W0 [6,9] I1 [10,12] W1 [12,15]
    # step = 3F + 3I + 2W = 15 ms = (m + p - 1)(F + I + W) - (p - 1) W.
    f, i, w = 1e-3, 2e-3, 3e-3
    schedule = one_f_one_b(2, 2, split_backward=True)
    assert schedule.to_text() == "0F0 0F1 0I0 0W0 0I1 0W1\n1F0 1I0 1W0 1F1 1I1 1W1\n"
    result = simulate_pipeline(uniform_stages(2, f, i, w), schedule, free_cluster(2))
    assert close(result.step_time_s, 15e-3)
    expected = {"0I0": (4e-3, 6e-3), "0I1": (10e-3, 12e-3), "1F1": (7e-3, 8e-3),
                "1W1": (10e-3, 13e-3), "0W1": (12e-3, 15e-3)}
    for name, (start, end) in expected.items():
        t = task(result, name)
        assert close(t.start_s, start) and close(t.end_s, end), name
    busy = 2 * (f + i + w)
    assert close(result.bubble_fraction, (2 * 15e-3 - 2 * busy) / (2 * 15e-3))
    # GPipe with the same split gives the same step here.
    assert close(simulate_pipeline(uniform_stages(2, f, i, w), gpipe(2, 2, True)).step_time_s,
                 15e-3)


@pytest.mark.parametrize("comm", ["parallel", "sequential"])
def test_communication_adds_two_transfers_for_p2_m1(comm):
    # rank 0: F [0, f]; activation x; rank 1: F [f+x, 2f+x], B [.., 2f+x+b]; gradient x;
    # rank 0: B [2f+2x+b, 2f+2x+2b]. Step = 2(f + b) + 2x, x = α + S/B.
    f, b = 1e-3, 2e-3
    cluster = make_cluster(2, comm)
    x = p2p_s(3 * MB, cluster.link(0, 1))
    assert close(x, 3e-3 + 10e-6)
    stages = uniform_stages(2, f, b / 2, b / 2, activation_bytes=3 * MB)
    free = simulate_pipeline(uniform_stages(2, f, b / 2, b / 2), one_f_one_b(2, 1), cluster)
    result = simulate_pipeline(stages, one_f_one_b(2, 1), cluster)
    assert close(free.step_time_s, 2 * (f + b))
    assert close(result.step_time_s - free.step_time_s, 2 * x)
    assert close(result.step_time_s, 2 * (f + b) + 2 * x)
    sends = [t for t in result.tasks if t.category == "comm"]
    assert [t.name for t in sends] == ["0SEND_F0->gpu1", "1SEND_B0->gpu0"]
    assert close(task(result, "0SEND_F0->gpu1").start_s, f)
    assert close(task(result, "0B0").start_s, 2 * f + 2 * x + b)
    assert close(result.exposed_comm_s, 2 * x)
    assert [p.name for p in result.critical_path] == [
        "0F0", "0SEND_F0->gpu1", "1F0", "1B0", "1SEND_B0->gpu0", "0B0"]


def test_stages_on_one_device_communicate_for_free():
    # Both ranks on one device: the boundary is free and the ranks share one compute stream.
    stages = uniform_stages(2, 1e-3, 1e-3, 1e-3, activation_bytes=MB)
    result = simulate_pipeline(stages, one_f_one_b(2, 3), make_cluster(2),
                               ranks_to_devices=[1, 1])
    assert not [t for t in result.tasks if t.category == "comm"]
    assert result.devices == ("gpu1",) and result.rank_devices == ("gpu1", "gpu1")
    # One stream runs all 2 * 3 * (F + B) = 18 ms of work back to back.
    assert close(result.step_time_s, 18e-3)


def test_more_stages_than_ranks_loop_placement():
    # 4 stages on 2 ranks (stage s on rank s % 2): the boundaries 0->1, 1->2, 2->3 all cross.
    text = ("0F0 2F0 2B0 0B0\n"
            "1F0 3F0 3B0 1B0\n")
    schedule = Schedule.from_text(text)
    assert schedule.stage_to_rank == (0, 1, 0, 1)
    result = simulate_pipeline(uniform_stages(4, 1e-3, 1e-3, 1e-3), schedule, free_cluster(2))
    assert close(result.step_time_s, 4 * 1e-3 + 4 * 2e-3)  # a chain through all 8 actions
    assert len([t for t in result.tasks if t.category == "comm"]) == 6


# --- memory ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("p", "m"), [(2, 4), (4, 8), (4, 4)])
def test_1f1b_holds_fewer_activations_than_gpipe(p, m):
    saved, resident = 1000, 7
    stages = uniform_stages(p, 1e-3, 1e-3, 1e-3, saved_bytes=saved, param_bytes=resident)
    cluster = free_cluster(p)
    g = simulate_pipeline(stages, gpipe(p, m), cluster)
    o = simulate_pipeline(stages, one_f_one_b(p, m), cluster)
    # Resident: parameters + gradients. GPipe: m micro-batches in flight on rank 0; 1F1B: p.
    assert g.peak_memory_bytes["gpu0"] == 2 * resident + m * saved
    assert o.peak_memory_bytes["gpu0"] == 2 * resident + min(m, p) * saved
    if m > p:
        assert o.peak_memory_bytes["gpu0"] < g.peak_memory_bytes["gpu0"]
    for r in range(p):  # 1F1B rank r holds min(m, p - r)
        assert o.peak_memory_bytes[f"gpu{r}"] == 2 * resident + min(m, p - r) * saved
    assert g.peak_op["gpu0"] == f"0F{m - 1}"


def test_split_frees_the_input_grad_share_at_i():
    # One stage, m = 1: 0F0 0I0 0W0 with 1000 saved bytes; 0.25 of it freed at I.
    schedule = Schedule.from_text("0F0 0I0 0W0\n")
    stages = uniform_stages(1, 1e-3, 1e-3, 1e-3, saved_bytes=1000)
    result = simulate_pipeline(stages, schedule, input_grad_only_fraction=0.25)
    assert result.memory_timeline["device0"] == ((0.0, 1000), (2e-3, 750), (3e-3, 0))
    fused = simulate_pipeline(stages, Schedule.from_text("0F0 0B0\n"))
    assert fused.memory_timeline["device0"] == ((0.0, 1000), (3e-3, 0))
    with pytest.raises(TrainschedError, match="input_grad_only_fraction"):
        simulate_pipeline(stages, schedule, input_grad_only_fraction=1.5)


def test_activation_buffers_on_both_sides_of_a_transfer():
    cluster = make_cluster(2)
    stages = uniform_stages(2, 1e-3, 1e-3, 1e-3, activation_bytes=MB)
    result = simulate_pipeline(stages, one_f_one_b(2, 1), cluster)
    x = p2p_s(MB, cluster.link(0, 1))
    # gpu0: its output from 0 until the send ends; the gradient from its arrival until 0B0 ends.
    assert result.memory_timeline["gpu0"][:3] == ((0.0, MB), (1e-3 + x, 0),
                                                  (task(result, "1SEND_B0->gpu0").start_s, MB))
    # gpu1 frees its received input when 1F0 ends, before 1B0 allocates the gradient.
    assert result.peak_memory_bytes == {"gpu0": MB, "gpu1": MB}


# --- errors ----------------------------------------------------------------------------------


@pytest.mark.timeout(20)
def test_a_deadlocking_schedule_raises():
    schedule = Schedule.from_text("0F0 0B0 0F1 0B1\n1F0 1F1 1B0 1B1\n")
    with pytest.raises(TrainschedError, match="schedule deadlocks"):
        simulate_pipeline(uniform_stages(2, 1e-3, 1e-3, 1e-3), schedule, make_cluster(2))


def test_mismatches_are_user_errors():
    stages = uniform_stages(2, 1e-3, 1e-3, 1e-3)
    with pytest.raises(TrainschedError, match="have 3 stages but the schedule has 2"):
        simulate_pipeline(uniform_stages(3, 1e-3, 1e-3, 1e-3), gpipe(2, 2))
    with pytest.raises(TrainschedError, match="4 ranks but cluster"):
        simulate_pipeline(uniform_stages(4, 1e-3, 1e-3, 1e-3), gpipe(4, 2), make_cluster(2))
    with pytest.raises(TrainschedError, match="ranks_to_devices has 1 entries"):
        simulate_pipeline(stages, gpipe(2, 2), make_cluster(2), ranks_to_devices=[0])
    with pytest.raises(TrainschedError, match=r"ranks_to_devices\[1\]: device 5"):
        simulate_pipeline(stages, gpipe(2, 2), make_cluster(2), ranks_to_devices=[0, 5])
    with pytest.raises(TrainschedError, match="schedule is invalid"):
        simulate_pipeline(stages, Schedule.from_text("0F0 0B0\n1F0\n"))
    with pytest.raises(TrainschedError, match="stages must be StageCosts"):
        simulate_pipeline("x", gpipe(2, 2))  # type: ignore[arg-type]
    with pytest.raises(TrainschedError, match="per micro-batch of 4"):
        simulate_pipeline(replace(stages, num_microbatches=4), gpipe(2, 2))


# --- other results, trace, determinism -------------------------------------------------------


def test_bubble_fraction_of_a_plain_result():
    g = Graph([Op(name="a", compute_s=1.0)], [])
    assert bubble_fraction(simulate_single(g, allow_forward_only=True)) == 0.0


def test_trace_has_one_process_per_rank():
    p = 3
    stages = uniform_stages(p, 1e-3, 1e-3, 1e-3, activation_bytes=MB)
    result = simulate_pipeline(stages, one_f_one_b(p, 4, split_backward=True), make_cluster(4))
    trace = chrome_trace(result)
    names = [e["args"]["name"] for e in trace["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_name"]
    assert names == ["gpu0", "gpu1", "gpu2"]
    slices = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["cat"] != "comm"]
    assert len(slices) == p * 4 * 3
    assert {e["args"]["rank"] for e in slices} == {0, 1, 2}
    assert {e["cat"] for e in slices} == {"forward", "backward_input", "backward_weight"}
    doc = json.loads(result.to_json())
    assert doc["bubble_fraction"] == result.bubble_fraction
    assert doc["rank_devices"] == ["gpu0", "gpu1", "gpu2"]


SCRIPT = textwrap.dedent("""
    import hashlib, sys
    from trainsched.backprop.schedules import one_f_one_b
    from trainsched.cluster import Link, cluster_from_flags
    from trainsched.sim import simulate_pipeline, trace_json
    from trainsched.backprop.stages import uniform_stages
    cluster = cluster_from_flags(devices=4, memory="1GiB", bandwidth="1GB/s", latency="10us",
                                 comm="sequential")
    stages = uniform_stages(4, 1e-3, 7e-4, 9e-4, activation_bytes=123456, saved_bytes=999)
    result = simulate_pipeline(stages, one_f_one_b(4, 6, split_backward=True), cluster)
    sys.stdout.write(hashlib.sha256(result.to_json().encode()).hexdigest() + " "
                     + hashlib.sha256(trace_json(result).encode()).hexdigest())
""")


def test_deterministic_across_processes():
    cluster = make_cluster(4, "sequential")
    stages = uniform_stages(4, 1e-3, 7e-4, 9e-4, activation_bytes=123456, saved_bytes=999)
    schedule = one_f_one_b(4, 6, split_backward=True)
    one = simulate_pipeline(stages, schedule, cluster)
    two = simulate_pipeline(stages, schedule, cluster)
    assert one.to_json() == two.to_json() and trace_json(one) == trace_json(two)
    outputs = set()
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        run = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                             env=env, timeout=120, check=True)
        outputs.add(run.stdout)
    assert len(outputs) == 1
    here = (hashlib.sha256(one.to_json().encode()).hexdigest() + " "
            + hashlib.sha256(trace_json(one).encode()).hexdigest())
    assert outputs == {here}
