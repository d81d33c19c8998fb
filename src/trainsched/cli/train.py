"""``trainsched train``: train a zoo model on real gloo ranks with scheduled communication and
print the measured step time; ``--autotune`` searches partition and credit online first
(imports torch, through the runtime)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from trainsched.backprop.reorder import BACKPROP_ORDERS
from trainsched.cli.common import (
    TUNE_FLAGS,
    Applies,
    Fact,
    Subcommands,
    add_alias,
    add_json,
    add_tune_args,
    check_applicable,
    check_count,
    dump,
    parse_credit,
    size_rules_and_facts,
    tune_ranges,
)
from trainsched.cli.outputs import check_writable_dir
from trainsched.cli.sync_train import SYNC_FLAGS, add_sync_args, run_sync_cli
from trainsched.comm.policy import COMM_POLICIES, CREDIT_MODES
from trainsched.compare import TRIAL_CANDIDATES, TRIAL_GAIN, TRIAL_ROUNDS
from trainsched.errors import TrainschedError
from trainsched.graph import OPTIMIZERS
from trainsched.report.tables import (
    auto_report,
    autotune_intro,
    autotune_report,
    plan_run_report,
    registered_report,
    train_report,
)

NAME = "train"


#: ``--auto-trial``'s default: steps per round of the measured check of auto's pick.
AUTO_TRIAL_STEPS = 3

def add_parser(sub: Subcommands) -> None:
    p = sub.add_parser(NAME, help="train a zoo model on N real gloo ranks with scheduled "
                       "communication and print the measured step time")
    p.add_argument("model", help="a zoo model name or file.py:function")
    p.add_argument("--plan", default=None,
                   help="run this plan file (trainsched compare writes one per strategy) and "
                   "print measured beside predicted; under torchrun, this process is one rank")
    p.add_argument("--ranks", type=int, default=None,
                   help=f"worker processes, one rank each (default {DEFAULTS['ranks']})")
    add_alias(p, "--nproc", "ranks", type=int)
    p.add_argument("--comm-policy", choices=comm_choices(), default=None,
                   help="fifo: whole tensors, barrier; ddp: torch DDP; priority (default): "
                   "partitions, credit, crossing the barrier; bytescheduler: priority with "
                   "gradients below 1 MiB fused into one collective; any other registered "
                   "policy at its defaults; auto: capture this model's costs, simulate every "
                   "data-parallel strategy on this host's calibration and run the fastest "
                   "(stock DDP unless another is predicted over 5%% faster)")
    add_alias(p, "--comm", "comm_policy", choices=comm_choices())
    p.add_argument("--backprop", choices=tuple(BACKPROP_ORDERS), default=None,
                   help="inorder (default): each layer's weight gradient right after its input "
                   "gradient; ooo: out-of-order backprop, the weight gradients of the first k "
                   "layers after the last input gradient (reverse-first-k; priority or "
                   "bytescheduler)")
    p.add_argument("--k", type=int, default=None,
                   help="--backprop ooo: layers whose weight gradient is deferred (default: "
                   "the k the simulator predicts fastest on this host)")
    p.add_argument("--calibration", default=None,
                   help="--comm-policy auto, or --backprop ooo without --k: a cluster file "
                   "from trainsched calibrate to predict with (default: calibrate this host "
                   "first)")
    p.add_argument("--auto-trial", type=int, default=None, metavar="STEPS",
                   help=f"--comm-policy auto: when a strategy is predicted faster than stock "
                   f"DDP, time the (up to {TRIAL_CANDIDATES}) strategies predicted faster "
                   f"against stock DDP first, interleaved in one job ({TRIAL_ROUNDS} rounds of "
                   f"at least STEPS steps each, default {AUTO_TRIAL_STEPS}, more for a short "
                   f"step), and run the one that measured fastest, DDP unless another beat "
                   f"it by more than {100 * TRIAL_GAIN:.0f}%%; 0: trust the simulator")
    p.add_argument("--partition", default=None,
                   help=f"priority/bytescheduler: partition size (default "
                   f"{DEFAULTS['partition']})")
    p.add_argument("--credit", default=None,
                   help=f"priority/bytescheduler: bytes in flight (or inf; default "
                   f"{DEFAULTS['credit']})")
    p.add_argument("--credit-mode", choices=CREDIT_MODES, default=None,
                   help=f"priority/bytescheduler (default {DEFAULTS['credit_mode']})")
    p.add_argument("--backfill", action="store_true",
                   help="priority, strict credit: when the most urgent partition does not fit "
                   "in the credit left, send the most urgent one that does")
    p.add_argument("--order", default=None,
                   help="fifo/priority: the collective order every rank issues: leader "
                   "(default; rank 0 decides each step, published in the store) or static "
                   "(compiled once from step 0's ready times, no per-decision store traffic)")
    p.add_argument("--no-schedule", action="store_true",
                   help="fifo/priority: turn the scheduler off (its pass-through: stock DDP, one "
                   "optimizer, no hooks or threads of its own)")
    p.add_argument("--steps", type=int, default=20, help="timed steps after the warm-up")
    p.add_argument("--warmup", type=int, default=3, help="untimed first steps")
    p.add_argument("--batch-size", type=int, default=None, help="examples per rank")
    p.add_argument("--image-size", type=int, default=None, help="vision models: input side")
    p.add_argument("--seq-len", type=int, default=None, help="text models: tokens")
    p.add_argument("--optimizer", choices=OPTIMIZERS, default="sgd",
                   help="how every rank updates its parameters")
    p.add_argument("--lr", type=float, default=0.01, help="learning rate (default 0.01)")
    p.add_argument("--trace-dir", default=None,
                   help="directory for one Chrome trace per rank (first 3 timed steps); with "
                   "--plan also steps.trace.json, the measured steps")
    add_alias(p, "--timeline", "trace_dir")
    p.add_argument("--timeout", type=float, default=1800, help="seconds before giving up")
    p.add_argument("--huge-pages", choices=HUGE_PAGES_CHOICES, default=None,
                   help="on/off: the ranks' THP_MEM_ALLOC_ENABLE (PyTorch's CPU allocator "
                   "asking for 2 MiB pages for buffers of 2 MiB or more); auto: time short "
                   "stock-DDP jobs of the model with it off and on, and keep it on only where "
                   "that is more than 3%% faster (default: the environment's value)")
    p.add_argument("--autotune", action="store_true",
                   help="priority: pick partition and credit by Bayesian search, online (every "
                   "rank switches to each trial point in one job), then time the best")
    add_tune_args(p, "--autotune")
    p.add_argument("--tune-steps", type=int, default=None,
                   help=f"--autotune: measured steps per trial (after 1 settling step; default "
                   f"{DEFAULTS['tune_steps']})")
    p.add_argument("--tune-confirm", type=int, default=None,
                   help=f"--autotune: rounds re-measuring the 3 fastest points, in alternating "
                   f"order, to choose among them (0: take the fastest trial; default "
                   f"{DEFAULTS['tune_confirm']})")
    add_sync_args(p)
    add_json(p)
    p.set_defaults(func=run)


#: Defaults of the flags that apply in some modes only (given in code, so that a flag given
#: where it does not apply is seen).
DEFAULTS = {"ranks": 2, "comm_policy": "priority", "partition": "4MiB", "credit": "16MiB",
            "credit_mode": "overdraft", "order": "leader", "tune_steps": 5, "tune_confirm": 2}

def comm_choices() -> tuple[str, ...]:
    """``--comm-policy``'s choices: the policies registered now, and ``auto`` (simulate, then
    run the strategy predicted fastest)."""
    return (*COMM_POLICIES, "auto")

#: The policies the scheduled runtime runs (``--no-schedule`` turns its scheduler off, and
#: ``--trace-dir`` records it).
SCHEDULER = ("fifo", "priority", "bytescheduler")


def rules(model: str) -> tuple[list[Applies], dict[str, Fact]]:
    """Which flags apply with which ``--comm-policy`` (``plan``: ``--plan FILE``), ``--autotune``,
    ``--no-schedule`` and model (:func:`trainsched.cli.common.check_applicable`)."""
    tuned = ("priority", "bytescheduler")
    table, facts = size_rules_and_facts(model)
    table += [
        Applies(flags=("ranks", "comm_policy"), when={"comm": comm_choices()},
                where="without --plan (the plan file sets them)"),
        Applies(flags=("auto_trial",), when={"comm": ("auto",)},
                where="with --comm-policy auto"),
        Applies(flags=("calibration",), when={"predicts": (True,)},
                where="with --comm-policy auto or --backprop ooo without --k (they simulate)"),
        Applies(flags=("backprop",), when={"comm": tuned},
                where="with --comm-policy priority or bytescheduler (their updates cross the "
                "step barrier, as deferred layers need)"),
        Applies(flags=("k",), when={"backprop": ("ooo",)}, where="with --backprop ooo"),
        Applies(flags=("partition", "credit", "credit_mode", "backfill"), when={"comm": tuned},
                where="with --comm-policy priority or bytescheduler"),
        Applies(flags=("order",), when={"comm": tuple(c for c in COMM_POLICIES if c != "ddp"),
                                        "no_schedule": (False,)},
                where="with a --comm-policy other than ddp, without --no-schedule"),
        Applies(flags=("no_schedule",), when={"comm": SCHEDULER, "autotune": (False,)},
                where=f"with --comm-policy {', '.join(SCHEDULER)}, without --autotune (it "
                "tunes the scheduler)"),
        Applies(flags=("trace_dir",), when={"comm": (*SCHEDULER, "plan", "auto"),
                                           "autotune": (False,), "no_schedule": (False,)},
                where=f"with --plan, auto or --comm-policy {', '.join(SCHEDULER)} (the scheduled "
                "runtime), without --autotune or --no-schedule (give it at the point the tuner "
                "reports)"),
        Applies(flags=("autotune",), when={"comm": tuned},
                where="with --comm-policy priority or bytescheduler (it tunes their partition "
                "and credit)"),
        Applies(flags=(*TUNE_FLAGS, "tune_steps", "tune_confirm"), when={"autotune": (True,)},
                where="with --autotune"),
    ]
    return table, facts


def check_flags(args: argparse.Namespace) -> None:
    """Refuse every flag that does not apply to the run the others describe (:func:`rules`),
    and a learning rate that is not a finite number > 0."""
    _check_sync_flags(args)
    if args.sync is not None:
        _check_lr(args.lr)
        return
    comm = "plan" if args.plan is not None else args.comm_policy or DEFAULTS["comm_policy"]
    table, facts = rules(args.model)
    facts.update(
        comm=Fact(value=comm, text="with --plan FILE" if comm == "plan"
                  else f"with --comm-policy {comm}"),
        autotune=Fact(value=bool(args.autotune), text="with --autotune"),
        backprop=Fact(value=args.backprop or "inorder",
                      text=f"with --backprop {args.backprop or 'inorder'}"),
        predicts=Fact(value=comm == "auto" or (args.backprop == "ooo" and args.k is None),
                      text="without --comm-policy auto or --backprop ooo (without --k)"),
        no_schedule=Fact(value=bool(args.no_schedule), text="with --no-schedule"))
    check_applicable(args, table, facts)
    _check_lr(args.lr)
    check_count("--ranks", args.ranks, 1)
    check_count("--steps", args.steps, 1)
    check_count("--warmup", args.warmup, 0)
    if args.auto_trial is not None:
        check_count("--auto-trial", args.auto_trial, 0)
    from trainsched.runtime.train import ORDERS

    if args.order is not None and args.order not in ORDERS:
        raise TrainschedError(f"--order {args.order}: give {' or '.join(ORDERS)}")


def _check_lr(lr: float) -> None:
    import math

    if not (math.isfinite(lr) and lr > 0):
        raise TrainschedError(f"--lr {lr}: give a finite learning rate > 0, e.g. 0.01")


#: The flags of data-parallel training on zoo models, which a ``--sync`` run does not take.
NOT_WITH_SYNC = ("plan", "backprop", "k", "calibration", "partition", "credit",
                 "credit_mode", "backfill", "order", "no_schedule", "autotune", "trace_dir")


def _check_sync_flags(args: argparse.Namespace) -> None:
    """``--sync`` trains a built-in task or a zoo model on the sync runtime: the scheduled
    data-parallel runtime's flags do not apply to it, nor its own flags without it; a zoo
    model's input sizes apply as without ``--sync``."""
    if args.sync is None:
        given = [f for f in SYNC_FLAGS if getattr(args, f) is not None]
        if given:
            raise TrainschedError(f"--{given[0]} applies only with --sync POLICY; drop it")
        return
    given = [f for f in NOT_WITH_SYNC if getattr(args, f) not in (None, False)]
    if given:
        raise TrainschedError(f"--{given[0].replace('_', '-')} does not apply with --sync (the "
                              f"sync runtime trains the model under the policy; only "
                              f"--comm-policy applies, at the policy's defaults); drop it")
    if args.comm_policy == "auto":
        raise TrainschedError("--comm-policy auto times strategies against each other before "
                              "training; with --sync name the BSP phases' policy (e.g. ddp "
                              "or priority)")
    if args.optimizer not in ("sgd", "adam"):
        raise TrainschedError(f"--optimizer {args.optimizer}: the sync runtime trains with sgd "
                              f"(add --momentum for momentum) or adam")
    from trainsched.runtime.tasks import TASKS

    if args.model.strip().lower() not in TASKS:  # a zoo model: its input sizes
        table, facts = size_rules_and_facts(args.model)
        check_applicable(args, table, facts)
        return
    sizes = [f for f in ("image_size", "seq_len") if getattr(args, f) is not None]
    if sizes:
        raise TrainschedError(f"--{sizes[0].replace('_', '-')} applies to zoo models; the "
                              f"built-in task {args.model} makes its own inputs: drop it")


def warn_oversubscribed(nproc: int) -> None:
    """A warning on stderr when ``nproc`` ranks are far more than this host's cores (each rank
    is a process that computes: the step times measure the contention)."""
    import os
    import sys

    cores = os.cpu_count() or 1
    if nproc > 2 * cores:
        print(f"trainsched: warning: --ranks {nproc} runs {nproc} processes on {cores} cores; "
              f"the step times will measure their contention", file=sys.stderr, flush=True)


#: ``--huge-pages``: the settings it names and ``auto``.
HUGE_PAGES_CHOICES = ("auto", "on", "off")


def run(args: argparse.Namespace) -> int:
    check_flags(args)
    if args.huge_pages is None:
        return _run(args)
    from trainsched.runtime.launch import huge_pages, torchrun_rank

    if torchrun_rank() is not None:
        raise TrainschedError("--huge-pages sets the environment of the ranks trainsched "
                              "starts; under torchrun set THP_MEM_ALLOC_ENABLE=0 or 1 in "
                              "torchrun's environment instead")
    setting = {"on": "1", "off": "0"}.get(args.huge_pages)
    if setting is None:
        setting = _choose_huge_pages(args)
    with huge_pages(setting):
        return _run(args)


def _choose_huge_pages(args: argparse.Namespace) -> str:
    """``--huge-pages auto``: short stock-DDP jobs of the model off and on; the setting."""
    from trainsched.runtime.huge_pages import huge_pages_trial

    print("huge pages: timing the model with them off and on (stock DDP, 4 short jobs) ...",
          file=sys.stderr, flush=True)
    choice = huge_pages_trial(args.model, nproc=args.ranks or DEFAULTS["ranks"],
                              batch_size=args.batch_size, image_size=args.image_size,
                              seq_len=args.seq_len, optimizer=args.optimizer, lr=args.lr,
                              timeout_s=args.timeout)
    print(choice.reason(), file=sys.stderr, flush=True)
    return choice.setting


def _run(args: argparse.Namespace) -> int:
    from trainsched.runtime.train import COMMS, train
    from trainsched.units import parse_size

    if args.sync is not None:
        return run_sync_cli(args)
    if args.trace_dir is not None:  # fail now, not once the workers have trained
        check_writable_dir(args.trace_dir, "--trace-dir")
    if args.plan is not None:
        return _run_plan(args)
    for option, default in DEFAULTS.items():
        if getattr(args, option) is None:
            setattr(args, option, default)
    warn_oversubscribed(args.ranks)
    if args.comm_policy == "auto":
        return _run_auto(args)
    if args.comm_policy not in COMMS:
        return _run_registered(args)
    partition = parse_size(args.partition)
    credit = parse_credit(args.credit)
    if args.autotune:
        return _autotune(args, partition, credit)
    enabled = not args.no_schedule
    backprop_k = _backprop_k(args, partition, credit)
    result = train(args.model, args.comm_policy, nproc=args.ranks, steps=args.steps,
                   warmup=args.warmup, partition_bytes=partition, credit_bytes=credit,
                   credit_mode=args.credit_mode, timeline_dir=args.trace_dir,
                   order=args.order, enabled=enabled, backfill=args.backfill,
                   batch_size=args.batch_size, image_size=args.image_size,
                   seq_len=args.seq_len, optimizer=args.optimizer, lr=args.lr,
                   timeout_s=args.timeout, backprop_k=backprop_k)
    seg = result.first
    if args.backprop == "ooo" and not args.json:
        print(f"out-of-order backprop: the weight gradients of the first {backprop_k} layers "
              f"run after the last input gradient (reverse-first-k)")
    if args.json:
        print(dump({"comm": args.comm_policy, "backprop": args.backprop or "inorder",
                    "k": backprop_k, "partition_bytes": partition,
                    "credit_bytes": None if credit == float("inf") else credit,
                    "credit_mode": args.credit_mode, "backfill": args.backfill,
                    "order": args.order, "schedule": enabled, "warmup": args.warmup,
                    "steps": args.steps, "median_s": seg.median_s,
                    "p10_s": seg.quantile_s(0.1), "p90_s": seg.quantile_s(0.9),
                    "throughput_samples_per_s": result.throughput(), **result.to_dict()}))
        return 0
    print(train_report(result, nproc=args.ranks, comm=args.comm_policy, partition_bytes=partition,
                       credit_bytes=credit, credit_mode=args.credit_mode,
                       backfill=args.backfill, order=args.order, scheduled=enabled,
                       optimizer=args.optimizer, warmup=args.warmup, timeline=args.trace_dir))
    return 0


def _autotune(args: argparse.Namespace, partition: int, credit: float) -> int:
    """``--autotune``: Bayesian search of (partition, credit) online, in one job: rank 0 switches
    every rank to each trial point for ``--tune-steps`` steps, then to the best; the ``--steps``
    timed steps run there."""
    from trainsched.runtime.train import train

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
        print(autotune_intro(model=args.model, nproc=args.ranks,
                             search_trials=args.tune_trials, confirm_trials=tuner.n_confirm,
                             trial_steps=args.tune_steps, total_steps=tuner.total_steps,
                             warmup=args.warmup, steps=args.steps), flush=True)
    result = train(args.model, args.comm_policy, nproc=args.ranks, steps=args.steps,
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
        print(dump({"comm": args.comm_policy, "credit_mode": args.credit_mode, "order": args.order,
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

    plan, prediction = read_plan_file(args.plan)
    result = run_plan(plan, args.model, steps=args.steps, warmup=args.warmup,
                      batch_size=args.batch_size, image_size=args.image_size,
                      seq_len=args.seq_len, optimizer=args.optimizer, lr=args.lr,
                      timeout_s=args.timeout, timeline_dir=args.trace_dir)
    if result is None:  # one rank of a torchrun job that is not rank 0
        return 0
    doc = {"plan": args.plan, **result.to_dict(),
           "predicted": None if prediction is None else {
               "cluster": prediction.cluster, "step_time_s": prediction.step_time_s,
               "measured_over_predicted": result.mean_s / prediction.step_time_s
               if prediction.step_time_s else None}}
    print(dump(doc) if args.json else plan_run_report(args.plan, plan, result, prediction,
                                                      warmup=args.warmup,
                                                      timeline=args.trace_dir))
    if result.sync is not None and not args.json:  # a sync plan: its phases and switches
        from trainsched.cli.sync_train import sync_report

        print(sync_report(result.sync, plan.sync))
    return 0


def _host_model(args: argparse.Namespace) -> tuple[Any, Any]:
    """The training graph of ``args.model`` with costs measured on this host (one thread per
    rank) and the host's cluster: ``--calibration``, else calibrated now on ``--ranks``
    (:func:`trainsched.runtime.host.host_model`)."""
    import sys

    from trainsched.report.progress import ProgressBar
    from trainsched.runtime.host import host_model

    def announce() -> None:
        if not args.json:
            print(f"calibrating this host's gloo on {args.ranks} ranks (save it with "
                  f"trainsched calibrate -o FILE, reuse it with --calibration FILE)",
                  file=sys.stderr, flush=True)

    with ProgressBar(f"capturing {args.model}", enabled=not args.json) as bar:
        return host_model(args.model, ranks=args.ranks, batch_size=args.batch_size,
                          image_size=args.image_size, seq_len=args.seq_len,
                          optimizer=args.optimizer, calibration=args.calibration,
                          progress=bar.update, before_calibrating=announce)


def _backprop_k(args: argparse.Namespace, partition: int, credit: float) -> int:
    """``--backprop ooo``'s k: ``--k``, else the k the simulator predicts fastest for this
    model, policy and host (:func:`trainsched.sim.sweep_k`); 0 for in-order backprop."""
    if args.backprop != "ooo":
        return 0
    if args.k is not None:
        check_count("--k", args.k, 0)
        return args.k
    from trainsched.runtime.train import segment_for
    from trainsched.sim import sweep_k

    graph, cluster = _host_model(args)
    # the very policy the run below will use (priority crosses the barrier there)
    policy = segment_for(args.comm_policy, partition_bytes=partition, credit_bytes=credit,
                         credit_mode=args.credit_mode,
                         backfill=args.backfill).policy_object()
    sweep = sweep_k(graph, cluster.first_devices(args.ranks), ranks=args.ranks, policy=policy)
    if not args.json:
        print(f"k chosen by simulation: {sweep.k} of {sweep.layers} layers "
              f"(predicted {sweep.speedup:.3f}x over in-order backprop)", flush=True)
    return sweep.k


def _run_auto(args: argparse.Namespace) -> int:
    """``--comm-policy auto``: capture the model's costs on this host (measured, one thread per
    rank), calibrate the host (or read ``--calibration``), simulate every data-parallel
    strategy, run the plan :func:`trainsched.compare.choose_comm` picks and print measured
    beside predicted."""
    from trainsched.compare import AUTO_BASELINE, Options, choose_comm, confirm_choice
    from trainsched.compare import trial_steps as trial_steps_for
    from trainsched.plan import Prediction
    from trainsched.runtime import run as run_plan

    graph, cluster = _host_model(args)
    choice = choose_comm(graph, cluster, Options(ranks=args.ranks, microbatches=1,
                                                 batch_size=graph.meta["batch_size"]))
    trial_steps = AUTO_TRIAL_STEPS if args.auto_trial is None else args.auto_trial
    if choice.strategy != AUTO_BASELINE and trial_steps > 0:
        from trainsched.runtime.run import interleaved_trial

        trial_steps = trial_steps_for(choice, trial_steps)

        assert choice.shortlist is not None
        if not args.json:
            print(f"auto: {choice.strategy} is predicted faster ({choice.reason}); timing "
                  f"{', '.join(n for n in choice.shortlist if n != AUTO_BASELINE)} against "
                  f"stock DDP first ({TRIAL_ROUNDS} rounds of {trial_steps} steps)", flush=True)
        measured = interleaved_trial(
            args.model, {n: p.plan for n, p in choice.shortlist.items()}, rounds=TRIAL_ROUNDS,
            steps=trial_steps, batch_size=args.batch_size, image_size=args.image_size,
            seq_len=args.seq_len, optimizer=args.optimizer, lr=args.lr, timeout_s=args.timeout)
        choice = confirm_choice(choice, measured)
    plan = choice.planned.plan
    result = run_plan(plan, args.model, steps=args.steps, warmup=args.warmup,
                      batch_size=args.batch_size, image_size=args.image_size,
                      seq_len=args.seq_len, optimizer=args.optimizer, lr=args.lr,
                      timeout_s=args.timeout, timeline_dir=args.trace_dir)
    assert result is not None  # our own launcher: this process is rank 0
    prediction = Prediction(cluster=cluster.label, step_time_s=choice.predicted_s[
        choice.strategy], samples_per_step=choice.planned.samples_per_step)
    if args.json:
        print(dump({"auto": {"strategy": choice.strategy, "reason": choice.reason,
                             "predicted_s": choice.predicted_s, "trial": choice.trial},
                    **result.to_dict(),
                    "predicted": {"cluster": prediction.cluster,
                                  "step_time_s": prediction.step_time_s}}))
        return 0
    print(auto_report(choice, cluster.label))
    print(plan_run_report(f"auto:{choice.strategy}", plan, result, prediction,
                          warmup=args.warmup, timeline=args.trace_dir))
    return 0


def _run_registered(args: argparse.Namespace) -> int:
    """``--comm-policy NAME`` for a registered policy beyond the four the flags describe: the
    policy at its registered defaults, on the scheduled runtime."""
    from trainsched.comm.policy import comm_policy
    from trainsched.runtime.run import policy_segment
    from trainsched.runtime.train import run_segments

    segment = policy_segment(comm_policy(args.comm_policy), label=args.comm_policy,
                             order=args.order, steps=args.steps, warmup=args.warmup)
    result = run_segments(args.model, [segment], nproc=args.ranks, batch_size=args.batch_size,
                          image_size=args.image_size, seq_len=args.seq_len,
                          optimizer=args.optimizer, lr=args.lr, timeout_s=args.timeout)
    seg = result.first
    if args.json:
        print(dump({"comm": args.comm_policy, "order": args.order, "warmup": args.warmup,
                    "steps": args.steps, "median_s": seg.median_s,
                    "p10_s": seg.quantile_s(0.1), "p90_s": seg.quantile_s(0.9),
                    "throughput_samples_per_s": result.throughput(), **result.to_dict()}))
        return 0
    print(registered_report(result, comm=args.comm_policy, nproc=args.ranks, order=args.order,
                            optimizer=args.optimizer, warmup=args.warmup))
    return 0
