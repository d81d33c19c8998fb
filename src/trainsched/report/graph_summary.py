"""A graph's summary (``trainsched show`` and ``profile``): the facts as a JSON-ready dict, and
the same facts as the text the CLI prints."""

from __future__ import annotations

from typing import Any

from trainsched.graph.core import SPREAD_LIMIT
from trainsched.units import format_duration, format_flops, format_size

#: (phase name, median field, p10 field, p90 field) of the measured phases an op carries.
_PHASES = (("forward", "compute_s", "compute_p10_s", "compute_p90_s"),
           ("dX", "backward_input_s", "backward_input_p10_s", "backward_input_p90_s"),
           ("dW", "backward_weight_s", "backward_weight_p10_s", "backward_weight_p90_s"))


def timing_spread(graph: Any) -> dict[str, Any] | None:
    """How far the measured phases' samples spread (p90 / p10), or None for a graph without
    measured times: the phases counted, the median ratio, how many exceed ``SPREAD_LIMIT`` and
    the widest (op, phase, ratio; the first op in graph order among equals)."""
    lows = [graph.column(low) for _, _, low, _ in _PHASES]
    if all(column.count(None) == len(graph) for column in lows):
        return None  # nothing measured (counted in C: a graph may have a million ops)
    highs = [graph.column(high) for _, _, _, high in _PHASES]
    ratios: list[tuple[float, str, str]] = []  # op by op, each op's phases in order
    for name, *pairs in zip(graph.column("name"), *lows, *highs, strict=True):
        for k, (phase, _, _, _) in enumerate(_PHASES):
            low, high = pairs[k], pairs[k + len(_PHASES)]
            if low is not None and high is not None and low > 0:
                ratios.append((high / low, name, phase))
    if not ratios:
        return None
    ordered = sorted(r for r, _, _ in ratios)
    mid = len(ordered) // 2
    median = ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
    worst = max(ratios, key=lambda r: r[0])
    return {"phases": len(ratios), "median_ratio": median, "limit": SPREAD_LIMIT,
            "over_limit": sum(1 for r, _, _ in ratios if r > SPREAD_LIMIT),
            "worst": {"op": worst[1], "phase": worst[2], "ratio": worst[0]}}


def graph_summary(graph: Any, top: int = 10) -> dict[str, Any]:
    """Counts, totals, the critical path and the ``top`` heaviest ops of a :class:`Graph`."""
    totals = graph.totals()
    length_s, path = graph.critical_path()
    heavy = graph.heaviest(top)
    total_s = totals.compute_s or 1.0
    return {
        "meta": graph.meta,
        "ops": totals.num_ops,
        "edges": totals.num_edges,
        "ops_by_kind": dict(totals.ops_by_kind),
        "compute_s": totals.compute_s,
        "flops": totals.flops,
        "param_bytes": totals.param_bytes,
        "buffer_bytes": totals.buffer_bytes,
        "saved_bytes": totals.saved_bytes,
        "output_bytes": totals.output_bytes,
        "critical_path_s": length_s,
        "critical_path_ops": len(path),
        "critical_path": list(path),
        "timing_spread": timing_spread(graph),
        "heaviest": [{"name": op.name, "kind": op.kind, "module": op.module_path,
                      "target": op.target, "compute_s": op.compute_s, "flops": op.flops,
                      "share": op.compute_s / total_s} for op in heavy],
    }


def describe_step_overhead(record: dict[str, Any]) -> str:
    """One line on a measured graph's ``meta["step_overhead"]``: the eager step against the
    ops' sum before, and what each op was charged."""
    step, ops = record.get("eager_step_s"), record.get("ops_s")
    if not isinstance(step, int | float) or not isinstance(ops, int | float):
        return "recorded without its times"
    head = f"eager step {format_duration(step)}, ops {format_duration(ops)} before: "
    if record.get("rule") == "none":
        return head + "nothing charged (the ops already add up to the step)"
    parts = []
    for side in ("forward", "backward"):
        per_op, count = record.get(f"{side}_per_op_s"), record.get(f"{side}_ops")
        if isinstance(per_op, int | float) and per_op > 0:
            parts.append(f"{format_duration(per_op)} to each of {count} {side} ops")
    return head + f"+{format_duration(step - ops)} charged, " + " and ".join(parts)


def describe_optimizer_step(record: dict[str, Any]) -> str:
    """One line on a measured graph's ``meta["optimizer_step"]``: the timed optimizer step
    the training transform charges to that optimizer's ops."""
    step = record.get("step_s")
    if not isinstance(step, int | float):
        return "recorded without its time"
    return (f"{record.get('optimizer', '?')} step() + zero_grad() {format_duration(step)} over "
            f"{record.get('params', '?')} parameter tensors (median of {record.get('steps', '?')}"
            f"), charged to the {record.get('optimizer', '?')} optimizer ops by the training "
            f"transform")


def describe_graph(s: dict[str, Any], top: int) -> str:
    """The text of a :func:`graph_summary`: a title line, then one line per fact."""
    meta = s["meta"]
    lines = []
    title = meta.get("model", "graph")
    facts = [f"{k} {meta[k]}" for k in ("batch_size", "seq_len", "granularity", "tier",
                                         "device") if k in meta]
    lines.append(f"{title}: " + ", ".join(facts) if facts else title)
    kinds = ", ".join(f"{n} {k}" for k, n in s["ops_by_kind"].items())
    lines.append(f"  ops              {s['ops']} ({kinds}), {s['edges']} edges")
    lines.append(f"  compute          {format_duration(s['compute_s'])} total, "
                 f"{format_flops(s['flops'])}")
    lines.append(f"  parameters       {format_size(s['param_bytes'])} "
                 f"(+ {format_size(s['buffer_bytes'])} buffers)")
    lines.append(f"  saved for bwd    {format_size(s['saved_bytes'])}")
    spread = s.get("timing_spread")
    if spread is not None:
        worst = spread["worst"]
        lines.append(f"  timing spread    p90/p10 median {spread['median_ratio']:.2f} over "
                     f"{spread['phases']} measured phases; {spread['over_limit']} above "
                     f"{spread['limit']:g}x (widest {worst['ratio']:.1f}x: {worst['op']} "
                     f"{worst['phase']})")
    beside = meta.get("measured_beside")
    if isinstance(beside, int) and beside > 0:
        lines.append(f"  measured beside  {beside} other process{'es' * (beside > 1)} "
                     f"capturing at once (as the ranks of a job on this host)")
    passes = meta.get("capture_passes")
    if isinstance(passes, int) and passes > 1:
        lines.append(f"  captured         {passes} times in a row; each op's times are the "
                     f"medians of its {passes}")
    overhead = meta.get("step_overhead")
    if isinstance(overhead, dict):
        lines.append(f"  step overhead    {describe_step_overhead(overhead)}")
    update = meta.get("optimizer_step")
    if isinstance(update, dict):
        lines.append(f"  optimizer step   {describe_optimizer_step(update)}")
    path = s["critical_path"]
    shown = " -> ".join(path if len(path) <= 6 else [*path[:3], "...", *path[-2:]])
    lines.append(f"  critical path    {format_duration(s['critical_path_s'])} over "
                 f"{s['critical_path_ops']} ops: {shown}")
    if s["heaviest"]:
        lines.append(f"  heaviest {min(top, len(s['heaviest']))} ops:")
        width = max(len(h["name"]) for h in s["heaviest"])
        for h in s["heaviest"]:
            lines.append(f"    {h['name']:<{width}}  {format_duration(h['compute_s']):>10}  "
                         f"{100 * h['share']:5.1f}%  {format_flops(h['flops']):>12}  "
                         f"{h['module'] or '-'}  {h['target']}")
    return "\n".join(lines)
