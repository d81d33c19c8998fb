"""Costs measured as the ranks of a job on this host will run: several processes at once
(:func:`trainsched.runtime.host.capture_beside`)."""

from __future__ import annotations

import textwrap

import pytest

from trainsched.errors import TrainschedError

pytest.importorskip("torch")

from trainsched.runtime.host import capture_beside

#: A tiny model whose every forward leaves "<pid> <time>" in the folder of ``MARKS``.
MODEL = textwrap.dedent("""
    import os, time
    import torch

    MARKS = {marks!r}

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(8, 8)

        def forward(self, x):
            with open(os.path.join(MARKS, str(os.getpid())), "a") as fh:
                fh.write(f"{{time.monotonic()}}\\n")
            return self.fc(x).relu()

    def make(batch_size=4):
        return Net(), (torch.randn(batch_size, 8),)
""")


def _model_file(folder, marks) -> str:
    marks.mkdir()
    (folder / "net.py").write_text(MODEL.format(marks=str(marks)))
    return "net.py:make"


def _forwards(marks) -> dict[int, list[float]]:
    return {int(p.name): [float(t) for t in p.read_text().split()] for p in marks.iterdir()}


@pytest.mark.timeout(120)
def test_two_ranks_capture_in_two_processes_at_the_same_time(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a relative model file: the workers must find it too
    marks = tmp_path / "marks"
    graph = capture_beside(_model_file(tmp_path, marks), ranks=2, batch_size=4)
    forwards = _forwards(marks)
    assert len(forwards) == 2  # two processes ran the model, neither of them this one
    first, second = sorted(forwards.values(), key=len)
    # They overlapped: each ran a forward before the other's last.
    assert min(first) < max(second) and min(second) < max(first)
    assert graph.meta["measured_beside"] == 1
    assert [op.name for op in graph.ops] == ["x", "linear", "relu"]  # rank 0's capture


@pytest.mark.timeout(120)
def test_one_rank_captures_here_alone(tmp_path):
    import os

    marks = tmp_path / "marks"
    file = str(tmp_path / _model_file(tmp_path, marks))
    graph = capture_beside(file, ranks=1, batch_size=4)
    assert list(_forwards(marks)) == [os.getpid()]
    assert graph.meta["measured_beside"] == 0


@pytest.mark.timeout(120)
def test_an_unknown_model_on_two_ranks_is_one_clear_error():
    with pytest.raises(TrainschedError, match="no_such_model"):
        capture_beside("no_such_model", ranks=2)


def test_ranks_below_one_are_refused():
    with pytest.raises(TrainschedError, match="ranks must be at least 1"):
        capture_beside("mlp", ranks=0)


@pytest.mark.timeout(180)
def test_passes_capture_the_model_that_many_times_in_every_process(tmp_path):
    once, twice = tmp_path / "once", tmp_path / "twice"
    once.mkdir()
    twice.mkdir()
    capture_beside(str(once / _model_file(once, once / "marks")), ranks=2, batch_size=4)
    graph = capture_beside(str(twice / _model_file(twice, twice / "marks")), ranks=2,
                           batch_size=4, passes=2)
    single = sorted(len(v) for v in _forwards(once / "marks").values())
    double = sorted(len(v) for v in _forwards(twice / "marks").values())
    assert double == [2 * n for n in single]  # each of the two processes captured twice
    assert graph.meta["capture_passes"] == 2
    assert [op.name for op in graph.ops] == ["x", "linear", "relu"]


@pytest.mark.parametrize("passes", [0, 1.5, "3"])
def test_passes_below_one_or_not_a_whole_number_are_refused(passes):
    with pytest.raises(TrainschedError, match="passes must be an integer of at least 1"):
        capture_beside("mlp", ranks=1, passes=passes)
