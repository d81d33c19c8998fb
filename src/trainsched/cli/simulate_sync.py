"""``simulate --sync``: the multi-step protocol simulation of a data-parallel plan's sync
policy beside pure BSP (:mod:`trainsched.sim.sync`), and the plan's parameter servers from
``--servers`` and ``--server-placement``. Kept apart from :mod:`trainsched.cli.simulate`, which
parses the flags and runs the step simulation."""

from __future__ import annotations

import argparse
from typing import Any

from trainsched.cli.common import check_count, given
from trainsched.errors import TrainschedError

#: The protocol simulation's defaults: BSP steps' worth of samples, step-time variation.
SYNC_STEPS = 200
STEP_NOISE = 0.05
#: The protocol simulation's flags (``--sync`` itself needs ``--parallelism data``).
SYNC_FLAGS = ("straggler", "sync_steps", "step_noise", "switch_cost")


def plan_servers(args: argparse.Namespace, cluster: Any) -> dict[str, Any]:
    """The plan's ``servers`` and ``server_placement`` from ``--servers`` and
    ``--server-placement`` (a policy without a server phase takes neither); by default the
    cluster's parameter servers (one where it describes none), dedicated."""
    from trainsched.sync import parse_policy

    flags = [f for f in ("servers", "server_placement") if getattr(args, f) is not None]
    if not parse_policy(args.sync or "bsp").uses_servers:
        if flags:
            raise TrainschedError(f"--{flags[0].replace('_', '-')} applies to a --sync policy "
                                  f"with a parameter-server phase (asp, ssp:S, k-of-n:K, or "
                                  f"straggler(relax)); drop it or give such a policy")
        return {}
    check_count("--servers", args.servers, 1)
    return {"servers": args.servers or max(1, cluster.parameter_servers),
            "server_placement": args.server_placement or "dedicated"}


def sync_doc(plan: Any, graph: Any, cluster: Any, result: Any,
             args: argparse.Namespace) -> dict[str, Any] | None:
    """The protocol simulation of ``plan``'s sync policy beside pure BSP (``None`` when the
    policy is plain BSP and no protocol-simulation flag is given). BSP's synchronisation time
    is the step simulator's: its step time minus the one-device step."""
    from trainsched.sim import simulate_single
    from trainsched.sim.sync import simulate_sync, sync_workload
    from trainsched.sync import Bsp, format_straggler, parse_stragglers
    from trainsched.units import parse_duration

    if plan.sync == "bsp" and not given(args, list(SYNC_FLAGS)):
        return None
    check_count("--sync-steps", args.sync_steps, 1)
    noise = STEP_NOISE if args.step_noise is None else args.step_noise
    if not 0 <= noise < 10:
        raise TrainschedError(f"--step-noise must be a coefficient of variation in [0, 10), "
                              f"got {noise}")
    switch_s = parse_duration(args.switch_cost or 0)
    stragglers = parse_stragglers(args.straggler or ())
    for s in stragglers:
        if s.rank >= plan.ranks:
            raise TrainschedError(f"--straggler {format_straggler(s)}: rank {s.rank} is not one "
                                  f"of the {plan.ranks} ranks (0..{plan.ranks - 1})")
    batch = graph.meta.get("batch_size")
    batch = batch if isinstance(batch, int) and batch >= 1 else 1
    single = simulate_single(graph, cluster).step_time_s
    served = plan.sync_policy.uses_servers
    workload = sync_workload(graph, cluster, ranks=plan.ranks, batch_per_rank=batch,
                             algorithm=plan.algorithm, noise_cv=noise, stragglers=stragglers,
                             allreduce_s=max(0.0, result.step_time_s - single),
                             servers=plan.servers if served else None,
                             server_placement=plan.server_placement)
    steps = args.sync_steps or SYNC_STEPS
    total = steps * plan.ranks * batch
    rows = []
    runs = [("bsp", Bsp())] + ([(plan.sync, plan.sync_policy)] if plan.sync != "bsp" else [])
    for text, policy in runs:
        run = simulate_sync(policy, workload, total_samples=total, switch_s=switch_s)
        rows.append({
            "policy": text,
            "time_s": run.time_s, "step_time_s": run.step_time_s,
            "time_per_sample_s": run.time_per_sample_s, "mean_staleness": run.mean_staleness,
            "max_staleness": max(run.update_staleness, default=0),
            "phases": [{"protocol": p.protocol, "samples": p.samples, "updates": p.updates,
                        "time_s": p.time_s, "staleness": [list(x) for x in p.staleness]}
                       for p in run.phases]})
    return {"policy": plan.sync, "steps": steps, "batch_per_rank": batch,
            "samples": total, "step_noise": noise, "switch_s": switch_s,
            "stragglers": [format_straggler(s) for s in stragglers],
            "compute_s": single, "allreduce_s": workload.allreduce_s,
            "push_s": workload.push_s, "server_s": workload.server_s,
            "servers": plan.servers if served else None,
            "server_placement": plan.server_placement if served else None, "rows": rows}
