"""``trainsched train``: train a zoo model on real gloo ranks with scheduled communication and
print the measured step time; ``--autotune`` searches partition and credit online first
(imports torch, through the runtime)."""

from __future__ import annotations

import argparse

from trainsched.cli.common import (
    Subcommands,
    add_json,
    add_tune_args,
    dump,
    parse_credit,
    tune_ranges,
)
from trainsched.cli.outputs import check_writable_dir
from trainsched.comm.policy import COMM_POLICIES
from trainsched.errors import TrainschedError
from trainsched.report.tables import (
    autotune_intro,
    autotune_report,
    plan_run_report,
    registered_report,
    train_report,
)

NAME = "train"


def add_parser(sub: Subcommands) -> None:
    p = sub.add_parser(NAME, help="train a zoo model on N real gloo ranks with scheduled "
                       "communication and print the measured step time")
    p.add_argument("model", help="a zoo model name or file.py:function")
    p.add_argument("--plan", default=None,
                   help="run this plan file (trainsched compare writes one per strategy) and "
                   "print measured beside predicted; under torchrun, this process is one rank")
    p.add_argument("--nproc", type=int, default=2, help="worker processes (ranks)")
    p.add_argument("--comm", choices=tuple(COMM_POLICIES), default="priority",
                   help="fifo: whole tensors, barrier; ddp: torch DDP; priority: partitions, "
                   "credit, crossing the barrier; bytescheduler: priority with gradients below "
                   "1 MiB fused into one collective; any other registered policy at its "
                   "defaults")
    p.add_argument("--partition", default="4MiB", help="priority/bytescheduler: partition size")
    p.add_argument("--credit", default="16MiB",
                   help="priority/bytescheduler: bytes in flight (or inf)")
    p.add_argument("--credit-mode", choices=("overdraft", "strict"), default="overdraft")
    p.add_argument("--backfill", action="store_true",
                   help="priority, strict credit: when the most urgent partition does not fit "
                   "in the credit left, send the most urgent one that does")
    p.add_argument("--order", default="leader",
                   help="fifo/priority: the collective order every rank issues: leader (rank 0 "
                   "decides each step, published in the store) or static (compiled once from "
                   "step 0's ready times, no per-decision store traffic)")
    p.add_argument("--no-schedule", action="store_true",
                   help="fifo/priority: turn the scheduler off (its pass-through: stock DDP, one "
                   "optimizer, no hooks or threads of its own)")
    p.add_argument("--steps", type=int, default=20, help="timed steps after the warm-up")
    p.add_argument("--warmup", type=int, default=3, help="untimed first steps")
    p.add_argument("--batch-size", type=int, default=None, help="examples per rank")
    p.add_argument("--image-size", type=int, default=None, help="vision models: input side")
    p.add_argument("--seq-len", type=int, default=None, help="text models: tokens")
    p.add_argument("--optimizer", choices=("sgd", "momentum", "adam"), default="sgd")
    p.add_argument("--lr", type=float, default=0.01, help="learning rate")
    p.add_argument("--timeline", default=None,
                   help="directory for one Chrome trace per rank (first 3 timed steps); with "
                   "--plan also steps.trace.json, the measured steps")
    p.add_argument("--timeout", type=float, default=1800, help="seconds before giving up")
    p.add_argument("--autotune", action="store_true",
                   help="priority: pick partition and credit by Bayesian search, online (every "
                   "rank switches to each trial point in one job), then time the best")
    add_tune_args(p, "--autotune")
    p.add_argument("--tune-steps", type=int, default=5,
                   help="--autotune: measured steps per trial (after 1 settling step)")
    p.add_argument("--tune-confirm", type=int, default=2,
                   help="--autotune: rounds re-measuring the 3 fastest points, in alternating "
                   "order, to choose among them (0: take the fastest trial)")
    add_json(p)
    p.set_defaults(func=run)


#: Flags ``--plan`` replaces (the plan says what they would): destination -> default.
PLAN_REPLACES = {"nproc": 2, "comm": "priority", "partition": "4MiB", "credit": "16MiB",
                 "credit_mode": "overdraft", "backfill": False, "order": "leader",
                 "no_schedule": False, "autotune": False}


def run(args: argparse.Namespace) -> int:
    from trainsched.runtime.train import COMMS, train
    from trainsched.units import parse_size

    if args.timeline is not None:  # fail now, not once the workers have trained
        check_writable_dir(args.timeline, "--timeline")
    if args.plan is not None:
        return _run_plan(args)
    if args.comm not in COMMS:
        return _run_registered(args)
    partition = parse_size(args.partition)
    credit = parse_credit(args.credit)
    if args.autotune:
        return _autotune(args, partition, credit)
    enabled = not args.no_schedule
    result = train(args.model, args.comm, nproc=args.nproc, steps=args.steps,
                   warmup=args.warmup, partition_bytes=partition, credit_bytes=credit,
                   credit_mode=args.credit_mode, timeline_dir=args.timeline,
                   order=args.order, enabled=enabled, backfill=args.backfill,
                   batch_size=args.batch_size, image_size=args.image_size,
                   seq_len=args.seq_len, optimizer=args.optimizer, lr=args.lr,
                   timeout_s=args.timeout)
    seg = result.first
    if args.json:
        print(dump({"comm": args.comm, "partition_bytes": partition,
                    "credit_bytes": None if credit == float("inf") else credit,
                    "credit_mode": args.credit_mode, "backfill": args.backfill,
                    "order": args.order, "schedule": enabled, "warmup": args.warmup,
                    "steps": args.steps, "median_s": seg.median_s,
                    "p10_s": seg.quantile_s(0.1), "p90_s": seg.quantile_s(0.9),
                    "throughput_samples_per_s": result.throughput(), **result.to_dict()}))
        return 0
    print(train_report(result, nproc=args.nproc, comm=args.comm, partition_bytes=partition,
                       credit_bytes=credit, credit_mode=args.credit_mode,
                       backfill=args.backfill, order=args.order, scheduled=enabled,
                       optimizer=args.optimizer, warmup=args.warmup, timeline=args.timeline))
    return 0


def _autotune(args: argparse.Namespace, partition: int, credit: float) -> int:
    """``--autotune``: Bayesian search of (partition, credit) online, in one job: rank 0 switches
    every rank to each trial point for ``--tune-steps`` steps, then to the best; the ``--steps``
    timed steps run there."""
    from trainsched.runtime.train import train

    if args.comm not in ("priority", "bytescheduler"):
        raise TrainschedError("--autotune tunes the scheduler's partition and credit; drop "
                              f"--comm {args.comm} (or use --comm priority or bytescheduler)")
    if args.no_schedule:
        raise TrainschedError("--autotune tunes the scheduler, which --no-schedule turns off; "
                              "drop one of them")
    if args.timeline:
        raise TrainschedError("--timeline records one run; give it without --autotune, at the "
                              "partition and credit the tuner reports")
    ranges = tune_ranges(args)
    if args.tune_steps < 1:
        raise TrainschedError(f"--tune-steps must be >= 1, got {args.tune_steps}")
    if args.tune_confirm < 0:
        raise TrainschedError(f"--tune-confirm must be >= 0, got {args.tune_confirm}")
    startup = min(10, args.tune_trials)
    options = {"partition_range": list(ranges[0]), "credit_range": list(ranges[1]),
               "startup_trials": startup, "guided_trials": args.tune_trials - startup,
               "seed": args.tune_seed, "warmup_steps": args.warmup, "settle_steps": 1,
               "trial_steps": args.tune_steps, "confirm_points": 3,
               "confirm_rounds": args.tune_confirm}
    if not args.json:
        from trainsched.comm.tune import OnlineTuner

        tuner = OnlineTuner(**{**options, "partition_range": ranges[0],
                               "credit_range": ranges[1]})
        print(autotune_intro(model=args.model, nproc=args.nproc,
                             search_trials=args.tune_trials, confirm_trials=tuner.n_confirm,
                             trial_steps=args.tune_steps, total_steps=tuner.total_steps,
                             warmup=args.warmup, steps=args.steps), flush=True)
    result = train(args.model, args.comm, nproc=args.nproc, steps=args.steps,
                   warmup=args.warmup, partition_bytes=partition, credit_bytes=credit,
                   credit_mode=args.credit_mode, tune=options, order=args.order,
                   backfill=args.backfill, batch_size=args.batch_size,
                   image_size=args.image_size, seq_len=args.seq_len,
                   optimizer=args.optimizer, lr=args.lr, timeout_s=args.timeout)
    seg = result.first
    tuned = seg.autotune
    if tuned is None:
        raise TrainschedError("the tuner reported nothing (rank 0 ran no trial)")
    if args.json:
        print(dump({"comm": args.comm, "credit_mode": args.credit_mode, "order": args.order,
                    "steps": args.steps,
                    "warmup": args.warmup, "autotune": tuned, "median_s": seg.median_s,
                    "p10_s": seg.quantile_s(0.1), "p90_s": seg.quantile_s(0.9),
                    "throughput_samples_per_s": result.throughput(), **result.to_dict()}))
        return 0
    print(autotune_report(result, tuned, warmup=args.warmup))
    return 0


def _run_plan(args: argparse.Namespace) -> int:
    """``--plan FILE``: run the plan; print measured beside the prediction the file holds."""
    from trainsched.plan import read_plan_file
    from trainsched.runtime import run as run_plan

    given = [f"--{k.replace('_', '-')}" for k, v in PLAN_REPLACES.items()
             if getattr(args, k) != v]
    if given:
        raise TrainschedError(f"{', '.join(given)}: the plan file sets how the model is run; "
                              f"drop {'them' if len(given) > 1 else 'it'} or drop --plan")
    plan, prediction = read_plan_file(args.plan)
    result = run_plan(plan, args.model, steps=args.steps, warmup=args.warmup,
                      batch_size=args.batch_size, image_size=args.image_size,
                      seq_len=args.seq_len, optimizer=args.optimizer, lr=args.lr,
                      timeout_s=args.timeout, timeline_dir=args.timeline)
    if result is None:  # one rank of a torchrun job that is not rank 0
        return 0
    doc = {"plan": args.plan, **result.to_dict(),
           "predicted": None if prediction is None else {
               "cluster": prediction.cluster, "step_time_s": prediction.step_time_s,
               "measured_over_predicted": result.median_s / prediction.step_time_s
               if prediction.step_time_s else None}}
    print(dump(doc) if args.json else plan_run_report(args.plan, plan, result, prediction,
                                                      warmup=args.warmup,
                                                      timeline=args.timeline))
    return 0


def _run_registered(args: argparse.Namespace) -> int:
    """``--comm NAME`` for a registered policy beyond the four the flags describe: the
    policy at its registered defaults, on the scheduled runtime."""
    from trainsched.comm.policy import comm_policy
    from trainsched.runtime.run import policy_segment
    from trainsched.runtime.train import run_segments

    given = [f"--{k.replace('_', '-')}" for k in ("partition", "credit", "credit_mode",
                                                  "backfill", "no_schedule", "autotune")
             if getattr(args, k) != PLAN_REPLACES[k]]
    if args.timeline is not None:
        given.append("--timeline")
    if given:
        raise TrainschedError(f"{', '.join(given)}: --comm {args.comm} runs the registered "
                              f"policy at its defaults; drop {', '.join(given)}")
    segment = policy_segment(comm_policy(args.comm), label=args.comm, order=args.order,
                             steps=args.steps, warmup=args.warmup)
    result = run_segments(args.model, [segment], nproc=args.nproc, batch_size=args.batch_size,
                          image_size=args.image_size, seq_len=args.seq_len,
                          optimizer=args.optimizer, lr=args.lr, timeout_s=args.timeout)
    seg = result.first
    if args.json:
        print(dump({"comm": args.comm, "order": args.order, "warmup": args.warmup,
                    "steps": args.steps, "median_s": seg.median_s,
                    "p10_s": seg.quantile_s(0.1), "p90_s": seg.quantile_s(0.9),
                    "throughput_samples_per_s": result.throughput(), **result.to_dict()}))
        return 0
    print(registered_report(result, comm=args.comm, nproc=args.nproc, order=args.order,
                            optimizer=args.optimizer, warmup=args.warmup))
    return 0
