"""The command line when things go wrong: one line on stderr (never a traceback), exit status 2
(130 on Ctrl-C, 143 on SIGTERM), a JSON error object on stdout with --json, and no output folder
left half-written."""

from __future__ import annotations

import errno
import json
import os
import pty
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainsched.cli import main
from trainsched.errors import TrainschedError
from trainsched.graph import Edge, Graph, Op

ROOT = os.geteuid() == 0  # permission bits do not stop root: those tests use a failing probe


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_failed(code: int, out: str, err: str, *needles: str, status: int = 2,
                  kind: str | None = None) -> None:
    """Exit ``status``, exactly one line on stderr, no traceback; with ``kind`` the JSON error
    object on stdout, carrying the same message."""
    assert code == status, err
    assert "Traceback" not in err and err.endswith("\n") and err.count("\n") == 1, err
    assert err.startswith("trainsched: "), err
    for needle in needles:
        assert needle in err, err
    if kind is not None:
        doc = json.loads(out)
        assert doc["kind"] == kind
        assert set(doc) == {"error", "kind"}
        assert err.rstrip("\n").endswith(doc["error"])


def hand_graph(path: Path) -> Path:
    Graph([Op(name="a", compute_s=1e-3, param_bytes=400, flops=10.0),
           Op(name="b", compute_s=2e-3, flops=20.0),
           Op(name="c", compute_s=3e-3, param_bytes=800, flops=30.0)],
          [Edge(src="a", dst="b", size_bytes=100), Edge(src="b", dst="c", size_bytes=100)],
          {"model": "hand"}).save(path)
    return path


def deep_json(path: Path, depth: int = 100_000) -> Path:
    path.write_text("[" * depth + "]" * depth)
    return path


def leftovers(folder: Path) -> list[str]:
    """Hidden temporary files or folders (``.NAME.*.tmp``) left in ``folder``."""
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


# --- files: nesting, empty, byte-order mark, directories -----------------------------------

def _verbs_reading(tmp_path: Path, bad: Path) -> dict[str, list[str]]:
    """A command line per file format that reads ``bad`` as that format."""
    graph = str(hand_graph(tmp_path / "g.json"))
    return {"graph": ["show", str(bad)],
            "cluster": ["cluster", str(bad)],
            "placement": ["simulate", graph, "--cluster", "cpu", "--parallelism", "placed",
                          "--placement", str(bad)],
            "plan": ["simulate", graph, "--cluster", "cpu", "--plan", str(bad)]}


@pytest.mark.parametrize("fmt", ["graph", "cluster", "placement", "plan"])
def test_deeply_nested_json_is_one_line(tmp_path, capsys, fmt):
    bad = deep_json(tmp_path / "deep.json")
    argv = _verbs_reading(tmp_path, bad)[fmt]
    assert_failed(*run(capsys, *argv, "--json"), f"{bad}: JSON nested too deeply",
                  kind="user_error")


def test_deeply_nested_toml_cluster_is_one_line(tmp_path, capsys):
    bad = tmp_path / "deep.toml"
    bad.write_text("a = " + "[" * 100_000 + "]" * 100_000)
    assert_failed(*run(capsys, "cluster", str(bad)), f"{bad}: TOML nested too deeply")


@pytest.mark.parametrize("fmt", ["graph", "cluster", "placement", "plan"])
@pytest.mark.parametrize("content", ["", " \n\n"], ids=["empty", "blank"])
def test_empty_file_says_so(tmp_path, capsys, fmt, content):
    bad = tmp_path / "empty.json"
    bad.write_text(content)
    assert_failed(*run(capsys, *_verbs_reading(tmp_path, bad)[fmt], "--json"),
                  f"{bad}: file is empty (expected a {fmt} file)", kind="user_error")


@pytest.mark.parametrize("fmt", ["graph", "cluster", "placement", "plan"])
def test_directory_says_so(tmp_path, capsys, fmt):
    folder = tmp_path / "folder.json"
    folder.mkdir()
    assert_failed(*run(capsys, *_verbs_reading(tmp_path, folder)[fmt]),
                  f"{folder}: is a directory, not a {fmt} file")


def _with_bom(path: Path) -> Path:
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    return path


def test_byte_order_mark_is_accepted_in_graph_and_cluster_files(tmp_path, capsys):
    graph = _with_bom(hand_graph(tmp_path / "g.json"))
    code, out, _ = run(capsys, "show", str(graph), "--json")
    assert code == 0 and json.loads(out)["ops"] == 3
    cluster = tmp_path / "lab.toml"
    cluster.write_text('name = "lab"\n[device]\nkind = "RTX2080"\ncount = 3\n'
                       '[intra_node]\nbandwidth = "5.7GB/s"\nlatency = "134us"\n')
    code, out, err = run(capsys, "cluster", str(_with_bom(cluster)), "--json")
    assert code == 0, err
    assert json.loads(out)["device"]["count"] == 3


def test_byte_order_mark_is_accepted_in_placement_and_plan_files(tmp_path, capsys):
    graph = str(hand_graph(tmp_path / "g.json"))
    placement = tmp_path / "p.json"
    assert main(["place", graph, "--cluster", "cpu", "-o", str(placement), "--json"]) == 0
    out = tmp_path / "out"
    assert main(["compare", graph, "--cluster", "cpu", "--out-dir", str(out), "--json"]) == 0
    capsys.readouterr()
    code, text, err = run(capsys, "simulate", graph, "--cluster", "cpu", "--parallelism",
                          "placed", "--placement", str(_with_bom(placement)), "--json")
    assert code == 0, err
    assert json.loads(text)["parallelism"] == "placed"
    code, text, err = run(capsys, "simulate", graph, "--cluster", "cpu", "--plan",
                          str(_with_bom(out / "single.plan.json")), "--json")
    assert code == 0, err
    assert json.loads(text)["parallelism"] == "single"


# --- --json on errors ----------------------------------------------------------------------

VERB_ERRORS = {
    "profile": ["profile", "no-such-model"],
    "show": ["show", "missing.json"],
    "cluster": ["cluster", "no-such-preset"],
    "simulate": ["simulate", "missing.json", "--cluster", "cpu"],
    "place": ["place", "missing.json", "--cluster", "cpu"],
    "compare": ["compare", "missing.json", "--cluster", "cpu"],
    "calibrate": ["calibrate", "-o", "no/such/dir/c.json"],
    "train": ["train", "mlp", "--plan", "missing.json"],
}


@pytest.mark.parametrize("verb", sorted(VERB_ERRORS))
def test_json_error_object_from_every_verb(tmp_path, capsys, monkeypatch, verb):
    monkeypatch.chdir(tmp_path)
    assert_failed(*run(capsys, *VERB_ERRORS[verb], "--json"), kind="user_error")
    assert not any(tmp_path.iterdir())  # compare made no compare-out/


def test_error_without_json_prints_nothing_on_stdout(capsys):
    code, out, err = run(capsys, "show", "missing.json")
    assert_failed(code, out, err, "no such graph file")
    assert out == ""


@pytest.mark.parametrize("verb", ["simulate", "show", "place"])
def test_a_model_name_where_a_graph_file_goes_says_how_to_capture_it(tmp_path, capsys,
                                                                     monkeypatch, verb):
    monkeypatch.chdir(tmp_path)
    cluster = [] if verb == "show" else ["--cluster", "p3.16xlarge"]
    code, out, err = run(capsys, verb, "resnet50", *cluster)
    assert_failed(code, out, err, "resnet50: no such graph file",
                  "trainsched profile resnet50 -o graph.tsg", "trainsched compare resnet50")


def test_a_missing_graph_file_gets_no_capture_hint(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, "simulate", "r50.tsg", "--cluster", "p3.16xlarge")
    assert_failed(code, out, err, "r50.tsg: no such graph file")
    assert "profile" not in err


def test_usage_error_with_json_adds_the_error_object(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["show", "--json"])
    assert exit_.value.code == 2
    captured = capsys.readouterr()
    assert json.loads(captured.out) == {"error": "the following arguments are required: graph",
                                        "kind": "usage_error"}
    assert "usage: trainsched show" in captured.err


# --- operating-system errors: the user's paths are one line, anything else a bug -------------

def test_os_error_on_a_path_the_user_gave_is_one_line(tmp_path, capsys, monkeypatch):
    from trainsched.cli import show

    target = tmp_path / "g.json"

    def refuse(args):
        raise PermissionError(errno.EACCES, "Permission denied", str(target))

    monkeypatch.setattr(show, "run", refuse)
    assert_failed(*run(capsys, "show", str(target), "--json"), f"{target}: Permission denied",
                  kind="file_error")


def test_os_error_on_another_path_keeps_its_traceback(tmp_path, monkeypatch):
    from trainsched.cli import show

    def bug(args):
        raise PermissionError(errno.EACCES, "Permission denied", "/somewhere/else.json")

    monkeypatch.setattr(show, "run", bug)
    with pytest.raises(PermissionError):
        main(["show", str(tmp_path / "g.json")])


def test_an_unexpected_exception_keeps_its_traceback(tmp_path, monkeypatch):
    from trainsched.cli import show

    def bug(args):
        raise RecursionError("a bug")

    monkeypatch.setattr(show, "run", bug)
    with pytest.raises(RecursionError):
        main(["show", str(tmp_path / "g.json")])


# --- compare --out-dir ---------------------------------------------------------------------

def test_compare_out_dir_that_is_a_file(tmp_path, capsys):
    graph = str(hand_graph(tmp_path / "g.json"))
    blocker = tmp_path / "out"
    blocker.write_text("mine\n")
    assert_failed(*run(capsys, "compare", graph, "--cluster", "cpu", "--out-dir", str(blocker),
                       "--json"), "exists and is not a directory", kind="user_error")
    assert blocker.read_text() == "mine\n"
    assert leftovers(tmp_path) == []


@pytest.mark.skipif(ROOT, reason="permission bits do not stop root")
def test_compare_out_dir_read_only(tmp_path, capsys):
    graph = str(hand_graph(tmp_path / "g.json"))
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        for out in (locked, locked / "new"):
            assert_failed(*run(capsys, "compare", graph, "--cluster", "cpu", "--out-dir",
                               str(out), "--json"), "Permission denied", kind="user_error")
        assert list(locked.iterdir()) == []
    finally:
        locked.chmod(0o700)


def test_compare_out_dir_that_cannot_be_written(tmp_path, capsys, monkeypatch):
    """A folder the system refuses (read-only, even for root): one line, before the work."""
    from trainsched.cli import outputs
    graph = str(hand_graph(tmp_path / "g.json"))

    def refuse(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(outputs.tempfile, "mkstemp", refuse)
    out = tmp_path / "out"
    assert_failed(*run(capsys, "compare", graph, "--cluster", "cpu", "--out-dir", str(out),
                       "--json"), f"--out-dir {out}: cannot write in {tmp_path}: Read-only",
                  kind="user_error")
    assert not out.exists()


def _fail_chart(monkeypatch, exc: BaseException | None = None, *, sigterm: bool = False):
    """compare's chart (written after the traces and plans) fails with ``exc``, or sends this
    process SIGTERM."""
    from trainsched.report import chart

    def broken(path, rows, title):
        assert Path(path).parent.is_dir() and any(Path(path).parent.glob("*.plan.json"))
        if sigterm:
            # never the default action here: it would end the test run, not fail this test
            assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler raises before this ends
        raise exc

    monkeypatch.setattr(chart, "write_chart", broken)


@pytest.mark.parametrize(
    ("failure", "status", "line"),
    [(TrainschedError("no room for the chart"), 2, "trainsched: error: no room for the chart"),
     (KeyboardInterrupt(), 130, "trainsched: interrupted"),
     (None, 143, "trainsched: terminated")],
    ids=["error", "ctrl-c", "sigterm"])
def test_failed_compare_leaves_no_new_folder(tmp_path, capsys, monkeypatch, failure, status,
                                             line):
    graph = str(hand_graph(tmp_path / "g.json"))
    _fail_chart(monkeypatch, failure, sigterm=failure is None)
    out = tmp_path / "results" / "run1"  # its parent is made for it, and removed again
    code, text, err = run(capsys, "compare", graph, "--cluster", "cpu", "--out-dir", str(out),
                          "--json")
    assert_failed(code, text, err, status=status,
                  kind="user_error" if status == 2 else "interrupted")
    assert err == line + "\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.json"]


def test_failed_compare_in_an_existing_folder_keeps_its_files(tmp_path, capsys, monkeypatch):
    graph = str(hand_graph(tmp_path / "g.json"))
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine\n")
    (out / "compare.json").write_text("{}\n")  # a previous run's, replaced only on success
    _fail_chart(monkeypatch, TrainschedError("no room for the chart"))
    assert_failed(*run(capsys, "compare", graph, "--cluster", "cpu", "--out-dir", str(out)),
                  "no room for the chart")
    assert (out / "notes.txt").read_text() == "mine\n"
    assert (out / "compare.json").read_text() == "{}\n"
    assert leftovers(out) == [] and leftovers(tmp_path) == []
    for plan in out.glob("*.plan.json"):  # written before the failure: whole files
        assert json.loads(plan.read_text())["format"] == "trainsched.plan/1"


def test_compare_into_the_folder_of_its_input_graph_keeps_the_input(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    graph = hand_graph(out / "graph.json")
    before = graph.read_bytes()
    code, _, err = run(capsys, "compare", str(graph), "--cluster", "cpu", "--out-dir",
                          str(out), "--json")
    assert code == 0, err
    assert graph.read_bytes() == before
    assert (out / "compare.json").is_file() and leftovers(out) == []


def test_compare_refuses_an_output_name_that_is_an_input(tmp_path, capsys):
    """--run calibrates the host into OUT/calibration.json: refused, before any work, when
    that file is the cluster file given."""
    out = tmp_path / "out"
    out.mkdir()
    cluster = out / "calibration.json"
    assert main(["cluster", "cpu", "-o", str(cluster)]) == 0
    capsys.readouterr()
    before = cluster.read_bytes()
    assert_failed(*run(capsys, "compare", "mlp", "--cluster", str(cluster), "--run",
                       "--out-dir", str(out), "--json"),
                  f"would overwrite the input {cluster}", kind="user_error")
    assert cluster.read_bytes() == before and sorted(p.name for p in out.iterdir()) == [
        "calibration.json"]


def test_compare_makes_missing_parent_folders(tmp_path, capsys):
    graph = str(hand_graph(tmp_path / "g.json"))
    out = tmp_path / "a" / "b"
    code, _, err = run(capsys, "compare", graph, "--cluster", "cpu", "--out-dir", str(out),
                       "--json")
    assert code == 0, err
    assert (out / "compare.json").is_file() and leftovers(tmp_path / "a") == []
    assert oct(out.stat().st_mode & 0o777) != oct(0o700)  # not the private temporary mode


def test_ctrl_c_during_compare_leaves_nothing(tmp_path):
    """SIGINT once the capture's progress bar shows (stderr a terminal, so it draws): exit 130,
    one line, no output folder and no temporary one."""
    master, slave = pty.openpty()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "trainsched.cli", "compare", "mlp",
                             "--cluster", "cpu", "--out-dir", "out"], cwd=tmp_path, env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=slave)
    os.close(slave)
    seen = b""
    try:
        deadline = time.monotonic() + 240
        while b"capturing mlp [" not in seen:
            assert time.monotonic() < deadline and proc.poll() is None, seen
            if select.select([master], [], [], 1.0)[0]:
                seen += os.read(master, 4096)
        proc.send_signal(signal.SIGINT)
        stdout, _ = proc.communicate(timeout=120)
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # the other end closed
                break
            if not chunk:
                break
            seen += chunk
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    text = seen.decode().replace("\r\n", "\n")
    assert proc.returncode == 130, text
    assert stdout == b""
    assert "Traceback" not in text and text.count("\n") == 1, text
    assert text.split("\r")[-1] == "trainsched: interrupted\n"
    assert list(tmp_path.iterdir()) == []


# --- train, profile and user models --------------------------------------------------------

@pytest.mark.parametrize("case", ["file", "under-a-file"])
def test_train_timeline_that_cannot_be_a_folder(tmp_path, capsys, monkeypatch, case):
    from trainsched.runtime import train as runtime_train

    monkeypatch.setattr(runtime_train, "train",
                        lambda *a, **k: pytest.fail("workers started before the check"))
    blocker = tmp_path / "taken"
    blocker.write_text("mine\n")
    timeline = blocker if case == "file" else blocker / "timeline"
    assert_failed(*run(capsys, "train", "mlp", "--trace-dir", str(timeline), "--json"),
                  f"--trace-dir {timeline}: ", kind="user_error")
    assert blocker.read_text() == "mine\n"


def test_train_timeline_that_cannot_be_written(tmp_path, capsys, monkeypatch):
    from trainsched.cli import outputs
    from trainsched.runtime import train as runtime_train

    monkeypatch.setattr(runtime_train, "train",
                        lambda *a, **k: pytest.fail("workers started before the check"))
    monkeypatch.setattr(outputs.tempfile, "mkstemp", _raise(PermissionError(
        errno.EACCES, "Permission denied")))
    timeline = tmp_path / "timeline"
    assert_failed(*run(capsys, "train", "mlp", "--timeline", str(timeline)),  # former spelling
                  f"--trace-dir {timeline}: cannot write in {tmp_path}: Permission denied")
    assert not timeline.exists()


def _raise(exc: BaseException):
    def fail(*args, **kwargs):
        raise exc
    return fail


def test_profile_on_cuda_without_a_gpu(capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert_failed(*run(capsys, "profile", "mlp", "--device", "cuda", "--json"),
                  "device 'cuda': no CUDA device here", kind="user_error")


def test_profile_on_an_unknown_device(capsys):
    pytest.importorskip("torch")
    assert_failed(*run(capsys, "profile", "mlp", "--device", "tpu"),
                  "device 'tpu': costs are measured on 'cpu' or 'cuda'")


BRANCHY = '''
import torch


class Branchy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(8, 8)

    def forward(self, x):
        y = self.layer(x)
        if y.sum() > 0:  # control flow on a tensor's value: neither export nor fx can trace it
            return y * 2
        return y


def build():
    return Branchy(), (torch.randn(4, 8),)
'''


def test_user_model_that_cannot_be_traced_is_one_line(tmp_path, capsys):
    pytest.importorskip("torch")
    source = tmp_path / "branchy.py"
    source.write_text(BRANCHY)
    assert_failed(*run(capsys, "profile", f"{source}:build", "--costs", "static", "--json"),
                  "could not trace the model", "control flow", kind="user_error")


@pytest.mark.parametrize("record", [[["weight", 400]], {"a": [["weight", "400"]]},
                                    {"a": [["weight", 300, 100]]}])
def test_a_malformed_parameter_tensor_record_is_one_line(tmp_path, capsys, record):
    """A graph file whose meta ``param_tensors`` is not op -> [[name, bytes], ...] (edited by
    hand) fails data-parallel simulation with exit 2 and what to do, not a traceback."""
    graph = tmp_path / "g.json"
    Graph([Op(name="a", compute_s=1e-3, param_bytes=400)], [],
          {"model": "hand", "param_tensors": record}).save(graph)
    code, out, err = run(capsys, "simulate", str(graph), "--cluster", "cpu",
                         "--parallelism", "data", "--ranks", "2")
    assert_failed(code, out, err, "param_tensors", "capture the model again or remove")
