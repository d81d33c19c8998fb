"""The text reports of the CLI's verbs, as plain functions returning the lines to print.

Each takes the library's results (or the JSON document the verb also prints with ``--json``)
and formats them; none computes anything a result does not already hold, so that the text and
the JSON of one run always agree. Torch-free.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from trainsched.units import format_duration, format_number, format_size, format_size_flag


# -- lists --------------------------------------------------------------------------------------
def preset_list(rows: Sequence[Mapping[str, Any]]) -> str:
    """``cluster --list``: one preset a line, name then description."""
    width = max(len(r["name"]) for r in rows)
    return "\n".join(f"{r['name']:<{width}}  {r['description']}" for r in rows)


def model_list(rows: Sequence[Mapping[str, Any]]) -> str:
    """``models``: one zoo model a line, with its description and default batch size."""
    return "\n".join(f"{r['name']:<20} {r['description']} (batch {r['default_batch_size']})"
                     for r in rows)


# -- simulate -----------------------------------------------------------------------------------
def trial_lines(trials: Sequence[Mapping[str, Any]], step_label: str) -> list[str]:
    """One line per tuner trial: its number, phase, partition, credit and step time."""
    return [f"  trial {t['number']:>2} ({t['phase']:<7}) partition "
            f"{format_size(t['partition_bytes']):>10}  credit "
            f"{format_size(t['credit_bytes']):>10}  {step_label} "
            f"{format_duration(t['step_time_s'])}" for t in trials]


def data_plan_lines(doc: Mapping[str, Any]) -> list[str]:
    """The data-parallel lines of ``simulate``: the tuner's trials if any, then the policy."""
    lines = []
    tuned = doc["autotune"]
    if tuned is not None:
        lines += trial_lines(tuned["trials"], "step")
        lines.append(f"  best of {len(tuned['trials'])} trials: --partition "
                     f"{format_size_flag(tuned['partition_bytes'])} --credit "
                     f"{format_size_flag(tuned['credit_bytes'])} (small tensors fused up to "
                     f"one partition)")
    policy = doc["policy"]
    what = [policy["class"]]
    if policy.get("partition_bytes") is not None:
        what.append(f"partition {format_size(policy['partition_bytes'])}")
    if "credit_bytes" in policy and "partition_bytes" in policy:  # priority-queue policies
        credit = policy["credit_bytes"]
        if credit is None:
            what.append("one collective in flight")
        elif credit == "inf":
            what.append("credit unlimited")
        else:
            backfill = " with backfill" if policy["backfill"] else ""
            what.append(f"credit {format_size(credit)} {policy['credit_mode']}{backfill}")
    if policy.get("cross_barrier"):
        what.append("crossing the barrier")
    steady = f", steady step of {doc['steps']}" if doc["steps"] > 1 else ""
    lines.append(f"  policy           {', '.join(what)}; {doc['ranks']} ranks, "
                 f"{doc['algorithm']}{steady}")
    slowest = doc.get("slowest_rank")
    if slowest is not None:
        parts = [f"{what} {100 * slowest[key]:.2f}%" for what, key in
                 (("device spread", "device_cv"), ("step jitter", "step_cv"))
                 if slowest.get(key)]
        lines.append(f"  slowest rank     compute x {slowest['factor']:.4f} every step (step "
                     f"time varies by {100 * slowest['cv']:.2f}% per rank: "
                     f"{' and '.join(parts)}; E[max of {slowest['ranks']} normals] = "
                     f"{slowest['expected_max']:.4f})")
    lines += backprop_lines(doc.get("backprop"))
    return lines


def slot_lines(slots: Mapping[str, Any]) -> list[str]:
    """``simulate --backprop ooo`` on one device: how many layers each slot got, and the step
    against every weight gradient inline."""
    kinds: dict[str, int] = {}
    for slot in slots["slots"]:
        kind = slot.split("(")[0]
        kinds[kind] = kinds.get(kind, 0) + 1
    shown = ", ".join(f"{kind} {count}" for kind, count in kinds.items())
    return [f"  dW slots         {shown} (chosen by the simulator, {slots['simulations']} "
            f"simulations)",
            f"  against inline   {format_duration(slots['inline_step_time_s'])} -> "
            f"{format_duration(slots['step_time_s'])} ({slots['speedup']:.3f}x)"]


def backprop_lines(backprop: Mapping[str, Any] | None) -> list[str]:
    """``simulate``'s backprop line: in-order, or the k deferred and, when the simulator chose
    it, the k sweep's summary (k = 0, the best k, the slowest k)."""
    if backprop is None or backprop["name"] == "inorder":
        return [] if backprop is None else ["  backprop         in-order"]
    line = (f"  backprop         {backprop['name']}: reverse-first-k, k = {backprop['k']} of "
            f"{backprop['layers']} layers")
    held = (f"  dW queue         holds {format_size(backprop['deferred_bytes'])} at its peak "
            f"(the deferred layers' inputs and output gradients)")
    sweep = backprop.get("sweep")
    if sweep is None:
        return [line + " (given)", held]
    times, k = sweep["step_time_s"], sweep["k"]
    worst = max(range(len(times)), key=lambda j: (times[j], -j))
    cap = sweep["memory_cap_bytes"]
    parts = [f"in order (k=0) {format_duration(times[0])}",
             (f"chosen k={k} {format_duration(times[k])} ({sweep['speedup']:.3f}x)" if k
              else "no k faster, so k=0")]
    if worst not in (0, k):
        parts.append(f"slowest k={worst} {format_duration(times[worst])}")
    return [line + f" (chosen: every k in 0..{sweep['layers']} simulated"
            + (f", within {format_size(cap)})" if cap is not None else ")"),
            "  k sweep          " + "; ".join(parts), held]


def simulate_report(doc: Mapping[str, Any], model: str) -> str:
    """``simulate``'s text from its JSON document ``doc``; ``model`` names the graph."""
    lines = [f"{model} on {doc['cluster']}, {doc['parallelism']}:"]
    costs = doc.get("costs")
    if costs:
        lines.append(f"  costs            {costs}")
    data = doc["parallelism"] == "data"
    batch = doc.get("batch")
    if batch:
        tokens = f" x {batch['seq_len']} tokens" if batch["seq_len"] else ""
        lines.append(f"  batch            {batch['samples']} samples{tokens}"
                     f"{' per rank' if data else ''}")
    if data:
        lines += data_plan_lines(doc)
    if doc.get("slots"):
        lines += slot_lines(doc["slots"])
    pipeline = doc.get("pipeline")
    if pipeline:
        lines.append(pipeline_line(pipeline))
        if pipeline["microbatch_costs"] == "divided" and pipeline["microbatches"] > 1 \
                and str(doc.get("costs") or "").startswith("measured"):
            lines.append("  note             measured costs do not divide with the batch (a small "
                         "micro-batch costs more per sample): profile the model at the "
                         "micro-batch size and pass --microbatch-graph FILE")
    steps = doc.get("steps", 1)
    lines.append(f"  step time        {format_duration(doc['step_time_s'])} "
                 f"(dependency bound {format_duration(doc['dependency_bound_s'])}"
                 f"{f' over all {steps} steps' if steps > 1 else ''})")
    if data and doc["crossing_bound_gradient"]:
        lines.append(f"  crossing bound   {format_duration(doc['crossing_bound_s'])} (no comm "
                     f"policy beats it: {doc['crossing_bound_gradient']}'s loop)")
    lines.append(f"  exposed comm     {format_duration(doc['exposed_comm_s'])}")
    lines.append(f"  idle compute     {100 * doc['bubble_fraction']:.1f}%")
    peaks = sorted(doc["peak_memory_bytes"].items())
    shown = ", ".join(f"{d} {format_size(b)}{' OOM' if doc['oom'].get(d) else ''}"
                      for d, b in peaks[:8])
    lines.append(f"  peak memory      {shown}{' ...' if len(peaks) > 8 else ''}")
    if doc["trace"]:
        lines.append(f"  trace            {doc['trace']} (open in ui.perfetto.dev)")
    if doc.get("sync"):
        lines += sync_lines(doc["sync"])
    if doc.get("choice"):
        lines += pipeline_choice_lines(doc["choice"])
    return "\n".join(lines)


#: Where a pipeline's micro-batch costs came from, as ``simulate`` says it.
MICROBATCH_COSTS = {"graph": "costs of the micro-batch graph",
                    "divided": "costs the graph's divided by {m}",
                    "divided, launches whole": "costs the graph's divided by {m}, each op's "
                                               "launch paid whole"}


def pipeline_line(pipeline: Mapping[str, Any]) -> str:
    """A pipeline plan's shape: schedule, stages, micro-batches and their costs' source."""
    m, samples = pipeline["microbatches"], pipeline["microbatch_samples"]
    size = f" of {samples} sample{'s' if samples != 1 else ''}" if samples is not None else ""
    return (f"  pipeline         {pipeline['schedule']}, {pipeline['stages']} stages, {m} "
            f"micro-batch{'es' if m != 1 else ''}{size}; "
            f"{MICROBATCH_COSTS[pipeline['microbatch_costs']].format(m=m)}")


def pipeline_choice_lines(choice: Mapping[str, Any]) -> list[str]:
    """``simulate --schedule auto``: every candidate tried, then why the winner won."""
    lines = ["", f"schedules tried (memory limit {format_size(choice['memory_limit_bytes'])} "
                 f"per device):",
             f"  {'schedule':<20} {'m':>4} {'step':>10} {'peak':>10}  note"]
    for c in choice["candidates"]:
        step = "-" if c["step_time_s"] is None else format_duration(c["step_time_s"])
        peak = "-" if c["peak_memory_bytes"] is None else format_size(c["peak_memory_bytes"])
        won = c["schedule"] == choice["schedule"] and c["microbatches"] == choice["microbatches"]
        note = "chosen" if won else c["note"].split(";")[0]
        lines.append(f"  {c['schedule']:<20} {c['microbatches']:>4} {step:>10} {peak:>10}  "
                     f"{note}".rstrip())
    lines.append(f"chosen: {choice['reason']}")
    return lines


def sync_lines(sync: Mapping[str, Any]) -> list[str]:
    """``simulate``'s protocol simulation: the setting, then one row per policy (BSP first)
    with its phases under it."""
    stragglers = ", ".join(sync["stragglers"]) or "none"
    lines = [f"  sync policy      {sync['policy']}: {sync['steps']} BSP steps' worth of samples "
             f"({sync['samples']}), step noise {100 * sync['step_noise']:.0f}%, stragglers "
             f"{stragglers}, switch {format_duration(sync['switch_s'])}"
             + (f", {sync['servers']} {sync['server_placement']} server"
                f"{'s' * (sync['servers'] > 1)}" if sync.get("servers") else ""),
             f"  {'':<17}{'policy':<28}{'time':>10}{'per step':>11}{'per sample':>12}"
             f"{'staleness':>11}{'vs bsp':>8}"]
    base = sync["rows"][0]["time_s"]
    for row in sync["rows"]:
        speedup = base / row["time_s"] if row["time_s"] else float("inf")
        stale = f"{row['mean_staleness']:.1f}/{row['max_staleness']}"
        lines.append(f"  {'':<17}{row['policy']:<28}{format_duration(row['time_s']):>10}"
                     f"{format_duration(row['step_time_s']):>11}"
                     f"{format_duration(row['time_per_sample_s']):>12}{stale:>11}"
                     f"{speedup:>7.2f}x")
        if len(row["phases"]) > 1:
            for phase in row["phases"]:
                lines.append(f"  {'':<19}{'phase ' + phase['protocol']:<26}"
                             f"{format_duration(phase['time_s']):>10}  {phase['samples']} "
                             f"samples, {phase['updates']} updates")
    return lines


# -- place --------------------------------------------------------------------------------------
def place_report(result: Any, summary: Mapping[str, Any], *, model: str, cluster: Any,
                 algorithm: str, graph_path: str, cluster_spec: str,
                 output: str | None) -> str:
    """``place``'s text: the placer chosen, its times, one row per device, the candidates.

    ``result`` is a placement result and ``summary`` its ``summary()``; ``graph_path`` and
    ``cluster_spec`` are the arguments as given, for the follow-up command shown.
    """
    chosen = f"; auto chose {result.placer}" if algorithm == "auto" else ""
    lines = [f"{model} on {cluster.label} ({cluster.num_devices} devices, "
             f"{result.placement.meta['comm']} channels): {algorithm}{chosen}",
             f"  placement time   {format_duration(result.wall_s)} ({result.ops_before} ops, "
             f"{result.ops_after} after reduction)"]
    step = result.predicted_step_s
    lines.append(f"  predicted step   {format_duration(step) if step is not None else '-'} "
                 f"(lower bound {format_duration(result.lower_bound_s)}; placer's schedule "
                 f"{format_duration(result.makespan_s)})")
    lines.append(f"  {'device':<10}{'ops':>7}{'peak memory':>14}{'capacity':>12}")
    for name, ops in summary["ops_per_device"].items():
        peak, cap = summary["peak_bytes"][name], summary["capacity_bytes"][name]
        lines.append(f"  {name:<10}{ops:>7}{format_size(peak):>14}{format_size(cap):>12}"
                     f"{'  OOM' if peak > cap else ''}")
    if result.candidates:
        shown = ", ".join(f"{c.name} {format_duration(c.step_s)}{' OOM' if c.oom else ''}"
                          if c.step_s is not None else f"{c.name} (did not fit)"
                          for c in result.candidates)
        lines.append(f"  candidates       {shown}")
    if output:
        lines.append(f"  wrote {output} (trainsched simulate {graph_path} --cluster "
                     f"{cluster_spec} --parallelism placed --placement {output})")
    return "\n".join(lines)


# -- compare ------------------------------------------------------------------------------------
def compare_report(rows: Sequence[Any], *, title: str, tier: Any, device: Any,
                   out_dir: Any, skipped: Mapping[str, str] | None = None,
                   precision: str = "fp32") -> str:
    """``compare``'s table: one row per strategy, fastest first (with the samples each step
    trains), then the strategies that could not be built for this graph and why, and where the
    files went."""
    skipped = skipped or {}
    lines = [f"{title}; costs: {tier} ({device}, {precision})"]
    width = max(len("strategy"), *(len(r.strategy) for r in rows),
                *(len(name) for name in skipped)) + 2
    lines.append(f"  {'strategy':<{width}}{'devices':>8}{'samples/step':>13}{'step':>11}"
                 f"{'samples/s':>11}{'speedup':>9}{'peak mem':>11}{'idle':>7}"
                 f"{'exposed comm':>14}")
    for r in rows:
        lines.append(f"  {r.strategy:<{width}}{r.devices:>8}{r.samples_per_step:>13}"
                     f"{format_duration(r.step_time_s):>11}"
                     f"{format_number(r.samples_per_s, 1):>11}"
                     f"{format_number(r.speedup, 2) + 'x':>9}"
                     f"{format_size(r.peak_memory_bytes) + (' OOM' if r.oom else ''):>11}"
                     f"{100 * r.idle_fraction:>6.1f}%{format_duration(r.exposed_comm_s):>14}")
    for name, reason in skipped.items():
        lines.append(f"  {name:<{width}}  not built: {reason}")
    lines.append(f"\n  wrote {out_dir}/compare.json, compare.png and one trace per strategy "
                 f"(open *.trace.json in ui.perfetto.dev)")
    return "\n".join(lines)


def sync_report(rows: Sequence[Any], *, steps: int, noise: float, servers: str) -> str:
    """``compare``'s protocol table: every sync protocol over many steps, in registry order;
    ``servers`` says where the parameter-server protocols' pushes and pulls go."""
    width = max(len("protocol"), *(len(r.protocol) for r in rows)) + 2
    lines = [f"\nsync protocols on the data-ddp rows' ranks ({steps} BSP steps' worth of samples, "
             f"{100 * noise:.0f}% spread in each rank's step; no stragglers):",
             f"  {'protocol':<{width}}{'step':>11}{'samples/s':>11}{'staleness':>11}"
             f"{'vs bsp':>8}"]
    for r in rows:
        lines.append(f"  {r.protocol:<{width}}{format_duration(r.step_time_s):>11}"
                     f"{format_number(r.samples_per_s, 1):>11}"
                     f"{f'{r.mean_staleness:.1f}/{r.max_staleness}':>11}{r.speedup:>7.2f}x")
    lines.append(f"  asp, ssp and k-of-n push and pull every gradient through {servers}; "
                 f"simulate --sync POLICY --straggler RANK:DELAY compares under stragglers")
    return "\n".join(lines)


def measured_report(rows: Sequence[Any], measured: dict[str, dict[str, Any]],
                    out_dir: Any) -> str:
    """``compare --run``'s second table: predicted and measured step per strategy, or why a
    strategy was not run."""
    width = max(len("strategy"), *(len(r.strategy) for r in rows)) + 2
    lines = ["\nmeasured on this host (mean of the timed steps, as a run pays them; median, p10 "
             "and p90 beside):",
             f"  {'strategy':<{width}}{'predicted':>11}{'measured':>11}{'median':>11}"
             f"{'p10':>11}{'p90':>11}{'meas/pred':>11}"]
    for r in rows:
        m = measured[r.strategy]
        if "skipped" in m:
            lines.append(f"  {r.strategy:<{width}}{format_duration(r.step_time_s):>11}  "
                         f"not run: {m['skipped']}")
            continue
        ratio = m["measured_over_predicted"]
        lines.append(f"  {r.strategy:<{width}}{format_duration(r.step_time_s):>11}"
                     f"{format_duration(m['mean_s']):>11}{format_duration(m['median_s']):>11}"
                     f"{format_duration(m['p10_s']):>11}{format_duration(m['p90_s']):>11}"
                     f"{'-' if ratio is None else f'{ratio:.2f}x':>11}")
    lines.append(f"\n  wrote {out_dir}/measured.png and one plan per strategy (*.plan.json: "
                 f"trainsched train MODEL --plan FILE runs one)")
    return "\n".join(lines)


# -- train --------------------------------------------------------------------------------------
def _step_time_line(seg: Any, warmup: int, label: str) -> str:
    return (f"  {label}  median {format_duration(seg.median_s)}  p10 "
            f"{format_duration(seg.quantile_s(0.1))}  p90 "
            f"{format_duration(seg.quantile_s(0.9))}  ({len(seg.step_times_s)} steps after "
            f"{warmup} warm-up)")


def train_report(result: Any, *, nproc: int, comm: str, partition_bytes: int,
                 credit_bytes: float, credit_mode: str, backfill: bool, order: str,
                 scheduled: bool, optimizer: str, warmup: int, timeline: str | None) -> str:
    """``train``'s text: how gradients were communicated, step times, throughput."""
    credit = "unlimited" if credit_bytes == float("inf") else format_size(credit_bytes)
    policy = (f"partition {format_size(partition_bytes)}, credit {credit} {credit_mode}"
              f"{' with backfill' if backfill else ''}, crossing the barrier")
    how = {"fifo": "whole tensors in ready order, barrier",
           "ddp": "torch DistributedDataParallel, 25 MiB buckets",
           "priority": policy,
           "bytescheduler": f"{policy}, gradients below 1 MiB fused"}[comm]
    if comm != "ddp":
        how += (", scheduler off (--no-schedule: stock DDP, 25 MiB buckets)" if not scheduled
                else f", {order} order")
    lines = [f"{result.model}: {nproc} gloo ranks x batch {result.batch_size}, --comm-policy "
             f"{comm} ({how}), {optimizer}",
             _step_time_line(result.first, warmup, "step time"),
             f"  throughput {result.throughput():.2f} samples/s"]
    if timeline:
        lines.append(f"  wrote {timeline}/rank<r>.trace.json (open in ui.perfetto.dev)")
    return "\n".join(lines)


def autotune_intro(*, model: str, nproc: int, search_trials: int, confirm_trials: int,
                   trial_steps: int, total_steps: int, warmup: int, steps: int) -> str:
    """``train --autotune``'s first line, printed before the job starts: what it will run."""
    return (f"{model}: tuning partition and credit online on {nproc} gloo ranks: the start "
            f"point, {search_trials} search and {confirm_trials} confirmation trials of "
            f"{trial_steps} steps ({total_steps} steps), then {warmup} + {steps} at the "
            f"chosen point")


def autotune_report(result: Any, tuned: Mapping[str, Any], *, warmup: int) -> str:
    """``train --autotune``'s text: each trial, the point chosen, and the timed steps there."""
    lines = trial_lines(tuned["trials"], "median step")
    lines.append(f"  best: --partition {format_size_flag(tuned['partition_bytes'])} --credit "
                 f"{format_size_flag(tuned['credit_bytes'])} (median "
                 f"{format_duration(tuned['step_time_s'])} in its trials), from step "
                 f"{tuned['total_steps']} on every rank")
    lines.append(_step_time_line(result.first, warmup, "step time there"))
    lines.append(f"  throughput {result.throughput():.2f} samples/s")
    return "\n".join(lines)


def auto_report(choice: Any, cluster: str) -> str:
    """``train --comm-policy auto``'s choice: every candidate's predicted step, fastest first,
    and why the one run was chosen."""
    lines = [f"auto: every data-parallel strategy simulated on {cluster}:"]
    width = max(len(n) for n in choice.predicted_s) + 2
    for name, step_s in sorted(choice.predicted_s.items(), key=lambda kv: (kv[1], kv[0])):
        mark = "  <- runs" if name == choice.strategy else ""
        lines.append(f"  {name:<{width}}{format_duration(step_s):>11}{mark}")
    lines.append(f"  {choice.strategy}: {choice.reason}")
    return "\n".join(lines)


def plan_run_report(path: str, plan: Any, result: Any, prediction: Any, *, warmup: int,
                    timeline: str | None = None) -> str:
    """``train --plan``'s text: what ran, measured step times, and the plan's prediction."""
    lines = [f"{result.model}: plan {path} ({plan.kind}, {result.ranks} rank"
             f"{'s' if result.ranks > 1 else ''}, {result.samples_per_step} samples per step)",
             f"  measured   mean {format_duration(result.mean_s)}  median "
             f"{format_duration(result.median_s)}  p10 "
             f"{format_duration(result.p10_s)}  p90 {format_duration(result.p90_s)}  "
             + (f"({len(result.step_times_s)} steps after {warmup} warm-up)"
                if getattr(result, "sync", None) is None else
                f"(worker 0's mean time per batch of each of {len(result.step_times_s)} sync "
                f"phases)")]
    if prediction is None:
        lines.append("  predicted  - (the plan file holds no prediction)")
    else:
        ratio = result.mean_s / prediction.step_time_s if prediction.step_time_s else None
        lines.append(f"  predicted  {format_duration(prediction.step_time_s)} on "
                     f"{prediction.cluster}"
                     + (f"  (measured / predicted {ratio:.2f}x)" if ratio else ""))
    lines.append(f"  throughput {result.samples_per_s:.2f} samples/s")
    if timeline:
        lines.append(f"  wrote {timeline}/steps.trace.json (open in ui.perfetto.dev)")
    return "\n".join(lines)


def registered_report(result: Any, *, comm: str, nproc: int, order: str, optimizer: str,
                      warmup: int) -> str:
    """``train --comm-policy NAME`` for a registered policy at its defaults."""
    seg = result.first
    return "\n".join([
        f"{result.model}: {nproc} gloo ranks x batch {result.batch_size}, --comm-policy {comm} "
        f"(the registered policy at its defaults, {order} order), {optimizer}",
        _step_time_line(seg, warmup, "step time"),
        f"  throughput {result.throughput():.2f} samples/s"])
