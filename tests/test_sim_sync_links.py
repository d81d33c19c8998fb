"""The protocol simulator's delayed links and server placement, on hand-worked numbers: a
delayed link holds the messages a rank sends (one per BSP step, one per push, one per local-SGD
average), not its compute; a colocated server keeps its worker's messages on the host."""

from __future__ import annotations

import json

import pytest

from trainsched.cli import main
from trainsched.cluster import resolve_cluster
from trainsched.errors import TrainschedError
from trainsched.graph import Graph, Op, to_training
from trainsched.sim.sync import SyncWorkload, simulate_sync, sync_workload
from trainsched.sync import Asp, Bsp, KOfN, LocalSgd, parse_stragglers

# --- delayed links -------------------------------------------------------------------------


def _two(stragglers: str = "", **extra) -> SyncWorkload:
    return SyncWorkload(ranks=2, batch_per_rank=1, compute_s=1.0,
                        stragglers=parse_stragglers(stragglers) if stragglers else (), **extra)


def test_under_bsp_a_delayed_link_costs_what_a_compute_sleep_costs():
    # 4 steps of max(1, 1 + 0.25) + 0.5 s all-reduce = 7 s, the hold before the all-reduce or
    # the sleep after the compute alike.
    link = simulate_sync(Bsp(), _two("1:250ms@link", allreduce_s=0.5), total_samples=8)
    sleep = simulate_sync(Bsp(), _two("1:250ms", allreduce_s=0.5), total_samples=8)
    assert (link.time_s, sleep.time_s) == (7.0, 7.0)


def test_under_local_sgd_a_delayed_link_holds_only_the_average():
    # h = 4, 8 samples = one period of 4 local steps per rank. A compute sleep of 0.25 s
    # stretches every step: max(4, 4 x 1.25) + 0.5 = 5.5 s; a delayed link holds the one
    # average: max(4, 4 + 0.25) + 0.5 = 4.75 s.
    link = simulate_sync(LocalSgd(4), _two("1:250ms@link", allreduce_s=0.5), total_samples=8)
    sleep = simulate_sync(LocalSgd(4), _two("1:250ms", allreduce_s=0.5), total_samples=8)
    assert (link.time_s, sleep.time_s) == (4.75, 5.5)


def test_under_asp_a_delayed_link_holds_every_push():
    # Rank 1's pushes leave 0.5 s late: it applies at 1.5 and 3.0 s while rank 0 applies at
    # 1 and 2 s; 4 updates end at 3.0 s instead of 2.0 s.
    assert simulate_sync(Asp(), _two(), total_samples=4).time_s == 2.0
    assert simulate_sync(Asp(), _two("1:500ms@link"), total_samples=4).time_s == 3.0


def test_a_delayed_link_window_holds_only_its_steps():
    # the hold only in rank 1's step 1: 1.5 + 1.75 + 1.5 + 1.5 s
    result = simulate_sync(Bsp(), _two("1:250ms@link:1-2", allreduce_s=0.5), total_samples=8)
    assert result.time_s == 6.25


# --- server placement ------------------------------------------------------------------------

#: k80-ps:2: one worker per node, 10 Gbit/s (1.25e9 B/s, 50 us) to the network and to the
#: parameter servers. One layer of 4 MB of parameters: G / B = 3.2 ms.
GRADIENT_BYTES, BANDWIDTH, LATENCY = 4_000_000, 1.25e9, 50e-6
CROSS = LATENCY + GRADIENT_BYTES / BANDWIDTH  # a push or pull over the network: 3.25 ms


def _graph() -> Graph:
    return to_training(Graph([Op(name="a", compute_s=1e-3, param_bytes=GRADIENT_BYTES,
                                 flops=10.0)], [], {"model": "hand", "batch_size": 1}))


def _workload(placement: str) -> SyncWorkload:
    return sync_workload(_graph(), resolve_cluster("k80-ps:2"), ranks=2, batch_per_rank=1,
                         servers=1, server_placement=placement)


def test_dedicated_servers_put_every_push_on_the_network_and_the_server_link():
    w = _workload("dedicated")
    assert (w.push_s, w.pull_s) == (pytest.approx(CROSS), pytest.approx(CROSS))
    assert w.server_s == pytest.approx(GRADIENT_BYTES / BANDWIDTH)


def test_a_colocated_server_keeps_its_workers_messages_on_the_host():
    w = _workload("colocated")
    assert w.push_s == pytest.approx((0.0, CROSS)) and w.pull_s == w.push_s
    # the server's NIC receives worker 1's gradient; worker 0's never leaves the host
    assert w.server_s == pytest.approx((0.0, GRADIENT_BYTES / BANDWIDTH))


def test_two_colocated_shards_send_half_of_each_gradient_across():
    w = sync_workload(_graph(), resolve_cluster("k80-ps:2"), ranks=2, batch_per_rank=1,
                      servers=2, server_placement="colocated")
    half = LATENCY + GRADIENT_BYTES / 2 / BANDWIDTH
    assert w.push_s == pytest.approx((half, half))
    assert w.server_s == pytest.approx((GRADIENT_BYTES / 2 / BANDWIDTH,) * 2)


def test_colocating_the_server_shortens_a_1_of_2_update_by_the_messages_and_the_server_time():
    # k-of-n(k=1) with 2 workers and 1 server: an update waits for the first push.
    # dedicated: c + pull + push + server = c + 2 x 3.25 ms + 3.2 ms; colocated: worker 0's
    # messages and apply stay on its host, so c alone. Difference per update 9.7 ms.
    dedicated = simulate_sync(KOfN(1), _workload("dedicated"), total_samples=10)
    colocated = simulate_sync(KOfN(1), _workload("colocated"), total_samples=10)
    assert dedicated.time_s - colocated.time_s == pytest.approx(
        10 * (2 * CROSS + GRADIENT_BYTES / BANDWIDTH))


def test_colocating_the_server_changes_nothing_when_the_update_waits_for_the_remote_worker():
    # k-of-n(k=2): the update waits for worker 1's push over the network either way, and the
    # server link and the worker link have the same bandwidth here.
    dedicated = simulate_sync(KOfN(2), _workload("dedicated"), total_samples=10)
    colocated = simulate_sync(KOfN(2), _workload("colocated"), total_samples=10)
    assert colocated.time_s == pytest.approx(dedicated.time_s)


def test_more_colocated_servers_than_workers_are_refused():
    with pytest.raises(TrainschedError, match="at most 2"):
        sync_workload(_graph(), resolve_cluster("k80-ps:2"), ranks=2, batch_per_rank=1,
                      servers=3, server_placement="colocated")


def _run(tmp_path, *flags) -> int:
    path = tmp_path / "g.json"
    Graph([Op(name="a", compute_s=1e-3, param_bytes=GRADIENT_BYTES, flops=10.0)], [],
          {"model": "hand", "batch_size": 1}).save(path)
    return main(["simulate", str(path), "--cluster", "k80-ps:2", "--parallelism", "data",
                 "--ranks", "2", "--step-noise", "0", "--json", *flags])


def _simulate(tmp_path, capsys, *flags):
    assert _run(tmp_path, *flags) == 0
    return json.loads(capsys.readouterr().out)["sync"]


def test_simulate_takes_the_servers_and_their_placement_into_the_plan(tmp_path, capsys):
    dedicated = _simulate(tmp_path, capsys, "--sync", "k-of-n:1", "--servers", "1",
                          "--server-placement", "dedicated")
    colocated = _simulate(tmp_path, capsys, "--sync", "k-of-n:1", "--servers", "1",
                          "--server-placement", "colocated")
    assert (colocated["servers"], colocated["server_placement"]) == (1, "colocated")
    # one BSP step's worth of samples = 2 updates of 1 sample
    gap = dedicated["rows"][1]["step_time_s"] - colocated["rows"][1]["step_time_s"]
    assert gap == pytest.approx(2 * (2 * CROSS + GRADIENT_BYTES / BANDWIDTH))


def test_simulate_defaults_to_the_clusters_parameter_servers(tmp_path, capsys):
    assert _simulate(tmp_path, capsys, "--sync", "asp")["servers"] == 2


def test_simulate_refuses_servers_for_a_policy_without_a_server_phase(tmp_path, capsys):
    assert _run(tmp_path, "--sync", "local:4", "--servers", "2") == 2
    assert "--servers applies to a --sync policy with a parameter-server phase" in \
        capsys.readouterr().err


def test_the_online_controller_sees_local_times_so_a_delayed_link_raises_no_episode():
    from trainsched.sim.sync_online import simulate_online
    from trainsched.sync import StragglerPolicy

    # 4 ranks, rank 3's link 2 s late: every BSP step takes 1 + 2 + 0.1 s, but the local
    # times the detector compares stay equal (a compute delay of 2 s would be excluded).
    workload = SyncWorkload(ranks=4, batch_per_rank=1, compute_s=1.0, allreduce_s=0.1,
                            stragglers=parse_stragglers("3:2s@link"))
    result = simulate_online(workload, total_samples=400,
                             policy=StragglerPolicy(action="exclude"), switch_s=0.1)
    assert result.events == ()
    assert result.time_s == pytest.approx(100 * 3.1)
