"""Out-Of-Order BackProp's pipeline setups (BERT-12 to BERT-48 on 8 to 32 V100s), simulated.

The published pipeline runs pretrain BERT models of BERT-large width (hidden 1024, 16 heads,
feed-forward 4096, sequence 128) with 12, 24, 36 and 48 encoder layers on p3.16xlarge nodes
(8 V100-16GB on NVLink, 25 Gbit/s between nodes), and report 1.41-1.99x over GPipe run by the
same code. Setups (layers, GPUs, batch, micro-batches) are the published runs':
BERT-12 on 8 GPUs, batch 480 in 40 micro-batches; BERT-24 on 16, 320 in 16 (and, to stay in the
30-40 range the paper states, in 32); BERT-36 on 24, 384 in 32; BERT-48 on 32, 320 in 32.

Each model is built from a ``transformers`` ``BertConfig`` (``BertForMaskedLM``, random weights,
no download) and captured at the micro-batch size with roofline costs for a V100 in fp32 (fake
tensors: no torch compute runs), turned into a training graph with Adam, and cut two ways:

- ``compute``: stages balanced by compute (forward + dX + dW), as trainsched plans them;
- ``paper``: whole encoder layers as the published runs spread them (``L mod N`` GPUs take one
  layer more, counted from the second GPU; the embedding with the first layer, the masked-LM
  head with the last), for the schedules with one stage per rank.

``push-window`` is the push the published runs used: a sliding window (micro-batch ``N + k``'s
forward on stage ``v`` waits for the ``W`` of micro-batch ``k + v`` there, each stage running a
micro-batch's ``I`` then its ``W``), which with ``N = p`` is 1F1B with split backwards; the
registered ``fast-forward-push`` runs groups of ``N``, fill and drain each.

Schedules with two stages per rank (``modulo``, ``zbv``, the interleaved ones) are cut by
compute into 2N stages. Every registered schedule is simulated on the stages' per-micro-batch
costs (the Zero Bubble greedy planned with each boundary's transfer time and the V100's memory
less each rank's resident state); the table gives each one's speedup over GPipe, and ``bound``,
GPipe's step over the shortest step any schedule could reach on N GPUs (the whole step's
compute spread evenly, no bubble, no transfer). Peaks are the largest rank's, against 16 GiB.
Results: tables on stdout and ``benchmarks/results/pipeline_paper.json``.

    python benchmarks/pipeline_paper.py            # about 3 minutes on 2 shared cores
    python benchmarks/pipeline_paper.py --quick    # BERT-12 on 8 GPUs only
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import time
from dataclasses import dataclass, replace
from typing import Any

from _common import cpu_model, write_results
from trainsched.backprop.schedules import (
    SCHEDULES,
    build_schedule,
    schedule_stage_count,
    stage_ranks,
)
from trainsched.backprop.stages import StageCosts, stage_costs_from_graph
from trainsched.cluster import resolve_cluster
from trainsched.costs import p2p_s
from trainsched.graph import Graph
from trainsched.sim import simulate_pipeline
from trainsched.sim.pipeline_choice import Cut, plan_stages, schedule_cuts

GiB = 1 << 30
PUBLISHED = (1.41, 1.99)   # Out-Of-Order BackProp (EuroSys 2022), pipeline, over GPipe
OURS = ("fast-forward", "fast-forward-push", "modulo", "push-window")   # the paper's schedules
# The published push is a sliding window, not groups: micro-batch N + k's forward on stage v
# waits for the W of micro-batch k + v there, and each stage runs a micro-batch's I then its W.
# With N = p that is 1F1B with its backwards split, I then W: this row.
WINDOW = "push-window"


@dataclass(frozen=True)
class Setup:
    layers: int
    gpus: int
    batch: int
    microbatches: int
    source: str

    @property
    def microbatch_size(self) -> int:
        return self.batch // self.microbatches


SETUPS = (
    Setup(12, 8, 480, 40, "published: 8 GPUs, batch 480, 40 micro-batches"),
    Setup(24, 16, 320, 16, "published: 16 GPUs, batch 320, 16 micro-batches"),
    Setup(24, 16, 320, 32, "the paper's 30-40 micro-batches at the script's batch"),
    Setup(36, 24, 384, 32, "published: 24 GPUs, batch 384, 32 micro-batches"),
    Setup(48, 32, 320, 32, "published: 32 GPUs, batch 320, 32 micro-batches"),
)


MASKED = 20   # masked positions per sequence the published pretraining predicts


def pretraining_bert(layers: int) -> Any:
    """BERT pretraining as published: BERT-large width, ``layers`` encoder layers; the masked-LM
    head (tied to the word embeddings) runs on the ``MASKED`` masked positions of each
    sequence only, and the next-sentence head on the pooled output."""
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    config = transformers.BertConfig(hidden_size=1024, num_attention_heads=16,
                                     intermediate_size=4096, num_hidden_layers=layers)

    class Pretraining(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            full = transformers.BertForPreTraining(config)
            self.bert, self.cls = full.bert, full.cls

        def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
            out = self.bert(input_ids=input_ids)
            index = positions.unsqueeze(-1).expand(-1, -1, config.hidden_size)
            masked = torch.gather(out.last_hidden_state, 1, index)
            logits, order = self.cls(masked, out.pooler_output)
            return logits.mean() + order.mean()

    return Pretraining(), config


def capture_bert(layers: int, microbatch_size: int) -> Graph:
    """The pretraining model on one micro-batch (sequence 128), V100 roofline, fp32, Adam."""
    import torch

    from trainsched.capture import capture
    from trainsched.graph import to_training

    torch.manual_seed(0)
    model, config = pretraining_bert(layers)
    ids = torch.randint(0, config.vocab_size, (microbatch_size, 128))
    positions = torch.stack([torch.randperm(128)[:MASKED] for _ in range(microbatch_size)])
    graph = capture(model, (ids, positions), costs="roofline", device_kind="V100",
                    name=f"bert-{layers}", precision="fp32",
                    meta={"batch_size": microbatch_size, "seq_len": 128})
    return to_training(graph, optimizer="adam")


def paper_layers(layers: int, gpus: int) -> list[int]:
    """How many encoder layers each GPU holds in the published contiguous placement: every GPU
    ``layers // gpus``, and the ``layers % gpus`` left over one each to GPUs 1, 2, ... (GPU 0
    also holds the embedding, the last GPU the masked-LM head)."""
    q, extra = divmod(layers, gpus)
    assert q >= 1, "fewer layers than GPUs"
    return [q + (1 <= g <= extra) for g in range(gpus)]


def paper_cut(graph: Graph, layers: int, gpus: int) -> list[str]:
    """Cut points (first op of each stage but the first) at the published layer boundaries."""
    order = [n for n in graph.topological_order() if graph.op(n).kind == "forward"]
    first: dict[int, str] = {}
    for name in order:
        path = graph.op(name).module_path
        if path.startswith("bert.encoder.layer."):
            first.setdefault(int(path.split(".")[3]), name)
    assert sorted(first) == list(range(layers)), sorted(first)
    starts = [sum(paper_layers(layers, gpus)[:g]) for g in range(1, gpus)]
    return [first[k] for k in starts]


def per_microbatch(stages: StageCosts) -> StageCosts:
    """Costs captured at the micro-batch size are per micro-batch already: any count."""
    return replace(stages, num_microbatches=None)


def simulate_setup(graph: Graph, setup: Setup) -> list[dict[str, Any]]:
    cluster = resolve_cluster("p3.16xlarge", nodes=-(-setup.gpus // 8))
    limit = cluster.device.memory_bytes
    p, m = setup.gpus, setup.microbatches
    cuts: dict[tuple[str, int, Cut], StageCosts] = {}

    def stages_for(cut: str, count: int, points: Cut = "compute") -> StageCosts:
        """``compute``: balanced by compute, or at ``points``; ``paper``: the published cut."""
        if (cut, count, points) not in cuts:
            how = paper_cut(graph, setup.layers, p) if cut == "paper" else points
            cuts[cut, count, points] = per_microbatch(stage_costs_from_graph(
                graph, count, 1, cut=how))
        return cuts[cut, count, points]

    rows = []
    for cut in ("compute", "paper"):
        gpipe_s = None
        for name in [*SCHEDULES, WINDOW]:
            count = p if name == WINDOW else schedule_stage_count(name, p)
            if cut == "paper" and count != p:
                continue
            ranks = tuple(range(p)) if name == WINDOW else stage_ranks(name, p, m)
            stages = stages_for(cut, count)
            tried = 1
            options: dict[str, Any] = {}
            if name != WINDOW and SCHEDULES.tags(name).get("costs"):
                options["memory_limit_bytes"] = [max(0, limit - r)
                                                 for r in stages.resident_bytes]
                options["p2p_s"] = [p2p_s(stages.activation_bytes[s], cluster.link(s, s + 1))
                                    for s in range(p - 1)]
            began = time.perf_counter()
            if count > p:  # several stages per rank: the fastest cut, as plans choose it
                candidates = schedule_cuts(graph, name, p, m)
                tried = len(candidates)
                stages, schedule, result = plan_stages(
                    lambda c, _m, points, cut=cut: stages_for(cut, c, points), name, p, m,
                    cluster, cuts=candidates)
            else:
                schedule = build_schedule("1f1b", p, m, split_backward=True) \
                    if name == WINDOW else build_schedule(name, p, m, stages=stages, **options)
                result = simulate_pipeline(stages, schedule, cluster)
            work = m * math.fsum(stages.forward_s + stages.backward_input_s
                                 + stages.backward_weight_s)
            if name == "gpipe":
                gpipe_s = result.step_time_s
            assert gpipe_s is not None
            peak = max(result.peak_memory_bytes.values())
            rows.append({
                "layers": setup.layers, "gpus": p, "batch": setup.batch, "microbatches": m,
                "cut": cut, "schedule": name, "stages": count,
                "balanced_by": "rank" if stages is not stages_for(cut, count) else "stage",
                "cuts_tried": tried,
                "step_time_s": result.step_time_s, "speedup_over_gpipe":
                gpipe_s / result.step_time_s, "bound_over_gpipe": gpipe_s / (work / p),
                "bubble_fraction": result.bubble_fraction, "peak_memory_bytes": peak,
                "fits_16gib": peak <= limit, "wall_s": time.perf_counter() - began,
                "max_stage_s": max(a + b + c for a, b, c in zip(
                    stages.forward_s, stages.backward_input_s, stages.backward_weight_s,
                    strict=True)),
                "mean_stage_s": work / m / count,
                "max_rank_s": max(math.fsum(
                    a + b + c for s, (a, b, c) in enumerate(zip(
                        stages.forward_s, stages.backward_input_s, stages.backward_weight_s,
                        strict=True)) if ranks[s] == r) for r in range(p))})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="BERT-12 on 8 GPUs only")
    parser.add_argument("--out", default="benchmarks/results/pipeline_paper.json")
    args = parser.parse_args()
    setups = SETUPS[:1] if args.quick else SETUPS
    began, load_before = time.perf_counter(), os.getloadavg()
    graphs: dict[tuple[int, int], Graph] = {}
    rows: list[dict[str, Any]] = []
    names = [*SCHEDULES, WINDOW]
    short = {n: n.replace("fast-forward", "ff").replace("interleaved", "il")
             .replace("zb-greedy", "greedy").replace("push-window", "push-win") for n in names}
    print(f"{'model':<8}{'GPUs':>5}{'m':>4} {'cut':<8}{'GPipe ms':>9}"
          + "".join(f"{short[n]:>9}" for n in names[1:]) + f"{'bound':>8}")
    for setup in setups:
        key = (setup.layers, setup.microbatch_size)
        if key not in graphs:
            graphs[key] = capture_bert(*key)
        mine = simulate_setup(graphs[key], setup)
        rows += mine
        for cut in ("compute", "paper"):
            by = {r["schedule"]: r for r in mine if r["cut"] == cut}
            cells = "".join(f"{by[n]['speedup_over_gpipe']:>8.3f}x" if n in by else f"{'-':>9}"
                            for n in names[1:])
            print(f"{'bert-' + str(setup.layers):<8}{setup.gpus:>5}{setup.microbatches:>4} "
                  f"{cut:<8}{1e3 * by['gpipe']['step_time_s']:>9.1f}{cells}"
                  f"{by['gpipe']['bound_over_gpipe']:>7.3f}x", flush=True)
    print("\npeak memory of the largest rank, GiB (V100: 16):")
    print(f"{'model':<8}{'GPUs':>5}{'m':>4} {'cut':<8}" + "".join(f"{short[n]:>9}" for n in names))
    for setup in setups:
        for cut in ("compute", "paper"):
            by = {r["schedule"]: r for r in rows if r["cut"] == cut and r["layers"] ==
                  setup.layers and r["microbatches"] == setup.microbatches}
            print(f"{'bert-' + str(setup.layers):<8}{setup.gpus:>5}{setup.microbatches:>4} "
                  f"{cut:<8}" + "".join(f"{by[n]['peak_memory_bytes'] / GiB:>9.1f}"
                                       if n in by else f"{'-':>9}" for n in names))
    ours = [r["speedup_over_gpipe"] for r in rows if r["schedule"] in OURS]
    inside = sum(PUBLISHED[0] <= s <= PUBLISHED[1] for s in ours)
    summary = {"ours_speedup_range": [min(ours), max(ours)],
               "ours_within_published": inside, "ours_rows": len(ours),
               "best_speedup": max(r["speedup_over_gpipe"] for r in rows),
               "bound_range": [min(r["bound_over_gpipe"] for r in rows),
                               max(r["bound_over_gpipe"] for r in rows)]}
    print(f"\nfast-forward, push and modulo: {min(ours):.3f}-{max(ours):.3f}x over GPipe, "
          f"{inside} of {len(ours)} within the published {PUBLISHED[0]}-{PUBLISHED[1]}x")
    write_results(args.out, {
        "benchmark": "pipeline_paper", "published_speedup_range": list(PUBLISHED),
        "setups": [s.__dict__ for s in setups], "cluster": "p3.16xlarge (8 V100-16GB/node)",
        "precision": "fp32", "optimizer": "adam", "seq_len": 128,
        "machine": {"cpu": cpu_model(), "python": platform.python_version(),
                    "loadavg_before": load_before, "loadavg_after": os.getloadavg()},
        "wall_s": time.perf_counter() - began, "summary": summary, "rows": rows})


if __name__ == "__main__":
    main()
