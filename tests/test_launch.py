"""The worker launcher: a failed rank's status and log reach the error, a killed rank names
its signal and its Python stack (the fault handler is on), a deadline stops every worker; each
for workers forked from the fork server (the default) and for fresh interpreters. Forked
workers get their own environment, arguments and path, find torch already imported, and die
with the process that launched them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from trainsched.errors import TrainschedError
from trainsched.runtime.launch import (
    HUGE_PAGES_ENV,
    PIN_ENV,
    START_ENV,
    WorkerFailure,
    failure_message,
    first_failure,
    rank_cpus,
    run_workers,
    status_text,
    worker_env,
)


@pytest.fixture(params=["forkserver", "fresh"])
def start_method(request, monkeypatch):
    """The test runs once per way of starting workers."""
    monkeypatch.setenv(START_ENV, request.param)
    return request.param

WORKER = textwrap.dedent("""
    import json, os, sys, time
    cfg = json.loads(sys.argv[1])

    def crash_in_here():
        print("about to fail", flush=True)
        if cfg["how"] == "abort":
            os.abort()
        if cfg["how"] == "exit":
            sys.exit(3)
        time.sleep(60)

    if cfg["rank"] == 1:
        crash_in_here()
    print("rank 0 done", flush=True)
""")


def launch(tmp_path: Path, how: str, timeout_s: float = 30, **kw) -> WorkerFailure:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    with pytest.raises(WorkerFailure) as info:
        run_workers(str(script), [{"rank": r, "how": how} for r in range(2)],
                    workdir=tmp_path, timeout_s=timeout_s, **kw)
    return info.value


@pytest.mark.timeout(60)
def test_an_aborted_rank_names_the_signal_and_its_python_stack(tmp_path, start_method):
    failure = launch(tmp_path, "abort")
    assert (failure.rank, failure.status) == (1, -6)
    text = str(failure)
    assert text.startswith("rank 1 exited with status -6 (SIGABRT); its output ends:")
    assert "about to fail" in text
    assert "Fatal Python error: Aborted" in text and "crash_in_here" in text


@pytest.mark.timeout(60)
def test_a_failed_rank_reports_its_status_and_output(tmp_path, start_method):
    failure = launch(tmp_path, "exit")
    assert (failure.rank, failure.status) == (1, 3)
    assert str(failure) == "rank 1 exited with status 3; its output ends:\nabout to fail"


@pytest.mark.timeout(60)
def test_the_deadline_fails_the_run_and_kills_the_rest(tmp_path, start_method):
    failure = launch(tmp_path, "hang", timeout_s=3)
    assert failure.rank is None and str(failure) == "workers did not finish in time"
    exits = run_workers(str(tmp_path / "worker.py"),
                        [{"rank": r, "how": "hang"} for r in range(2)], workdir=tmp_path,
                        timeout_s=3, wait_all=True)
    assert [(e.rank, e.status) for e in exits] == [(0, 0), (1, None)]
    assert json.dumps([e.log.read_text().strip() for e in exits]) == json.dumps(
        ["rank 0 done", "about to fail"])


@pytest.mark.parametrize(("codes", "expected"), [
    ([None, 0, None], None),             # nothing failed
    ([None, 3], (1, 3)),                 # one failure
    ([1, 3], (1, 3)),                    # rank 1 died, rank 0 followed it with an exception
    ([1, -9, 1], (1, -9)),               # a killed rank before the peers it took down
    ([1, None, 1], (0, 1)),              # all exceptions: the lowest rank
    ([0, 2, 5], (1, 2)),                 # two of their own statuses: the lowest rank
])
def test_the_failure_reported_is_the_rank_that_took_the_others_down(codes, expected):
    assert first_failure(codes) == expected


def test_status_text_names_signals_only():
    assert status_text(-9) == "-9 (SIGKILL)"
    assert status_text(2) == "2" and status_text(None) == "None"


def test_failure_message_prefers_the_rank_s_own_error_file(tmp_path):
    failure = WorkerFailure(1, 1, "Traceback (most recent call last):\n  ...\nValueError: boom\n")
    assert failure_message(tmp_path, failure) == "rank 1 exited with status 1: ValueError: boom"
    (tmp_path / "rank1.error").write_text("batch size 6 is not divisible by 4 micro-batches\n")
    assert failure_message(tmp_path, failure) == (
        "rank 1: batch size 6 is not divisible by 4 micro-batches")


def test_a_forked_worker_gets_its_own_environment_arguments_and_path(tmp_path, monkeypatch,
                                                                     start_method):
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "helper_mod.py").write_text("WHERE = 'lib'\n")
    (tmp_path / "worker.py").write_text(textwrap.dedent("""
        import json, os, sys
        import helper_mod
        print(json.dumps({"config": json.loads(sys.argv[1]), "mark": os.environ.get("MARK"),
                          "threads": os.environ["OMP_NUM_THREADS"], "lib": helper_mod.WHERE,
                          "torch": "torch" in sys.modules}))
    """))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(lib), os.environ.get("PYTHONPATH",
                                                                                 "")]))
    for mark in ("first", "second"):    # a second job: the server's own environment is not it
        monkeypatch.setenv("MARK", mark)
        exits = run_workers(str(tmp_path / "worker.py"), [{"rank": 0, "n": 7}],
                            workdir=tmp_path, timeout_s=60)
        seen = json.loads(exits[0].log.read_text())
        assert exits[0].status == 0
        assert seen["config"] == {"rank": 0, "n": 7} and seen["mark"] == mark
        assert seen["threads"] == "1" and seen["lib"] == "lib"
        # A forked worker starts with torch imported; a fresh interpreter has not imported it.
        assert seen["torch"] is (start_method == "forkserver")


AFFINITY = textwrap.dedent("""
    import json, os, sys, threading
    box = []
    t = threading.Thread(target=lambda: box.append(sorted(os.sched_getaffinity(0))))
    t.start(); t.join()   # a thread the worker starts inherits its binding
    print(json.dumps({"main": sorted(os.sched_getaffinity(0)), "thread": box[0]}))
""")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("asked", ["1", "0"])
def test_each_rank_is_bound_to_a_cpu_of_its_own(tmp_path, monkeypatch, start_method, asked):
    """As many ranks as this process's CPUs (at most 4): ``1`` binds rank k, and the threads it
    starts, to the k-th CPU; ``0`` leaves every rank on all of them."""
    cpus = sorted(os.sched_getaffinity(0))
    nproc = min(len(cpus), 4)
    monkeypatch.setenv(PIN_ENV, asked)
    (tmp_path / "worker.py").write_text(AFFINITY)
    exits = run_workers(str(tmp_path / "worker.py"), [{"rank": r} for r in range(nproc)],
                        workdir=tmp_path, timeout_s=60)
    seen = [json.loads(e.log.read_text()) for e in exits]
    want = [[cpus[k]] if asked == "1" else cpus for k in range(nproc)]
    assert [s["main"] for s in seen] == want and [s["thread"] for s in seen] == want


def test_ranks_are_bound_only_when_asked_and_each_gets_a_cpu(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3, 1, 7, 5})
    monkeypatch.delenv(PIN_ENV, raising=False)
    assert rank_cpus(2) is None                      # the default: not bound
    monkeypatch.setenv(PIN_ENV, "1")
    assert rank_cpus(4) == [1, 3, 5, 7] and rank_cpus(2) == [1, 3]
    assert rank_cpus(5) is None                      # more ranks than CPUs
    monkeypatch.setenv(PIN_ENV, "auto")
    with pytest.raises(TrainschedError, match="TRAINSCHED_PIN_CPUS='auto': expected 0 or 1"):
        rank_cpus(2)


def test_an_unknown_start_method_is_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv(START_ENV, "thread")
    with pytest.raises(TrainschedError, match="TRAINSCHED_WORKER_START='thread': expected"):
        run_workers(str(tmp_path / "worker.py"), [{"rank": 0}], workdir=tmp_path, timeout_s=5)


LAUNCHER = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from trainsched.runtime.launch import run_workers
    out = Path(sys.argv[1])
    (out / "worker.py").write_text(
        "import os, sys, time\\n"
        "open(sys.argv[0] + '.pid', 'w').write(str(os.getpid()))\\n"
        "time.sleep(120)\\n")
    run_workers(str(out / "worker.py"), [{"rank": 0}], workdir=out, timeout_s=120)
""")


@pytest.mark.timeout(120)
def test_a_killed_launcher_leaves_no_worker_behind(tmp_path):
    """The fork server ends its workers when the process that launched them dies."""
    script = tmp_path / "launcher.py"
    script.write_text(LAUNCHER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), START_ENV: "forkserver"}
    launcher = subprocess.Popen([sys.executable, str(script), str(tmp_path)], env=env)
    pid_file = tmp_path / "worker.py.pid"
    deadline = time.monotonic() + 90
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline and launcher.poll() is None
        time.sleep(0.1)
    worker = int(pid_file.read_text())
    os.kill(worker, 0)                       # running
    launcher.send_signal(signal.SIGKILL)
    launcher.wait(timeout=10)
    while time.monotonic() < deadline:
        try:
            os.kill(worker, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    pytest.fail(f"worker {worker} still runs after its launcher was killed")


FORKING = textwrap.dedent("""
    import json, os, sys
    from pathlib import Path
    from trainsched.runtime import launch
    out = Path(sys.argv[1])
    (out / "worker.py").write_text("import sys\\nprint(sys.argv[1])\\n")

    def one_job(tag):
        folder = out / tag
        folder.mkdir()
        exits = launch.run_workers(str(out / "worker.py"), [{"rank": 0, "tag": tag}],
                                   workdir=folder, timeout_s=60)
        return exits[0].status, json.loads(exits[0].log.read_text())["tag"]

    first = one_job("parent-before")
    pid = os.fork()
    if pid == 0:                 # a forked copy of the launcher: its own server, not the pipes
        ok = one_job("child") == (0, "child") and launch._SERVER.alive()
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    print(json.dumps({"first": first, "child": os.waitstatus_to_exitcode(status),
                      "after": one_job("parent-after")}))
""")


@pytest.mark.timeout(120)
def test_a_forked_copy_of_the_launcher_starts_its_own_server(tmp_path):
    script = tmp_path / "forking.py"
    script.write_text(FORKING)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), START_ENV: "forkserver"}
    done = subprocess.run([sys.executable, str(script), str(tmp_path)], env=env, timeout=110,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen == {"first": [0, "parent-before"], "child": 0, "after": [0, "parent-after"]}


def test_the_trimmed_mean_follows_two_modes_where_the_median_picks_one():
    # 6 fast (0.5) and 4 slow (3.0) collectives: the median is a fast one, a sum of many of
    # them grows by the mean; one of each extreme is dropped (0.5 and 3.0), 8 are kept
    from trainsched.runtime.launch import trimmed_mean

    samples = [0.5] * 6 + [3.0] * 4
    assert trimmed_mean(samples) == pytest.approx((5 * 0.5 + 3 * 3.0) / 8)


def test_the_trimmed_mean_drops_a_stray_sample():
    from trainsched.runtime.launch import trimmed_mean

    assert trimmed_mean([1.0, 2.0, 3.0, 4.0, 500.0]) == pytest.approx(3.0)  # 2, 3, 4 kept
    assert trimmed_mean([5.0, 1.0]) == pytest.approx(3.0)  # fewer than 3: nothing dropped
    with pytest.raises(ValueError):
        trimmed_mean([])


@pytest.mark.timeout(60)
def test_watch_sees_what_a_worker_leaves_in_its_folder_while_it_runs(tmp_path):
    (tmp_path / "worker.py").write_text(textwrap.dedent("""
        import json, os, sys, time
        from pathlib import Path
        cfg = json.loads(sys.argv[1])
        for k in range(1, 4):  # written whole (a rename), so a reader never sees it half-done
            Path(cfg["folder"], "step.tmp").write_text(str(k))
            os.replace(Path(cfg["folder"], "step.tmp"), Path(cfg["folder"], "step"))
            time.sleep(0.4)
    """))
    seen = []

    def watch() -> None:
        step = tmp_path / "step"
        if step.exists():
            seen.append(int(step.read_text()))

    exits = run_workers(str(tmp_path / "worker.py"), [{"rank": 0, "folder": str(tmp_path)}],
                        workdir=tmp_path, timeout_s=30, watch=watch)
    assert exits[0].status == 0
    assert sorted(set(seen)) == [1, 2, 3]  # each step was watched while the worker slept


def test_ranks_take_huge_pages_only_when_the_environment_asks(monkeypatch):
    monkeypatch.delenv(HUGE_PAGES_ENV, raising=False)
    assert HUGE_PAGES_ENV not in worker_env()  # PyTorch's default: off
    monkeypatch.setenv(HUGE_PAGES_ENV, "1")
    assert worker_env()[HUGE_PAGES_ENV] == "1"


def _kernel_huge_pages() -> str:
    """The kernel's transparent huge page mode: ``always``, ``madvise`` or ``never``."""
    try:
        text = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return "never"
    return text.split("[", 1)[1].split("]", 1)[0] if "[" in text else "never"


FAULTS = textwrap.dedent("""
    import json, resource
    import torch
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    torch.empty(64 << 20, dtype=torch.uint8).fill_(1)   # 64 MiB: 16,384 pages of 4 KiB
    print(json.dumps({"faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before}))
""")


@pytest.mark.timeout(120)
def test_a_rank_s_large_buffers_take_huge_pages_as_its_environment_says(tmp_path, monkeypatch,
                                                                        start_method):
    """Writing a new 64 MiB tensor faults in 16,384 pages of 4 KiB, or 32 of 2 MiB: a rank started
    with huge pages on takes far fewer faults than one started with them off. The fork
    server is replaced when the setting changes (its torch read it at its start), and back
    again."""
    if _kernel_huge_pages() != "madvise":
        pytest.skip("the kernel's transparent huge pages are not in madvise mode here, so "
                    "the allocator's advice changes nothing to measure")
    (tmp_path / "worker.py").write_text(FAULTS)
    faults = {}
    for asked in ("1", "0", "1"):
        monkeypatch.setenv(HUGE_PAGES_ENV, asked)
        exits = run_workers(str(tmp_path / "worker.py"), [{"rank": 0}], workdir=tmp_path,
                            timeout_s=100)
        assert exits[0].status == 0
        faults.setdefault(asked, []).append(json.loads(exits[0].log.read_text())["faults"])
    assert min(faults["0"]) >= 16_000
    assert max(faults["1"]) < 8_000  # at least half the tensor in huge pages
