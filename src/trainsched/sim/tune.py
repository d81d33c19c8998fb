"""Offline tuning on the simulator: the objective :func:`trainsched.comm.tune.tune` searches.

The search itself (:mod:`trainsched.comm.tune`) knows nothing of the simulator; this module
gives it the simulator's step time as the objective, so ``simulate --autotune`` and
``compare``'s tuned row pick a policy's partition and credit without running anything.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from trainsched.comm.policy import ByteSchedulerPolicy, MiB
from trainsched.comm.tune import Objective, tuned_policy
from trainsched.sim.data_parallel import simulate_data_parallel

__all__ = ["simulated_objective"]


def simulated_objective(graph: Any, cluster: Any, ranks: int, algorithm: str = "ring", *,
                        steps: int = 3, startup_overlap: bool = False,
                        **policy_options: Any) -> Objective:
    """The simulator's step time (steady period of ``steps`` steps, see
    :func:`trainsched.sim.simulate_data_parallel`) of ``graph`` on ``ranks`` ranks of
    ``cluster`` with ``algorithm``, under :class:`ByteSchedulerPolicy` at the given partition
    and credit. ``policy_options`` go to the policy (``credit_mode``, ``cross_barrier``,
    ``fusion_bytes``); without ``fusion_bytes`` small neighbours are fused up to one partition
    (``fusion_bytes = partition_bytes``), so the partition size sets every task's size and
    the number of collectives, which is what pays each collective's start-up latency. With
    ``credit_mode="strict"`` a credit below the partition is raised to one partition.
    ``startup_overlap`` goes to the simulator (collectives in flight together overlap their
    start-up latency)."""

    base = ByteSchedulerPolicy(**{"fusion_bytes": MiB, **policy_options})  # bad options fail now
    fused = "fusion_bytes" not in policy_options

    def objective(partition_bytes: int, credit_bytes: int) -> float:
        policy = tuned_policy(base, partition_bytes, credit_bytes)
        if not fused:
            policy = replace(policy, fusion_bytes=base.fusion_bytes)
        return simulate_data_parallel(graph, cluster, ranks=ranks, policy=policy,
                                      algorithm=algorithm, steps=steps,
                                      startup_overlap=startup_overlap).step_time_s

    return objective
