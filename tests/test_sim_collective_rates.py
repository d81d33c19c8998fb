"""Collectives by rate: compute slowed while a collective runs, collectives slowed while compute
runs, several collectives in flight sharing the wire, a fixed overhead per collective, the
catalogue's NCCL bus bandwidth; the engine's couplings; the cluster fields' file round trip and
validation. Every expected time is worked out by hand in the test's docstring."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from trainsched.cluster import Cluster, DeviceSpec, Link, device_kind, resolve_cluster
from trainsched.comm import FifoPolicy, PriorityPolicy
from trainsched.errors import TrainschedError
from trainsched.graph import Edge, Graph, Op, to_training
from trainsched.sim import collective_s, simulate_data_parallel
from trainsched.sim.engine import Coupling, TaskGraph, run_tasks

MS = 1e-3
MB = 1_000_000  # 1 ms on the 1 GB/s two-rank ring below


def close(actual: float, expected: float) -> bool:
    return math.isclose(actual, expected, rel_tol=1e-9, abs_tol=1e-12)


def two_ranks(**device: float) -> Cluster:
    """Two ranks, 1 GB/s, no latency: a ring all-reduce of S bytes takes S / 1 GB/s."""
    base = replace(device_kind("V100"), compute_rate_with_comm=1.0, device_cv=0.0)
    return Cluster(name="t", device=replace(base, **device), devices_per_node=2,
                   intra_node=Link(bandwidth_bytes_per_s=1e9, latency_s=0.0))


def three_layers(size: int) -> Graph:
    """L0 -> L1 -> L2, 1 ms per forward, dX and dW, each parameter ``size`` bytes; an SGD step
    costs 3·size / 6 GB/s. Alone: forward [0, 3], then L2:dX [3, 4], L2:dW [4, 5], L1:dX
    [5, 6], L1:dW [6, 7], L0:dW [7, 8] ms: gradients ready at 5, 7 and 8 ms."""
    ops = [Op(name=f"L{i}", compute_s=MS, backward_input_s=MS, backward_weight_s=MS,
              param_bytes=size, output_bytes=4096, saved_bytes=4096, layer_index=i)
           for i in range(3)]  # fmt: skip
    edges = [Edge(src=f"L{i}", dst=f"L{i + 1}", size_bytes=4096) for i in range(2)]
    return to_training(Graph(ops, edges), memory_bandwidth_bytes_per_s=6e9)


def priority(**options):
    """The wire's rules alone: no pass of the scheduled runtime over a collective's bytes."""
    return PriorityPolicy(runtime_passes=False, **options)


def fifo_step(cluster: Cluster, size: int = MB) -> float:
    """One collective in flight at a time (FIFO's credit), the barrier before the SGD steps."""
    return simulate_data_parallel(three_layers(size), cluster, ranks=2,
                                  policy=FifoPolicy(runtime_passes=False)).step_time_s


def unlimited_step(cluster: Cluster, size: int) -> float:
    """Every collective handed to the wire once its gradient is ready (unlimited credit, in
    ready order here), the barrier before the SGD steps."""
    return simulate_data_parallel(three_layers(size), cluster, ranks=2,
                                  policy=priority(credit_bytes=math.inf)).step_time_s


def test_plain_device_baseline_by_hand():
    """FIFO, 1 MB gradients (1 ms each), full speed: c2 [5, 6], c1 [7, 8], c0 [8, 9]; the
    barrier at 9 ms, then three 0.5 ms SGD steps: 10.5 ms."""
    assert close(fifo_step(two_ranks()), 10.5 * MS)


def test_compute_runs_slower_while_a_collective_is_in_flight():
    """Compute at half rate beside a collective: c2 [5, 6] while L1:dX does 0.5 ms of work,
    the rest at full rate: L1:dX ends 6.5, L1:dW [6.5, 7.5]; c1 [7.5, 8.5] while L0:dW does
    0.5, so L0:dW ends 9.0; c0 [9, 10]; + 1.5 ms of SGD: 11.5 ms."""
    assert close(fifo_step(two_ranks(compute_rate_with_comm=0.5)), 11.5 * MS)


def test_collectives_run_slower_while_their_rank_computes():
    """Collectives at half rate beside compute: c2 from 5 does 1 ms of work by 7 (L1:dX and
    L1:dW run throughout); c1 from 7 does 0.5 by 8 (L0:dW), then the compute stream is idle
    and c1 ends 8.5; c0, dispatched at 8, waits for the wire: [8.5, 9.5]; + 1.5: 11.0 ms."""
    assert close(fifo_step(two_ranks(comm_rate_with_compute=0.5)), 11.0 * MS)


def test_collectives_in_flight_together_share_the_wire():
    """3 MB gradients (3 ms each, SGD 1.5 ms each), unlimited credit, two slots, contention
    1 (processor sharing): c2 alone [5, 7] (2 ms of work), then c2 and c1 at half rate: c2
    ends 9, c1 has done 1; c0 (dispatched at 8, both slots taken) starts 9; c1's 2 ms left
    at half rate end at 13; c0 has done 2 by 13 and ends 14; + 4.5 ms of SGD: 18.5 ms, the
    same as one slot (c2 [5, 8], c1 [8, 11], c0 [11, 14]): sharing moves no more bytes. The
    small collective ahead finishes later than alone (9 against 8)."""
    shared = two_ranks(collective_slots=2, collective_contention=1.0)
    result = simulate_data_parallel(three_layers(3 * MB), shared, ranks=2,
                                    policy=priority(credit_bytes=math.inf))
    assert close(result.step_time_s, 18.5 * MS)
    ends = sorted(t.end_s for t in result.tasks if t.category == "comm" and t.device == "gpu0")
    assert all(close(a, b * MS) for a, b in zip(ends, (9, 13, 14), strict=True)), ends
    assert close(unlimited_step(two_ranks(), 3 * MB), 18.5 * MS)


def test_collectives_without_contention_run_as_fast_as_alone():
    """Unlimited credit, two slots, contention 0: c2 [5, 8], c1 [7, 10], c0 waits for c2's
    slot: [8, 11]; + 4.5 ms of SGD: 15.5 ms."""
    free = two_ranks(collective_slots=2, collective_contention=0.0)
    assert close(unlimited_step(free, 3 * MB), 15.5 * MS)


def test_each_collective_pays_the_overhead():
    """0.25 ms per collective on the wire but the step's first: c2 [5, 6], c1 [7, 8.25], c0
    (ready at 8) waits for the wire: [8.25, 9.5]; + 1.5 ms of SGD: 11.0 ms."""
    assert close(fifo_step(two_ranks(collective_overhead_s=0.25 * MS)), 11.0 * MS)


def test_by_rate_a_collective_s_start_up_is_a_delay_that_compute_does_not_stretch():
    """0.25 ms per hop (a 1 MB collective: 0.5 ms of start-up and 1 ms of bytes on two ranks),
    collectives at half rate beside compute, FIFO. c2 waits its start-up [5, 5.5] at full
    rate, then its bytes at 0.5 beside L1:dX, L1:dW and L0:dW (0.75 ms by 7, the last 0.25 by
    7.5); c1 (ready at 7) waits its start-up [7.5, 8] while L0:dW ends, then its bytes at full
    rate (the compute stream is idle): [8, 9]; c0 (ready at 8) [9, 9.5] and [9.5, 10.5]; + 1.5
    ms of SGD: 12.0 ms (the whole collective stretched: c2 ends 8.0, c1 9.5, c0 11.0: 12.5)."""
    cluster = two_ranks(comm_rate_with_compute=0.5)
    cluster = replace(cluster, intra_node=Link(bandwidth_bytes_per_s=1e9, latency_s=0.25 * MS))
    assert close(fifo_step(cluster), 12.0 * MS)


def fifo_comm_ends(cluster: Cluster) -> list[float]:
    result = simulate_data_parallel(three_layers(MB), cluster, ranks=2,
                                    policy=FifoPolicy(runtime_passes=False))
    return sorted(t.end_s for t in result.tasks if t.category == "comm" and t.device == "gpu0")


@pytest.mark.parametrize(("after_ms", "ends_ms"), [(0.0, (6.0, 8.25, 9.5)),
                                                   (0.5, (6.5, 8.25, 9.5))])
def test_the_first_collective_of_a_step_pays_after_compute_in_place_of_the_overhead(
        after_ms, ends_ms):
    """0.25 ms per collective, and 0 or 0.5 ms after compute: c2, the step's first, [5, 6] or
    [5, 6.5] (its 1 ms plus what follows compute, not the 0.25 ms as well); c1 [7, 8.25]; c0
    (ready at 8) waits for the wire: [8.25, 9.5]."""
    cluster = two_ranks(collective_overhead_s=0.25 * MS, collective_after_compute_s=after_ms * MS)
    ends = fifo_comm_ends(cluster)
    assert all(close(a, b * MS) for a, b in zip(ends, ends_ms, strict=True)), ends


def test_each_collective_takes_its_host_time_from_compute():
    """0.5 ms of processor time per collective, taken from its rank's compute stream as the
    collective starts, ahead of the ops waiting there: c2 starts at 5 and its host time runs
    [5, 5.5], so L1:dX [5.5, 6.5], L1:dW [6.5, 7.5]; c1 [7.5, 8.5] and its host time [7.5, 8]
    before L0:dW [8, 9]; c0 [9, 10] (its host time [9, 9.5]); the barrier at 10 and 1.5 ms of
    SGD: 11.5 ms (10.5 without)."""
    cluster = two_ranks(collective_host_s=0.5 * MS)
    assert close(fifo_step(cluster), 11.5 * MS)
    result = simulate_data_parallel(three_layers(MB), cluster, ranks=2,
                                    policy=FifoPolicy(runtime_passes=False))
    host = sorted((t.start_s, t.end_s) for t in result.tasks
                  if t.category == "comm-host" and t.device == "gpu0")
    assert all(close(a, b * MS) and close(c, d * MS)
               for (a, c), (b, d) in zip(host, ((5, 5.5), (7.5, 8), (9, 9.5)), strict=True))


def test_by_rate_each_collective_also_takes_its_host_time_from_compute():
    """The same host time with collectives by rate (two slots): one 0.5 ms task per collective
    on each rank's compute stream, next to the collective's own slowing of compute."""
    cluster = two_ranks(collective_host_s=0.5 * MS, collective_slots=2)
    result = simulate_data_parallel(three_layers(MB), cluster, ranks=2,
                                    policy=FifoPolicy(runtime_passes=False))
    host = [t for t in result.tasks if t.category == "comm-host" and t.device == "gpu0"]
    assert len(host) == 3 and all(close(t.end_s - t.start_s, 0.5 * MS) for t in host)


def test_the_p3_preset_runs_collectives_at_nccl_bus_bandwidth():
    """8 ranks, 1 GB: ring 2·7/8 · 1 GB / 130 GB/s + 2·7 hops · 10 µs (not the 150 GB/s link
    peak)."""
    cluster = resolve_cluster("p3.16xlarge")
    assert close(collective_s(1e9, 8, cluster), 1.75e9 / 130e9 + 14 * 10e-6)


def test_the_catalogue_gpus_slow_compute_beside_nccl():
    for kind in ("V100", "A100", "H100"):
        assert device_kind(kind).compute_rate_with_comm == 0.8
        assert device_kind(kind).comm_by_rate
    assert not device_kind("cpu").comm_by_rate


def test_startup_overlap_is_refused_on_a_cluster_by_rate():
    with pytest.raises(TrainschedError, match="startup_overlap is a rule of the FIFO wire"):
        simulate_data_parallel(three_layers(MB), two_ranks(compute_rate_with_comm=0.5),
                               ranks=2, policy=FifoPolicy(), startup_overlap=True)


# --- the engine's couplings ------------------------------------------------------------------


def coupled_pair(compute_s: float, comm_s: float, fixed_s: float = 0.0):
    """A compute task on a stream and a collective (no resource), coupled at half rate each
    beside the other, the collective's first ``fixed_s`` a delay: (tasks, stream, compute,
    collective)."""
    tasks = TaskGraph()
    stream = tasks.add_resource("s")
    c = tasks.add_task("compute", compute_s, (stream,))
    x = tasks.add_task("comm", comm_s, ())
    g = tasks.add_coupling(Coupling(first_rate=0.5, second_rate=0.5))
    tasks.couple(c, g, 0)
    tasks.couple(x, g, 1, fixed_s=fixed_s)
    return tasks, stream, c, x


def test_engine_coupling_by_hand():
    """A compute task of 2 s on a stream and a collective of 1 s (no resource), coupled with
    compute at 0.5 and the collective at 0.5, both from 0: both at half rate until the
    collective ends at 2 (1 s of work); compute has done 1 s, ends at 3."""
    tasks, stream, c, x = coupled_pair(2.0, 1.0)
    replay = run_tasks(tasks)
    assert close(replay.end_s[x], 2.0) and close(replay.end_s[c], 3.0)
    assert close(replay.busy_s[stream], 3.0)


def test_engine_coupling_leaves_uncoupled_tasks_alone():
    """The same two tasks, only the collective coupled (nothing on the first side): both end
    at their durations."""
    tasks = TaskGraph()
    stream = tasks.add_resource("s")
    c = tasks.add_task("compute", 2.0, (stream,))
    x = tasks.add_task("comm", 1.0, ())
    tasks.couple(x, tasks.add_coupling(Coupling(first_rate=0.5, second_rate=0.5)), 1)
    replay = run_tasks(tasks)
    assert close(replay.end_s[x], 1.0) and close(replay.end_s[c], 2.0)


def test_a_coupled_task_s_fixed_part_runs_at_full_rate():
    """Compute of 4 s and a collective of 3 s whose first 1 s is a delay, both from 0, at half
    rate beside each other: the delay passes by 1 (compute has done 0.5); the collective's 2 s
    of work at half rate end at 5 (compute has done 2.5); compute's last 1.5 s alone end at 6.5.
    (All of the 3 s as work: the collective would end at 6 and compute at 7.)"""
    tasks, _, c, x = coupled_pair(4.0, 3.0, fixed_s=1.0)
    replay = run_tasks(tasks)
    assert close(replay.end_s[x], 5.0) and close(replay.end_s[c], 6.5)


def test_two_collectives_wait_their_delays_side_by_side():
    """Two collectives of 2 s, each with a 1 s delay, from 0, contention 1: the delays pass
    together by 1, then each 1 s of work at half rate: both end at 3 (as work alone: 4)."""
    tasks = TaskGraph()
    a, b = tasks.add_task("a", 2.0, ()), tasks.add_task("b", 2.0, ())
    g = tasks.add_coupling(Coupling(first_rate=1.0, second_rate=1.0, contention=1.0))
    tasks.couple(a, g, 1, fixed_s=1.0)
    tasks.couple(b, g, 1, fixed_s=1.0)
    replay = run_tasks(tasks)
    assert close(replay.end_s[a], 3.0) and close(replay.end_s[b], 3.0)


def test_by_rate_the_overhead_is_a_delay_that_contention_does_not_stretch():
    """3 MB gradients (3 ms each), two slots, contention 1, 0.5 ms per collective but the
    step's first: c2 alone from 5 has 1 ms left at 7, when c1 starts its delay (c2 at half
    rate: 0.75 left at 7.5); then both at half rate: c2 ends 9.0, c1 has done 0.75; c0
    (ready at 8, both slots taken) starts at 9, its delay to 9.5 (c1 reaches 1.0); c1's 2 ms
    left and c0's 3 at half rate: c1 ends 13.5, c0's last 1 ms alone ends 14.5."""
    shared = two_ranks(collective_slots=2, collective_contention=1.0,
                       collective_overhead_s=0.5 * MS)
    result = simulate_data_parallel(three_layers(3 * MB), shared, ranks=2,
                                    policy=priority(credit_bytes=math.inf))
    ends = sorted(t.end_s for t in result.tasks if t.category == "comm" and t.device == "gpu0")
    assert all(close(a, b * MS) for a, b in zip(ends, (9.0, 13.5, 14.5), strict=True)), ends


def test_coupling_rates_are_checked():
    with pytest.raises(TrainschedError, match="first_rate must be in"):
        Coupling(first_rate=0.0, second_rate=1.0)
    with pytest.raises(TrainschedError, match="contention must be in"):
        Coupling(first_rate=1.0, second_rate=1.0, contention=2.0)


# --- the cluster fields ----------------------------------------------------------------------


def test_collective_fields_round_trip_through_toml_and_json(tmp_path):
    device = replace(device_kind("cpu"), collective_overhead_s=40e-6, collective_host_s=3e-4,
                     compute_rate_with_comm=0.7, comm_rate_with_compute=0.25,
                     collective_slots=2, collective_contention=0.6)
    cluster = Cluster(name="host", device=device, devices_per_node=2,
                      intra_node=Link(bandwidth_bytes_per_s=1e9, latency_s=5e-4))
    for suffix, text in ((".toml", cluster.to_toml()), (".json", cluster.to_json())):
        path = tmp_path / f"host{suffix}"
        path.write_text(text)
        assert resolve_cluster(str(path)) == cluster
    assert "2 collective(s) at once (contention 0.60)" in cluster.describe()
    assert "each collective takes 300 µs of its rank's compute" in cluster.describe()


def test_defaults_are_left_out_of_the_file():
    table = resolve_cluster("cpu").to_dict()["device"]
    for key in ("collective_overhead", "compute_rate_with_comm", "comm_rate_with_compute",
                "collective_slots", "collective_contention", "collective_host"):
        assert key not in table


@pytest.mark.parametrize(("field", "value", "message"), [
    ("compute_rate_with_comm", 0.0, "compute_rate_with_comm must be a rate in"),
    ("comm_rate_with_compute", 1.5, "comm_rate_with_compute must be a rate in"),
    ("collective_slots", 0, "collective_slots must be an integer in 1..64"),
    ("collective_contention", -0.1, "collective_contention must be a number in"),
    ("collective_overhead_s", -1e-6, "collective_overhead_s must be a duration"),
    ("collective_host_s", -1e-6, "collective_host_s must be a duration"),
])
def test_invalid_collective_fields_are_refused(field, value, message):
    with pytest.raises(TrainschedError, match=message):
        replace(device_kind("cpu"), **{field: value})


def test_a_bad_file_value_names_the_field(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text('[device]\nkind = "cpu"\ncount = 2\ncollective_slots = "two"\n'
                    '[intra_node]\nbandwidth = "1GB/s"\nlatency = "1ms"\n')
    with pytest.raises(TrainschedError, match=r"\[device\] collective_slots"):
        resolve_cluster(str(path))
    assert isinstance(device_kind("cpu"), DeviceSpec)


def test_take_turns_and_by_rate_are_not_given_together():
    with pytest.raises(TrainschedError, match="two models of one effect"):
        replace(device_kind("cpu"), comm_compute_share=0.5, collective_slots=2)


# --- the shared wire (the simulated transport of several collectives at once) ----------------


def test_shared_wire_runs_up_to_its_slots_and_queues_the_rest_in_dispatch_order():
    """Two slots: 0 and 1 start on dispatch at 0; 2 waits; 1 ends at 3 and 2 starts then,
    behind 1; 0 ends at 4, 2 at 6: busy from 0 to 6."""
    from trainsched.comm.dispatch import SharedWire

    wire = SharedWire(2)
    for k in (0, 1, 2):
        wire.issue(k)
    assert wire.take_started() == [0, 1] and list(wire.waiting) == [2]
    wire.now = 3.0
    wire.finish(1)
    assert wire.take_started() == [2] and wire.start_s[2] == 3.0 and wire.behind[2] == 1
    wire.now = 4.0
    wire.finish(0)
    wire.now = 6.0
    wire.finish(2)
    assert wire.take_started() == [] and wire.busy_s == 6.0 and wire.behind[0] == -1
    with pytest.raises(TrainschedError, match="slots >= 1"):
        SharedWire(0)


# --- properties on random graphs -------------------------------------------------------------


def random_chain(rng, layers: int) -> Graph:
    """A chain with skip edges, random costs, some layers without parameters."""
    ops = [Op(name=f"op{i}", compute_s=rng.uniform(0.1, 2) * MS,
              backward_input_s=rng.uniform(0.1, 2) * MS,
              backward_weight_s=rng.uniform(0.1, 2) * MS,
              param_bytes=rng.choice([0, rng.randrange(1, 4 * MB)]) if i else MB,
              output_bytes=4096, saved_bytes=4096) for i in range(layers)]  # fmt: skip
    edges = [Edge(src=f"op{i}", dst=f"op{j}", size_bytes=4096)
             for i in range(layers) for j in (i + 1, i + 3) if j < layers]  # fmt: skip
    return to_training(Graph(ops, edges), memory_bandwidth_bytes_per_s=6e9)


def test_properties_by_rate_on_random_graphs():
    """Under rates: collapsed ranks equal expanded ones, the dependency bound holds, every
    collective starts after its gradients and every update after its collectives; and a
    shared wire whose rates are all 1, fed one collective at a time (FIFO's credit), is the
    FIFO wire."""
    import random

    from trainsched.comm import DdpBucketPolicy

    rng = random.Random(11)
    rates = two_ranks(compute_rate_with_comm=0.7, comm_rate_with_compute=0.5,
                      collective_slots=2, collective_contention=0.6)
    rates = replace(rates, devices_per_node=4)
    neutral = replace(rates, device=replace(rates.device, compute_rate_with_comm=1.0,
                                            comm_rate_with_compute=1.0))
    plain = replace(neutral, device=replace(neutral.device, collective_slots=1))
    for _ in range(8):
        g = random_chain(rng, rng.randrange(2, 10))
        n = rng.choice([2, 3, 4])
        stragglers = rng.choice([None, {rng.randrange(n): rng.uniform(1.1, 3)}])
        for policy in (FifoPolicy(), DdpBucketPolicy(first_bucket_bytes=MB, bucket_bytes=3 * MB),
                       PriorityPolicy(partition_bytes=MB, credit_bytes=math.inf),
                       FifoPolicy(cross_barrier=True)):
            result = simulate_data_parallel(g, rates, ranks=n, policy=policy,
                                            stragglers=stragglers)
            expanded = simulate_data_parallel(g, rates, ranks=n, policy=policy,
                                              stragglers=stragglers, expand=True)
            assert close(result.step_time_s, expanded.step_time_s)
            assert result.dependency_bound_s <= result.step_time_s * (1 + 1e-12)
            for d in result.devices:
                tasks = [t for t in result.tasks if t.device == d]
                end = {t.name: t.end_s for t in tasks}
                colls = [t for t in tasks if t.category == "comm"]
                for t in colls:
                    assert t.start_s >= max(end[m.replace(":grad", ":dW")]
                                            for m in t.args["members"]) - 1e-15
                for t in tasks:
                    if t.category == "optimizer":
                        grad = t.name.replace(":opt", ":grad")
                        mine = [c.end_s for c in colls if grad in c.args["members"]]
                        assert mine and t.start_s >= max(mine) - 1e-15
        fifo = simulate_data_parallel(g, plain, ranks=n, policy="fifo", stragglers=stragglers)
        shared = simulate_data_parallel(g, neutral, ranks=n, policy="fifo",
                                        stragglers=stragglers)
        assert close(shared.step_time_s, fifo.step_time_s)
