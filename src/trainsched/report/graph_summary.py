"""A graph's summary (``trainsched show`` and ``profile``): the facts as a JSON-ready dict, and
the same facts as the text the CLI prints."""

from __future__ import annotations

from typing import Any

from trainsched.units import format_duration, format_flops, format_size


def graph_summary(graph: Any, top: int = 10) -> dict[str, Any]:
    """Counts, totals, the critical path and the ``top`` heaviest ops of a :class:`Graph`."""
    totals = graph.totals()
    length_s, path = graph.critical_path()
    heavy = graph.heaviest(top)
    total_s = totals.compute_s or 1.0
    return {
        "meta": graph.meta,
        "ops": len(graph.ops),
        "edges": len(graph.edges),
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
        "heaviest": [{"name": op.name, "kind": op.kind, "module": op.module_path,
                      "target": op.target, "compute_s": op.compute_s, "flops": op.flops,
                      "share": op.compute_s / total_s} for op in heavy],
    }


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
