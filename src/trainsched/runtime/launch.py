"""Start real ``torch.distributed`` worker processes on this host and watch them.

Shared by :mod:`~trainsched.runtime.calibrate` and :mod:`~trainsched.runtime.train`: each worker
runs ``FUNCTION()`` of ``MODULE`` (or a script file) with its own JSON config (``rank``, ``port``,
...) as ``sys.argv[1]``, in the environment of :func:`worker_env` (``OMP_NUM_THREADS=1``, this
source tree on ``PYTHONPATH``, gloo on the loopback interface). Output goes to one log file per
rank. :func:`run_workers` polls them: a rank that exits with a non-zero status or an overall
deadline fails the run with :class:`WorkerFailure`, and every worker still running is killed, so
nothing is left behind.

Workers are forked from a server that imported torch once
(:class:`~trainsched.runtime.forkserver.ForkServer`, started on first use and kept while this
process lives), so a job does not pay torch's import once per rank;
``TRAINSCHED_WORKER_START=fresh`` starts each worker as a new interpreter instead.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from trainsched.errors import TrainschedError
from trainsched.runtime.forkserver import ForkServer

SRC_ROOT = str(Path(__file__).resolve().parents[2])
#: ``fresh``: every worker a new interpreter; ``forkserver`` (the default): forked from a
#: server that imported torch once.
START_ENV = "TRAINSCHED_WORKER_START"
#: ``1``: bind rank k of a job to the k-th CPU this process may use, where the job has no more
#: ranks than CPUs; ``0`` (the default): leave the ranks to the operating system.
PIN_ENV = "TRAINSCHED_PIN_CPUS"
#: ``1``: PyTorch's CPU allocator advises the kernel to back every buffer of 2 MiB or more with
#: 2 MiB pages (``madvise(MADV_HUGEPAGE)``; where the kernel's transparent huge pages are
#: ``madvise`` or ``always``). Ranks run with what the launching environment says (unset:
#: off). It depends on the model: on this project's 2-CPU host VGG-16's steps ran 1.26x faster
#: with it (its 411 MB gradient is new memory every step, each 4 KiB page faulted in) and the
#: small CNN's at batch 32 2.3x slower (its 2-8 MB activations, which the C library otherwise
#: reuses, faulted in afresh each step): ``benchmarks/huge_pages.py``. PyTorch reads it once
#: per process, at its first allocation.
HUGE_PAGES_ENV = "THP_MEM_ALLOC_ENABLE"
#: What a process reads once at start: a fork server started with other values is replaced.
READ_AT_START = (HUGE_PAGES_ENV,)


HUGE_PAGES_SETTINGS = ("0", "1")


@contextlib.contextmanager
def huge_pages(setting: str) -> Iterator[None]:
    """Ranks started inside run with :data:`HUGE_PAGES_ENV` = ``setting`` (``"0"`` or
    ``"1"``); this process's environment is as it was afterwards."""
    if setting not in HUGE_PAGES_SETTINGS:
        raise TrainschedError(f"huge pages: expected one of {', '.join(HUGE_PAGES_SETTINGS)}, "
                              f"got {setting!r}")
    before = os.environ.get(HUGE_PAGES_ENV)
    os.environ[HUGE_PAGES_ENV] = setting
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(HUGE_PAGES_ENV, None)
        else:
            os.environ[HUGE_PAGES_ENV] = before


def rank_cpus(nproc: int) -> list[int] | None:
    """The CPU each of ``nproc`` ranks is bound to, or ``None`` (not bound; :data:`PIN_ENV`).

    Where every CPU runs a rank, an unbound rank that a peer's message wakes may wait for the
    CPU of a peer that has started computing: on this project's 2-CPU host the ranks of a
    small model computed one after the other in a quarter to a third of the steps of a loop of
    blocking all-reduces (``benchmarks/rank_skew.py``), never when bound. Stock DDP steps
    were not reliably faster bound (``benchmarks/pin_cpus.py``), so binding is asked for, not
    the default."""
    asked = os.environ.get(PIN_ENV, "0").strip()
    if asked not in ("0", "1"):
        raise TrainschedError(f"{PIN_ENV}={asked!r}: expected 0 or 1")
    if asked == "0" or not hasattr(os, "sched_getaffinity"):
        return None
    cpus = sorted(os.sched_getaffinity(0))
    return cpus[:nproc] if nproc <= len(cpus) else None


def free_port() -> int:
    """A TCP port free on the loopback interface right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def worker_env(backend: str = "gloo", extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a worker: one OpenMP thread, this source tree importable, gloo on
    the loopback interface, Python's fault handler on."""
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = "1"
    # A worker killed by a signal (an abort inside torch, say) prints every thread's Python
    # stack to its log first, so the failure says where it happened.
    env.setdefault("PYTHONFAULTHANDLER", "1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (SRC_ROOT, env.get("PYTHONPATH")) if p)
    if backend == "gloo":
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    env.update(extra or {})
    return env


def tail(path: Path, limit: int = 1500) -> str:
    """The end of a log file (empty if unreadable), without the fault handler's list of loaded
    extension modules (with torch loaded, a long line that would crowd out the stack)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    lines = [ln for ln in text.splitlines() if not ln.startswith("Extension modules:")]
    return "\n".join(lines).strip()[-limit:]


def status_text(status: int | None) -> str:
    """An exit status as text, naming the signal of a killed process: ``-6 (SIGABRT)``."""
    if status is not None and status < 0:
        with contextlib.suppress(ValueError):
            return f"{status} ({signal.Signals(-status).name})"
    return str(status)


def first_failure(codes: Sequence[int | None]) -> tuple[int, int] | None:
    """``(rank, status)`` of the failed worker to report among ``codes`` (the exit statuses
    one poll saw, ``None`` for a worker still running), or ``None`` if none failed. When
    several failed between two polls, the one that did not exit with status 1 comes first:
    a rank that dies takes its peers down with it, and they exit with an exception (status
    1, "connection closed by peer") a few milliseconds after the rank that caused it (killed
    by a signal, or exiting with a status of its own); then the lowest rank."""
    failed = [(rank, code) for rank, code in enumerate(codes) if code not in (None, 0)]
    if not failed:
        return None
    return min(failed, key=lambda rc: (rc[1] == 1, rc[0]))


@dataclass
class WorkerFailure(Exception):
    """A worker exited with ``status`` (``None``: the deadline passed first)."""

    rank: int | None
    status: int | None
    log_tail: str

    def __str__(self) -> str:
        if self.rank is None:
            return "workers did not finish in time"
        head = f"rank {self.rank} exited with status {status_text(self.status)}"
        return f"{head}; its output ends:\n{self.log_tail}" if self.log_tail else head


def quantile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile of ``values``, interpolating linearly between order statistics (the
    p10 and p90 every measured run reports)."""
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    pos = q * (len(ordered) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def trimmed_mean(values: Sequence[float]) -> float:
    """The mean of ``values`` without the lowest and the highest tenth (at least one of each
    from 3 values on). Where a time has two modes, as gloo's small collectives do on a shared
    host (about 0.5 ms or about 3 ms, in shares that change from run to run), the median
    jumps from one mode to the other while a sum of many such times follows the mean; the
    trimming keeps one stray sample from setting it."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("trimmed_mean of no values")
    cut = math.ceil(len(ordered) / 10) if len(ordered) >= 3 else 0
    kept = ordered[cut:len(ordered) - cut]
    return math.fsum(kept) / len(kept)


@contextlib.contextmanager
def job(target: str, config: Mapping[str, Any], nproc: int, *, timeout_s: float,
        what: str, watch: Callable[[Path], None] | None = None) -> Iterator[Path]:
    """Run ``nproc`` workers of ``target`` (each gets ``config`` with its ``rank`` and ``out``,
    the job's folder) to the end; yields the folder, where rank 0 left ``rank0.json``. A rank
    that fails or a deadline passed is one :class:`TrainschedError` line (``what``: what did
    not finish, e.g. ``"training"``); the folder is removed after the block. ``watch`` is
    called with the folder while the workers run (progress they leave there)."""
    with tempfile.TemporaryDirectory(prefix="trainsched-job-") as tmp:
        workdir = Path(tmp)
        configs = [{**config, "rank": r, "out": str(workdir)} for r in range(nproc)]
        try:
            run_workers(target, configs, workdir=workdir, timeout_s=timeout_s,
                        watch=None if watch is None else partial(watch, workdir))
        except WorkerFailure as failure:
            if failure.rank is None:
                raise TrainschedError(f"{what} did not finish within {timeout_s:g} s; use "
                                      f"fewer steps or a larger timeout") from None
            raise TrainschedError(failure_message(workdir, failure)) from None
        yield workdir


def serve_worker(work: Callable[[dict[str, Any]], Any]) -> None:  # pragma: no cover - workers
    """A worker's whole life: its config from ``sys.argv[1]``, ``work(config)``, then rank 0's
    result to ``rank0.json`` (atomically) and exit 0; a :class:`TrainschedError` goes to
    ``rank<K>.error`` for :func:`failure_message`, anything else to the log, and exit 1 at once
    (never waiting for a process group whose peer is gone)."""
    import traceback

    cfg = json.loads(sys.argv[1])
    rank, out = int(cfg["rank"]), Path(cfg["out"])
    try:
        result = work(cfg)
    except TrainschedError as exc:
        (out / f"rank{rank}.error").write_text(str(exc).replace("\n", " "))
        sys.stdout.flush()
        os._exit(1)
    except BaseException:
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    if rank == 0:
        tmp = out / "rank0.json.tmp"
        tmp.write_text(json.dumps(result))
        os.replace(tmp, out / "rank0.json")
    sys.stdout.flush()
    os._exit(0)


def failure_message(workdir: Path, failure: WorkerFailure) -> str:
    """One line for a failed rank: the message it wrote to ``rank<K>.error`` in ``workdir``
    (the workers' convention for a user error), else the last line of its output."""
    path = workdir / f"rank{failure.rank}.error"
    if path.exists():
        return f"rank {failure.rank}: {path.read_text().strip()}"
    lines = [ln for ln in failure.log_tail.splitlines() if ln.strip()]
    last = lines[-1].strip() if lines else "no output"
    return f"rank {failure.rank} exited with status {status_text(failure.status)}: {last}"


@dataclass(frozen=True)
class Exit:
    """How one worker ended: its status (``None``: killed at the deadline) and its log."""

    rank: int
    status: int | None
    log: Path


def run_workers(target: str, configs: Sequence[dict[str, Any]], *, workdir: Path,
                timeout_s: float, backend: str = "gloo", wait_all: bool = False,
                env: Mapping[str, str] | None = None,
                watch: Callable[[], None] | None = None) -> list[Exit]:
    """Run one worker per config (rank ``k`` gets ``configs[k]``) and wait for them.

    ``target`` is ``"package.module:function"`` or a path to a Python script. Without
    ``wait_all`` the first non-zero exit raises :class:`WorkerFailure` (the others are killed);
    with it every worker runs until it exits or the deadline passes, and the caller reads the
    statuses (used to check how survivors react to a dead rank). Passing the deadline raises
    :class:`WorkerFailure` with ``rank=None`` unless ``wait_all``. ``watch`` is called about
    ten times a second while the workers run.
    """
    environment = worker_env(backend, env)
    start = _starter(environment)
    cpus = rank_cpus(len(configs))
    deadline = time.monotonic() + timeout_s
    procs: list[_Worker] = []
    logs: list[Path] = []
    next_watch = 0.0
    try:
        for rank, cfg in enumerate(configs):
            log = workdir / f"rank{rank}.log"
            logs.append(log)
            procs.append(start(str(target), json.dumps(cfg), log,
                               None if cpus is None else cpus[rank]))
        while True:
            codes = [p.poll() for p in procs]
            failed = first_failure(codes)
            if failed is not None and not wait_all:
                rank, code = failed
                raise WorkerFailure(rank, code, tail(logs[rank]))
            if all(c is not None for c in codes):
                break
            if time.monotonic() > deadline:
                if wait_all:
                    break
                raise WorkerFailure(None, None, "")
            if watch is not None and time.monotonic() >= next_watch:
                watch()
                next_watch = time.monotonic() + 0.1
            time.sleep(0.02)
    finally:
        killed = set()
        for rank, p in enumerate(procs):
            if p.poll() is None:
                p.kill()
                killed.add(rank)
        for p in procs:
            p.wait(timeout_s=10)
    return [Exit(rank=r, status=None if r in killed else p.poll(), log=logs[r])
            for r, p in enumerate(procs)]  # fmt: skip


class _Worker:
    """One started worker: a subprocess, or a pid forked by the fork server."""

    def __init__(self, proc: subprocess.Popen[bytes] | None = None,
                 server: ForkServer | None = None, pid: int = 0):
        self._proc, self._server, self._pid = proc, server, pid

    def poll(self) -> int | None:
        """The exit status (negative: killed by that signal), ``None`` while running."""
        if self._proc is not None:
            return self._proc.poll()
        assert self._server is not None
        return self._server.poll(self._pid)

    def kill(self) -> None:
        if self._proc is not None:
            self._proc.kill()
        else:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._pid, signal.SIGKILL)

    def wait(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while self.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)


_SERVER: ForkServer | None = None


def _starter(environment: dict[str, str]
             ) -> Callable[[str, str, Path, int | None], _Worker]:
    """How this run starts a worker (``target``, its config text, its log, the CPU to bind it
    to or ``None``): forked by the fork server, started on first use, unless
    ``TRAINSCHED_WORKER_START=fresh``."""
    global _SERVER
    asked = os.environ.get(START_ENV, "forkserver").strip().lower()
    if asked not in ("fresh", "forkserver"):
        raise TrainschedError(f"{START_ENV}={asked!r}: expected fresh or forkserver")
    if asked == "fresh":
        def fresh(target: str, config: str, log: Path, cpu: int | None) -> _Worker:
            if ":" in target and not target.endswith(".py"):
                module, function = target.rsplit(":", 1)
                command = [sys.executable, "-c",
                           f"from {module} import {function}; {function}()"]
            else:
                command = [sys.executable, target]
            with log.open("wb") as fh:
                bind = None if cpu is None else partial(os.sched_setaffinity, 0, {cpu})
                return _Worker(subprocess.Popen([*command, config], env=environment,
                                                stdin=subprocess.DEVNULL, stdout=fh,
                                                stderr=subprocess.STDOUT, preexec_fn=bind))
        return fresh
    started = worker_env()
    if _SERVER is not None and any(_SERVER.environment.get(k) != started.get(k)
                                   for k in READ_AT_START):
        _SERVER.close()  # its torch read another value at its start
        _SERVER = None
    if _SERVER is None or not _SERVER.alive():
        _SERVER = ForkServer(started)
        atexit.register(_SERVER.close)
    server = _SERVER

    def forked(target: str, config: str, log: Path, cpu: int | None) -> _Worker:
        return _Worker(server=server, pid=server.start(target, config, str(log), environment,
                                                       cpu=cpu))
    return forked


def torchrun_rank() -> tuple[int, int] | None:
    """``(rank, world size)`` when this process is one rank of a ``torchrun`` job (it sets
    ``TORCHELASTIC_RUN_ID``, ``RANK`` and ``WORLD_SIZE``), else ``None``."""
    if "TORCHELASTIC_RUN_ID" not in os.environ:
        return None
    try:
        return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    except (KeyError, ValueError):
        raise TrainschedError("torchrun left RANK or WORLD_SIZE unset or not a number; start "
                              "the job with torchrun --nproc-per-node N") from None
