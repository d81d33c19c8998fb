"""``trainsched train TASK --sync POLICY``: the sync runtime from the command line.

The flags ``--sync``, ``--straggler``, ``--samples`` and ``--momentum`` (added to ``train`` by
:func:`add_sync_args`) train a built-in task (``teacher-student``) or a zoo model on data
generated in code (:class:`~trainsched.runtime.tasks.ZooTask`, at ``--image-size`` and
``--seq-len``) on N workers (plus a server rank for the ASP, SSP and k-of-N phases) through
the policy's phases, switched in process, and print each phase, each switch's cost and the
held-out loss and accuracy. The BSP phases average the gradients with one flat all-reduce
after backward, or, with ``--comm-policy NAME``, reduce them on the scheduled data-parallel
runtime with that policy (``ddp``: its pass-through to stock DDP).
A zoo model is built and run once here first, so one the sync
runtime cannot train (an input it cannot feed, an output that is not scores) is refused in one
line before any rank starts. A policy's straggler part (``bsp;straggler(relax)``,
``bsp;straggler(exclude)``) watches the BSP phases (:mod:`trainsched.runtime.sync.online`);
the report then lists the detector's events and the episodes. ``--servers S`` shards the
parameter server over S ranks; ``--deterministic`` makes the server phases repeat bit for bit
(pushes in round robin).

Under ``torchrun --nproc-per-node N+S`` (N without a server phase) this process is one rank:
workers first, then the servers; ``--ranks`` defaults to the job's world size less the
servers, and only worker 0 prints the result.
"""

from __future__ import annotations

import argparse
from typing import Any

from trainsched.cli.common import check_count, dump
from trainsched.errors import TrainschedError
from trainsched.units import format_duration

#: ``--samples``' default: samples applied to the shared model over the whole run.
SAMPLES = 32768
#: The flags that apply with ``--sync`` only.
SYNC_FLAGS = ("straggler", "samples", "momentum", "servers", "deterministic")


def add_sync_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sync", default=None, metavar="POLICY",
                   help="train on the sync runtime under this sync policy: bsp, asp, ssp:S, "
                   "k-of-n:K, local:H, or phases such as bsp:0.125,asp:0.875 or "
                   "bsp:0.5,ssp(s=4):0.5 (a parameter in parentheses among several phases; "
                   "docs/sync.md); the model is a built-in task (teacher-student) or a zoo "
                   "model on data generated in code; its BSP phases average gradients with "
                   "one flat all-reduce after backward, or on the scheduled runtime with "
                   "--comm-policy NAME")
    p.add_argument("--straggler", action="append", default=None, metavar="RANK:DELAY[:FROM-TO]",
                   help="--sync: slow a worker by a delay (1:50ms) or a factor (1:3x), or "
                   "hold every message it sends (1:20ms@link), optionally in steps FROM to "
                   "TO-1; repeatable")
    p.add_argument("--samples", type=int, default=None,
                   help=f"--sync: samples applied to the shared model over the run (default "
                   f"{SAMPLES}, rounded down to the phases' common update size)")
    p.add_argument("--momentum", type=float, default=None,
                   help="--sync: SGD momentum, kept across switches (default 0)")
    p.add_argument("--servers", type=int, default=None,
                   help="--sync: parameter-server ranks for the asp, ssp and k-of-n phases, "
                   "each owning one shard of the parameters (default 1)")
    p.add_argument("--deterministic", action="store_true", default=None,
                   help="--sync: the servers take the workers' gradients in round robin, so "
                   "the run repeats bit for bit (no straggler policy)")


def run_sync_cli(args: argparse.Namespace) -> int:
    """Train ``args.model`` (a built-in task or a zoo model) under ``args.sync``; print or dump
    the result."""
    from trainsched.runtime.launch import torchrun_rank
    from trainsched.runtime.sync import needs_server, phase_quantum, policy_phases, run_sync
    from trainsched.runtime.tasks import ZooTask, task_for
    from trainsched.sync import format_policy, parse_policy, parse_stragglers

    task = task_for(args.model, image_size=args.image_size, seq_len=args.seq_len)
    policy = parse_policy(args.sync)
    stragglers = parse_stragglers(args.straggler or ())
    servers = 1 if args.servers is None else args.servers
    check_count("--servers", servers, 1)
    if args.servers is not None and not policy.uses_servers:
        raise TrainschedError(f"--servers applies to a --sync policy with a parameter-server "
                              f"phase (asp, ssp:S, k-of-n:K, or straggler(relax)); "
                              f"{format_policy(policy)} has none: drop --servers")
    launched = torchrun_rank()
    ranks, batch = args.ranks, args.batch_size or 32
    if ranks is None and launched is not None:  # the job's world less its servers
        served = policy.straggler is not None and policy.straggler.action == "relax"
        ranks = launched[1] - (servers if served or any(needs_server(p)
                                                        for p in policy.protocols) else 0)
    ranks = 2 if ranks is None else ranks
    check_count("--ranks", ranks, 1)
    check_count("--batch-size", batch, 1)
    quantum = phase_quantum(policy.protocols, ranks, batch)
    wanted = SAMPLES if args.samples is None else args.samples
    check_count("--samples", wanted, quantum, None,
                f"the phases' common update size is {quantum} samples")
    total = wanted - wanted % quantum
    phases = policy_phases(policy, total, ranks=ranks, batch_per_rank=batch)
    if isinstance(task, ZooTask):
        task.check()  # builds and runs the model once: refused here, not on every rank
    result = run_sync(task, phases, ranks=ranks, batch_per_rank=batch, lr=args.lr,
                      momentum=args.momentum or 0.0, stragglers=stragglers,
                      straggler_policy=policy.straggler,
                      timeout_s=min(args.timeout, 120.0), deadline_s=args.timeout,
                      servers=servers, deterministic=bool(args.deterministic),
                      optimizer=args.optimizer, comm=args.comm_policy)
    if result is None:  # a rank of a torchrun job other than worker 0
        return 0
    if args.json:
        print(dump({"policy": format_policy(policy), **result.to_json()}))
        return 0
    print(sync_report(result, format_policy(policy)))
    return 0


def sync_report(result: Any, policy: str) -> str:
    """The run's text: the setting, one row per phase, one per switch, the held-out result."""
    comm = f", BSP on comm {result.comm}" if result.comm is not None else ""
    lines = [f"{result.task}: {result.ranks} workers x batch {result.batch_per_rank}, policy "
             f"{policy}{comm}, {result.total_samples} samples in {result.wall_s:.1f} s",
             f"  {'phase':<16}{'samples':>9}{'updates':>9}{'lr':>9}{'step':>11}"
             f"{'staleness':>11}"]
    steps = []
    for phase in result.phases:
        step = phase.wall_s / phase.batches if phase.batches else 0.0
        steps.append(step)
        applied = [(s, n) for per_rank in phase.staleness for s, n in enumerate(per_rank)]
        count = sum(n for _, n in applied)
        stale = f"{sum(s * n for s, n in applied) / count:.2f}" if count else "-"
        lines.append(f"  {phase.protocol:<16}{phase.samples:>9}{phase.updates:>9}"
                     f"{phase.lr:>9.4g}{format_duration(step):>11}{stale:>11}")
    for event in result.detector_events:
        lines.append(f"  detector: worker {event.rank} {event.kind} at step {event.step} "
                     f"({event.samples} samples, {event.at_s:.2f} s, ratio {event.ratio:.2f})")
    for switch in result.switches:
        why = (f" (straggler: worker {', '.join(map(str, switch.ranks))})"
               if switch.reason == "straggler" else "")
        lines.append(f"  switch {switch.from_protocol} -> {switch.to_protocol} at "
                     f"{switch.samples} samples{why}: {format_duration(switch.cost_s)}")
    for episode in result.episodes:
        kind = ("relaxed episode" if episode.protocol != "bsp(fast)" else
                f"episode without worker {', '.join(map(str, episode.ranks))}")
        lines.append(f"  {kind}: {episode.samples} samples in {episode.updates} "
                     f"{episode.protocol} updates from {episode.start_samples}, "
                     f"{episode.wall_s:.2f} s, ended by {episode.end}")
    for rank in sorted({r.rank for r in result.links if r.delayed}):
        mine = [r for r in result.links if r.rank == rank]
        lines.append(f"  delayed link: worker {rank} held {sum(r.delayed for r in mine)} of "
                     f"{sum(r.messages for r in mine)} messages, "
                     f"{format_duration(sum(r.delay_s for r in mine))} in all (sending "
                     f"{format_duration(sum(r.comm_s for r in mine))})")
    lines.append(f"  held-out loss {result.final_loss:.4f}, accuracy "
                 f"{100 * result.final_accuracy:.1f}%")
    return "\n".join(lines)
