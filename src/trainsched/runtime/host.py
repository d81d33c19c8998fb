"""This host as the simulator's input: a zoo model's training graph with costs measured here
and the host's cluster, calibrated now or read from a file.

``trainsched train --comm-policy auto`` (and ``--backprop ooo`` without ``--k``) predicts with
them before it runs anything, and ``benchmarks/comm_auto.py`` makes the same choice through
this one function, so the plan the benchmark times is the plan the command would run.

Costs are measured as the ranks will run: one thread per rank, and, where several ranks will
share this host's cores, with as many processes at work at once (:func:`capture_beside`). One
process alone ran MobileNet-V3's step in 148 ms on this project's 2-core host, and 175 ms
beside a second one (2026-11-29): costs timed alone under-predict a job whose ranks share the
cores.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from trainsched.cluster import Cluster
from trainsched.errors import TrainschedError
from trainsched.units import is_int

__all__ = ["capture_beside", "host_model"]

#: How long a capture beside other processes may take before it is called stuck.
CAPTURE_TIMEOUT_S = 3600.0
#: What rank 0 of a capture beside others leaves in the job's folder (one graph per pass).
GRAPH_FILE, PROGRESS_FILE = "graph{}.tsg", "progress"
#: How many times ``train``'s and ``compare --run``'s captures on a CPU host time the model:
#: each op's cost is the median of its passes (:func:`trainsched.graph.median_costs`).
HOST_PASSES = 3


def host_model(model: str, *, ranks: int, batch_size: int | None = None,
               image_size: int | None = None, seq_len: int | None = None,
               optimizer: str = "sgd", calibration: str | Cluster | None = None,
               progress: Callable[..., Any] | None = None,
               before_calibrating: Callable[[], None] | None = None) -> tuple[Any, Any]:
    """The training graph of zoo model ``model`` (costs measured on this host, ``optimizer``'s
    update ops) and the host's cluster: ``calibration`` (a cluster file, or a cluster already
    calibrated; it must have at least ``ranks`` devices), else this host's gloo calibrated
    now on ``ranks`` ranks
    (``before_calibrating`` is called first, to say so). ``progress`` is the capture's
    progress callback. Returns ``(graph, cluster)``; the graph's ``meta["batch_size"]`` is the
    batch it was captured at."""
    from trainsched.capture import build
    from trainsched.cluster import resolve_cluster
    from trainsched.graph import to_training

    zoo = build(model, batch_size=batch_size, seq_len=seq_len, image_size=image_size)
    if calibration is not None:
        cluster = (calibration if isinstance(calibration, Cluster)
                   else resolve_cluster(calibration))
        if cluster.num_devices < ranks:
            what = (f"--calibration {calibration}" if isinstance(calibration, str)
                    else f"the calibration {cluster.name!r}")
            raise TrainschedError(f"{what} has {cluster.num_devices} devices; --ranks {ranks} "
                                  f"needs as many: calibrate with --ranks {ranks}")
    else:
        from trainsched.runtime.calibrate import calibrate

        if before_calibrating is not None:
            before_calibrating()
        cluster = calibrate(world_size=ranks).to_cluster()
    graph = capture_beside(model, ranks=ranks, batch_size=batch_size, image_size=image_size,
                           seq_len=seq_len, meta={"batch_size": zoo.batch_size},
                           progress=progress, passes=HOST_PASSES)
    return to_training(graph, optimizer=optimizer), cluster


def capture_beside(model: str, *, ranks: int, batch_size: int | None = None,
                   image_size: int | None = None, seq_len: int | None = None,
                   precision: str = "fp32", meta: Mapping[str, Any] | None = None,
                   progress: Callable[[int, int, str], None] | None = None,
                   timeout_s: float = CAPTURE_TIMEOUT_S, passes: int = 1) -> Any:
    """The forward graph of zoo model ``model`` with costs measured on this host's CPU (one
    thread) while ``ranks`` processes work at once, as the ranks of a job on this host will:
    each captures the model at the same time; rank 0's graph is returned, with ``meta`` and
    ``measured_beside`` (the other processes' count) in its meta. ``ranks`` 1 captures in
    this process. ``progress(done, total, item)`` hears rank 0's capture. ``passes`` above 1
    captures the model that many times in a row (every process alike) and returns each op's
    median times (:func:`trainsched.graph.median_costs`): a shared host's speed moves over
    seconds, one capture takes a snapshot of it.

    The others capture rather than train: real ranks compute with pauses for their
    collectives, and a second process training without pause beside the capture
    over-predicted ResNet-50's and the small CNN's DDP steps by 22-27% on this project's
    2-core host (2026-11-29, ``benchmarks/validate_sim.py``)."""
    from trainsched.graph import Graph, median_costs

    if ranks < 1:
        raise TrainschedError(f"ranks must be at least 1, got {ranks}")
    if not (is_int(passes) and passes >= 1):
        raise TrainschedError(f"passes must be an integer of at least 1, got {passes!r}")
    config = {"model": _portable(model), "batch_size": batch_size, "image_size": image_size,
              "seq_len": seq_len, "precision": precision, "passes": passes,
              "meta": {**(meta or {}), "measured_beside": ranks - 1}, "timeout_s": timeout_s}
    if ranks == 1:
        return median_costs(_captures(config, progress))
    from trainsched.runtime.launch import job

    def watch(folder: Path) -> None:
        if progress is not None:
            fields = _read_progress(folder / PROGRESS_FILE)
            if fields is not None:
                progress(*fields)

    with job("trainsched.runtime.host:_beside_main", config, ranks, timeout_s=timeout_s,
             what=f"the capture of {model} on {ranks} processes", watch=watch) as out:
        return median_costs([Graph.load(out / GRAPH_FILE.format(k)) for k in range(passes)])



def _portable(model: str) -> str:
    """``model`` as another process sees it: a model file's path made absolute."""
    if ".py:" not in model:
        return model
    path, function = model.rsplit(":", 1)
    return f"{os.path.abspath(path)}:{function}"


def _capture(cfg: Mapping[str, Any], progress: Callable[[int, int, str], None] | None) -> Any:
    from trainsched.capture import build, capture

    zoo = build(cfg["model"], batch_size=cfg["batch_size"], seq_len=cfg["seq_len"],
                image_size=cfg["image_size"])
    return capture(zoo.model, zoo.args, example_kwargs=zoo.kwargs, costs="measured",
                   device="cpu", threads=1, name=zoo.name, meta=cfg["meta"],
                   precision=cfg["precision"], progress=progress)


def _captures(cfg: Mapping[str, Any],
              progress: Callable[[int, int, str], None] | None) -> list[Any]:
    """``cfg["passes"]`` captures in a row; ``progress`` hears them as one piece of work."""
    passes = int(cfg.get("passes", 1))
    graphs = []
    for k in range(passes):
        def report(done: int, total: int, item: str, k: int = k) -> None:
            if progress is not None:
                progress(k * total + done, passes * total, item)

        graphs.append(_capture(cfg, report))
    return graphs


def _read_progress(path: Path) -> tuple[int, int, str] | None:
    try:
        done, total, item = path.read_text().split("\t", 2)
        return int(done), int(total), item
    except (OSError, ValueError):
        return None


def _beside_main() -> None:  # pragma: no cover - runs in the workers
    from trainsched.runtime.launch import serve_worker

    serve_worker(_beside)


def _beside(cfg: dict[str, Any]) -> dict[str, str] | None:  # pragma: no cover - in the workers
    """One process of :func:`capture_beside`: capture; rank 0 saves its graphs."""
    import torch

    torch.set_num_threads(1)
    rank, out = int(cfg["rank"]), Path(cfg["out"])
    if rank != 0:
        _captures(cfg, None)
        return None

    def report(done: int, total: int, item: str) -> None:
        tmp = out / f"{PROGRESS_FILE}.tmp"
        tmp.write_text(f"{done}\t{total}\t{item}")
        os.replace(tmp, out / PROGRESS_FILE)

    graphs = _captures(cfg, report)
    for k, graph in enumerate(graphs):
        graph.save(out / GRAPH_FILE.format(k))
    return {"graphs": str(len(graphs))}
