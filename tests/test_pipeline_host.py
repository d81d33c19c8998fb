"""The pipeline runtime's host time per action and per message (``runtime.pipeline_host``),
measured on real gloo processes as ``trainsched calibrate`` does, and its timed stage."""

from __future__ import annotations

import json
import textwrap

import pytest

from trainsched.runtime.launch import free_port, run_workers
from trainsched.runtime.pipeline_host import TimedStage

WORKER = textwrap.dedent("""
    import json, sys
    from datetime import timedelta
    import torch, torch.distributed as dist
    from trainsched.runtime.pipeline_host import pipeline_host_times

    cfg = json.loads(sys.argv[1])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{cfg['port']}",
                            rank=cfg["rank"], world_size=cfg["n"],
                            timeout=timedelta(seconds=60))
    figures = pipeline_host_times(cfg["rank"], cfg["n"], steps=2, warmup=1)
    with open(cfg["out"], "w") as fh:
        json.dump(figures, fh)
    dist.destroy_process_group()
""")


def _measure(tmp_path, n: int) -> list[list[float]]:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    port = free_port()
    outs = [tmp_path / f"out{r}.json" for r in range(n)]
    run_workers(str(script), [{"rank": r, "n": n, "port": port, "out": str(outs[r])}
                              for r in range(n)], workdir=tmp_path, timeout_s=120)
    return [json.loads(o.read_text()) for o in outs]


@pytest.mark.timeout(150)
def test_two_ranks_measure_one_action_and_one_message_time(tmp_path):
    (action, message), other = _measure(tmp_path, 2)
    assert [action, message] == other  # the same figures on every rank
    assert 0 < action < 1 and 0 < message < 1


@pytest.mark.timeout(150)
def test_a_third_rank_waits_and_gets_the_figures_of_ranks_0_and_1(tmp_path):
    figures = _measure(tmp_path, 3)
    assert figures[2] == figures[0] == figures[1]
    assert all(v > 0 for v in figures[2])


class _Stage:
    input_names = ("x",)

    def forward(self, microbatch, inputs):
        return [microbatch, *inputs]

    def backward(self, microbatch, grads):
        return ["B", microbatch]

    def backward_input(self, microbatch, grads):
        return ["I", microbatch]

    def backward_weight(self, microbatch):
        return None


def test_a_timed_stage_records_each_action_by_kind_and_passes_everything_through():
    record: dict[str, list[float]] = {}
    stage = TimedStage(_Stage(), record)
    assert stage.forward(0, ["a"]) == [0, "a"] and stage.forward(1, ["b"]) == [1, "b"]
    assert stage.backward(0, []) == ["B", 0]
    assert stage.backward_input(1, []) == ["I", 1]
    assert stage.backward_weight(1) is None
    assert stage.input_names == ("x",)
    assert {kind: len(times) for kind, times in record.items()} == {"F": 2, "B": 1, "I": 1,
                                                                     "W": 1}
    assert all(t >= 0 for times in record.values() for t in times)
