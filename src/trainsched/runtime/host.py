"""This host as the simulator's input: a zoo model's training graph with costs measured here
and the host's cluster, calibrated now or read from a file.

``trainsched train --comm-policy auto`` (and ``--backprop ooo`` without ``--k``) predicts with
them before it runs anything, and ``benchmarks/comm_auto.py`` makes the same choice through
this one function, so the plan the benchmark times is the plan the command would run.
Costs are measured with one thread per rank (the ranks share this host's cores).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from trainsched.cluster import Cluster
from trainsched.errors import TrainschedError

__all__ = ["host_model"]


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
    from trainsched.capture import build, capture
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
        cluster = calibrate(world_size=ranks, repeats=5).to_cluster()
    graph = capture(zoo.model, zoo.args, example_kwargs=zoo.kwargs, costs="measured",
                    device="cpu", name=zoo.name, meta={"batch_size": zoo.batch_size},
                    progress=progress)
    return to_training(graph, optimizer=optimizer), cluster
