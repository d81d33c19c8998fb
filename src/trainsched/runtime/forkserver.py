"""A process that imported torch once and forks workers from it.

A fresh interpreter spends several seconds of CPU importing torch; on a small host that is most
of a short job, and every rank of every job pays it. :class:`ForkServer` starts one server
process per launching process, in the workers' environment, that imports :data:`PRELOAD` and
then forks one child per request. A child behaves as ``python -c "from M import F; F()" CONFIG``
or ``python SCRIPT CONFIG`` would: its environment, ``sys.argv`` and log (stdout and stderr)
are its own, SIGINT raises ``KeyboardInterrupt``, and its exit status is the one that
interpreter would have (negative: killed by that signal).

The protocol is one JSON line per request on the server's stdin (``target``, ``config``,
``log``, ``env``), answered on its stdout by ``pid N``; the server reaps its children and writes
``exit N STATUS`` for each. When its stdin closes (the launching process exited or died) the
server kills every child still running and exits, so no worker outlives its launcher.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping

from trainsched.errors import TrainschedError

#: What the server imports once, so that no worker pays for it: torch, and what training imports
#: lazily on its first use (an optimizer imports ``torch._dynamo``; splitting a model for a
#: pipeline or a placement exports it).
PRELOAD = ("torch", "torch.distributed", "torch.nn", "torch.nn.parallel", "torch.optim",
           "torch._dynamo", "torch.distributed.pipelining", "torch.export._trace",
           "torch.fx.experimental.validator")


class ForkServer:
    """The launching side: start workers, poll and kill them by pid."""

    def __init__(self, environment: Mapping[str, str]):
        self.environment = dict(environment)  # the server's own, which its torch read
        self._proc = subprocess.Popen(
            [sys.executable, "-c", "from trainsched.runtime.forkserver import serve; serve()"],
            env=dict(environment), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert self._proc.stdout is not None
        self._out = self._proc.stdout.fileno()
        os.set_blocking(self._out, False)
        self._buffer = b""
        self._status: dict[int, int] = {}
        self._lock = threading.Lock()
        self._owner = os.getpid()

    def alive(self) -> bool:
        """Running, and started by this process (a process forked from the one that started
        it must not share its pipes)."""
        return self._owner == os.getpid() and self._proc.poll() is None

    def start(self, target: str, config: str, log: str, environment: Mapping[str, str],
              timeout_s: float = 60.0, cpu: int | None = None) -> int:
        """Fork a worker (bound to CPU ``cpu`` when given, before it starts a thread); its
        pid."""
        request = json.dumps({"target": target, "config": config, "log": log,
                              "env": dict(environment), "cpu": cpu})
        with self._lock:
            assert self._proc.stdin is not None
            try:
                self._proc.stdin.write(request.encode() + b"\n")
                self._proc.stdin.flush()
            except OSError:
                raise TrainschedError("the worker fork server has exited; set "
                                      "TRAINSCHED_WORKER_START=fresh to start workers as "
                                      "new interpreters") from None
            deadline = time.monotonic() + timeout_s
            while True:
                for word, *values in self._read(max(0.0, deadline - time.monotonic())):
                    if word == "pid":
                        return values[0]
                if time.monotonic() > deadline or not self.alive():
                    raise TrainschedError("the worker fork server did not start a worker; set "
                                          "TRAINSCHED_WORKER_START=fresh to start workers as "
                                          "new interpreters")

    def poll(self, pid: int) -> int | None:
        """The exit status of worker ``pid``, ``None`` while it runs."""
        with self._lock:
            for _ in self._read(0.0):
                pass
            return self._status.get(pid)

    def close(self) -> None:
        """End the server (it kills what still runs); in any process but its owner, nothing."""
        if self._owner != os.getpid():
            return
        with contextlib.suppress(OSError):
            if self._proc.stdin is not None:
                self._proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout=10)

    def _read(self, timeout_s: float) -> list[list]:
        """The messages the server wrote (waiting up to ``timeout_s`` for the first); exit
        statuses are recorded as they pass."""
        ready, _, _ = select.select([self._out], [], [], timeout_s)
        if ready:
            with contextlib.suppress(BlockingIOError):
                self._buffer += os.read(self._out, 65536)
        *lines, self._buffer = self._buffer.split(b"\n")
        messages = []
        for line in lines:
            word, *numbers = line.decode().split()
            values = [int(n) for n in numbers]
            if word == "exit":
                self._status[values[0]] = values[1]
            messages.append([word, *values])
        return messages


def serve() -> None:  # pragma: no cover - the server process
    """The server's loop: fork a child per request line, report pids and exit statuses."""
    import importlib

    signal.signal(signal.SIGINT, signal.SIG_IGN)   # the launcher decides; children get it
    for name in PRELOAD:
        importlib.import_module(name)
    children: set[int] = set()
    stdin = sys.stdin.fileno()
    pending = b""
    while True:
        ready, _, _ = select.select([stdin], [], [], 0.02)
        if ready:
            chunk = os.read(stdin, 65536)
            if not chunk:
                break
            pending += chunk
            *requests, pending = pending.split(b"\n")
            for request in requests:
                pid = os.fork()
                if pid == 0:
                    _child(json.loads(request))
                children.add(pid)
                _say(f"pid {pid}")
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            children.discard(pid)
            _say(f"exit {pid} {os.waitstatus_to_exitcode(status)}")
    for pid in children:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for pid in children:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)


def _say(line: str) -> None:  # pragma: no cover - the server process
    os.write(sys.stdout.fileno(), line.encode() + b"\n")


def _child(request: dict) -> None:  # pragma: no cover - a forked worker
    """Become the worker of ``request`` and exit with its status; never returns."""
    import faulthandler
    import importlib
    import runpy
    import traceback
    from pathlib import Path

    signal.signal(signal.SIGINT, signal.default_int_handler)
    code = 1
    try:
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        fd = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        faulthandler.enable(file=sys.stderr)
        env = request["env"]
        os.environ.clear()
        os.environ.update(env)
        # The request's PYTHONPATH, as a new interpreter would put it on sys.path.
        entries = [e for e in env.get("PYTHONPATH", "").split(os.pathsep) if e]
        sys.path[:0] = [e for e in entries if e not in sys.path]
        if request.get("cpu") is not None:  # every thread it starts inherits the binding
            os.sched_setaffinity(0, {request["cpu"]})
        threads = env.get("OMP_NUM_THREADS", "")
        if threads.isdigit() and int(threads) > 0:
            sys.modules["torch"].set_num_threads(int(threads))
        target = request["target"]
        sys.argv = [target, request["config"]]
        if ":" in target and not target.endswith(".py"):
            module, function = target.rsplit(":", 1)
            getattr(importlib.import_module(module), function)()
        else:
            sys.path.insert(0, str(Path(target).resolve().parent))
            runpy.run_path(target, run_name="__main__")
        code = 0
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            code = stop.code or 0
        else:
            print(stop.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)
