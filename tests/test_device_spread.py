"""The spread of compute speed across devices of one kind (``DeviceSpec.device_cv``): the V100
value derived by hand from the published measurement, its combination with the per-step
jitter (``step_cv``) on a hand-worked two-rank case, the kinds without a measurement, the file
field and its errors, and the report line that names both parts."""

from __future__ import annotations

import math

import pytest

from slowest_rank_graphs import MS, three_layers, two_ranks
from trainsched.cli import main
from trainsched.cluster import cluster_preset, device_kind
from trainsched.comm import FifoPolicy
from trainsched.costs import slowest_rank_factor
from trainsched.graph import Graph
from trainsched.sim import simulate_data_parallel

# the wire's rules alone: no pass of the scheduled runtime over a collective's bytes
FIFO = FifoPolicy(runtime_passes=False)


def test_v100_value_follows_from_the_published_spread_by_hand():
    """8% between Tukey's fences over the median. A normal's quartiles lie 0.67449 σ from its
    median (tables), so IQR = 1.34898 σ and the fences span 4 IQR = 5.39592 σ:
    cv = 0.08 / 5.39592 = 0.0148260."""
    assert device_kind("V100").device_cv == pytest.approx(0.0148260, abs=1e-7)


def test_eight_v100_wait_for_the_expected_slowest_by_hand():
    """E[max of 8 standard normals] = 1.4236 (tables): 1 + 0.0148260 · 1.4236 = 1.021106."""
    device = cluster_preset("p3.16xlarge").device
    assert slowest_rank_factor(device.slowest_rank_cv, 8) == pytest.approx(1.021106, abs=2e-6)


def test_device_and_step_draws_add_in_quadrature_by_hand():
    """device_cv 0.03 and step_cv 0.04: one normal of cv 0.05 per rank. On two ranks F = 1 +
    0.05/√π = 1.028209; the FIFO step of the three layers is 9.5F + 1 ms (forward 3F, the
    last dW at 8F, its all-reduce 1 ms, three SGD steps of 0.5F): 10.76799 ms."""
    result = simulate_data_parallel(three_layers(),
                                    two_ranks(device_cv=0.03, step_cv=0.04), ranks=2,
                                    policy=FIFO)
    assert math.isclose(result.step_time_s, 10.76799 * MS, rel_tol=1e-6)


def test_device_spread_alone_stretches_by_hand():
    """device_cv 0.1 alone: F = 1 + 0.1/√π = 1.056419; 9.5F + 1 ms = 11.03598 ms."""
    result = simulate_data_parallel(three_layers(), two_ranks(device_cv=0.1), ranks=2,
                                    policy=FIFO)
    assert math.isclose(result.step_time_s, 11.03598 * MS, rel_tol=1e-6)


def test_one_rank_is_never_stretched():
    """One rank waits for nobody: 8 ms of compute and 1.5 ms of SGD steps, 9.5 ms."""
    lone = simulate_data_parallel(three_layers(),
                                  two_ranks(device_cv=0.1), ranks=1, policy=FifoPolicy())
    assert math.isclose(lone.step_time_s, 9.5 * MS, rel_tol=1e-9)


@pytest.mark.parametrize("kind", ["A100", "H100", "rtx2080", "k80", "cpu"])
def test_kinds_without_a_measurement_have_none(kind):
    assert device_kind(kind).device_cv == 0


def test_report_names_both_parts(tmp_path, capsys):
    graph = three_layers()
    graph_path = tmp_path / "g.json"
    Graph(list(graph.ops), list(graph.edges), {"model": "hand"}).save(graph_path)
    cluster = tmp_path / "c.toml"
    cluster.write_text('[device]\nkind = "V100"\ncount = 2\ndevice_cv = 0.03\nstep_cv = 0.04\n'
                       '[intra_node]\nbandwidth = "1GB/s"\nlatency = "0s"\n')
    assert main(["simulate", str(graph_path), "--cluster", str(cluster), "--parallelism",
                 "data", "--ranks", "2"]) == 0
    out = capsys.readouterr().out
    assert ("compute x 1.0282 every step (step time varies by 5.00% per rank: device spread "
            "3.00% and step jitter 4.00%") in out
