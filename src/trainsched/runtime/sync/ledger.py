"""Worker 0's running account of a sync run (torch-free): per-phase counters merged over the
phase's segments, switch events, checkpoints, the held-out curve and, under an online
straggler policy, the detector's events and the relaxed episodes. It goes into every
checkpoint (so a resumed run reports the whole run) and becomes the
:class:`~trainsched.runtime.sync.results.SyncRunResult` at the end.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from trainsched.runtime.sync.config import Segment
from trainsched.sync.protocols import format_protocol

__all__ = ["Ledger", "checkpoint_name"]


def checkpoint_name(samples: int) -> str:
    """The file stem of the checkpoint written after ``samples`` applied samples."""
    return f"sync-{samples:012d}"


def _merge_hist(a: Sequence[int], b: Sequence[int]) -> list[int]:
    size = max(len(a), len(b))
    return [(a[i] if i < len(a) else 0) + (b[i] if i < len(b) else 0) for i in range(size)]


class Ledger:
    def __init__(self, *, ranks: int, eval_every: int | None) -> None:
        self.ranks = ranks
        self.eval_every = eval_every
        self.next_eval = eval_every
        self.phases: dict[int, dict[str, Any]] = {}
        self.switches: list[dict[str, Any]] = []
        self.checkpoints: list[int] = []
        self.curve: list[dict[str, Any]] = []
        self.resumed_from: int | None = None
        self.detector_events: list[dict[str, Any]] = []
        self.episodes: list[dict[str, Any]] = []
        self.observations = 0
        self.declined = 0

    def first_point(self, loss_accuracy: tuple[float, float]) -> None:
        loss, accuracy = loss_accuracy
        self.curve.append({"samples": 0, "loss": loss, "accuracy": accuracy})

    def maybe_evaluate(self, samples: int,
                       evaluate: Callable[[], tuple[float, float]]) -> None:
        """Evaluate when ``samples`` reached the next multiple of ``eval_every``."""
        if self.next_eval is None or samples < self.next_eval:
            return
        loss, accuracy = evaluate()
        self.curve.append({"samples": samples, "loss": loss, "accuracy": accuracy})
        assert self.eval_every is not None
        while self.next_eval <= samples:
            self.next_eval += self.eval_every

    def add(self, segment: Segment, counters: dict[str, Any], *, lr: float, wall_s: float,
            batches: int) -> None:
        record = self.phases.setdefault(segment.phase, {
            "index": segment.phase, "protocol": format_protocol(segment.protocol),
            "samples": 0, "updates": 0, "gradients": 0, "dropped": 0, "drained": 0,
            "lr": lr, "staleness": [[] for _ in range(self.ranks)], "max_clock_lead": None,
            "wall_s": 0.0, "batches": 0, "local_s": 0.0})
        for key in ("samples", "updates", "gradients", "dropped", "drained"):
            record[key] += int(counters[key])
        record["staleness"] = [_merge_hist(a, b) for a, b in
                               zip(record["staleness"], counters["staleness"], strict=True)]
        lead = counters["max_clock_lead"]
        if lead is not None:
            record["max_clock_lead"] = max(lead, record["max_clock_lead"] or 0)
        record["lr"] = lr
        record["wall_s"] += wall_s
        record["batches"] += batches
        record["local_s"] += float(counters.get("local_s", 0.0))

    def switch(self, segment: Segment, following: Segment, *, step: int, at_s: float,
               cost_s: float, samples: int | None = None) -> None:
        """A planned switch at the end of ``segment`` (``samples``: those applied then, when
        the online policy moved them off the plan's count)."""
        self.switches.append({
            "from_protocol": format_protocol(segment.protocol),
            "to_protocol": format_protocol(following.protocol),
            "samples": segment.start + segment.samples if samples is None else samples,
            "step": step, "at_s": at_s, "cost_s": cost_s, "reason": "plan", "ranks": []})

    def straggler_switch(self, from_protocol: str, to_protocol: str, *, ranks: Sequence[int],
                         samples: int, step: int, at_s: float, cost_s: float) -> None:
        self.switches.append({
            "from_protocol": from_protocol, "to_protocol": to_protocol, "samples": samples,
            "step": step, "at_s": at_s, "cost_s": cost_s, "reason": "straggler",
            "ranks": list(ranks)})

    def detector_event(self, *, kind: str, rank: int, observation: int, ratio: float,
                       samples: int, step: int, at_s: float) -> None:
        self.detector_events.append({"kind": kind, "rank": rank, "observation": observation,
                                     "ratio": ratio, "samples": samples, "step": step,
                                     "at_s": at_s})

    def episode(self, record: dict[str, Any]) -> None:
        self.episodes.append(record)

    def to_json(self) -> dict[str, Any]:
        return {"phases": [self.phases[k] for k in sorted(self.phases)],
                "switches": self.switches, "checkpoints": self.checkpoints,
                "curve": self.curve, "next_eval": self.next_eval}

    def restore(self, data: dict[str, Any], samples: int) -> None:
        self.phases = {p["index"]: p for p in data["phases"]}
        self.switches = list(data["switches"])
        self.checkpoints = list(data["checkpoints"])
        self.curve = list(data["curve"])
        self.next_eval = data["next_eval"]
        self.resumed_from = samples

    def result(self, *, task: str, batch_per_rank: int, final: tuple[float, float],
               wall_s: float, params: list[float] | None, protocols: Sequence[str],
               straggler_policy: str | None = None,
               links: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
        phases = [self.phases[k] for k in sorted(self.phases)]
        total = sum(p["samples"] for p in phases) + sum(e["samples"] for e in self.episodes)
        curve = [c for c in self.curve if c["samples"] < total]
        curve.append({"samples": total, "loss": final[0], "accuracy": final[1]})
        assert [p["protocol"] for p in phases] == list(protocols), (phases, protocols)
        return {"task": task, "ranks": self.ranks, "batch_per_rank": batch_per_rank,
                "phases": phases, "switches": self.switches, "checkpoints": self.checkpoints,
                "curve": curve, "final_loss": final[0], "final_accuracy": final[1],
                "total_samples": total, "wall_s": wall_s,
                "resumed_from": self.resumed_from, "params": params,
                "straggler_policy": straggler_policy, "observations": self.observations,
                "detector_events": self.detector_events, "episodes": self.episodes,
                "declined": self.declined, "links": list(links)}
