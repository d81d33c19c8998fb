"""A calibrated cluster file carries every fitted quantity, and the simulator uses them: the
all-reduce fit for collectives, the interference of compute and communication (by rate, or γ
when the file takes turns), the copy bandwidth."""

from __future__ import annotations

import dataclasses
import json

import pytest

from trainsched.cluster import Cluster, Link
from trainsched.errors import TrainschedError
from trainsched.sim.data_parallel import collective_s

torch = pytest.importorskip("torch")

from trainsched.runtime import Calibration  # noqa: E402
from trainsched.runtime.calibration import Row  # noqa: E402

P2P = Link(bandwidth_bytes_per_s=4e9, latency_s=20e-6)
ALLREDUCE = Link(bandwidth_bytes_per_s=1e9, latency_s=100e-6)


def _calibration() -> Calibration:
    rows = (Row(size_bytes=4, p2p_s=2e-5, allreduce_s=2e-4),
            Row(size_bytes=1 << 20, p2p_s=3e-4, allreduce_s=1.2e-3))
    return Calibration(backend="gloo", world_size=2, host={"hostname": "h"},
                       measured_at="2026-11-25T00:00:00Z", repeats=5, warmup=2, rows=rows,
                       p2p=P2P, allreduce=ALLREDUCE, p2p_errors=(0.0, 0.0),
                       allreduce_errors=(0.0, 0.0), comm_compute_share=0.7,
                       memory_bandwidth_bytes_per_s=5e9, compute_rate_with_comm=0.6,
                       comm_rate_with_compute=0.3, collective_slots=2,
                       collective_contention=0.9, buffer_sync_s=1.2e-3,
                       collective_after_compute_s=2.5e-3, pipeline_action_s=3.4e-4,
                       pipeline_message_s=1.5e-4)


def test_the_cluster_file_carries_every_fitted_quantity():
    cluster = Cluster.from_dict(json.loads(_calibration().to_cluster().to_json()))
    assert cluster.intra_node == P2P
    assert cluster.collectives == ALLREDUCE
    dev = cluster.device
    assert (dev.compute_rate_with_comm, dev.comm_rate_with_compute, dev.collective_slots,
            dev.collective_contention) == (0.6, 0.3, 2, 0.9)
    assert dev.comm_compute_share == 0.0  # by rate, not take turns as well
    assert dev.memory_bandwidth_bytes_per_s == 5e9
    assert dev.buffer_sync_s == 1.2e-3
    assert dev.collective_after_compute_s == 2.5e-3
    assert (dev.microbatch_overhead_s, dev.message_host_s) == (3.4e-4, 1.5e-4)


def test_the_take_turns_file_carries_gamma_and_no_rates():
    text = _calibration().to_cluster(comm_model="turns").to_json()
    dev = Cluster.from_dict(json.loads(text)).device
    assert dev.comm_compute_share == 0.7 and not dev.comm_by_rate
    with pytest.raises(TrainschedError, match="comm_model must be one of rates, turns"):
        _calibration().to_cluster(comm_model="both")


def test_collectives_run_at_the_all_reduce_fit_not_the_point_to_point_line():
    cluster = Cluster.from_dict(json.loads(_calibration().to_cluster().to_json()))
    size = 8 << 20
    # ring over 2 ranks: 2(n-1)·α + 2(n-1)/n · S/B = 2·100 µs + 8 MiB / 1 GB/s
    expected = 2 * 100e-6 + size / 1e9
    assert collective_s(size, 2, cluster) == pytest.approx(expected, rel=1e-12)


def test_a_cluster_without_a_collective_fit_uses_its_intra_node_link():
    cluster = Cluster.from_dict(json.loads(_calibration().to_cluster().to_json()))
    plain = Cluster(name="p", device=cluster.device, devices_per_node=2, intra_node=P2P)
    size = 8 << 20
    assert collective_s(size, 2, plain) == pytest.approx(2 * 20e-6 + size / 4e9, rel=1e-12)


def test_describe_names_the_collective_fit():
    text = _calibration().to_cluster().describe()
    assert "collectives" in text and "fitted to measured all-reduces" in text


@pytest.mark.parametrize(("measured_s", "expected_s"), [(4.0e-3, 4.0e-3 - 1.248576e-3),
                                                        (0.5e-3, 0.0)])
def test_the_after_compute_figure_is_what_the_fit_does_not_charge(measured_s, expected_s):
    """An all-reduce of 1 MiB on 2 ranks costs 2 x 100 us + 1 MiB / 1 GB/s = 1.248576 ms by the
    fit; measured after a step at 4 ms, the device carries the 2.751424 ms beyond it, and a
    faster measurement than the fit carries 0, never a negative figure."""
    from trainsched.runtime.calibration import with_after_compute

    cal = with_after_compute(_calibration(), [1 << 20, measured_s])
    assert cal.collective_after_compute_s == pytest.approx(expected_s, abs=1e-12)
    assert with_after_compute(_calibration(), None) == _calibration()


def test_the_overhead_is_what_each_extra_collective_costs_beyond_the_fit():
    """By the fit (2 x 100 us + S / 1 GB/s on 2 ranks) collectives of 1, 1 and 2 MB cost 4.6
    ms one by one and 4.2 ms as one of 4 MB: 0.4 ms apart. Measured 2.4 ms apart, the two
    collectives beyond the first carry (2.4 - 0.4) / 2 = 1.0 ms each; measured closer than the
    fit, 0."""
    from trainsched.runtime.calibration import with_overhead

    sizes = [1_000_000, 1_000_000, 2_000_000]
    cal = with_overhead(_calibration(), [sizes, 2.4e-3])
    assert cal.collective_overhead_s == pytest.approx(1.0e-3, rel=1e-12)
    assert cal.to_cluster().device.collective_overhead_s == cal.collective_overhead_s
    assert cal.to_dict()["collective_overhead_s"] == cal.collective_overhead_s
    assert "+1.000 ms beyond the fit" in cal.table()
    assert with_overhead(_calibration(), [sizes, 0.2e-3]).collective_overhead_s == 0.0
    assert with_overhead(_calibration(), None) == _calibration()


def test_the_host_time_is_the_processor_time_of_each_extra_collective():
    """Three collectives of 1, 1 and 2 MB took 3.0 ms more processor time per step than one
    of their 4 MB: the bytes cost both alike, so each of the two extra collectives took 1.5
    ms; less processor time than the single collective (noise) reads 0."""
    from trainsched.runtime.calibration import with_overhead

    sizes = [1_000_000, 1_000_000, 2_000_000]
    cal = with_overhead(_calibration(), [sizes, 2.4e-3, 3.0e-3])
    assert cal.collective_host_s == pytest.approx(1.5e-3, rel=1e-12)
    assert cal.collective_overhead_s == pytest.approx(1.0e-3, rel=1e-12)
    assert cal.to_cluster().device.collective_host_s == cal.collective_host_s
    assert cal.to_dict()["collective_host_s"] == cal.collective_host_s
    assert "1.500 ms of processor time" in cal.table()
    assert with_overhead(_calibration(), [sizes, 2.4e-3, -1e-4]).collective_host_s == 0.0
    assert with_overhead(_calibration(), [sizes, 2.4e-3]).collective_host_s == 0.0


def test_gamma_and_the_rate_keep_only_what_the_host_time_does_not_charge():
    """The interference probe lost 12 ms of compute beside 10 all-reduces that took 30 ms
    alone and 40 ms beside it: γ = 0.4, r = 0.7. With 0.5 ms of processor time per
    collective charged on its own, 5 ms of the 12 are that: γ' = 7 / 30, r' = 1 − 7 / 40
    = 0.825. A host time above the whole loss leaves γ' 0 and r' 1; no host time, or no
    figures from the probe, leaves both alone."""
    from trainsched.runtime.calibration import beyond_host_time

    rates = {"count": 10, "comm_alone_s": 0.030, "comm_beside_s": 0.040}
    share, rate = beyond_host_time(0.4, 0.7, rates, 0.5e-3)
    assert share == pytest.approx(7 / 30, rel=1e-12) and rate == pytest.approx(0.825, rel=1e-12)
    assert beyond_host_time(0.4, 0.7, rates, 2e-3) == (0.0, 1.0)
    assert beyond_host_time(0.4, 0.7, rates, 0.0) == (0.4, 0.7)
    assert beyond_host_time(0.4, 0.7, {}, 0.5e-3) == (0.4, 0.7)


def test_the_collectives_rates_are_read_on_their_bytes_alone():
    """10 all-reduces of 1 ms start-up each took 30 ms alone and 50 ms beside compute: their
    bytes, 20 ms of work, took 40 ms, rate 0.5 (the whole: 0.6). Two at once took 1.6 times one
    of 11 ms (ρ 0.6): after their 1 ms start-ups side by side, 6.6 ms more over 10 ms of bytes,
    ρ' 0.66. Start-ups that leave no bytes, or missing figures, change nothing."""
    from trainsched.runtime.calibration import beyond_startup

    rates = {"comm": 0.6, "count": 10, "comm_alone_s": 0.030, "comm_beside_s": 0.050,
             "contention": 0.6, "contention_alone_s": 0.011}
    out = beyond_startup(rates, 1e-3)
    assert out["comm"] == pytest.approx(0.5, rel=1e-12)
    assert out["contention"] == pytest.approx(0.66, rel=1e-12)
    assert beyond_startup(rates, 0.02) == {}
    assert beyond_startup({"comm": 0.6, "contention": 0.6}, 1e-3) == {}


def test_the_overhead_needs_two_collectives():
    from trainsched.runtime.calibration import overhead_from_steps

    with pytest.raises(TrainschedError, match="at least 2 collectives, got 1"):
        overhead_from_steps([1024], 1e-3, lambda s: 0.0)
    from trainsched.runtime.calibration import host_from_steps

    with pytest.raises(TrainschedError, match="at least 2 collectives, got 1"):
        host_from_steps(1, 1e-3)


def test_the_simulator_charges_the_overhead_as_the_calibration_reads_it():
    """The same two plans simulated on the calibrated cluster carrying 1 ms per collective (4
    layers whose compute takes microseconds, so the collectives run one after another): the
    fifo step's lead over the one-bucket step read back through the calibration's formula
    gives that 1 ms again (to the microseconds of compute that overlap the first
    collectives)."""
    from trainsched.comm import FifoPolicy, ReadyBucketPolicy
    from trainsched.graph import Edge, Graph, Op, to_training
    from trainsched.runtime.calibration import overhead_from_steps
    from trainsched.sim import simulate_data_parallel

    sizes = [1_000_000, 2_000_000, 500_000, 3_000_000]
    ops = [Op(name=f"L{i}", compute_s=1e-6, backward_input_s=1e-6, backward_weight_s=1e-6,
              param_bytes=size, output_bytes=64, saved_bytes=64, layer_index=i)
           for i, size in enumerate(sizes)]  # fmt: skip
    edges = [Edge(src=f"L{i}", dst=f"L{i + 1}", size_bytes=64) for i in range(len(sizes) - 1)]
    graph = to_training(Graph(ops, edges), memory_bandwidth_bytes_per_s=1e12)
    cal = _calibration()
    cluster = dataclasses.replace(cal, collective_overhead_s=1e-3).to_cluster()
    one = 1 << 40
    steps = {}
    for name, policy in {"fifo": FifoPolicy(runtime_passes=False),
                         "one": ReadyBucketPolicy(bucket_bytes=one, first_bucket_bytes=one,
                                                  cross_barrier=False, bucket_copies=False)
                         }.items():
        result = simulate_data_parallel(graph, cluster, ranks=2, policy=policy)
        comms = [t for t in result.tasks if t.category == "comm" and t.device == "cpu0"]
        assert len(comms) == (len(sizes) if name == "fifo" else 1)
        steps[name] = result.step_time_s
    read = overhead_from_steps(sizes, steps["fifo"] - steps["one"], cal.allreduce_predict)
    assert read == pytest.approx(1e-3, abs=2e-5)


def _workers_result(**probes):
    """A raw result as the workers write it: times on exact α–β lines (p2p 20 µs + S / 4 GB/s
    one way; all-reduce on 2 ranks 2 × 100 µs + S / 1 GB/s), and ``probes``."""
    sizes = [4, 4096, 1 << 20, 16 << 20]
    return {"rows": [[s, 20e-6 + s / 4e9, 200e-6 + s / 1e9] for s in sizes], **probes}


def _read(data):
    from trainsched.runtime.calibration import read_measurements

    return read_measurements(data, backend="gloo", world_size=2, measured_at="t", repeats=5,
                             warmup=1, host={"hostname": "h"})


def test_the_workers_result_is_read_into_every_figure():
    """Every figure worked out by hand from the probes' raw numbers:
    - links: the rows lie on the lines, so the fit gives them back;
    - after compute: 4 ms measured against 0.2 + 1.048576 ms by the fit: 2.751424 ms;
    - per collective: 1, 1 and 2 MB cost 4.6 ms one by one and 4.2 ms as one by the fit;
      measured 2.4 ms apart, each of the 2 extra collectives 1.0 ms; 1.0 ms more processor
      time, 0.5 ms each;
    - start-up 2 × 100 µs; 10 all-reduces took 30 ms alone and 40 ms beside compute: on their
      bytes (30 − 2) / (40 − 2) = 28/38; contention 0.5 on 10.2 ms: 0.5 × 10.2 / 10.0 = 0.51;
    - γ 0.4 less 10 × 0.5 ms / 30 ms = 0.2333...; compute at 0.6 + 10 × 0.5 ms / 40 ms = 0.725.
    """
    cal = _read(_workers_result(
        host={"torch": "x"}, comm_compute_share=0.4, memory_bandwidth=5e9, buffer_sync=1.2e-3,
        rates={"compute": 0.6, "comm": 0.3, "count": 10, "comm_alone_s": 0.030,
               "comm_beside_s": 0.040, "contention": 0.5, "contention_alone_s": 0.0102},
        after_compute=[1 << 20, 4e-3], per_collective=[[1e6, 1e6, 2e6], 2.4e-3, 1.0e-3],
        pipeline_host=[3.4e-4, 1.5e-4]))
    assert cal.p2p.latency_s == pytest.approx(20e-6, rel=1e-6)
    assert cal.p2p.bandwidth_bytes_per_s == pytest.approx(4e9, rel=1e-6)
    assert cal.allreduce.latency_s == pytest.approx(100e-6, rel=1e-6)
    assert cal.allreduce.bandwidth_bytes_per_s == pytest.approx(1e9, rel=1e-6)
    assert max(abs(e) for e in (*cal.p2p_errors, *cal.allreduce_errors)) < 1e-6
    assert cal.collective_after_compute_s == pytest.approx(2.751424e-3, rel=1e-5)
    assert cal.collective_overhead_s == pytest.approx(1.0e-3, rel=1e-5)
    assert cal.collective_host_s == pytest.approx(0.5e-3, rel=1e-12)
    assert cal.comm_rate_with_compute == pytest.approx(28 / 38, rel=1e-5)
    assert cal.collective_contention == pytest.approx(0.51, rel=1e-5)
    assert cal.comm_compute_share == pytest.approx(0.4 - 1 / 6, rel=1e-12)
    assert cal.compute_rate_with_comm == pytest.approx(0.725, rel=1e-12)
    assert (cal.collective_slots, cal.buffer_sync_s, cal.memory_bandwidth_bytes_per_s) == \
        (2, 1.2e-3, 5e9)
    assert (cal.pipeline_action_s, cal.pipeline_message_s) == (3.4e-4, 1.5e-4)
    assert dict(cal.host) == {"hostname": "h", "torch": "x"}


def test_a_result_without_probes_keeps_the_neutral_figures():
    """An older worker's result (rows only): nothing slows anything, nothing is added."""
    cal = _read(_workers_result())
    assert (cal.compute_rate_with_comm, cal.comm_rate_with_compute, cal.collective_contention,
            cal.comm_compute_share) == (1.0, 1.0, 1.0, 0.0)
    assert (cal.collective_after_compute_s, cal.collective_overhead_s, cal.collective_host_s,
            cal.buffer_sync_s, cal.memory_bandwidth_bytes_per_s) == (0.0, 0.0, 0.0, 0.0, None)


def test_a_non_positive_time_is_refused():
    data = _workers_result()
    data["rows"][1][2] = 0.0
    with pytest.raises(TrainschedError, match="non-positive time at 4096 B"):
        _read(data)
