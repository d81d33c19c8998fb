"""``trainsched.runtime.calibrate``: real gloo processes on this host."""

import time

import pytest

from trainsched.cluster import Cluster
from trainsched.errors import TrainschedError
from trainsched.runtime import Calibration, calibrate
from trainsched.runtime.calibrate import measurement_order
from trainsched.runtime.calibration import Row, fit

MiB = 2**20


@pytest.mark.timeout(180)
@pytest.mark.slow
def test_real_calibration_on_two_gloo_ranks():
    sizes = [4, 64 * 1024, 4 * MiB, 16 * MiB]
    cal = calibrate(world_size=2, sizes_bytes=sizes, repeats=5, warmup=2, timeout_s=120)
    assert isinstance(cal, Calibration)
    assert cal.backend == "gloo" and cal.world_size == 2
    assert [r.size_bytes for r in cal.rows] == sizes
    for row in cal.rows:
        assert row.p2p_s > 0 and row.allreduce_s > 0
    by_size = {r.size_bytes: r for r in cal.rows}
    # 16 MiB rather than 4 MiB: on a busy 2-core host a 4 B all-reduce can take milliseconds.
    assert by_size[16 * MiB].allreduce_s > by_size[4].allreduce_s
    assert by_size[16 * MiB].p2p_s > by_size[4].p2p_s
    for link in (cal.p2p, cal.allreduce):
        assert 1e7 < link.bandwidth_bytes_per_s < 1e11
        assert 1e-6 < link.latency_s < 0.1
    assert len(cal.p2p_errors) == len(cal.allreduce_errors) == len(sizes)
    for row, error in zip(cal.rows, cal.p2p_errors, strict=True):
        assert error == pytest.approx((cal.p2p_predict(row.size_bytes) - row.p2p_s) / row.p2p_s)

    data = cal.to_dict()
    assert data["p2p"]["latency_s"] == cal.p2p.latency_s
    assert [r["size_bytes"] for r in data["rows"]] == sizes
    assert "p2p_fit_error" in data["rows"][0]
    assert "4194304" in cal.table()

    cluster = cal.to_cluster()
    assert cluster.name == "calibrated"
    assert cluster.devices_per_node == 2 and cluster.num_devices == 2
    assert cluster.intra_node == cal.p2p
    # measured beside a matmul loop; on 2 ranks sharing this host's cores it is well above 0
    assert 0.0 <= cal.comm_compute_share <= 4.0
    assert 0.0 < cal.compute_rate_with_comm <= 1.0 and 0.0 < cal.comm_rate_with_compute <= 1.0
    assert 0.0 <= cal.collective_contention <= 1.0 and cal.collective_slots == 2  # gloo
    assert cluster.device.compute_rate_with_comm == cal.compute_rate_with_comm
    turns = cal.to_cluster(comm_model="turns")
    assert turns.device.comm_compute_share == cal.comm_compute_share
    assert data["comm_compute_share"] == cal.comm_compute_share
    assert "compute lost to communication" in cal.table() and "by rate" in cal.table()
    assert cal.memory_bandwidth_bytes_per_s is not None
    assert 1e8 < cal.memory_bandwidth_bytes_per_s < 1e13
    assert cluster.device.memory_bandwidth_bytes_per_s == cal.memory_bandwidth_bytes_per_s
    # a real DDP forward's buffer broadcast: a gloo collective, so more than a microsecond
    assert 1e-6 < cal.buffer_sync_s < 1.0
    assert cluster.device.buffer_sync_s == cal.buffer_sync_s == data["buffer_sync_s"]
    assert "DDP buffer broadcast before forward" in cal.table()
    # an all-reduce after a real training step, beyond the fit; clamped at 0, never negative
    assert 0.0 <= cal.collective_after_compute_s < 1.0
    assert cluster.device.collective_after_compute_s == cal.collective_after_compute_s
    assert data["collective_after_compute_s"] == cal.collective_after_compute_s
    assert 0.0 <= cal.collective_overhead_s < 1.0
    assert cluster.device.collective_overhead_s == cal.collective_overhead_s
    assert "an all-reduce right after compute" in cal.table()
    # the pipeline runtime's own host time, measured by running it (gloo)
    assert 0.0 < cal.pipeline_action_s < 1.0 and 0.0 < cal.pipeline_message_s < 1.0
    assert cluster.device.microbatch_overhead_s == cal.pipeline_action_s
    assert cluster.device.message_host_s == cal.pipeline_message_s
    assert data["pipeline_action_s"] == cal.pipeline_action_s
    assert "pipeline runtime:" in cal.table()
    assert "gloo" in cluster.description and cal.measured_at in cluster.description
    assert Cluster.from_dict(cluster.to_dict()) == cluster
    assert cal.to_cluster(name="here").name == "here"


@pytest.mark.timeout(180)
@pytest.mark.parametrize("fail_rank", [0, 1])
def test_a_dead_rank_fails_fast_instead_of_hanging(fail_rank):
    start = time.monotonic()
    with pytest.raises(TrainschedError, match=f"rank {fail_rank} of 2 exited with status 3"):
        calibrate(world_size=2, sizes_bytes=[4], repeats=1, warmup=0, timeout_s=60,
                  _fail_rank=fail_rank)
    assert time.monotonic() - start < 30


@pytest.mark.timeout(180)
def test_the_overall_timeout_is_enforced():
    start = time.monotonic()
    with pytest.raises(TrainschedError, match="did not finish within"):
        calibrate(world_size=2, sizes_bytes=[4], repeats=1000000, warmup=0, timeout_s=4)
    assert time.monotonic() - start < 30


@pytest.mark.parametrize("kwargs, message", [
    ({"world_size": 1}, "at least 2"),
    ({"world_size": 0}, "at least 2"),
    ({"world_size": 2.0}, "at least 2"),
    ({"sizes_bytes": []}, "at least one message size"),
    ({"sizes_bytes": [4, -8]}, "positive integers"),
    ({"sizes_bytes": [0]}, "positive integers"),
    ({"repeats": 0}, "repeats"),
    ({"warmup": -1}, "warm-up"),
    ({"backend": "mpi"}, "unknown backend"),
    ({"timeout_s": 0}, "timeout"),
])
def test_bad_arguments_raise_before_spawning(kwargs, message):
    with pytest.raises(TrainschedError, match=message):
        calibrate(**kwargs)


def test_fit_inverts_exact_alpha_beta_and_ring_data():
    n, alpha, bw = 4, 1e-4, 2e9
    sizes = [4, 1024, MiB, 4 * MiB, 16 * MiB]
    rows = [Row(size_bytes=s, p2p_s=alpha + s / bw,
                allreduce_s=2 * (n - 1) * alpha + 2 * (n - 1) / n * s / bw) for s in sizes]
    p2p, allreduce = fit(rows, n)
    assert p2p.bandwidth_bytes_per_s == pytest.approx(bw, rel=1e-6)
    assert allreduce.bandwidth_bytes_per_s == pytest.approx(bw, rel=1e-6)
    assert p2p.latency_s == pytest.approx(alpha, rel=1e-6)
    assert allreduce.latency_s == pytest.approx(alpha, rel=1e-6)


def test_fit_bounds_the_relative_error_where_one_small_size_is_an_outlier():
    # gloo-like data: ~2 ms at every small size except one fast outlier, ~1 GB/s beyond 1 MiB
    sizes = [4, 256, 4096, 65536, MiB, 4 * MiB, 16 * MiB, 64 * MiB]
    times = [2.0e-3, 0.1e-3, 2.1e-3, 2.2e-3, 3.0e-3, 6.0e-3, 18e-3, 66e-3]
    rows = [Row(size_bytes=s, p2p_s=t, allreduce_s=t) for s, t in zip(sizes, times, strict=True)]
    p2p, _ = fit(rows, 2)
    errors = [abs(p2p.latency_s + s / p2p.bandwidth_bytes_per_s - t) / t
              for s, t in zip(sizes, times, strict=True) if s != 256]
    assert max(errors) < 0.35
    assert 1.5e-3 < p2p.latency_s < 2.5e-3
    assert 0.9e9 < p2p.bandwidth_bytes_per_s < 1.3e9


def test_sizes_are_timed_round_robin_after_untimed_warm_up_rounds():
    # a host's slow periods last tens of milliseconds: every size is timed once per round
    order = measurement_order([64, 4, 1024], warmup=1, repeats=2)
    assert order == [(4, False), (64, False), (1024, False),
                     (4, True), (64, True), (1024, True),
                     (4, True), (64, True), (1024, True)]
