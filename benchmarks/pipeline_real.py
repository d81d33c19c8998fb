"""Real pipelines on 2 gloo ranks: generated schedules, PyTorch's ZBV class, and the simulator.

The model: 8 transformer encoder layers (d_model 512, 8 heads, feed-forward 2048, no dropout),
sequence 128, batch 16 (``_encoder.py``), cut at layer boundaries: 2 stages of 4 layers for the
one-stage-per-rank schedules, 4 stages of 2 layers for those with two stages per rank (V
placement for ZBV, loop placement for the interleaved ones and modulo). Rows, measured in one
run with the configurations interleaved (A B C ... A B C ..., ``--rounds`` rounds of
``--warmup`` untimed and ``--steps`` timed steps):

- every registered schedule (``--rows``: a subset; ``gpipe``, ``1f1b``, ``zb-h1`` and ``zbv``
  always): trainsched's generated schedules run by its pipeline runtime
  (``runtime.pipeline.run_actions`` on stages cut from the exported model);
- ``torch-zbv``: PyTorch's own ``ScheduleZBVZeroBubble`` through ``torch.distributed.pipelining``
  on ``nn.Sequential`` slices holding the same layers;
- ``auto``: the schedule and micro-batch count ``choose_from_costs`` picks on the simulator (every
  registered schedule, every divisor of the batch) when it is not one of the rows above;
- ``bound`` (not a schedule, left out of the replay's figures): each rank runs GPipe's actions
  on its half of the model with messages neither sent nor waited for (zeros stand for what it
  would receive), both ranks at once. No schedule of that cut and micro-batch size waits less
  or sends less, so its time bounds them all from below: at 2 stages and 4 micro-batches with
  even stages and free messages it is GPipe's time x 4/5 (its bubble is (p-1)/(m+p-1) = 1/5),
  so ``--microbatches 4`` can beat GPipe by 1.25x at most; the row says what this host allows.

A step is one forward and backward of the batch (no optimizer step), timed from a barrier to
the slowest rank's end. **Memory**: per rank, the peak bytes of saved activations (and, for
trainsched's runtime, the output gradients kept from ``I`` to ``W``), counted by
``runtime.saved_memory.SavedTensorMeter`` through ``saved_tensors_hooks``; parameters and
gradients are left out. PyTorch's class is counted the same way, without its kept gradients.

**Prediction.** Before the timed run, two gloo processes (one thread each) (1) time each layer
alone as its own stage, F, I, W and B, and count its saved bytes, for every micro-batch size
(the first layer, a middle one, the last one with the loss), both processes at once so that the
costs include two processes sharing the host as in the pipeline (the two ranks' medians
averaged), with the bytes a deferred ``W`` keeps after ``I`` (``weight_input_bytes``); (2)
measure a message's one-way time (4 B and one activation: latency and bandwidth); (3) run GPipe
at every micro-batch count ``auto`` may choose, every action timed, which gives per count how
many times longer an action runs inside the pipeline than alone (the median over both ranks'
F and B of inside / alone, at least 1; the costs of that count are multiplied by it, since it
differs from one count to another) and the time of posting a send (``message_host_s``, at the
rows' count). The stretch is a ratio, not a
fixed time per action: a fixed time fitted on GPipe's 4-layer actions overcharged ZBV's
2-layer ones, twice as many (runs of 2026-11-28: ZBV +10-13%, the others -4 to +9%).
The simulator (``simulate_pipeline``) then predicts every row (``torch-zbv`` as trainsched's
``zbv``, whose order it matches); the error is (predicted − measured) / measured, with Kendall's
τ over rows. Predicted peaks: ``pred`` with ``weight_input_bytes`` (trainsched's runtime frees
the graph at ``I``), ``graph kept`` with ``I`` freeing nothing (PyTorch's split backward keeps
the graph).

    python benchmarks/pipeline_real.py              # the full run, ~15-25 min on 2 idle cores
    python benchmarks/pipeline_real.py --quick      # 2 small layers, a smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from _common import cpu_model, write_results

HERE = Path(__file__).resolve().parent
SPEC = str(HERE / "_encoder.py") + ":encoder"
REQUIRED = ("gpipe", "1f1b", "zb-h1", "zbv")  # the summary compares these
MiB = 1 << 20


# --------------------------------------------------------------------------- the model cut


def layer_stages(graph: Any, num_stages: int, layers: int) -> tuple[tuple[str, ...], ...]:
    """The forward ops of ``graph`` cut into ``num_stages`` runs of whole layers."""
    per = layers // num_stages
    out: list[list[str]] = [[] for _ in range(num_stages)]
    current = 0
    for name in graph.topological_order():
        op = graph.op(name)
        if op.kind != "forward":
            continue
        head = op.module_path.split(".")[0]
        if head.isdigit():
            current = int(head)
        out[min(current // per, num_stages - 1)].append(name)
    return tuple(tuple(s) for s in out)


# --------------------------------------------------------------------------- costs alone


def measure_layers(cut: Any, layers: int, seq: int, sizes: list[int],
                   repeats: int) -> dict[int, dict[str, dict[str, float]]]:
    """Per micro-batch size: the first, a middle and the last layer's F, I, W, B seconds
    (medians, one thread) and saved bytes, each layer run as its own pipeline stage (``cut``:
    one op list per layer). The sizes and layers take turns, one repeat of each per round, so
    that the host's drift (its speed moves by up to a third within an hour here) falls on
    every size alike rather than on the size measured last: ``auto`` compares micro-batch
    counts by these costs."""
    import torch

    from trainsched.capture import build
    from trainsched.runtime.saved_memory import SavedTensorMeter
    from trainsched.runtime.stage_modules import build_stages

    torch.set_num_threads(1)
    roles = {"first": 0, "middle": min(1, layers - 1), "last": layers - 1}
    cases = []   # (size, role, stage, its input, output gradients, meter, model)
    for b in sizes:
        z = build(SPEC, batch_size=b, seq_len=seq)
        stages = build_stages(z.model, cut, z.args, num_microbatches=1)
        meter = SavedTensorMeter(exclude=[*z.model.parameters(), *z.model.buffers()])
        inputs = [list(z.args)]
        for st in stages[:-1]:
            inputs.append(st.forward(0, inputs[-1]))
            st.backward(0, [torch.ones(s, dtype=d) for s, d in st.grad_specs])
        z.model.zero_grad(set_to_none=True)
        for role, k in roles.items():
            grads = [torch.randn(s, dtype=d) for s, d in stages[k].grad_specs]
            cases.append((b, role, stages[k], inputs[k], grads, meter, z.model))
    times = {(b, role): {"F": [], "I": [], "W": [], "B": []} for b, role, *_ in cases}
    kept_bytes: dict[tuple[int, str], tuple[int, int]] = {}
    for r in range(repeats + 1):
        for b, role, st, x, grads, meter, _model in cases:
            t0 = time.perf_counter()
            st.meter = meter
            st.forward(0, x)
            t1 = time.perf_counter()
            saved = meter.bytes
            st.backward_input(0, grads)
            t2 = time.perf_counter()
            kept = meter.bytes
            st.backward_weight(0)
            t3 = time.perf_counter()
            st.meter = None
            st.forward(0, x)
            t4 = time.perf_counter()
            st.backward(0, grads)
            t5 = time.perf_counter()
            kept_bytes[b, role] = (saved, kept)
            if r:   # the first round warms up
                for kind, took in zip("FIWB", (t1 - t0, t2 - t1, t3 - t2, t5 - t4),
                                      strict=True):
                    times[b, role][kind].append(took)
    for *_, model in cases:
        model.zero_grad(set_to_none=True)
    out: dict[int, dict[str, dict[str, float]]] = {b: {} for b in sizes}
    for (b, role), per_kind in times.items():
        out[b][role] = {k: statistics.median(v) for k, v in per_kind.items()}
        out[b][role]["saved_bytes"], out[b][role]["kept_bytes"] = kept_bytes[b, role]
    return out


def stage_costs(alone: dict[int, dict[str, dict[str, float]]], num_stages: int, m: int,
                layers: int, batch: int, act_bytes_per_sample: int, param_bytes: int) -> Any:
    """StageCosts of ``num_stages`` runs of whole layers at ``m`` micro-batches."""
    from trainsched.backprop.stages import StageCosts

    b = batch // m
    per = layers // num_stages
    rows = []
    for s in range(num_stages):
        roles = ["first" if k == 0 else "last" if k == layers - 1 else "middle"
                 for k in range(s * per, (s + 1) * per)]
        rows.append({key: sum(alone[b][r][key] for r in roles)
                     for key in ("F", "I", "W", "saved_bytes", "kept_bytes")})
    p = num_stages
    return StageCosts(forward_s=tuple(r["F"] for r in rows),
                      backward_input_s=tuple(r["I"] for r in rows),
                      backward_weight_s=tuple(r["W"] for r in rows),
                      activation_bytes=(b * act_bytes_per_sample,) * (p - 1) + (0,),
                      saved_bytes=tuple(int(r["saved_bytes"]) for r in rows),
                      param_bytes=(per * param_bytes,) * p, grad_bytes=(per * param_bytes,) * p,
                      optimizer_state_bytes=(0,) * p,
                      weight_input_bytes=tuple(int(r["kept_bytes"]) for r in rows))


# --------------------------------------------------------------------------- the workers


def run_pair(job: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    from trainsched.runtime.launch import WorkerFailure, free_port, run_workers

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp, "out.json")
        configs = [dict(job, rank=r, port=free_port() if r == 0 else 0, out=str(out))
                   for r in range(2)]
        configs[1]["port"] = configs[0]["port"]
        try:
            run_workers(__file__, configs, workdir=Path(tmp), timeout_s=timeout_s)
        except WorkerFailure as exc:
            raise SystemExit(f"{job['phase']} failed: {exc}\n{exc.log_tail}") from None
        return json.loads(out.read_text())


def _worker(cfg: dict[str, Any]) -> None:
    import datetime

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{cfg['port']}",
                            rank=cfg["rank"], world_size=2,
                            timeout=datetime.timedelta(seconds=600))
    result = (_calibrate if cfg["phase"] == "calibrate" else _timed)(cfg)
    dist.destroy_process_group()
    if cfg["rank"] == 0:
        Path(cfg["out"]).write_text(json.dumps(result))


def _model(cfg: dict[str, Any]) -> Any:
    from trainsched.capture import build

    return build(SPEC, batch_size=cfg["batch"], seq_len=cfg["seq"])


def _calibrate(cfg: dict[str, Any]) -> dict[str, Any]:
    """One-way message times, and every action of GPipe timed inside the pipeline at each
    micro-batch count of ``cfg["schedules"]`` (count -> GPipe's schedule text)."""
    import torch
    import torch.distributed as dist

    from trainsched.plan import Schedule
    from trainsched.runtime.pipeline import GlooMailbox, run_actions
    from trainsched.runtime.pipeline_host import TimedStage
    from trainsched.runtime.stage_modules import (
        build_stages,
        flat_microbatches,
        split_microbatches,
    )

    rank = cfg["rank"]
    # Each layer alone, on both ranks at once: the costs include two processes sharing the
    # host, as in the pipeline; the two ranks' medians are averaged.
    dist.barrier()
    mine_alone = measure_layers(cfg["layer_cut"], cfg["layers"], cfg["seq"], cfg["sizes"],
                                cfg["repeats"])
    pair: list[Any] = [None, None]
    dist.all_gather_object(pair, mine_alone)
    alone = {b: {role: {k: (pair[0][b][role][k] + pair[1][b][role][k]) / 2
                        for k in pair[0][b][role]} for role in pair[0][b]} for b in pair[0]}
    one_way = {}
    for size in (4, cfg["message_bytes"]):
        buf = torch.zeros(size // 4)
        samples = []
        for _ in range(12):
            dist.barrier()
            t0 = time.perf_counter()
            if rank == 0:
                dist.send(buf, 1)
                dist.recv(buf, 1)
            else:
                dist.recv(buf, 0)
                dist.send(buf, 0)
            samples.append((time.perf_counter() - t0) / 2)
        one_way[str(size)] = statistics.median(samples[2:])
    z = _model(cfg)
    actions = {}
    for count, text in cfg["schedules"].items():
        m = int(count)
        schedule = Schedule.from_text(text, num_stages=2, num_microbatches=m)
        micro = split_microbatches(z.args, z.kwargs, m)
        stages = build_stages(z.model, cfg["stages"], *micro[0], num_microbatches=m)
        record: dict[str, list[float]] = {}
        owned = {rank: TimedStage(stages[rank], record)}
        inputs = flat_microbatches(stages[0], micro) if rank == 0 else []
        mailbox = GlooMailbox(rank, 2, m, 2)
        sends: list[float] = []
        plain_send = mailbox.send

        def send(key: Any, dst: int, tensors: list[Any], plain_send: Any = plain_send,
                 sends: list[float] = sends) -> None:
            t0 = time.perf_counter()
            plain_send(key, dst, tensors)
            sends.append(time.perf_counter() - t0)

        for step in range(cfg["steps"] + 1):
            if step == 1:   # the first step warms up
                record.clear()
                sends.clear()
            dist.barrier()
            run_actions(rank, schedule, owned, inputs, send, mailbox.recv)
            mailbox.flush()
            z.model.zero_grad(set_to_none=True)
        mine = {k: statistics.median(v) for k, v in record.items()}
        mine["send"] = statistics.median(sends)
        both: list[Any] = [None, None]
        dist.all_gather_object(both, mine)
        actions[count] = both
    return {"one_way_s": one_way, "actions": actions, "alone": alone}


def _drop(key: Any, dst: int, tensors: list[Any]) -> None:
    """The bound row's send: nothing leaves the rank."""


def _zeros(key: Any, src: int, specs: Any) -> list[Any]:
    """The bound row's receive: zeros of the message's shapes, at once."""
    import torch

    return [torch.zeros(shape, dtype=dtype) for shape, dtype in specs]


def _timed(cfg: dict[str, Any]) -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, ScheduleZBVZeroBubble
    from torch.nn import functional

    from trainsched.plan import Schedule
    from trainsched.runtime.pipeline import GlooMailbox, run_actions
    from trainsched.runtime.saved_memory import SavedTensorMeter
    from trainsched.runtime.stage_modules import (
        build_stages,
        flat_microbatches,
        split_microbatches,
    )

    rank = cfg["rank"]
    z = _model(cfg)
    model, x = z.model, z.args[0]
    meter = SavedTensorMeter(exclude=[*model.parameters(), *model.buffers()])
    runs = {}
    for c in cfg["configs"]:
        m = c["microbatches"]
        if c["kind"] == "torch-zbv":
            per = len(model) // 4
            mine = [(0, 3), (1, 2)][rank]
            pstages = [PipelineStage(torch.nn.Sequential(*model[i * per:(i + 1) * per]), i, 4,
                                     torch.device("cpu")) for i in mine]
            sched = ScheduleZBVZeroBubble(pstages, n_microbatches=m,
                                          loss_fn=lambda out, tgt: functional.mse_loss(out, tgt))
            target = torch.zeros_like(x)

            def step(sched: Any = sched, target: Any = target) -> None:
                with meter.saving():
                    if rank == 0:
                        sched.step(x, target=target)
                    else:
                        sched.step()
        else:
            schedule = Schedule.from_text(c["schedule"], num_stages=c["num_stages"],
                                          num_microbatches=m,
                                          stage_to_rank=c["stage_to_rank"])
            micro = split_microbatches(z.args, z.kwargs, m)
            stages = build_stages(model, c["stages"], *micro[0], num_microbatches=m)
            owned = {s: stages[s] for s in range(len(stages))
                     if schedule.stage_to_rank[s] == rank}
            inputs = flat_microbatches(stages[0], micro) if 0 in owned else []
            width = max(len(st.input_names) for st in stages) + 1

            def step(schedule: Any = schedule, owned: Any = owned, inputs: Any = inputs,
                     n: int = len(stages), width: int = width,
                     no_wait: bool = c["kind"] == "bound") -> None:
                mailbox = GlooMailbox(rank, n, schedule.num_microbatches, width)
                for st in owned.values():
                    st.meter = meter
                if no_wait:  # the same actions, messages neither sent nor waited for
                    run_actions(rank, schedule, owned, inputs, _drop, _zeros)
                else:
                    run_actions(rank, schedule, owned, inputs, mailbox.send, mailbox.recv)
                    mailbox.flush()
                for st in owned.values():
                    st.meter = None
        runs[c["name"]] = step
    times: dict[str, list[float]] = {name: [] for name in runs}
    peaks: dict[str, int] = {name: 0 for name in runs}
    for _ in range(cfg["rounds"]):
        for name, step in runs.items():
            for k in range(cfg["warmup"] + cfg["steps"]):
                dist.barrier()
                meter.reset_peak()
                t0 = time.perf_counter()
                step()
                took = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
                dist.all_reduce(took, op=dist.ReduceOp.MAX)
                model.zero_grad(set_to_none=True)
                if k >= cfg["warmup"]:
                    times[name].append(float(took))
                    peaks[name] = max(peaks[name], meter.peak_bytes)
    both: list[Any] = [None, None]
    dist.all_gather_object(both, peaks)
    return {"times": times, "peaks": {n: [both[0][n], both[1][n]] for n in runs}}


# --------------------------------------------------------------------------- main


def kendall_tau(a: list[float], b: list[float]) -> float:
    from scipy.stats import kendalltau

    return float(kendalltau(a, b).statistic) if len(a) > 1 else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="2 small layers, few steps")
    ap.add_argument("--microbatches", type=int, default=4, help="micro-batches of the rows")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=3, help="timed steps per row and round")
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps per row and round")
    ap.add_argument("--repeats", type=int, default=5, help="timings per layer alone")
    ap.add_argument("--rows", default="all",
                    help="generated schedules to run, comma-separated (default all registered; "
                         f"{', '.join(REQUIRED)} are always run)")
    ap.add_argument("--out", default=str(HERE / "results" / "pipeline_real.json"))
    args = ap.parse_args()
    if args.quick:
        os.environ["TRAINSCHED_ENCODER"] = "4,64,4"
    os.environ["OMP_NUM_THREADS"] = "1"
    batch, seq = (8, 16) if args.quick else (16, 128)
    m = args.microbatches

    import torch

    from _encoder import shape
    from trainsched.backprop.schedules import SCHEDULES, build_schedule, schedule_stage_count
    from trainsched.capture import build, capture
    from trainsched.cluster import cluster_from_flags
    from trainsched.sim import simulate_pipeline
    from trainsched.sim.pipeline_choice import choose_from_costs, microbatch_candidates

    torch.set_num_threads(1)
    wanted = list(SCHEDULES) if args.rows == "all" else [n.strip() for n in args.rows.split(",")]
    unknown = sorted(set(wanted) - set(SCHEDULES))
    if unknown:
        ap.error(f"unknown schedule(s) {', '.join(unknown)}; registered: {', '.join(SCHEDULES)}")
    row_names = [n for n in SCHEDULES if n in set(wanted) | set(REQUIRED)]
    began = time.perf_counter()
    load_before = Path("/proc/loadavg").read_text().split()[:3]
    layers, d_model, _ = shape()
    z = build(SPEC, batch_size=batch, seq_len=seq)
    graph = capture(z.model, z.args, costs="static", name="encoder")
    param_bytes = sum(p.numel() * 4 for p in z.model[0].parameters())
    act_per_sample = seq * d_model * 4
    cuts = {p: layer_stages(graph, p, layers) for p in (2, 4)}
    sizes = [batch // k for k in microbatch_candidates(batch, 2)]
    print(f"calibrating (2 gloo processes): each layer alone at micro-batch sizes {sizes}, "
          f"messages, actions inside GPipe ...", flush=True)
    counts = microbatch_candidates(batch, 2)
    cal = run_pair({"phase": "calibrate", "batch": batch, "seq": seq, "microbatches": m,
                    "stages": [list(s) for s in cuts[2]],
                    "schedules": {str(k): build_schedule("gpipe", 2, k).to_text()
                                  for k in counts},
                    "steps": 2, "message_bytes": batch // m * act_per_sample,
                    "layer_cut": [list(s) for s in layer_stages(graph, layers, layers)],
                    "layers": layers, "sizes": sizes, "repeats": args.repeats},
                   timeout_s=1800)
    alone = {int(b): v for b, v in cal["alone"].items()}
    for b in sizes:
        print(f"  micro-batch {b:>3}: " + ", ".join(
            f"{role} F {v['F'] * 1e3:.1f} I {v['I'] * 1e3:.1f} W {v['W'] * 1e3:.1f} ms"
            for role, v in alone[b].items()), flush=True)

    def alone_costs(num_stages: int, mb: int) -> Any:  # whole layers per stage
        return stage_costs(alone, num_stages, mb, layers, batch, act_per_sample, param_bytes)

    # How much longer an action runs inside a running pipeline than its stage alone, at each
    # micro-batch count (GPipe's actions timed at that count): the costs of that count carry it.
    stretch = {}
    for k in counts:
        gp_alone = alone_costs(2, k)
        ratios = []
        for r, acts in enumerate(cal["actions"][str(k)]):
            ratios += [acts["F"] / gp_alone.forward_s[r], acts["B"] / gp_alone.backward_s[r]]
        stretch[k] = min(max(1.0, statistics.median(ratios)), 4.0)

    def costs_of(num_stages: int, mb: int, _cut: Any = None) -> Any:
        c, f = alone_costs(num_stages, mb), stretch[mb]
        return replace(c, forward_s=tuple(x * f for x in c.forward_s),
                       backward_input_s=tuple(x * f for x in c.backward_input_s),
                       backward_weight_s=tuple(x * f for x in c.backward_weight_s))

    small, big = cal["one_way_s"]["4"], cal["one_way_s"][str(batch // m * act_per_sample)]
    latency = small
    bandwidth = (batch // m * act_per_sample) / max(big - small, 1e-9)
    message_host = statistics.median(a["send"] for a in cal["actions"][str(m)])
    base = cluster_from_flags(devices=2, memory="64GiB", bandwidth=repr(bandwidth),
                              latency=repr(latency), device_kind=None, name="this-host")
    cluster = replace(base, device=replace(base.device, message_host_s=message_host))
    print(f"  one-way message: {small * 1e3:.3f} ms (4 B), {big * 1e3:.3f} ms "
          f"({batch // m * act_per_sample / MiB:.1f} MiB) -> {bandwidth / 1e9:.2f} GB/s; "
          f"send {message_host * 1e3:.3f} ms; actions inside the pipeline, x alone: "
          + ", ".join(f"m={k} {stretch[k]:.3f}" for k in counts), flush=True)

    choice = choose_from_costs(costs_of, cluster, 2, microbatch_candidates(batch, 2),
                               memory_limit_bytes=cluster.device.memory_bytes)
    print(f"auto: {choice.reason}", flush=True)

    def ours(name: str, mb: int, label: str) -> dict[str, Any]:
        p = schedule_stage_count(name, 2)
        sched = build_schedule(name, 2, mb, stages=costs_of(p, mb))
        return {"name": label, "kind": "ours", "schedule_name": name, "microbatches": mb,
                "num_stages": p, "stages": [list(s) for s in cuts[p]],
                "schedule": sched.to_text(), "stage_to_rank": list(sched.stage_to_rank)}

    configs = [ours(n, m, n) for n in row_names]
    configs.append({"name": "torch-zbv", "kind": "torch-zbv", "schedule_name": "zbv",
                    "microbatches": m, "num_stages": 4})
    configs.append({**ours("gpipe", m, "bound"), "kind": "bound"})
    auto_label = f"auto:{choice.schedule_name}/m={choice.num_microbatches}"
    if (choice.schedule_name, choice.num_microbatches) not in {(n, m) for n in row_names}:
        configs.append(ours(choice.schedule_name, choice.num_microbatches, auto_label))
    else:
        auto_label = choice.schedule_name
    print(f"timed run: {len(configs)} rows x {args.rounds} rounds x ({args.warmup} + "
          f"{args.steps}) steps ...", flush=True)
    timed = run_pair({"phase": "timed", "batch": batch, "seq": seq, "configs": configs,
                      "rounds": args.rounds, "steps": args.steps, "warmup": args.warmup},
                     timeout_s=3600)

    bound_s = statistics.median(timed["times"]["bound"])
    rows = []
    for c in configs:
        if c["kind"] == "bound":
            continue
        name, mb = c["schedule_name"], c["microbatches"]
        p = schedule_stage_count(name, 2)
        stages = costs_of(p, mb)
        sched = build_schedule(name, 2, mb, stages=stages)
        sim = simulate_pipeline(stages, sched, cluster)
        act_only = replace(stages, param_bytes=(0,) * p, grad_bytes=(0,) * p)
        sim_mem = simulate_pipeline(act_only, sched, cluster)
        # PyTorch's split backward keeps the whole graph from I to W: I frees nothing
        sim_keep = simulate_pipeline(replace(act_only, weight_input_bytes=()), sched, cluster,
                                     input_grad_only_fraction=0.0)
        t = timed["times"][c["name"]]
        measured = statistics.median(t)
        q1, _, q3 = statistics.quantiles(t, n=4) if len(t) > 1 else (t[0], t[0], t[0])
        rows.append({"row": c["name"], "schedule": name, "microbatches": mb,
                     "measured_s": measured, "iqr_s": [q1, q3], "min_s": min(t),
                     "steps": len(t),
                     "predicted_s": sim.step_time_s,
                     "error": (sim.step_time_s - measured) / measured,
                     "peak_bytes": timed["peaks"][c["name"]],
                     "predicted_peak_bytes": [sim_mem.peak_memory_bytes.get(d, 0)
                                              for d in sim_mem.rank_devices],
                     "predicted_peak_graph_kept_bytes": [sim_keep.peak_memory_bytes.get(d, 0)
                                                      for d in sim_keep.rank_devices]})
    by = {r["row"]: r for r in rows}
    gpipe_s = by["gpipe"]["measured_s"]
    generated = [r for r in rows if r["row"] != "torch-zbv"]
    fastest = min(generated, key=lambda r: r["measured_s"])
    at_m = min((r for r in generated if r["microbatches"] == m), key=lambda r: r["measured_s"])
    errors = [abs(r["error"]) for r in rows]
    tau = kendall_tau([r["measured_s"] for r in rows], [r["predicted_s"] for r in rows])
    load_after = Path("/proc/loadavg").read_text().split()[:3]

    print(f"\n{'row':<22} {'measured':>10} {'IQR':>17} {'min':>8} {'predicted':>10} "
          f"{'error':>7}  {'peak MiB r0/r1':>14} {'pred':>9} {'graph kept':>13}")

    def pair(values: list[int]) -> str:
        return "/".join(f"{b / MiB:.0f}" for b in values)

    for r in rows:
        print(f"{r['row']:<22} {r['measured_s'] * 1e3:>8.0f}ms "
              f"{r['iqr_s'][0] * 1e3:>8.0f}-{r['iqr_s'][1] * 1e3:<8.0f} "
              f"{r['min_s'] * 1e3:>6.0f}ms {r['predicted_s'] * 1e3:>8.0f}ms "
              f"{r['error']:>+7.1%}  {pair(r['peak_bytes']):>14} "
              f"{pair(r['predicted_peak_bytes']):>9} "
              f"{pair(r['predicted_peak_graph_kept_bytes']):>13}")
    auto = by[auto_label]
    summary = {
        "auto_row": auto_label,
        "auto_vs_gpipe": gpipe_s / auto["measured_s"],
        "auto_vs_torch_zbv": by["torch-zbv"]["measured_s"] / auto["measured_s"],
        "fastest_generated": fastest["row"],
        "fastest_vs_gpipe": gpipe_s / fastest["measured_s"],
        "fastest_vs_torch_zbv": by["torch-zbv"]["measured_s"] / fastest["measured_s"],
        "zb_h1_peak_le_1f1b": max(by["zb-h1"]["peak_bytes"]) <= max(by["1f1b"]["peak_bytes"]),
        "median_abs_error": statistics.median(errors), "max_abs_error": max(errors),
        "kendall_tau": tau,
        "no_wait_bound_s": bound_s, "bound_vs_gpipe": gpipe_s / bound_s,
        "fastest_at_m": at_m["row"], "fastest_at_m_of_bound": bound_s / at_m["measured_s"],
    }
    print(f"\nauto ({auto_label}): {summary['auto_vs_gpipe']:.2f}x GPipe (target >= 1.25), "
          f"{summary['auto_vs_torch_zbv']:.2f}x torch ZBV (target >= 1.05)")
    print(f"fastest generated ({fastest['row']}): {summary['fastest_vs_gpipe']:.2f}x GPipe, "
          f"{summary['fastest_vs_torch_zbv']:.2f}x torch ZBV")
    print(f"no-wait bound (each rank's {m} F and {m} B of GPipe's cut, no messages, both ranks "
          f"at once): {bound_s * 1e3:.0f} ms = {summary['bound_vs_gpipe']:.2f}x GPipe; the "
          f"fastest generated row at {m} micro-batches ({at_m['row']}) "
          f"runs at {summary['fastest_at_m_of_bound']:.0%} of its speed")
    print(f"ZB-H1 peak <= 1F1B peak: {summary['zb_h1_peak_le_1f1b']}")
    print(f"replay: median |error| {summary['median_abs_error']:.1%} (target <= 10%), max "
          f"{summary['max_abs_error']:.1%}, Kendall tau {tau:.2f} (target >= 0.8)")
    print(f"load average before {' '.join(load_before)}, after {' '.join(load_after)}")
    write_results(args.out, {
        "benchmark": "pipeline_real", "quick": args.quick, "machine": cpu_model(),
        "cores": os.cpu_count(), "python": platform.python_version(),
        "torch": torch.__version__, "threads_per_rank": 1,
        "model": {"layers": layers, "d_model": d_model, "batch": batch, "seq": seq},
        "microbatches": m, "rounds": args.rounds, "steps": args.steps, "warmup": args.warmup,
        "loadavg_before": load_before, "loadavg_after": load_after,
        "alone": {str(b): v for b, v in alone.items()},
        "calibration": {"one_way_s": cal["one_way_s"], "actions": cal["actions"],
                        "latency_s": latency, "bandwidth_bytes_per_s": bandwidth,
                        "microbatch_stretch": stretch, "message_host_s": message_host},
        "auto": choice.to_dict(), "rows": rows, "summary": summary,
        "schedules_registered": list(SCHEDULES), "wall_s": time.perf_counter() - began})


if __name__ == "__main__":
    if len(sys.argv) == 2 and sys.argv[1].startswith("{"):  # a worker started by run_pair
        _worker(json.loads(sys.argv[1]))
    else:
        main()
