"""Distributed jobs for ``tests/test_comm_runtime.py``: ``python tests/comm_jobs.py CONFIG``.

Each job runs in every rank of a real gloo group (spawned by
:func:`trainsched.runtime.launch.run_workers`), runs several checks in that one group and
writes ``<out>/rank<r>.json`` with what it measured; the test asserts on those numbers.
"""

from __future__ import annotations

import atexit
import json
import math
import os
import random
import sys
import threading
import time
import traceback
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from trainsched.comm import (
    ByteSchedulerPolicy,
    DdpBucketPolicy,
    FifoPolicy,
    PriorityPolicy,
    ReadyBucketPolicy,
)
from trainsched.comm.tune import OnlineTuner
from trainsched.errors import TrainschedError
from trainsched.runtime.data_parallel import ScheduledDataParallel

KiB = 1024
STEPS = 3
OPTIMIZERS = {
    "sgd": (torch.optim.SGD, {"lr": 0.05}),
    "momentum": (torch.optim.SGD, {"lr": 0.05, "momentum": 0.9}),
    "adam": (torch.optim.Adam, {"lr": 1e-3}),
}
POLICIES = {
    "fifo": FifoPolicy(),
    "fifo-crossing": FifoPolicy(cross_barrier=True),
    "ddp-buckets": DdpBucketPolicy(first_bucket_bytes=KiB, bucket_bytes=8 * KiB),
    "priority-strict": PriorityPolicy(partition_bytes=KiB, credit_bytes=4 * KiB,
                                      cross_barrier=True),
    "priority-overdraft": PriorityPolicy(partition_bytes=KiB, credit_bytes=2 * KiB,
                                         credit_mode="overdraft", cross_barrier=True),
    "priority-unlimited": PriorityPolicy(partition_bytes=2 * KiB, credit_bytes=math.inf,
                                         cross_barrier=True),
    "priority-whole": PriorityPolicy(cross_barrier=True),
    # Strict credit with backfill: a smaller collective may use credit the head cannot.
    "priority-backfill": PriorityPolicy(partition_bytes=2 * KiB, credit_bytes=3 * KiB,
                                        backfill=True, cross_barrier=True),
    # Partitions, and the small tensors (biases, conv1's weight) fused into flat buffers.
    "bytescheduler": ByteSchedulerPolicy(partition_bytes=2 * KiB, credit_bytes=4 * KiB,
                                         fusion_bytes=KiB),
}


class Net(nn.Module):
    """Two convolutions and two linear layers: parameters from 32 B to 32 KiB."""

    def __init__(self, extra: bool = False) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3)
        self.conv2 = nn.Conv2d(8, 8, 3)
        self.fc1 = nn.Linear(128, 64)
        self.fc2 = nn.Linear(64, 10)
        if extra:
            self.fc3 = nn.Linear(10, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.conv2(torch.relu(self.conv1(x))))
        return self.fc2(torch.relu(self.fc1(y.flatten(1))))


def net(seed: int = 0, **kw) -> Net:
    torch.manual_seed(seed)
    return Net(**kw)


def batch(step: int, rank: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(4, 3, 8, 8, generator=g)


def loss_of(out: torch.Tensor) -> torch.Tensor:
    return out.square().mean()


def params(m: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in m.parameters()]


def max_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max((x - y).abs().max().item() for x, y in zip(a, b, strict=True))


def train_ddp(rank: int, optimizer: str, steps: int = STEPS) -> list[torch.Tensor]:
    m = net()
    ddp = nn.parallel.DistributedDataParallel(m)
    cls, kwargs = OPTIMIZERS[optimizer]
    opt = cls(m.parameters(), **kwargs)
    for s in range(steps):
        opt.zero_grad()
        loss_of(ddp(batch(s, rank))).backward()
        opt.step()
    return params(m)


def train_plain(rank: int, world: int, optimizer: str) -> list[torch.Tensor]:
    """Whole-tensor all-reduce after backward, divide, one optimizer over all parameters."""
    m = net()
    with torch.no_grad():
        for p in m.parameters():
            dist.broadcast(p, 0)
    cls, kwargs = OPTIMIZERS[optimizer]
    opt = cls(m.parameters(), **kwargs)
    for s in range(STEPS):
        opt.zero_grad()
        loss_of(m(batch(s, rank))).backward()
        for p in m.parameters():
            dist.all_reduce(p.grad)
            p.grad.div_(world)
        opt.step()
    return params(m)


def record_issues(sdp: ScheduledDataParallel) -> list[dict]:
    """Test instrumentation: log every collective this rank issues, step by step, beside the
    compiled static order as it stands at the step's first issue (read in the dispatcher
    thread, which owns it)."""
    log: list[dict] = []
    d = sdp._dispatch
    issue = d.issue

    def logged(c: int) -> None:
        if d.position == 0:
            log.append({"step": d.step, "order": [d.names[k] for k in d.static], "issued": []})
        log[-1]["issued"].append(d.names[c])
        issue(c)

    d.issue = logged
    return log


def decision_keys(sdp: ScheduledDataParallel, steps: int, count: int) -> list[str]:
    """The leader's per-decision store keys ``<s>/<k>`` of this wrapper that exist now (the
    leader deletes those of step s - 2 as it goes, so its last two steps' keys remain)."""
    store = dist.PrefixStore(sdp._store_prefix, dist.distributed_c10d._get_default_store())
    return [key for key in (f"{s}/{k}" for s in range(steps) for k in range(count))
            if store.check([key])]


def train_sdp(rank: int, policy, optimizer: str, steps: int = STEPS, sleeps: random.Random |
              None = None, model: nn.Module | None = None, stats: dict | None = None,
              inspect: dict | None = None, **kw) -> list[torch.Tensor]:
    """``steps`` steps of ``net()`` (or ``model``) under ``policy``; ``inspect``: filled with
    each step's issue sequence, the static order, the decision keys left in the store and the
    threads alive during training."""
    m = net() if model is None else model
    cls, kwargs = OPTIMIZERS[optimizer]
    sdp = ScheduledDataParallel(m, policy, optimizer=cls, optimizer_kwargs=kwargs,
                                timeout_s=60, **kw)
    log = record_issues(sdp) if inspect is not None else None
    if sleeps is not None:  # random delays in every gradient hook and module forward
        for p in m.parameters():
            p.register_post_accumulate_grad_hook(
                lambda _p: time.sleep(sleeps.choice([0, 0, 0.001, 0.003])))
        for mod in (m.conv1, m.conv2, m.fc1, m.fc2):
            mod.register_forward_pre_hook(
                lambda *_: time.sleep(sleeps.choice([0, 0, 0.001, 0.002])))
    try:
        for s in range(steps):
            loss_of(sdp(batch(s, rank))).backward()
            if inspect is not None and s == 1:
                inspect["threads"] = sorted(t.name for t in threading.enumerate())
        sdp.drain()
        if inspect is not None:
            inspect["issues"] = log
            inspect["static_order"] = (list(sdp.static_order) if sdp.order == "static"
                                       else None)
            most = max(len(entry["issued"]) for entry in log)
            inspect["decision_keys"] = decision_keys(sdp, steps, most)
    finally:
        sdp.close()
    if stats is not None:
        stats["max_in_flight_bytes"] = sdp.max_in_flight_bytes
    return params(m)


def lr_change(rank: int, scheduled: bool, enabled: bool = True) -> list[torch.Tensor]:
    """Momentum SGD at lr 0.05 for two steps, then 0.01 (set_lr drains first)."""
    m = net()
    cls, kwargs = OPTIMIZERS["momentum"]
    if scheduled:
        sdp = ScheduledDataParallel(m, POLICIES["priority-strict"], optimizer=cls,
                                    optimizer_kwargs=kwargs, enabled=enabled)
        for s in range(4):
            if s == 2:
                sdp.set_lr(0.01)
            loss_of(sdp(batch(s, rank))).backward()
        sdp.close()
        return params(m)
    ddp = nn.parallel.DistributedDataParallel(m)
    opt = cls(m.parameters(), **kwargs)
    for s in range(4):
        if s == 2:
            opt.param_groups[0]["lr"] = 0.01
        opt.zero_grad()
        loss_of(ddp(batch(s, rank))).backward()
        opt.step()
    return params(m)


def error_of(fn) -> str:
    try:
        fn()
    except TrainschedError as exc:
        return f"TrainschedError: {exc}"
    return "no error"


# --- jobs --------------------------------------------------------------------------------------


def job_equality(cfg: dict) -> dict:
    rank, world = cfg["rank"], cfg["world_size"]
    out: dict = {"vs_ddp": {}, "bitwise": {}}
    refs = {opt: train_ddp(rank, opt) for opt in OPTIMIZERS}
    runs = {}
    for name, policy in POLICIES.items():
        for opt in OPTIMIZERS:
            runs[name, opt] = train_sdp(rank, policy, opt)
            out["vs_ddp"][f"{name}/{opt}"] = max_diff(runs[name, opt], refs[opt])
    for opt in OPTIMIZERS:
        plain = train_plain(rank, world, opt)
        out["bitwise"][f"plain-vs-priority-whole/{opt}"] = all(
            torch.equal(a, b) for a, b in zip(plain, runs["priority-whole", opt], strict=True))
        for name in ("priority-strict", "priority-overdraft", "priority-unlimited", "fifo",
                     "bytescheduler", "priority-backfill"):
            out["bitwise"][f"{name}-vs-whole/{opt}"] = all(
                torch.equal(a, b)
                for a, b in zip(runs[name, opt], runs["priority-whole", opt], strict=True))
    # Stepping each partition alone (update="partition", the default for these optimizers)
    # is the same computation as stepping whole parameters.
    for opt in OPTIMIZERS:
        whole = train_sdp(rank, POLICIES["priority-strict"], opt, update="parameter")
        out["bitwise"][f"partition-vs-parameter-update/{opt}"] = all(
            torch.equal(a, b) for a, b in zip(whole, runs["priority-strict", opt], strict=True))
    # On a gloo group of our own with one worker thread (one FIFO wire): the same sums.
    for opt in ("sgd", "adam"):
        one = train_sdp(rank, POLICIES["priority-overdraft"], opt, comm_threads=1)
        out["bitwise"][f"one-thread-group/{opt}"] = all(
            torch.equal(a, b) for a, b in zip(one, runs["priority-overdraft", opt], strict=True))
    probe = ScheduledDataParallel(net(), POLICIES["priority-backfill"], timeout_s=60)
    loss_of(probe(batch(0, rank))).backward()
    probe.drain()
    out["backfill_in_core"] = probe._dispatch.core.backfill
    out["backfill_peak_bytes"] = probe.max_in_flight_bytes
    probe.close()
    out["partition_update_refused"] = error_of(lambda: ScheduledDataParallel(
        net(), "priority", optimizer=torch.optim.Adadelta, update="partition"))
    out["set_lr_vs_ddp"] = max_diff(lr_change(rank, True), lr_change(rank, False))
    # Every rank ends with rank 0's parameters, bit for bit.
    mine = torch.cat([p.flatten() for p in runs["priority-strict", "adam"]])
    gathered = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(gathered, mine)
    out["ranks_identical"] = all(torch.equal(g, gathered[0]) for g in gathered)
    return out


def job_fuzz(cfg: dict) -> dict:
    """Random per-rank delays; the order check runs before every issue and must stay quiet;
    then the local-only order mode must trip it."""
    rank, steps = cfg["rank"], cfg["steps"]
    out: dict = {}
    policy = PriorityPolicy(partition_bytes=KiB, credit_bytes=3 * KiB, cross_barrier=True)
    timeline = Path(cfg["out"]) / "timeline"
    timeline.mkdir(exist_ok=True)
    ref = train_ddp(rank, "momentum", steps=steps)
    stats: dict = {}
    got = train_sdp(rank, policy, "momentum", steps=steps, sleeps=random.Random(rank + 7),
                    verify_order_every=1, timeline=timeline, timeline_steps=(1, steps - 1),
                    stats=stats)
    out["fuzz_vs_ddp"] = max_diff(got, ref)
    out["credit_bytes"] = policy.credit_bytes
    out["max_in_flight_bytes"] = stats["max_in_flight_bytes"]

    # Bad input, rejected at construction on every rank (no collective is issued).
    out["mismatch"] = error_of(lambda: ScheduledDataParallel(net(extra=rank == 1), "fifo"))
    out["bad_partition"] = error_of(lambda: ScheduledDataParallel(
        net(), PriorityPolicy(partition_bytes=6, credit_bytes=64)))
    out["strict_credit"] = error_of(lambda: ScheduledDataParallel(
        net(), PriorityPolicy(partition_bytes=KiB, credit_bytes=KiB // 2)))
    unused = net(extra=True)  # fc3 is never used in forward
    out["unused"] = error_of(lambda: train_sdp(rank, "fifo", "sgd", model=unused))

    # Local-only order: rank 1 is slow to report gradients, so with one collective in flight
    # rank 0 picks the most urgent of several ready gradients while rank 1 has only one.
    torch.manual_seed(0)
    equal = nn.Sequential(*[nn.Linear(32, 32, bias=False) for _ in range(4)])

    def local() -> None:
        delay = 0.03 if rank == 1 else 0.0
        sdp = ScheduledDataParallel(equal, PriorityPolicy(cross_barrier=True), order="local",
                                    verify_order_every=1, timeout_s=30)
        for p in equal.parameters():
            p.register_post_accumulate_grad_hook(lambda _p: time.sleep(delay))
        try:
            for _ in range(3):
                sdp(torch.randn(2, 32)).square().mean().backward()
            sdp.drain()
        finally:
            sdp.close()
    out["local_order"] = error_of(local)
    return out


def job_fault(cfg: dict) -> dict:
    """Rank ``victim`` dies (or hangs) in the middle of step 2's backward."""
    rank, victim, mode = cfg["rank"], cfg["victim"], cfg["mode"]
    m = net()
    sdp = ScheduledDataParallel(m, PriorityPolicy(partition_bytes=KiB, credit_bytes=4 * KiB,
                                                  cross_barrier=True),
                                timeout_s=cfg["timeout_s"])
    step = [0]
    if rank == victim:
        def fault(_p) -> None:
            if step[0] == 2:
                if mode == "die":
                    os._exit(3)
                time.sleep(3600)
        m.fc1.weight.register_post_accumulate_grad_hook(fault)
    start = time.monotonic()
    try:
        for s in range(6):
            step[0] = s
            loss_of(sdp(batch(s, rank))).backward()
        sdp.drain()
    except TrainschedError as exc:
        return {"error": str(exc), "seconds": time.monotonic() - start}
    return {"error": None, "seconds": time.monotonic() - start}


def switches_of(sdp: ScheduledDataParallel) -> list:
    return [[step, policy.partition_bytes, policy.credit_bytes] for step, policy in sdp.switches]


def small_tuner() -> OnlineTuner:
    """1 warm-up step, the start point, 3 random and 1 guided trials and the 2 fastest points
    again, each trial 2 steps."""
    return OnlineTuner(partition_range=(KiB, 16 * KiB), credit_range=(KiB, 64 * KiB),
                       startup_trials=3, guided_trials=1, granularity_bytes=KiB,
                       warmup_steps=1, settle_steps=1, trial_steps=2, seed=3,
                       confirm_points=2, confirm_rounds=1)


def job_retune(cfg: dict) -> dict:
    """Rank 0 switches partition and credit mid-run (by hand, then an online tuner): every rank
    must switch at the same step, and the parameters must stay those of an unswitched run."""
    rank = cfg["rank"]
    out: dict = {"bitwise": {}, "vs_ddp": {}}
    start = PriorityPolicy(partition_bytes=KiB, credit_bytes=4 * KiB, cross_barrier=True)
    timeline = Path(cfg["out"]) / "retune-timeline"
    timeline.mkdir(exist_ok=True)
    steps = 8
    for opt in ("momentum", "adam"):
        m = net()
        cls, kwargs = OPTIMIZERS[opt]
        sdp = ScheduledDataParallel(m, start, optimizer=cls, optimizer_kwargs=kwargs,
                                    timeout_s=60, timeline=timeline if opt == "momentum" else
                                    None, timeline_steps=(1, 3))
        errors: dict = {}
        try:
            for s in range(steps):
                if s == 1 and rank == 0:
                    # Larger partitions from step 2; then whole tensors, a credit of one
                    # tensor at a time, and overdraft mode from step 5.
                    out[f"at/{opt}"] = [
                        sdp.retune(partition_bytes=4 * KiB, credit_bytes=8 * KiB),
                        sdp.retune(partition_bytes=None, credit_bytes=None,
                                   credit_mode="overdraft", at_step=5)]
                    errors["past"] = error_of(lambda sdp=sdp: sdp.retune(partition_bytes=2 * KiB,
                                                                 at_step=1))
                    errors["unaligned"] = error_of(lambda sdp=sdp: sdp.retune(partition_bytes=6))
                    errors["field"] = error_of(lambda sdp=sdp: sdp.retune(bucket_bytes=KiB))
                    errors["kind"] = error_of(lambda sdp=sdp: sdp.retune(FifoPolicy()))
                if s == 1 and rank == 1:
                    errors["follower"] = error_of(
                        lambda sdp=sdp: sdp.retune(partition_bytes=2 * KiB))
                loss_of(sdp(batch(s, rank))).backward()
            sdp.drain()
        finally:
            sdp.close()
        out[f"switches/{opt}"] = switches_of(sdp)
        out[f"errors/{opt}"] = errors
        plain = train_sdp(rank, start, opt, steps=steps)
        out["bitwise"][opt] = all(torch.equal(a, b)
                                  for a, b in zip(params(m), plain, strict=True))
        out["vs_ddp"][opt] = max_diff(params(m), train_ddp(rank, opt, steps=steps))

    # `optimizers` folds the partitions' state into whole parameters: fc1.weight (32 slices
    # of 1 KiB) has DDP's momentum buffer after 3 steps.
    m = net()
    with ScheduledDataParallel(m, start, optimizer=torch.optim.SGD,
                               optimizer_kwargs=OPTIMIZERS["momentum"][1]) as sdp:
        for s in range(3):
            loss_of(sdp(batch(s, rank))).backward()
        k = [n for n, _ in m.named_parameters()].index("fc1.weight")
        mine = sdp.optimizers[k].state[m.fc1.weight]["momentum_buffer"]
    ref = net()
    ddp = nn.parallel.DistributedDataParallel(ref)
    opt = torch.optim.SGD(ref.parameters(), **OPTIMIZERS["momentum"][1])
    for s in range(3):
        opt.zero_grad()
        loss_of(ddp(batch(s, rank))).backward()
        opt.step()
    theirs = opt.state[ref.fc1.weight]["momentum_buffer"]
    out["folded_buffer"] = [list(mine.shape) == list(theirs.shape),
                            float((mine - theirs).abs().max()), float(theirs.abs().max())]

    # An online tuner: 1 warm-up step, the start point, 3 random and 1 guided trials, the 2
    # fastest points again, each trial 2 steps, then the chosen point.
    tuner = small_tuner()
    steps = tuner.total_steps + 2
    m = net()
    cls, kwargs = OPTIMIZERS["momentum"]
    with ScheduledDataParallel(m, start, optimizer=cls, optimizer_kwargs=kwargs, timeout_s=60,
                               tuner=tuner) as sdp:
        for s in range(steps):
            loss_of(sdp(batch(s, rank))).backward()
        sdp.drain()
    out["tuner"] = {"total_steps": tuner.total_steps, "steps": steps,
                    "switches": switches_of(sdp),
                    "decided": [[at, p, c] for at, (p, c) in tuner.switches],
                    "trials": [t.to_dict() for t in tuner.trials]}
    out["tuner_vs_ddp"] = max_diff(params(m), train_ddp(rank, "momentum", steps=steps))
    out["tuner_fifo"] = error_of(lambda: ScheduledDataParallel(net(), "fifo", tuner=tuner))
    return out


def job_static(cfg: dict) -> dict:
    """``order="static"``: the same parameters as the leader order and DDP, the compiled order
    issued in every step on every rank, no decision in the store, random delays with the order
    checked before every issue, recompiled after a retune, with an online tuner, bad input."""
    rank = cfg["rank"]
    out: dict = {"runs": {}}
    steps = 5
    refs = {opt: train_ddp(rank, opt, steps=steps) for opt in ("momentum", "adam")}
    for name in ("priority-strict", "bytescheduler", "ddp-buckets", "fifo"):
        for opt in ("momentum", "adam"):
            leader_info: dict = {}
            leader = train_sdp(rank, POLICIES[name], opt, steps=steps, inspect=leader_info)
            info: dict = {}
            static = train_sdp(rank, POLICIES[name], opt, steps=steps, order="static",
                               inspect=info)
            out["runs"][f"{name}/{opt}"] = {
                "bitwise_vs_leader": all(torch.equal(a, b)
                                         for a, b in zip(static, leader, strict=True)),
                "vs_ddp": max_diff(static, refs[opt]),
                "issues": info["issues"], "static_order": info["static_order"],
                "decision_keys": info["decision_keys"], "threads": info["threads"],
                "leader_decision_keys": len(leader_info["decision_keys"]),
                "leader_threads": leader_info["threads"]}

    # Random per-rank delays in every hook and forward, the order checked before every issue.
    policy = PriorityPolicy(partition_bytes=KiB, credit_bytes=3 * KiB, cross_barrier=True)
    fuzz_steps = cfg.get("fuzz_steps", 30)
    stats: dict = {}
    info = {}
    got = train_sdp(rank, policy, "momentum", steps=fuzz_steps, order="static",
                    sleeps=random.Random(rank + 11), verify_order_every=1, stats=stats,
                    inspect=info)
    out["fuzz"] = {"vs_ddp": max_diff(got, train_ddp(rank, "momentum", steps=fuzz_steps)),
                   "steps": fuzz_steps, "issues": info["issues"],
                   "static_order": info["static_order"],
                   "decision_keys": info["decision_keys"],
                   "max_in_flight_bytes": stats["max_in_flight_bytes"],
                   "credit_bytes": policy.credit_bytes}

    # A retune at step 2 (4 KiB partitions): the order is recompiled, on every rank.
    start = PriorityPolicy(partition_bytes=KiB, credit_bytes=4 * KiB, cross_barrier=True)
    m = net()
    cls, kwargs = OPTIMIZERS["momentum"]
    sdp = ScheduledDataParallel(m, start, optimizer=cls, optimizer_kwargs=kwargs, timeout_s=60,
                                order="static")
    log = record_issues(sdp)
    errors: dict = {}
    try:
        for s in range(6):
            if s == 1:
                if rank == 0:
                    out["retune_at"] = sdp.retune(partition_bytes=4 * KiB,
                                                  credit_bytes=8 * KiB)
                else:
                    errors["follower"] = error_of(lambda: sdp.retune(partition_bytes=2 * KiB))
            loss_of(sdp(batch(s, rank))).backward()
        final = list(sdp.static_order)
    finally:
        sdp.close()
    switched = params(m)
    out["retune"] = {"switches": switches_of(sdp), "issues": log, "static_order": final,
                     "bitwise_vs_unswitched": all(torch.equal(a, b) for a, b in zip(
                         switched, train_sdp(rank, start, "momentum", steps=6), strict=True)),
                     "vs_ddp": max_diff(switched, train_ddp(rank, "momentum", steps=6)),
                     "errors": errors}

    # An online tuner switching every rank, under the static order.
    tuner = small_tuner()
    steps = tuner.total_steps + 2
    m = net()
    with ScheduledDataParallel(m, start, optimizer=cls, optimizer_kwargs=kwargs, timeout_s=60,
                               tuner=tuner, order="static") as sdp:
        log = record_issues(sdp)
        for s in range(steps):
            loss_of(sdp(batch(s, rank))).backward()
        sdp.drain()
    out["tuner"] = {"switches": switches_of(sdp), "steps": steps,
                    "decided": [[at, p, c] for at, (p, c) in tuner.switches],
                    "issues": log,
                    "vs_ddp": max_diff(params(m), train_ddp(rank, "momentum", steps=steps))}

    # Bad input, refused at construction on every rank.
    out["bad_wire"] = error_of(lambda: ScheduledDataParallel(net(), "priority", order="static",
                                                             static_wire=(1e-3, 0)))
    with ScheduledDataParallel(net(), "priority") as leader:
        out["not_static"] = error_of(lambda: leader.static_order)
    return out


def hook_counts(m: nn.Module) -> dict:
    """Hooks on the model: per-parameter post-accumulate-grad hooks, module forward hooks."""
    return {"grad": sum(len(p._post_accumulate_grad_hooks or {}) for p in m.parameters()),
            "forward": sum(len(mod._forward_pre_hooks) + len(mod._forward_hooks)
                           for mod in m.modules())}


def job_disabled(cfg: dict) -> dict:
    """``enabled=False``: DDP's parameters bit for bit, the optimizer stepped lazily (next
    forward, drain, close, ``optimizers``), no hooks, no threads, no store keys per step; the
    same measurements of an enabled wrapper show they can fail; the refusals."""
    rank = cfg["rank"]
    steps = 5
    store = dist.distributed_c10d._get_default_store()
    out: dict = {"runs": {}}
    for label, opt, enabled, factory in (("momentum", "momentum", False, False),
                                         ("adam", "adam", False, False),
                                         ("factory", "momentum", False, True),
                                         ("enabled", "momentum", True, False)):
        cls, kwargs = OPTIMIZERS[opt]
        if factory:
            cls, kwargs = (lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9)), None
        m = net()
        run: dict = {"hooks_before": hook_counts(m), "threads": [threading.active_count()]}
        sdp = ScheduledDataParallel(m, POLICIES["priority-strict"], optimizer=cls,
                                    optimizer_kwargs=kwargs, timeout_s=60, enabled=enabled)
        run["threads"].append(threading.active_count())
        dist.barrier()  # both ranks built theirs: count the keys the training adds
        keys = store.num_keys()
        run["hooks"] = []
        for s in range(steps):
            loss_of(sdp(batch(s, rank))).backward()
            run["hooks"].append(hook_counts(m))
        run["threads"].append(threading.active_count())
        run["steps_before_drain"] = sdp.steps
        if enabled:  # its dispatcher may still issue all-reduces: no barrier beside them
            sdp.drain()
        dist.barrier()
        run["store_keys_added"] = store.num_keys() - keys
        dist.barrier()  # neither rank writes a key before both counted
        if label == "momentum":
            sdp.drain()  # steps the last update; so do close() and `optimizers`
            run["steps_after_drain"] = sdp.steps
            state = sdp.optimizers[0].state[m.fc1.weight]["momentum_buffer"].clone()
        sdp.close()
        run["threads"].append(threading.active_count())
        run["hooks_after_close"] = hook_counts(m)
        ref = train_ddp(rank, opt, steps=steps)
        run["bitwise_vs_ddp"] = all(torch.equal(a, b)
                                    for a, b in zip(params(m), ref, strict=True))
        run["vs_ddp"] = max_diff(params(m), ref)
        if label == "momentum":
            ref_m = net()
            ddp = nn.parallel.DistributedDataParallel(ref_m)
            ref_opt = torch.optim.SGD(ref_m.parameters(), **OPTIMIZERS["momentum"][1])
            for s in range(steps):
                ref_opt.zero_grad()
                loss_of(ddp(batch(s, rank))).backward()
                ref_opt.step()
            run["momentum_buffer_bitwise"] = torch.equal(
                state, ref_opt.state[ref_m.fc1.weight]["momentum_buffer"])
            run["forward_after_close"] = error_of(lambda sdp=sdp: sdp(batch(0, rank)))
        out["runs"][label] = run
    out["set_lr_bitwise"] = all(torch.equal(a, b) for a, b in zip(
        lr_change(rank, True, enabled=False), lr_change(rank, False), strict=True))

    # Refused: what only the scheduler does.
    def disabled(**kw) -> str:
        return error_of(lambda: ScheduledDataParallel(net(), "priority", enabled=False, **kw))
    tuner = OnlineTuner(partition_range=(KiB, 16 * KiB), credit_range=(KiB, 64 * KiB))
    out["refused"] = {"tuner": disabled(tuner=tuner),
                      "timeline": disabled(timeline=cfg["out"]),
                      "verify": disabled(verify_order_every=1),
                      "order": disabled(order="static"),
                      "update": disabled(update="partition"),
                      "several": disabled(tuner=tuner, verify_order_every=2),
                      "enabled_type": error_of(lambda: ScheduledDataParallel(
                          net(), "priority", enabled="no"))}
    with ScheduledDataParallel(net(), "priority", enabled=False) as sdp:
        out["refused"]["retune"] = error_of(lambda: sdp.retune(partition_bytes=2 * KiB))
        out["refused"]["static_order"] = error_of(lambda: sdp.static_order)
    return out


def job_buckets(cfg: dict) -> dict:
    """DDP's buckets crossing the barrier (``ReadyBucketPolicy``) for ``steps`` steps per
    optimizer: parameters against DDP's, each step's issue sequence, the leader's decision
    keys left in the store and the threads alive while training."""
    rank = cfg["rank"]
    steps = cfg.get("steps", 5)
    policy = ReadyBucketPolicy(first_bucket_bytes=KiB, bucket_bytes=8 * KiB)
    out: dict = {"vs_ddp": {}, "inspect": {}}
    for opt in OPTIMIZERS:
        inspect: dict = {}
        mine = train_sdp(rank, policy, opt, steps=steps, inspect=inspect)
        out["vs_ddp"][opt] = max_diff(mine, train_ddp(rank, opt, steps=steps))
        out["inspect"][opt] = inspect
    # A bucket's parameters are stepped by one optimizer: the per-parameter optimizers still
    # hold the whole state (momentum buffers equal DDP's optimizer's).
    cls, kwargs = OPTIMIZERS["momentum"]
    m = net()
    sdp = ScheduledDataParallel(m, policy, optimizer=cls, optimizer_kwargs=kwargs, timeout_s=60)
    for s in range(steps):
        loss_of(sdp(batch(s, rank))).backward()
    sdp.drain()
    mine = [sdp.optimizers[k].state[p]["momentum_buffer"] for k, p in enumerate(m.parameters())]
    out["groups"] = len(sdp._dispatch._updates.groups)  # test instrumentation
    sdp.close()
    ref = net()
    ddp = nn.parallel.DistributedDataParallel(ref)
    opt = cls(ref.parameters(), **kwargs)
    for s in range(steps):
        opt.zero_grad()
        loss_of(ddp(batch(s, rank))).backward()
        opt.step()
    out["momentum_vs_ddp"] = max_diff(mine, [opt.state[p]["momentum_buffer"]
                                             for p in ref.parameters()])
    return out


def job_user_collectives(cfg: dict) -> dict:
    """The training loop's own collectives on the default group between steps (the loss
    all-reduced for logging, a barrier every other step) while the step's gradients are still
    in flight: the losses each rank saw, the summed losses and the parameters against DDP's."""
    rank = cfg["rank"]
    out: dict = {}
    for name in ("priority-overdraft", "bytescheduler", "fifo-crossing"):
        m = net()
        cls, kwargs = OPTIMIZERS["momentum"]
        sdp = ScheduledDataParallel(m, POLICIES[name], optimizer=cls, optimizer_kwargs=kwargs,
                                    timeout_s=cfg.get("timeout_s", 60))
        losses, summed = [], []
        try:
            for s in range(STEPS + 2):
                loss = loss_of(sdp(batch(s, rank)))
                loss.backward()
                logged = loss.detach().clone()
                dist.all_reduce(logged)
                losses.append(loss.item())
                summed.append(logged.item())
                if s % 2:
                    dist.barrier()
            sdp.drain()
        finally:
            sdp.close()
        out[name] = {"losses": losses, "summed": summed,
                     "vs_ddp": max_diff(params(m), train_ddp(rank, "momentum", STEPS + 2))}
    return out


def job_main(cfg: dict) -> dict:
    """The default suite's one job: equality, then the fuzz and the order hazard, then
    switching sizes mid-run."""
    return {"equality": job_equality(cfg), "fuzz": job_fuzz(cfg), "retune": job_retune(cfg)}


JOBS = {"main": job_main, "equality": job_equality, "fuzz": job_fuzz, "fault": job_fault,
        "retune": job_retune, "static": job_static, "disabled": job_disabled,
        "buckets": job_buckets, "user_collectives": job_user_collectives}


def main() -> None:
    cfg = json.loads(sys.argv[1])
    rank = cfg["rank"]
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{cfg['port']}", rank=rank,
                            world_size=cfg["world_size"],
                            timeout=timedelta(seconds=cfg.get("timeout_s", 60)))
    path = Path(cfg["out"]) / f"rank{rank}.json"
    try:
        result = JOBS[cfg["job"]](cfg)
    except Exception:
        result = {"crash": traceback.format_exc()}
    path.write_text(json.dumps(result))
    sys.stdout.flush()
    if cfg["job"] == "fault":
        os._exit(0)  # a survivor of a dead peer must not wait for the group's teardown
    dist.barrier()  # rank 0 hosts the store: keep it until every rank is done with it
    # Exit normally with a wrapper still open and its last step in flight: the exit hook
    # drains and closes it, and the process must not hang (the launcher's deadline would
    # fail the test). Exit hooks run last-registered first, so the wrapper's (registered when
    # it is built) drains before the process group is destroyed, as a script should end;
    # leaving a gloo group to interpreter teardown can abort the process inside torch.
    atexit.register(dist.destroy_process_group)
    sdp = ScheduledDataParallel(net(), PriorityPolicy(partition_bytes=KiB, credit_bytes=KiB,
                                                      cross_barrier=True))
    for s in range(2):
        loss_of(sdp(batch(s, rank))).backward()


if __name__ == "__main__":
    main()
