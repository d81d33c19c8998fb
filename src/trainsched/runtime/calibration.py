"""What a calibration measured, and how each measurement becomes a figure of the cluster.

:func:`~trainsched.runtime.calibrate.calibrate` runs the probes in real processes and hands
their raw result to :func:`read_measurements`, which fits and corrects it into a
:class:`Calibration`; :meth:`Calibration.to_cluster` writes the figures into a cluster. Every
step here is plain arithmetic on numbers, tested by hand without processes.

* p2p: the line α + S/B through the one-way times (half the round trip), fitted over all sizes
  to the log of the times with a robust loss (one noisy size does not bend it);
* all-reduce: the same fit of the measured times, read as the ring formula
  ``2(n-1)·α + 2(n-1)/n · S/B`` to give a per-rank latency α and bandwidth B.

The relative error of each fitted line at every measured size is kept, because one α–β line over
4 B–64 MiB on gloo can be off by a large factor in the middle (simulator spec §1.2).

The probes' figures are read so that the simulator charges each cost once:

* ``collective_after_compute_s``: what an all-reduce right after a training step took beyond
  the fit (:func:`with_after_compute`); the simulator adds it to a step's first collective.
* ``collective_overhead_s``: per extra collective, what a step issuing one collective per
  gradient takes beyond a step issuing one of all of them, less what the fit says of the
  difference (:func:`overhead_from_steps`); added to every later collective of a step.
* ``collective_host_s``: the same two steps' processor time, per extra collective
  (:func:`host_from_steps`): what each collective takes from its rank's compute when the rank
  has one core to itself, charged on the compute stream.
* γ and compute's rate beside collectives keep only what the host time does not charge
  (:func:`beyond_host_time`); the collectives' rate and their contention are read on their
  bytes alone, the start-up being a delay that no rate stretches (:func:`beyond_startup`).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from trainsched.cluster import INTERFERENCE_MODELS, Cluster, Link, cluster_preset
from trainsched.errors import TrainschedError

__all__ = ["GLOO_THREADS", "Calibration", "Row", "beyond_host_time", "beyond_startup", "fit",
           "host_from_steps", "overhead_from_steps", "read_measurements", "with_after_compute",
           "with_overhead"]

GLOO_THREADS = 2  # a gloo process group's worker threads: collectives it runs at once


@dataclass(frozen=True)
class Row:
    """Trimmed-mean times for one message size (seconds); ``p2p_s`` is one-way (half a round
    trip)."""

    size_bytes: int
    p2p_s: float
    allreduce_s: float

    def to_dict(self) -> dict[str, Any]:
        return {"size_bytes": self.size_bytes, "p2p_s": self.p2p_s,
                "allreduce_s": self.allreduce_s}


@dataclass(frozen=True)
class Calibration:
    """What :func:`calibrate` measured and fitted."""

    backend: str
    world_size: int
    host: Mapping[str, Any]
    measured_at: str  # ISO 8601, UTC
    repeats: int
    warmup: int
    rows: tuple[Row, ...]
    p2p: Link
    allreduce: Link
    p2p_errors: tuple[float, ...]  # (fitted - measured) / measured, per row
    allreduce_errors: tuple[float, ...]
    comm_compute_share: float = 0.0  # seconds of compute lost per second of all-reduce
    memory_bandwidth_bytes_per_s: float | None = None  # read + write of a 64 MiB copy
    compute_rate_with_comm: float = 1.0  # compute's rate while an all-reduce is in flight
    comm_rate_with_compute: float = 1.0  # an all-reduce's rate while compute runs
    collective_slots: int = 1  # collectives in flight at once
    collective_contention: float = 1.0  # how collectives in flight together share the wire
    buffer_sync_s: float = 0.0  # DDP's buffer broadcast before forward (fixed part)
    collective_after_compute_s: float = 0.0  # a step's first collective beyond the fit
    collective_overhead_s: float = 0.0  # each later collective of a step beyond the fit
    collective_host_s: float = 0.0  # processor time each collective takes from compute
    pipeline_action_s: float = 0.0  # the pipeline runtime's host time per action
    pipeline_message_s: float = 0.0  # ... and per point-to-point message, on each side

    def p2p_predict(self, size_bytes: float) -> float:
        return self.p2p.latency_s + size_bytes / self.p2p.bandwidth_bytes_per_s

    def allreduce_predict(self, size_bytes: float) -> float:
        return _ring_allreduce(self.world_size, self.allreduce, size_bytes)

    @property
    def max_abs_error(self) -> float:
        return max(abs(e) for e in (*self.p2p_errors, *self.allreduce_errors))

    def to_dict(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "world_size": self.world_size,
            "host": dict(self.host),
            "measured_at": self.measured_at,
            "repeats": self.repeats,
            "warmup": self.warmup,
            "rows": [
                {**row.to_dict(), "p2p_fit_error": pe, "allreduce_fit_error": ae}
                for row, pe, ae in zip(self.rows, self.p2p_errors, self.allreduce_errors,
                                       strict=True)
            ],
            "p2p": _link_dict(self.p2p),
            "allreduce": _link_dict(self.allreduce),
            "comm_compute_share": self.comm_compute_share,
            "memory_bandwidth_bytes_per_s": self.memory_bandwidth_bytes_per_s,
            "compute_rate_with_comm": self.compute_rate_with_comm,
            "comm_rate_with_compute": self.comm_rate_with_compute,
            "collective_slots": self.collective_slots,
            "collective_contention": self.collective_contention,
            "buffer_sync_s": self.buffer_sync_s,
            "collective_after_compute_s": self.collective_after_compute_s,
            "collective_overhead_s": self.collective_overhead_s,
            "collective_host_s": self.collective_host_s,
            "pipeline_action_s": self.pipeline_action_s,
            "pipeline_message_s": self.pipeline_message_s,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"

    def table(self) -> str:
        """A plain-text table of the measurements and the fit errors."""
        lines = [f"{'size B':>10} {'p2p one-way':>12} {'fit err':>8} "
                 f"{'all-reduce':>12} {'fit err':>8}"]
        for row, pe, ae in zip(self.rows, self.p2p_errors, self.allreduce_errors, strict=True):
            lines.append(f"{row.size_bytes:>10} {row.p2p_s * 1e3:>9.3f} ms {pe:>+8.0%} "
                         f"{row.allreduce_s * 1e3:>9.3f} ms {ae:>+8.0%}")
        lines.append(f"compute lost to communication: {self.comm_compute_share:.2f} s per s of "
                     "all-reduce")
        lines.append(f"by rate: compute at {self.compute_rate_with_comm:.2f} beside an "
                     f"all-reduce, all-reduce at {self.comm_rate_with_compute:.2f} beside "
                     f"compute; {self.collective_slots} at once, contention "
                     f"{self.collective_contention:.2f}")
        if self.buffer_sync_s:
            lines.append(f"DDP buffer broadcast before forward: {self.buffer_sync_s * 1e3:.3f} ms "
                         f"(fixed part)")
        lines.append(f"an all-reduce right after compute: "
                     f"{self.collective_after_compute_s * 1e3:+.3f} ms beyond the fit")
        lines.append(f"each collective of a step issued one per gradient: "
                     f"{self.collective_overhead_s * 1e3:+.3f} ms beyond the fit, "
                     f"{self.collective_host_s * 1e3:.3f} ms of processor time")
        if self.pipeline_action_s or self.pipeline_message_s:
            lines.append(f"pipeline runtime: {self.pipeline_action_s * 1e3:.3f} ms per action, "
                         f"{self.pipeline_message_s * 1e3:.3f} ms per message on each side")
        if self.memory_bandwidth_bytes_per_s:
            lines.append(f"memory bandwidth (64 MiB copy, read + write, every rank at once): "
                         f"{self.memory_bandwidth_bytes_per_s / 1e9:.1f} GB/s")
        return "\n".join(lines)

    def to_cluster(self, name: str = "calibrated", *, comm_model: str = "rates") -> Cluster:
        """The ``cpu`` preset with ``world_size`` devices, the fitted p2p link intra-node, the
        all-reduce fit as the link collectives run at, the measured interference of compute
        and communication and the measured copy bandwidth: everything the library's own
        predictions use, so that a cluster file predicts what the calibration does.

        ``comm_model`` says which interference model the file carries: ``"rates"`` (compute
        and collectives slow each other while both run, several collectives in flight share
        the wire) or ``"turns"`` (γ: a collective takes γ times its duration from compute)."""
        if comm_model not in INTERFERENCE_MODELS:
            raise TrainschedError(f"comm_model must be one of "
                                  f"{', '.join(INTERFERENCE_MODELS)}, got {comm_model!r}")
        base = cluster_preset("cpu")
        sizes = [r.size_bytes for r in self.rows]
        description = (
            f"measured {self.measured_at} on {self.host.get('hostname', '?')} by "
            f"'trainsched calibrate': {self.backend}, {self.world_size} processes, "
            f"{len(sizes)} sizes {min(sizes)}-{max(sizes)} B, trimmed mean of {self.repeats}; "
            f"p2p and all-reduce alpha-beta lines fitted to all sizes (log errors, robust "
            f"loss), worst fit error {self.max_abs_error:.0%}; inter-node link from the cpu "
            f"preset")
        interference: dict[str, Any] = {"comm_compute_share": self.comm_compute_share}
        if comm_model == "rates":
            interference = {"compute_rate_with_comm": self.compute_rate_with_comm,
                            "comm_rate_with_compute": self.comm_rate_with_compute,
                            "collective_slots": self.collective_slots,
                            "collective_contention": self.collective_contention}
        device = dataclasses.replace(
            base.device, **interference, buffer_sync_s=self.buffer_sync_s,
            collective_after_compute_s=self.collective_after_compute_s,
            collective_overhead_s=self.collective_overhead_s,
            collective_host_s=self.collective_host_s,
            microbatch_overhead_s=self.pipeline_action_s,
            message_host_s=self.pipeline_message_s,
            memory_bandwidth_bytes_per_s=(self.memory_bandwidth_bytes_per_s
                                          or base.device.memory_bandwidth_bytes_per_s))
        return Cluster(name=name, description=description, device=device,
                       devices_per_node=self.world_size, num_nodes=1, intra_node=self.p2p,
                       collectives=self.allreduce, inter_node=base.inter_node, comm=base.comm)


def _link_dict(link: Link) -> dict[str, float]:
    return {"bandwidth_bytes_per_s": link.bandwidth_bytes_per_s, "latency_s": link.latency_s}


def _ring_allreduce(n: int, link: Link, size_bytes: float) -> float:
    return 2 * (n - 1) * link.latency_s + 2 * (n - 1) / n * size_bytes / link.bandwidth_bytes_per_s


# --- fitting ----------------------------------------------------------------------------------

def _fit_line(sizes: Sequence[float], times: Sequence[float]) -> tuple[float, float]:
    """(alpha, seconds per byte) of the line ``alpha + size * slope`` fitted to every measured
    size in log space (the error of a size is ``log(predicted / measured)``) with a robust loss.

    Log errors weigh a 4 KiB message as much as a 64 MiB one (a plain least-squares line is set
    by the largest sizes alone), and the robust loss keeps one odd size from bending the line:
    gloo's small messages are noisy and non-monotone in size.
    """
    import numpy as np
    from scipy.optimize import least_squares

    x = np.asarray(sizes, dtype=float)
    t = np.asarray(times, dtype=float)
    keep = t > 0
    if not keep.any():
        raise TrainschedError("calibration measured no positive times; nothing to fit")
    x, t = x[keep], t[keep]
    # start: alpha the median of the smaller half, slope from the largest size beyond it
    alpha0 = float(np.median(t[x <= np.median(x)]))
    slope0 = max(float(t[np.argmax(x)]) - alpha0, float(t.max()) * 1e-3) / max(x.max(), 1.0)

    def residuals(p: Any) -> Any:
        return np.log(np.exp(p[0]) + x * np.exp(p[1])) - np.log(t)

    fitted = least_squares(residuals, [math.log(alpha0), math.log(slope0)], loss="soft_l1",
                           f_scale=0.1, method="trf")
    return float(math.exp(fitted.x[0])), float(math.exp(fitted.x[1]))


def _errors(predict: Any, rows: Sequence[Row], attr: str) -> tuple[float, ...]:
    return tuple((predict(r.size_bytes) - getattr(r, attr)) / getattr(r, attr) for r in rows)


def fit(rows: Sequence[Row], world_size: int) -> tuple[Link, Link]:
    """The fitted (p2p, all-reduce per-rank) links for measured ``rows``."""
    sizes = [float(r.size_bytes) for r in rows]
    alpha, slope = _fit_line(sizes, [r.p2p_s for r in rows])
    p2p = Link(bandwidth_bytes_per_s=1.0 / slope, latency_s=alpha)
    n = world_size
    a_ar, s_ar = _fit_line(sizes, [r.allreduce_s for r in rows])
    allreduce = Link(bandwidth_bytes_per_s=2 * (n - 1) / (n * s_ar), latency_s=a_ar / (2 * (n - 1)))
    return p2p, allreduce


# --- reading the probes -----------------------------------------------------------------------

def read_measurements(data: Mapping[str, Any], *, backend: str, world_size: int,
                      measured_at: str, repeats: int, warmup: int,
                      host: Mapping[str, Any]) -> Calibration:
    """The calibration the workers' raw result ``data`` says (``rows`` of ``[size, p2p one-way
    s, all-reduce s]`` and each probe's figures, absent where the probe did not run): the
    links fitted, every probe read as the module docstring says, each figure clamped to its
    range."""
    rows = tuple(Row(size_bytes=int(s), p2p_s=float(p), allreduce_s=float(a))
                 for s, p, a in data["rows"])
    for row in rows:
        if not (row.p2p_s > 0 and row.allreduce_s > 0):
            raise TrainschedError(f"calibration measured a non-positive time at "
                                  f"{row.size_bytes} B; the clock is too coarse here")
    p2p, allreduce = fit(rows, world_size)
    host = {**host, **data.get("host", {})}
    share = min(max(float(data.get("comm_compute_share", 0.0)), 0.0), 4.0)
    rates = dict(data.get("rates", {}))
    rates.update(beyond_startup(rates, _ring_allreduce(world_size, allreduce, 0.0)))
    pipeline = data.get("pipeline_host") or (0.0, 0.0)
    memory = data.get("memory_bandwidth")
    cal = Calibration(backend=backend, world_size=world_size, host=host, measured_at=measured_at,
                      repeats=repeats, warmup=warmup, rows=rows, p2p=p2p, allreduce=allreduce,
                      p2p_errors=(), allreduce_errors=(), comm_compute_share=share,
                      memory_bandwidth_bytes_per_s=float(memory) if memory else None,
                      compute_rate_with_comm=_clamp(rates.get("compute", 1.0), 0.05, 1.0),
                      comm_rate_with_compute=_clamp(rates.get("comm", 1.0), 0.01, 1.0),
                      collective_slots=GLOO_THREADS if backend == "gloo" else 1,
                      collective_contention=_clamp(rates.get("contention", 1.0), 0.0, 1.0),
                      buffer_sync_s=_clamp(data.get("buffer_sync", 0.0), 0.0, 1.0),
                      pipeline_action_s=_clamp(pipeline[0], 0.0, 1.0),
                      pipeline_message_s=_clamp(pipeline[1], 0.0, 1.0))
    cal = with_after_compute(cal, data.get("after_compute"))
    cal = with_overhead(cal, data.get("per_collective"))
    share, rate = beyond_host_time(cal.comm_compute_share, cal.compute_rate_with_comm, rates,
                                   cal.collective_host_s)
    cal = dataclasses.replace(cal, comm_compute_share=share, compute_rate_with_comm=rate)
    return dataclasses.replace(cal, p2p_errors=_errors(cal.p2p_predict, rows, "p2p_s"),
                               allreduce_errors=_errors(cal.allreduce_predict, rows,
                                                        "allreduce_s"))


def with_after_compute(cal: Calibration, measured: Any) -> Calibration:
    """``cal`` with ``collective_after_compute_s`` = what an all-reduce of ``size`` bytes took
    right after a training step beyond its fitted cost (the simulator charges the fit, and
    this on top), at least 0; ``measured`` is the workers' ``[size, seconds]``."""
    if not measured:
        return cal
    size, seconds = measured
    return dataclasses.replace(
        cal, collective_after_compute_s=_clamp(seconds - cal.allreduce_predict(size), 0.0, 1.0))


def overhead_from_steps(sizes: Sequence[float], extra_s: float,
                        predict: Any) -> float:
    """The time per collective beyond ``predict`` (seconds of a collective of a size) that
    makes a step issuing one collective per gradient of ``sizes``, one at a time, take
    ``extra_s`` longer than a step issuing one collective of all of them, as the simulator
    charges it (every collective its fitted cost plus the overhead o, but a step's first,
    which pays the same in both steps):
    ``extra_s = Σ predict(s) + K·o − (predict(Σ s) + o)``, so
    ``o = (extra_s − Σ predict(s) + predict(Σ s)) / (K − 1)``. At least 0; at most 1 s."""
    sizes = [float(s) for s in sizes]
    if len(sizes) < 2:
        raise TrainschedError(f"the per-collective probe needs at least 2 collectives, got "
                              f"{len(sizes)}")
    fitted = sum(predict(s) for s in sizes) - predict(sum(sizes))
    return _clamp((float(extra_s) - fitted) / (len(sizes) - 1), 0.0, 1.0)


def host_from_steps(count: int, extra_cpu_s: float) -> float:
    """The processor time per collective that makes a step issuing ``count`` collectives take
    ``extra_cpu_s`` more processor time than a step issuing one collective of the same bytes
    (the bytes cost both steps alike, so the difference is ``count − 1`` collectives' fixed
    work): ``extra_cpu_s / (count − 1)``. At least 0; at most 1 s."""
    if count < 2:
        raise TrainschedError(f"the per-collective probe needs at least 2 collectives, got "
                              f"{count}")
    return _clamp(float(extra_cpu_s) / (count - 1), 0.0, 1.0)


def beyond_host_time(share: float, rate: float, rates: Mapping[str, Any],
                     host_s: float) -> tuple[float, float]:
    """γ and compute's rate beside collectives without the collectives' processor time.

    The interference probe lost L = γ·D0 = (1 − r)·D1 of compute while ``count`` all-reduces
    ran beside it (D0 alone, D1 beside: ``comm_alone_s``, ``comm_beside_s`` of ``rates``).
    The simulator charges each collective ``host_s`` on the compute stream besides γ or the
    rate, so they keep what is left: γ' = (L − count·host_s) / D0 = γ − count·host_s / D0 and
    r' = 1 − (L − count·host_s) / D1 = r + count·host_s / D1 (γ' at least 0, r' at most 1).
    Without the probe's figures (an older worker) both are returned as they are."""
    count, alone_s, beside_s = (rates.get(k) for k in ("count", "comm_alone_s",
                                                        "comm_beside_s"))
    if not host_s or not count or not alone_s or not beside_s:
        return share, rate
    held = float(count) * host_s
    return max(share - held / float(alone_s), 0.0), min(rate + held / float(beside_s), 1.0)


def beyond_startup(rates: Mapping[str, Any], startup_s: float) -> dict[str, float]:
    """The collectives' rate beside compute and their contention on their bytes alone.

    The simulator runs a collective's start-up (its latency terms, ``startup_s`` by the fit)
    as a delay that neither rate stretches, so the probes' figures, which stretch whole
    collectives, are read on the rest: ``count`` all-reduces that took D0 alone and D1 beside
    compute (``comm_alone_s``, ``comm_beside_s``) ran their bytes at
    (D0 − count·α) / (D1 − count·α); two that took T2 = (1 + ρ)·d at once, one d alone
    (``contention_alone_s``), after their start-ups side by side, shared the wire with
    ρ' = (T2 − d) / (d − α) = ρ·d / (d − α). Clamped to (0, 1] and [0, 1]; a figure whose
    inputs are missing (an older worker) or leave no bytes is left as it is. Returns the
    ``comm`` and ``contention`` entries that change."""
    out: dict[str, float] = {}
    count, alone, beside = (rates.get(k) for k in ("count", "comm_alone_s", "comm_beside_s"))
    if "comm" in rates and count and alone and beside:
        held = float(count) * startup_s
        if float(alone) > held and float(beside) > held:
            out["comm"] = _clamp((float(alone) - held) / (float(beside) - held), 0.01, 1.0)
    rho, d = rates.get("contention"), rates.get("contention_alone_s")
    if rho is not None and d and float(d) > startup_s:
        out["contention"] = _clamp(float(rho) * float(d) / (float(d) - startup_s), 0.0, 1.0)
    return out


def with_overhead(cal: Calibration, measured: Any) -> Calibration:
    """``cal`` with ``collective_overhead_s`` (and ``collective_host_s``) from the workers'
    ``[sizes, seconds, processor seconds]``."""
    if not measured:
        return cal
    sizes, extra_s, *cpu = measured
    cal = dataclasses.replace(cal, collective_overhead_s=overhead_from_steps(
        sizes, extra_s, cal.allreduce_predict))
    if cpu:
        cal = dataclasses.replace(cal, collective_host_s=host_from_steps(len(sizes), cpu[0]))
    return cal


def _clamp(value: Any, low: float, high: float) -> float:
    value = float(value)
    return min(max(value, low), high) if math.isfinite(value) else high

