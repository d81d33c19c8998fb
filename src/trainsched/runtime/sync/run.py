"""``run_sync``: train a task through a sequence of sync protocols on real gloo ranks.

The parent process checks everything it can without torch (phases, stragglers, checkpoint
settings, a checkpoint's fit to this run), starts ``ranks`` workers plus, when a phase needs
it, ``servers`` parameter-server ranks, one per shard (:mod:`trainsched.runtime.launch`),
waits for all of them and returns worker 0's
:class:`~trainsched.runtime.sync.results.SyncRunResult`. Under ``torchrun`` this process is
one rank of the job instead (workers first, then the servers; the process group from
``env://``): worker 0 returns the result, every other rank ``None``. A rank that fails
makes the others fail within ``timeout_s`` (a dead peer closes its connections; a hung one
runs into the timeout); the error names every failed rank, the ones that crashed first.
"""

from __future__ import annotations

import json
import math
import tempfile
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from trainsched.comm.dispatch import check_sizes
from trainsched.comm.policy import CommPolicy, check_policy, comm_policy, policy_to_json
from trainsched.errors import TrainschedError
from trainsched.runtime.launch import free_port, run_workers, status_text, tail, torchrun_rank
from trainsched.runtime.sync.config import (
    LR_SCHEDULES,
    OPTIMIZERS,
    check_phases,
    needs_server,
    plan_segments,
)
from trainsched.runtime.sync.results import SyncRunResult
from trainsched.runtime.tasks import Task, TeacherStudent, ZooTask
from trainsched.sync.faults import Straggler
from trainsched.sync.protocols import SyncProtocol, format_protocol
from trainsched.sync.straggler import StragglerPolicy, format_straggler_policy
from trainsched.units import is_int

__all__ = ["run_sync"]

TARGET = "trainsched.runtime.sync.trainer:main"


def _number(what: str, value: object, low: float, *, low_open: bool = False) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(
        value) and (value > low if low_open else value >= low)
    if not ok:
        sign = ">" if low_open else ">="
        raise TrainschedError(f"{what} must be a finite number {sign} {low:g}, got {value!r}")
    return float(value)


def _resolve_checkpoint(path: str | Path) -> Path:
    p = Path(path)
    if p.is_dir():
        latest = p / "latest.json"
        if not latest.exists():
            raise TrainschedError(f"no checkpoint in {p} (latest.json is missing); name a "
                                  f"checkpoint file or a folder a sync run wrote")
        p = p / json.loads(latest.read_text())["checkpoint"]
    if not p.exists() or not p.with_suffix(".pt").exists():
        raise TrainschedError(f"checkpoint {p} (or its .pt beside it) does not exist")
    return p


def _check_resume(path: Path, fingerprint: dict[str, Any]) -> None:
    try:
        meta = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise TrainschedError(f"cannot read checkpoint {path}: {exc}") from None
    if meta.get("format") != "trainsched.sync-checkpoint/1":
        raise TrainschedError(f"{path} is not a sync-run checkpoint (format "
                              f"{meta.get('format')!r})")
    saved = meta["run"]
    if (saved["task"], saved["model"]) != (fingerprint["task"], fingerprint["model"]):
        raise TrainschedError(f"checkpoint {path} was written for another model (task "
                              f"{saved['task']}, model {saved['model'] or 'the student'}); "
                              f"resume with the same task and model, or start afresh")
    differ = [k for k in fingerprint if saved.get(k) != fingerprint[k]]
    if differ:
        first = differ[0]
        raise TrainschedError(f"checkpoint {path} was written by a run with other settings "
                              f"({', '.join(differ)}; {first}: {saved.get(first)!r} there, "
                              f"{fingerprint[first]!r} here); resume with the same settings")


def run_sync(task: Task, phases: Sequence[tuple[SyncProtocol | str, int]], *,
             ranks: int, batch_per_rank: int, lr: float, momentum: float = 0.0,
             weight_decay: float = 0.0, nesterov: bool = False, lr_schedule: str = "constant",
             model: str | None = None,
             deterministic: bool = False, push_order: Sequence[int] | None = None,
             stragglers: Sequence[Straggler] = (), checkpoint_every_samples: int | None = None,
             checkpoint_dir: str | Path | None = None, resume_from: str | Path | None = None,
             eval_every_samples: int | None = None, timeout_s: float = 60.0,
             deadline_s: float = 1800.0, return_params: bool = False,
             straggler_policy: StragglerPolicy | None = None,
             observe_every_steps: int = 2, servers: int = 1,
             optimizer: str = "sgd", comm: CommPolicy | str | None = None,
             comm_order: str = "leader") -> SyncRunResult | None:
    """Train ``task`` on ``ranks`` workers of ``batch_per_rank`` samples each, phase by phase.
    ``task``: the built-in :class:`~trainsched.runtime.tasks.TeacherStudent`, or a zoo model on
    data generated in code (:class:`~trainsched.runtime.tasks.ZooTask`; a model it cannot train
    fails on every rank with the reason, reported once).

    ``phases``: ``(protocol, samples)`` pairs (a protocol value or its text, ``"ssp(s=2)"``),
    each a whole number of the protocol's updates; the run applies their sum. ``lr`` is the
    base learning rate of SGD (with ``momentum``, ``weight_decay``, ``nesterov``), scaled per
    phase by effective batch / (N·b) and over the run by ``lr_schedule`` (``constant``,
    ``cosine``: to zero at the last sample). ``model``: ``"module:function"`` building the network
    from the task (default: the task's student). ``deterministic``: the server consumes pushes
    in ``push_order`` (cyclic; default round robin) so the run repeats bit for bit.
    ``stragglers`` slow ranks. ``checkpoint_every_samples`` writes a checkpoint into
    ``checkpoint_dir`` at each multiple (and at the end); ``resume_from`` (a checkpoint's
    ``.json`` or its folder) continues from one. ``eval_every_samples`` adds held-out points to
    the curve. ``timeout_s`` bounds every wait between ranks; ``deadline_s`` the whole run.

    ``straggler_policy`` (a sync policy's straggler part) watches the BSP phases: every
    ``observe_every_steps`` BSP steps the workers' local times feed the straggler controller,
    and on its decision the run relaxes to ASP while a worker is slow and comes back after
    (``relax``, :mod:`trainsched.runtime.sync.online`), or trains BSP among the fast workers
    while the slow ones idle and re-syncs them when they recover (``exclude``,
    :mod:`trainsched.runtime.sync.exclude`; at most 6 workers); ``ignore`` watches and records
    only.

    ``optimizer``: ``"sgd"`` (default) or ``"adam"`` (PyTorch's default betas and eps;
    ``weight_decay`` as its L2 term; no ``momentum`` or ``nesterov``): its moments and step
    counts move at switches, live with the shards on the servers, are averaged at the end of a
    local SGD phase and go into checkpoints like SGD's momentum. The learning-rate rule
    (effective batch over ``N·b``) applies to both.

    ``servers``: parameter-server ranks for the server phases, each owning one contiguous
    shard of the flat parameter vector and running the phase's loop on it (world ``ranks +
    servers``); the result's server counters are shard 0's.

    ``comm``: the comm policy (a :class:`~trainsched.comm.policy.CommPolicy` or a registered
    name) the BSP phases reduce their gradients with, on the scheduled data-parallel runtime
    (:mod:`trainsched.runtime.sync.worker`; ``ddp``: stock DDP), with ``comm_order``
    (``leader`` or ``static``) as its collective order. ``None`` (default): one flat
    all-reduce of the whole gradient after backward. The straggler policy's ``exclude``
    episodes reduce among the fast workers with the flat all-reduce either way.

    Under ``torchrun`` (``torchrun --nproc-per-node ranks+servers``, or ``ranks`` when no phase
    needs a server) this process trains as its rank: ranks ``0 .. ranks-1`` are the workers,
    the rest the servers; worker 0 returns the result, every other rank ``None``.
    """
    if not is_int(servers) or servers < 1:
        raise TrainschedError(f"servers must be a whole number >= 1, got {servers!r}")
    comm_doc = _comm_doc(comm, comm_order)
    if not isinstance(task, (TeacherStudent, ZooTask)):
        raise TrainschedError(f"task must be a built-in task (TeacherStudent) or a zoo model's "
                              f"(ZooTask), got {task!r}")
    for what, value in (("ranks", ranks), ("batch_per_rank", batch_per_rank)):
        if not is_int(value) or value < 1:
            raise TrainschedError(f"{what} must be a whole number >= 1, got {value!r}")
    checked = check_phases(phases, ranks, batch_per_rank)
    lr = _number("lr", lr, 0, low_open=True)
    momentum = _number("momentum", momentum, 0)
    if momentum >= 1:
        raise TrainschedError(f"momentum must be below 1, got {momentum}")
    weight_decay = _number("weight_decay", weight_decay, 0)
    if nesterov and not momentum:
        raise TrainschedError("nesterov needs momentum > 0")
    if optimizer not in OPTIMIZERS:
        raise TrainschedError(f"the sync runtime trains with {' or '.join(OPTIMIZERS)}, not "
                              f"{optimizer!r}")
    if optimizer == "adam" and momentum:
        raise TrainschedError("momentum and nesterov are SGD's; Adam keeps its own moments "
                              "(default betas): drop momentum with optimizer='adam'")
    LR_SCHEDULES.lookup(lr_schedule)
    timeout_s = _number("timeout_s", timeout_s, 0, low_open=True)
    deadline_s = _number("deadline_s", deadline_s, 0, low_open=True)
    order = None
    if push_order is not None:
        if not deterministic:
            raise TrainschedError("push_order scripts the deterministic mode; pass "
                                  "deterministic=True with it")
        order = [int(r) for r in push_order]
        if sorted(set(order)) != list(range(ranks)):
            raise TrainschedError(f"push_order must name every worker 0..{ranks - 1} and no "
                                  f"other rank, got {list(push_order)}")
    for s in stragglers:
        if not isinstance(s, Straggler):
            raise TrainschedError(f"stragglers must be Straggler values, got {s!r}")
        if s.rank >= ranks:
            raise TrainschedError(f"straggler rank {s.rank} is not a worker; workers are "
                                  f"0..{ranks - 1}")
    if (checkpoint_every_samples is None) != (checkpoint_dir is None):
        raise TrainschedError("checkpoint_every_samples and checkpoint_dir go together; give "
                              "both or neither")
    plan_segments(checked, ranks=ranks, batch_per_rank=batch_per_rank,
                  checkpoint_every=checkpoint_every_samples)
    if eval_every_samples is not None and (not is_int(eval_every_samples)
                                           or eval_every_samples < 1):
        raise TrainschedError(f"eval_every_samples must be a whole number >= 1, got "
                              f"{eval_every_samples!r}")
    _check_online(straggler_policy, observe_every_steps, ranks=ranks,
                  checkpoints=checkpoint_every_samples is not None or resume_from is not None,
                  deterministic=deterministic)
    if straggler_policy is not None and servers > 1:
        raise TrainschedError("a straggler policy runs with one parameter server for now; drop "
                              "servers (or --servers) or the policy")
    phase_text = [[format_protocol(p), s] for p, s in checked]
    fingerprint = {"task": task.to_json(), "model": model, "ranks": ranks,
                   "batch_per_rank": batch_per_rank, "phases": phase_text, "lr": lr,
                   "momentum": momentum, "weight_decay": weight_decay, "nesterov": nesterov,
                   "optimizer": optimizer,
                   "lr_schedule": lr_schedule.strip().lower(), "deterministic": deterministic,
                   "push_order": order,
                   "checkpoint_every": checkpoint_every_samples}
    resume = None
    if resume_from is not None:
        resume = _resolve_checkpoint(resume_from)
        _check_resume(resume, fingerprint)
    config = {**fingerprint, "fingerprint": fingerprint, "port": free_port(),
              "stragglers": [asdict(s) for s in stragglers],
              "checkpoint_dir": str(checkpoint_dir) if checkpoint_dir is not None else None,
              "resume": str(resume) if resume is not None else None,
              "eval_every": eval_every_samples, "timeout_s": timeout_s,
              "deadline_s": deadline_s, "return_params": return_params,
              "straggler_policy": (format_straggler_policy(straggler_policy)
                                   if straggler_policy is not None else None),
              "observe_every": observe_every_steps, "servers": servers,
              "comm": comm_doc, "comm_order": comm_order,
              "comm_name": (None if comm is None else comm.strip().lower()
                            if isinstance(comm, str) else type(comm).__name__)}
    relax = straggler_policy is not None and straggler_policy.action == "relax"
    world = ranks + (servers if relax or any(needs_server(p) for p, _ in checked) else 0)
    launched = torchrun_rank()
    if launched is not None:
        return _run_here(config, launched, world, ranks)
    with tempfile.TemporaryDirectory(prefix="trainsched-sync-") as tmp:
        workdir = Path(tmp)
        configs = [{**config, "rank": r, "out": str(workdir)} for r in range(world)]
        exits = run_workers(TARGET, configs, workdir=workdir, timeout_s=deadline_s,
                            wait_all=True)
        failed = [e for e in exits if e.status != 0]
        if failed:
            raise TrainschedError(_failure_text(workdir, failed, ranks, deadline_s))
        return SyncRunResult.from_json(json.loads((workdir / "rank0.json").read_text()))


def _run_here(config: dict[str, Any], launched: tuple[int, int], world: int,
              ranks: int) -> SyncRunResult | None:
    """Train as one rank of a ``torchrun`` job; worker 0 returns the result."""
    rank, size = launched
    if size != world:
        servers = world - ranks
        layout = f"{ranks} workers" + (f" + {servers} server{'s' * (servers > 1)}"
                                       if servers else "")
        raise TrainschedError(f"this sync run needs {world} ranks ({layout}) but torchrun "
                              f"started {size}; use torchrun --nproc-per-node {world}")
    import torch.distributed as dist

    from trainsched.runtime.sync.trainer import work

    data = work({**config, "port": None, "rank": rank, "out": None})
    dist.destroy_process_group()
    return SyncRunResult.from_json(data) if data is not None else None


def _comm_doc(comm: CommPolicy | str | None, order: str) -> dict[str, Any] | None:
    """``comm`` checked, as the JSON data the workers rebuild it from."""
    if order not in ("leader", "static"):
        raise TrainschedError(f"comm_order must be leader or static, got {order!r}")
    if comm is None:
        return None
    policy = comm_policy(comm) if isinstance(comm, str) else comm
    check_policy(policy)
    check_sizes(policy)
    return policy_to_json(policy)


def _check_online(policy: object, every: object, *, ranks: int, checkpoints: bool,
                  deterministic: bool) -> None:
    """Refuse what the online straggler policy in the runtime does not do."""
    if policy is None:
        return
    if not isinstance(policy, StragglerPolicy):
        raise TrainschedError(f"straggler_policy must be a StragglerPolicy (e.g. "
                              f"parse_policy('bsp;straggler(relax)').straggler), got {policy!r}")
    if policy.action == "exclude" and ranks > 6:
        raise TrainschedError(f"straggler(exclude) makes a process group for every set of fast "
                              f"workers, so it runs on at most 6 workers, got ranks={ranks}; "
                              f"use straggler(relax) or fewer workers")
    if ranks < 2:
        raise TrainschedError(f"a straggler policy compares workers with each other and needs "
                              f"at least 2, got ranks={ranks}")
    if not is_int(every) or every < 1:
        raise TrainschedError(f"observe_every_steps must be a whole number >= 1, got "
                              f"{every!r}")
    if checkpoints:
        raise TrainschedError("a straggler policy and checkpoints do not combine yet (an "
                              "episode moves the phases' samples); drop one of them")
    if deterministic:
        raise TrainschedError("a straggler policy reacts to measured times, so the run cannot "
                              "be deterministic; drop deterministic=True or the policy")


def _failure_text(workdir: Path, failed: Sequence[Any], ranks: int, deadline_s: float) -> str:
    """One line naming every failed rank: crashed ones first (the likely cause), then the
    errors the others reported, each error once with the ranks that reported it."""
    crashed: list[str] = []
    reported: dict[str, list[str]] = {}
    for e in failed:
        who = f"rank {e.rank}" + (" (server)" if e.rank >= ranks else "")
        error = workdir / f"rank{e.rank}.error"
        if error.exists():
            reported.setdefault(error.read_text().strip(), []).append(who)
        elif e.status is None:
            crashed.append(f"{who} did not finish within the {deadline_s:g} s deadline")
        else:
            lines = [ln for ln in tail(e.log).splitlines() if ln.strip()]
            last = lines[-1].strip() if lines else "no output"
            crashed.append(f"{who} exited with status {status_text(e.status)} ({last})")
    said = [f"{', '.join(who)}: {text}" for text, who in reported.items()]
    return "sync run failed: " + "; ".join(crashed + said)
