"""The worker launcher: a failed rank's status and log reach the error, a killed rank names
its signal and its Python stack (the fault handler is on), a deadline stops every worker."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from trainsched.runtime.launch import WorkerFailure, failure_message, run_workers, status_text

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
def test_an_aborted_rank_names_the_signal_and_its_python_stack(tmp_path):
    failure = launch(tmp_path, "abort")
    assert (failure.rank, failure.status) == (1, -6)
    text = str(failure)
    assert text.startswith("rank 1 exited with status -6 (SIGABRT); its output ends:")
    assert "about to fail" in text
    assert "Fatal Python error: Aborted" in text and "crash_in_here" in text


@pytest.mark.timeout(60)
def test_a_failed_rank_reports_its_status_and_output(tmp_path):
    failure = launch(tmp_path, "exit")
    assert (failure.rank, failure.status) == (1, 3)
    assert str(failure) == "rank 1 exited with status 3; its output ends:\nabout to fail"


@pytest.mark.timeout(60)
def test_the_deadline_fails_the_run_and_kills_the_rest(tmp_path):
    failure = launch(tmp_path, "hang", timeout_s=3)
    assert failure.rank is None and str(failure) == "workers did not finish in time"
    exits = run_workers(str(tmp_path / "worker.py"),
                        [{"rank": r, "how": "hang"} for r in range(2)], workdir=tmp_path,
                        timeout_s=3, wait_all=True)
    assert [(e.rank, e.status) for e in exits] == [(0, 0), (1, None)]
    assert json.dumps([e.log.read_text().strip() for e in exits]) == json.dumps(
        ["rank 0 done", "about to fail"])


def test_status_text_names_signals_only():
    assert status_text(-9) == "-9 (SIGKILL)"
    assert status_text(2) == "2" and status_text(None) == "None"


def test_failure_message_prefers_the_rank_s_own_error_file(tmp_path):
    failure = WorkerFailure(1, 1, "Traceback (most recent call last):\n  ...\nValueError: boom\n")
    assert failure_message(tmp_path, failure) == "rank 1 exited with status 1: ValueError: boom"
    (tmp_path / "rank1.error").write_text("batch size 6 is not divisible by 4 micro-batches\n")
    assert failure_message(tmp_path, failure) == (
        "rank 1: batch size 6 is not divisible by 4 micro-batches")
