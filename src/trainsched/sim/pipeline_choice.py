"""Pick a pipeline schedule and micro-batch count by simulation: :func:`choose_pipeline`.

``trainsched simulate --parallelism pipeline --schedule auto`` asks which of the registered
schedules (:data:`~trainsched.backprop.schedules.SCHEDULES`, every one) and how many
micro-batches give the shortest step for this graph on this cluster without going over the
memory limit. Each candidate is cut and costed the way a plan of it is
(:func:`plan_stages`: stages balanced by compute and, where a rank holds several stages, cuts
that balance the ranks, each costed by
:func:`~trainsched.backprop.stages.stage_costs_from_graph` and simulated by
:func:`~trainsched.sim.pipeline.simulate_pipeline`, the fastest kept); its peak is the largest
of its ranks' peaks (resident state, saved activations, buffers in flight).

- **Micro-batch counts** (:func:`microbatch_candidates`): the divisors of the batch, so that
  every micro-batch holds the same whole number of samples (never less than one); for a graph
  whose batch is unknown, 1, p, 2p and 4p for p ranks.
- **The memory limit** is per device, in bytes: the cluster's device memory unless one is
  given. The Zero Bubble greedy (``zb-greedy``) is planned under it too: each rank may hold the
  limit less its stages' resident state in activations.
- **The winner** is the shortest step among the candidates that fit; ties go to the smaller
  peak, then to the schedule tried first (the registry's order by default), then to fewer
  micro-batches. A candidate that cannot be
  built (a schedule that needs more micro-batches than that) is listed with the reason. When
  no candidate fits, the error names the smallest limit that works: the smallest peak of all.
- **Linear scaling**: the graph's costs are divided by the micro-batch count, except each
  op's launch overhead in a roofline graph, paid once per micro-batch
  (:func:`~trainsched.backprop.stages.launch_s`); what else stops the count growing is the
  host time of each action and message (``cluster.device.microbatch_overhead_s``,
  ``message_host_s``). Measured costs divide whole: without those host times the largest
  count that fits usually wins, so give such a graph its micro-batch captures
  (``microbatch_graphs``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from trainsched.backprop.schedules import (
    SCHEDULES,
    build_schedule,
    schedule_stage_count,
    stage_ranks,
)
from trainsched.backprop.stages import StageCosts, rank_cuts, stage_costs_from_graph
from trainsched.cluster import Cluster
from trainsched.errors import TrainschedError
from trainsched.graph import Graph
from trainsched.plan import Schedule
from trainsched.sim.pipeline import PipelineResult, simulate_pipeline
from trainsched.sim.simulate import training_graph
from trainsched.units import format_duration, format_size, is_int

__all__ = ["Candidate", "Cut", "PipelineChoice", "choose_from_costs", "choose_pipeline",
           "graph_costs", "microbatch_candidates", "plan_graph_stages", "plan_stages",
           "schedule_cuts"]

#: ``progress(done, total, item)``: how far a long piece of work is.
Progress = Callable[[int, int, str], None]
#: Where a model is cut (``stage_costs_from_graph``'s ``cut``): ``"compute"``, stages balanced
#: by their own costs, or cut points.
Cut = str | tuple[int, ...]
#: ``(num_stages, num_microbatches, cut) -> StageCosts``: what one micro-batch costs per stage
#: of the model cut at ``cut``.
CostsOf = Callable[[int, int, Cut], StageCosts]
#: ``(schedule name, num_microbatches) -> the cuts to try``, the first the default.
CutsOf = Callable[[str, int], Sequence[Cut]]


@dataclass(frozen=True, kw_only=True)
class Candidate:
    """One (schedule, micro-batches) tried: its simulated step and peak (``None`` when it could
    not be built, ``note`` says why), and whether the peak fits under the limit."""

    schedule: str
    num_microbatches: int
    step_time_s: float | None
    peak_memory_bytes: int | None
    fits: bool
    note: str = ""

    def to_dict(self) -> dict[str, object]:
        return {"schedule": self.schedule, "microbatches": self.num_microbatches,
                "step_time_s": self.step_time_s, "peak_memory_bytes": self.peak_memory_bytes,
                "fits": self.fits, "note": self.note}


@dataclass(frozen=True, kw_only=True)
class PipelineChoice:
    """The winner of :func:`choose_pipeline`: its schedule name, the stages it was costed and
    cut with, the schedule, its simulation, every candidate tried (in the order tried) and a
    sentence saying why it won."""

    schedule_name: str
    num_microbatches: int
    stages: StageCosts
    schedule: Schedule
    result: PipelineResult
    memory_limit_bytes: int
    candidates: tuple[Candidate, ...]
    reason: str

    def to_dict(self) -> dict[str, object]:
        return {"schedule": self.schedule_name, "microbatches": self.num_microbatches,
                "memory_limit_bytes": self.memory_limit_bytes, "reason": self.reason,
                "candidates": [c.to_dict() for c in self.candidates]}


def microbatch_candidates(batch_size: int | None, num_ranks: int) -> tuple[int, ...]:
    """The micro-batch counts tried: the divisors of ``batch_size`` (ascending), or 1, p, 2p,
    4p when the batch is unknown (``None``)."""
    if not (is_int(num_ranks) and num_ranks >= 1):
        raise TrainschedError(f"num_ranks must be an integer >= 1, got {num_ranks!r}")
    if batch_size is None:
        return tuple(sorted({1, num_ranks, 2 * num_ranks, 4 * num_ranks}))
    if not (is_int(batch_size) and batch_size >= 1):
        raise TrainschedError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    return tuple(m for m in range(1, batch_size + 1) if batch_size % m == 0)


def _peak(result: PipelineResult) -> int:
    return max(result.peak_memory_bytes.values(), default=0)


def choose_pipeline(graph: Graph, cluster: Cluster, num_ranks: int, *,
                    batch_size: int | None = None, memory_limit_bytes: int | None = None,
                    schedules: Sequence[str] | None = None,
                    microbatches: Sequence[int] | None = None,
                    microbatch_graphs: Mapping[int, Graph] | None = None,
                    progress: Progress | None = None) -> PipelineChoice:
    """The schedule and micro-batch count with the shortest simulated step under the memory
    limit (module docstring). ``schedules`` defaults to every registered one, ``microbatches``
    to :func:`microbatch_candidates` of ``batch_size`` (default: the graph's
    ``meta["batch_size"]``); ``memory_limit_bytes`` to the cluster's device memory.

    ``microbatch_graphs``: per micro-batch count m, the model captured at the micro-batch size
    (1/m of the batch), whose costs a micro-batch then has as they are
    (:func:`~trainsched.backprop.stages.stage_costs_from_graph`). The counts tried are then
    its keys (and 1, the graph itself, if asked for); a count without its graph is refused,
    so that no candidate is costed another way than the others. ``progress(done, total,
    candidate)`` hears each candidate simulated."""
    if not isinstance(graph, Graph):
        raise TrainschedError(f"choose_pipeline needs a Graph, got {type(graph).__name__}")
    if not isinstance(cluster, Cluster):
        raise TrainschedError(f"choose_pipeline needs a Cluster, got {type(cluster).__name__}")
    if not (is_int(num_ranks) and 1 <= num_ranks <= cluster.num_devices):
        raise TrainschedError(f"num_ranks must be an integer in 1..{cluster.num_devices} (the "
                              f"cluster's devices), got {num_ranks!r}")
    limit = cluster.device.memory_bytes if memory_limit_bytes is None else memory_limit_bytes
    if not (is_int(limit) and limit >= 1):
        raise TrainschedError(f"memory limit must be a number of bytes >= 1, got {limit!r}")
    graph = training_graph(graph)
    if batch_size is None:
        known = graph.meta.get("batch_size")
        batch_size = known if is_int(known) and known >= 1 else None
    sized = {m: training_graph(g) for m, g in (microbatch_graphs or {}).items()}
    if microbatches is not None:
        counts = list(microbatches)
    else:
        counts = sorted(sized) if sized else list(microbatch_candidates(batch_size, num_ranks))
    for m in counts:
        if not (is_int(m) and m >= 1):
            raise TrainschedError(f"micro-batch counts must be integers >= 1, got {m!r}")
        if batch_size is not None and m > batch_size:
            raise TrainschedError(f"{m} micro-batches of a batch of {batch_size}: a micro-batch "
                                  f"needs at least one sample; try at most {batch_size}")
    if sized:
        missing = [m for m in counts if m != 1 and m not in sized]
        if missing:
            raise TrainschedError(
                f"no micro-batch graph for {', '.join(map(str, missing))} micro-batches: with "
                f"micro-batch graphs every count needs its own (those given: "
                f"{', '.join(map(str, sorted(sized)))})")

    memo: dict[tuple[int, ...], tuple[Cut, ...]] = {}
    return choose_from_costs(graph_costs(graph, sized), cluster, num_ranks, counts,
                             memory_limit_bytes=limit,
                             schedules=schedules, progress=progress,
                             cuts_of=lambda name, m: schedule_cuts(graph, name, num_ranks, m,
                                                                   memo=memo))


def graph_costs(graph: Graph, sized: Mapping[int, Graph] | None = None) -> CostsOf:
    """The :data:`CostsOf` of a training graph: ``stage_costs_from_graph`` at each cut, a
    micro-batch costed by ``sized[m]`` (the model captured at 1/m of the batch) where it has
    the count ``m``, else by the graph divided."""
    sized = dict(sized or {})

    def costs_of(num_stages: int, m: int, cut: Cut) -> StageCosts:
        return stage_costs_from_graph(graph, num_stages, m, microbatch_graph=sized.get(m),
                                      cut=cut)
    return costs_of


def schedule_cuts(graph: Graph, name: str, num_ranks: int, num_microbatches: int, *,
                  memo: dict[tuple[int, ...], tuple[Cut, ...]] | None = None
                  ) -> tuple[Cut, ...]:
    """The cuts :func:`plan_stages` tries for schedule ``name``: stages balanced by their
    costs, then, where a rank holds several stages, the cuts that balance the ranks
    (:func:`~trainsched.backprop.stages.rank_cuts`). ``memo``: a dict the caller keeps for
    one graph, so that schedules placing their stages alike (and every micro-batch count)
    share one computation."""
    count = schedule_stage_count(name, num_ranks)
    if count == num_ranks:
        return ("compute",)
    mapping = stage_ranks(name, num_ranks, num_microbatches)
    if memo is not None and mapping in memo:
        return memo[mapping]
    cuts = ("compute", *rank_cuts(graph, count, mapping))
    if memo is not None:
        memo[mapping] = cuts
    return cuts


def plan_graph_stages(graph: Graph, name: str, num_ranks: int, num_microbatches: int,
                      cluster: Cluster, *, sized: Mapping[int, Graph] | None = None,
                      ) -> tuple[StageCosts, Schedule, PipelineResult]:
    """:func:`plan_stages` of schedule ``name`` on a training graph: its costs
    (:func:`graph_costs`, a micro-batch costed by ``sized`` where it has the count) at the cuts
    :func:`schedule_cuts` gives."""
    return plan_stages(graph_costs(graph, sized), name, num_ranks, num_microbatches, cluster,
                       cuts=schedule_cuts(graph, name, num_ranks, num_microbatches))


def plan_stages(costs_of: CostsOf, name: str, num_ranks: int, num_microbatches: int,
                cluster: Cluster, *, cuts: Sequence[Cut] = ("compute",),
                memory_limit_bytes: int | None = None,
                ) -> tuple[StageCosts, Schedule, PipelineResult]:
    """The stages, schedule and simulated step of schedule ``name`` at the fastest of ``cuts``.

    Stages balanced by their own costs (``"compute"``) suit a schedule with one stage per rank.
    Where a rank holds several (interleaved, modulo, ZBV), cuts that balance the ranks' totals
    (:func:`schedule_cuts`) can be faster or slower, as each micro-batch also waits on the
    longest stage of its path: on the published BERT setups each of them, and the
    stage-balanced cut, was the fastest for some schedule. Every cut is simulated and the
    shortest step kept (one that fits under ``memory_limit_bytes`` before one that does not;
    ties: the cut listed first). A schedule planned with costs (the Zero Bubble greedy) may
    hold, per rank, ``memory_limit_bytes`` less its stages' resident state."""
    count = schedule_stage_count(name, num_ranks)
    best: tuple[tuple[bool, float], StageCosts, Schedule, PipelineResult] | None = None
    for cut in cuts:
        stages = costs_of(count, num_microbatches, cut)
        options = {}
        if memory_limit_bytes is not None and SCHEDULES.tags(name).get("costs"):
            # one stage per rank: each may hold the limit less its resident state
            options["memory_limit_bytes"] = [max(0, memory_limit_bytes - r)
                                             for r in stages.resident_bytes]
        schedule = build_schedule(name, num_ranks, num_microbatches, stages=stages, **options)
        result = simulate_pipeline(stages, schedule, cluster)
        over = memory_limit_bytes is not None and _peak(result) > memory_limit_bytes
        key = (over, result.step_time_s)
        if best is None or key < best[0]:
            best = (key, stages, schedule, result)
    if best is None:
        raise TrainschedError("plan_stages needs at least one cut to try")
    return best[1], best[2], best[3]


def choose_from_costs(costs_of: CostsOf, cluster: Cluster, num_ranks: int,
                      microbatches: Sequence[int], *, memory_limit_bytes: int,
                      schedules: Sequence[str] | None = None,
                      progress: Progress | None = None,
                      cuts_of: CutsOf | None = None) -> PipelineChoice:
    """:func:`choose_pipeline` on stage costs from ``costs_of(num_stages, m, cut)`` (measured
    per micro-batch size, say, instead of a graph's linear scaling); each schedule at the
    fastest of the cuts ``cuts_of(name, m)`` gives (:func:`plan_stages`; default: only
    ``"compute"``); every count is tried, and ``progress(done, total, candidate)`` hears
    each."""
    limit, counts = memory_limit_bytes, list(microbatches)
    names = list(SCHEDULES)
    if schedules is not None:
        for n in schedules:
            SCHEDULES.lookup(n)   # an unknown name: an error listing the known ones
        names = [n.strip().lower() for n in schedules]
    if not names or not counts:
        raise TrainschedError("choose_pipeline needs at least one schedule and one "
                              "micro-batch count to try")

    tried: list[Candidate] = []
    built: dict[int, tuple[StageCosts, Schedule, PipelineResult]] = {}
    total = len(names) * len(counts)
    for name in names:
        for m in counts:
            if progress is not None:
                progress(len(tried), total, f"{name}, {m} micro-batch{'es' if m > 1 else ''}")
            try:
                cuts = ("compute",) if cuts_of is None else tuple(cuts_of(name, m))
                stages, schedule, result = plan_stages(costs_of, name, num_ranks, m, cluster,
                                                       cuts=cuts, memory_limit_bytes=limit)
            except TrainschedError as exc:
                tried.append(Candidate(schedule=name, num_microbatches=m, step_time_s=None,
                                       peak_memory_bytes=None, fits=False, note=str(exc)))
                continue
            peak = _peak(result)
            built[len(tried)] = (stages, schedule, result)
            tried.append(Candidate(schedule=name, num_microbatches=m,
                                   step_time_s=result.step_time_s, peak_memory_bytes=peak,
                                   fits=peak <= limit,
                                   note="" if peak <= limit else "over the memory limit"))
    if progress is not None:
        progress(total, total, "")
    if not built:
        raise TrainschedError(f"no pipeline schedule could be built for {num_ranks} ranks; "
                              f"first reason: {tried[0].note}")
    order = {n: k for k, n in enumerate(names)}

    def key(k: int) -> tuple[float, int, int, int]:
        c = tried[k]
        assert c.step_time_s is not None and c.peak_memory_bytes is not None
        return (c.step_time_s, c.peak_memory_bytes, order[c.schedule], c.num_microbatches)

    fitting = sorted((k for k in built if tried[k].fits), key=key)
    if not fitting:
        smallest = min(built, key=lambda k: (tried[k].peak_memory_bytes, key(k)))
        c = tried[smallest]
        raise TrainschedError(
            f"no pipeline schedule fits in {format_size(limit)} per device; the smallest "
            f"limit that works is {format_size(c.peak_memory_bytes)} ({c.schedule} with "
            f"{c.num_microbatches} micro-batches): raise the limit to at least that")
    best = fitting[0]
    stages, schedule, result = built[best]
    win = tried[best]
    return PipelineChoice(schedule_name=win.schedule, num_microbatches=win.num_microbatches,
                          stages=stages, schedule=schedule, result=result,
                          memory_limit_bytes=limit, candidates=tuple(tried),
                          reason=_reason(tried, fitting, sorted(built, key=key), limit))


def _reason(tried: list[Candidate], fitting: list[int], everything: list[int],
            limit: int) -> str:
    win = tried[fitting[0]]
    assert win.step_time_s is not None and win.peak_memory_bytes is not None
    text = (f"{win.schedule} with {win.num_microbatches} micro-batches has the shortest "
            f"step, {format_duration(win.step_time_s)}, of the {len(fitting)} candidates "
            f"within {format_size(limit)} (peak {format_size(win.peak_memory_bytes)})")
    if len(fitting) > 1:
        second = tried[fitting[1]]
        assert second.step_time_s is not None
        gap = (second.step_time_s / win.step_time_s - 1) if win.step_time_s > 0 else 0.0
        text += (f"; next: {second.schedule} with {second.num_microbatches}, "
                 f"{format_duration(second.step_time_s)} (+{100 * gap:.1f}%)")
    fastest = tried[everything[0]]
    if not fastest.fits:
        assert fastest.step_time_s is not None and fastest.peak_memory_bytes is not None
        text += (f"; {fastest.schedule} with {fastest.num_microbatches} would take "
                 f"{format_duration(fastest.step_time_s)} but needs "
                 f"{format_size(fastest.peak_memory_bytes)}")
    return text
