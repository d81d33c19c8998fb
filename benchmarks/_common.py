"""What every benchmark script shares: the machine it ran on, how results are written, and
the paired, interleaved rounds the communication benchmarks time configurations in."""

from __future__ import annotations

import json
import platform
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

#: The label of the stock DDP segment every paired ratio is taken against.
DDP_LABEL = "ddp-25MB"


def cpu_model() -> str:
    """The CPU's model name, from /proc/cpuinfo where there is one."""
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.exists() else []
    return next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")),
                platform.processor())


def write_results(path: str | Path, results: dict[str, Any]) -> None:
    """Write a results file (indented JSON) and say where."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {out}")


def summarise(label: str, rounds: list[list[float]]) -> dict[str, Any]:
    """One configuration's rounds of step times: the median of the round medians, the round
    medians, p10 and p90 over every step, and the step count."""
    medians = [statistics.median(r) for r in rounds]
    pooled = sorted(t for r in rounds for t in r)

    def q(x: float) -> float:
        return pooled[min(len(pooled) - 1, round(x * (len(pooled) - 1)))]

    return {"label": label, "median_s": statistics.median(medians),
            "round_medians_s": medians, "p10_s": q(0.1), "p90_s": q(0.9),
            "steps": len(pooled)}


def summarise_rounds(segments: Any, base: str = DDP_LABEL) -> tuple[
        dict[str, list[list[float]]], dict[str, dict[str, Any]]]:
    """Timed segments (one per configuration and round) by label: their step times per round
    and :func:`summarise`'s summary, with each configuration's ``paired_ddp_ratio``: the median
    over rounds of ``base``'s round median over this configuration's in the same round
    (minutes apart at most, so a drift between rounds cancels)."""
    rows: dict[str, list[list[float]]] = {}
    for seg in segments:
        rows.setdefault(seg.label, []).append(list(seg.step_times_s))
    summary = {label: summarise(label, rounds) for label, rounds in rows.items()}
    for s in summary.values():
        s["paired_ddp_ratio"] = statistics.median(
            b / m for b, m in zip(summary[base]["round_medians_s"], s["round_medians_s"],
                                  strict=False))
    return rows, summary


def run_rounds(model: str, configs: Sequence[Any], *, repeats: int, batch_size: int | None,
               image_size: int | None, timeout_s: float = 3600) -> tuple[
                   dict[str, list[list[float]]], dict[str, dict[str, Any]], dict[str, Any]]:
    """``repeats`` rounds of ``configs`` (runtime segments, the DDP one labelled
    :data:`DDP_LABEL`) interleaved A B C ... A B C ... in one 2-rank gloo job of ``model``
    (SGD, lr 0.01): the step times per round by label, :func:`summarise_rounds`'s summary and
    the host the ranks ran on."""
    from trainsched.runtime.train import run_segments

    job = run_segments(model, [c for _ in range(repeats) for c in configs], nproc=2,
                       batch_size=batch_size, image_size=image_size, optimizer="sgd",
                       lr=0.01, timeout_s=timeout_s)
    rows, summary = summarise_rounds(job.segments)
    return rows, summary, dict(job.host)


def print_rounds(title: str, summary: dict[str, dict[str, Any]], width: int = 40) -> None:
    """The table of :func:`summarise_rounds`' summary under ``title``: per configuration the
    median, p10, p90 (ms), the paired ratio to DDP and the round medians."""
    print(title)
    print(f"{'configuration':<{width}} {'median ms':>10} {'p10':>8} {'p90':>8} {'paired':>7}  "
          f"round medians (ms)")
    for label, s in summary.items():
        rounds = " ".join(f"{1e3 * m:.1f}" for m in s["round_medians_s"])
        print(f"{label:<{width}} {1e3 * s['median_s']:>10.2f} {1e3 * s['p10_s']:>8.2f} "
              f"{1e3 * s['p90_s']:>8.2f} {s['paired_ddp_ratio']:>6.2f}x  {rounds}")
    print()
