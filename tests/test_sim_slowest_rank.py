"""The slowest rank of a synchronous step (``DeviceSpec.step_cv``): the expected maximum of N
standard normals against published values and closed forms, the stretch applied once per step
on a hand-worked two-rank case, nothing changed where it is 0, the file field and its errors,
and the report and trace that say when it was applied."""

from __future__ import annotations

import json
import math

import pytest

from slowest_rank_graphs import MS, three_layers, two_ranks
from trainsched.cli import main
from trainsched.cluster import cluster_preset, device_kind, load_cluster_file
from trainsched.comm import FifoPolicy
from trainsched.costs import expected_max_normal, slowest_rank_factor
from trainsched.errors import TrainschedError
from trainsched.graph import Graph
from trainsched.sim import simulate_data_parallel

# the wire's rules alone: no pass of the scheduled runtime over a collective's bytes
FIFO = FifoPolicy(runtime_passes=False)


@pytest.mark.parametrize(("n", "published"), [(2, 0.5642), (4, 1.0294), (8, 1.4236)])
def test_expected_max_matches_the_published_table(n, published):
    """Tables of expected normal order statistics (Harter 1961): 0.5642, 1.0294, 1.4236."""
    assert abs(expected_max_normal(n) - published) < 5e-5


def test_expected_max_matches_the_closed_forms():
    """One normal: its mean, 0. Two: 1/√π. Three: 3/(2√π) (both exact)."""
    assert expected_max_normal(1) == 0.0
    assert math.isclose(expected_max_normal(2), 1 / math.sqrt(math.pi), rel_tol=1e-12)
    assert math.isclose(expected_max_normal(3), 3 / (2 * math.sqrt(math.pi)), rel_tol=1e-12)


def test_the_stretch_is_applied_once_per_step_by_hand():
    """cv 0.1 on two ranks: F = 1 + 0.1/√π = 1.05642. FIFO, every op F ms long: forward ends
    3F, L2:dW ends 5F (c2 [5F, 5F+1]), L1:dW ends 7F (c1 [7F, 7F+1], 7F > 5F+1), L0:dW ends 8F
    (c0 [8F, 8F+1]); the barrier at 8F+1, then three SGD steps of 0.5F: 9.5F + 1 ms = 11.036
    ms. Three steps have the same period (the barrier: the next step starts when the SGD
    steps end): the factor is not compounded across steps."""
    f = 1 + 0.1 / math.sqrt(math.pi)
    cluster = two_ranks(step_cv=0.1)
    one = simulate_data_parallel(three_layers(), cluster, ranks=2, policy=FIFO)
    three = simulate_data_parallel(three_layers(), cluster, ranks=2, policy=FIFO,
                                   steps=3)
    assert math.isclose(one.step_time_s, (9.5 * f + 1) * MS, rel_tol=1e-9)
    assert math.isclose(three.step_time_s, (9.5 * f + 1) * MS, rel_tol=1e-9)


def test_the_stretch_multiplies_a_straggler():
    """Rank 1 twice as slow and cv 0.1: rank 1's ops take 2F ms, rank 0's F; every collective
    waits for rank 1, whose L0:dW ends 16F: c0 [16F, 16F+1], then rank 1's three SGD steps of
    2 · 0.5F: the step ends at 19F + 1 ms."""
    f = 1 + 0.1 / math.sqrt(math.pi)
    result = simulate_data_parallel(three_layers(), two_ranks(step_cv=0.1), ranks=2,
                                    policy=FIFO, stragglers={1: 2.0})
    assert math.isclose(result.step_time_s, (19 * f + 1) * MS, rel_tol=1e-9)


def test_one_rank_and_zero_cv_are_untouched():
    """One rank waits for nobody: the same result with cv 0.1 as with 0, the serial sum of 8
    ms (3 forward, 2 dX, 3 dW) and 1.5 ms of SGD steps: 9.5 ms."""
    lone = simulate_data_parallel(three_layers(),
                                  two_ranks(step_cv=0.1), ranks=1, policy=FifoPolicy())
    plain = simulate_data_parallel(three_layers(),
                                   two_ranks(step_cv=0.0), ranks=1, policy=FifoPolicy())
    assert lone.to_json() == plain.to_json()
    assert math.isclose(lone.step_time_s, 9.5 * MS, rel_tol=1e-9)
    assert slowest_rank_factor(0.0, 8) == 1.0 and slowest_rank_factor(0.1, 1) == 1.0


def test_catalogue_presets_leave_it_out_of_their_files():
    """No catalogue device has a source for it: 0, and absent from the written file."""
    assert all(device.step_cv == 0 for device in
               (device_kind(k) for k in ("V100", "A100", "H100", "cpu")))
    assert "step_cv" not in cluster_preset("p3.16xlarge").to_dict()["device"]


@pytest.mark.parametrize(("field", "described"), [
    ("step_cv", "step jitter"),
    ("device_cv", "differ in compute speed by 2.00%"),
])
def test_cv_file_round_trip(tmp_path, field, described):
    path = tmp_path / "c.toml"
    path.write_text(f'[device]\nkind = "V100"\ncount = 8\n{field} = 0.02\n'
                    '[intra_node]\nbandwidth = "150GB/s"\nlatency = "10us"\n')
    cluster = load_cluster_file(path)
    assert getattr(cluster.device, field) == 0.02
    again = tmp_path / "again.toml"
    again.write_text(cluster.to_toml())
    assert load_cluster_file(again) == cluster
    assert described in cluster.describe()


@pytest.mark.parametrize("field", ["step_cv", "device_cv"])
@pytest.mark.parametrize(("value", "needle"), [
    ("0.5", "must be a number in [0, 0.3]"),
    ('"2%"', "expected a number (the coefficient of variation"),
    ("-0.01", "must be a number in [0, 0.3]"),
])
def test_bad_cv_names_file_and_field(tmp_path, field, value, needle):
    path = tmp_path / "c.toml"
    path.write_text(f'[device]\nkind = "V100"\ncount = 8\n{field} = {value}\n'
                    '[intra_node]\nbandwidth = "150GB/s"\nlatency = "10us"\n')
    with pytest.raises(TrainschedError) as err:
        load_cluster_file(path)
    assert str(path) in str(err.value) and needle in str(err.value) and field in str(err.value)


def _cli_files(tmp_path, step_cv):
    graph = three_layers()
    graph_path = tmp_path / "g.json"
    Graph(list(graph.ops), list(graph.edges), {"model": "hand"}).save(graph_path)
    cluster = tmp_path / "c.toml"
    cluster.write_text(f'[device]\nkind = "V100"\ncount = 2\nstep_cv = {step_cv}\n'
                       'device_cv = 0\n[intra_node]\nbandwidth = "1GB/s"\nlatency = "0s"\n')
    return graph_path, cluster


def test_report_and_trace_say_when_it_is_applied(tmp_path, capsys):
    graph_path, cluster = _cli_files(tmp_path, 0.1)
    trace = tmp_path / "t.json"
    argv = ["simulate", str(graph_path), "--cluster", str(cluster), "--parallelism", "data",
            "--ranks", "2"]
    assert main([*argv, "--trace", str(trace)]) == 0
    assert "slowest rank     compute x 1.0564 every step" in capsys.readouterr().out
    header = json.loads(trace.read_text())["otherData"]
    assert header["slowest_rank"]["factor"] == pytest.approx(1 + 0.1 / math.sqrt(math.pi))
    assert main([*argv, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["slowest_rank"]["ranks"] == 2


def test_report_and_trace_are_silent_without_it(tmp_path, capsys):
    graph_path, cluster = _cli_files(tmp_path, 0)
    trace = tmp_path / "t.json"
    assert main(["simulate", str(graph_path), "--cluster", str(cluster), "--parallelism",
                 "data", "--ranks", "2", "--trace", str(trace)]) == 0
    assert "slowest rank" not in capsys.readouterr().out
    assert "slowest_rank" not in json.loads(trace.read_text())["otherData"]


def test_the_crossing_bound_is_stretched_like_the_simulation():
    """Alone, L0 starts at 0 and L0:dW ends at 8 ms; its gradient's all-reduce takes 1 ms and
    its SGD step 0.5 ms: 9.5 ms, the longest loop. Stretched by F = 1 + 0.1/√π: 8F + 1 + 0.5F.
    FIFO stays above it (9.5F + 1: its barrier puts all three SGD steps after c0)."""
    from trainsched.sim import crossing_bound_s

    f = 1 + 0.1 / math.sqrt(math.pi)
    bound, gradient = crossing_bound_s(three_layers(), two_ranks(step_cv=0.1), ranks=2)
    assert gradient == "L0:grad"
    assert math.isclose(bound, (8.5 * f + 1) * MS, rel_tol=1e-9)
