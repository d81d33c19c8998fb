"""The ``compare`` chart: throughput speedup per strategy as a horizontal bar chart (PNG).

matplotlib is optional and imported only when a chart is drawn; the PNG carries no software or
date metadata, so the same rows give the same bytes.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import TYPE_CHECKING

from trainsched.errors import TrainschedError
from trainsched.graph import atomic_write_bytes

if TYPE_CHECKING:
    from trainsched.compare import Row


def write_chart(path: str, rows: Sequence[Row], title: str) -> None:
    """A bar chart of throughput speedup per strategy, as PNG (needs matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise TrainschedError("writing the chart needs matplotlib (pip install matplotlib)") \
            from exc

    fig, ax = plt.subplots(figsize=(7, 0.5 * len(rows) + 1.5), dpi=100)
    names = [r.strategy for r in rows][::-1]
    values = [r.speedup for r in rows][::-1]
    colors = ["#c0392b" if r.oom else "#2e86c1" for r in rows][::-1]
    ax.barh(names, values, color=colors)
    ax.axvline(1.0, color="black", linewidth=0.8)
    for y, v in enumerate(values):
        ax.text(v, y, f" {v:.2f}x", va="center", fontsize=9)
    ax.set_xlim(0, 1.15 * max(values, default=1.0))  # room for the longest bar's label
    ax.set_xlabel("throughput speedup over one device (red: out of memory)")
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", metadata={"Software": None})
    plt.close(fig)
    atomic_write_bytes(path, buffer.getvalue())


def write_measured_chart(path: str, pairs: Sequence[tuple[str, float, float]],
                         title: str) -> None:
    """Predicted and measured step time per strategy (``(name, predicted_s, measured_s)``),
    side by side as horizontal bars, in milliseconds (PNG, needs matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise TrainschedError("writing the chart needs matplotlib (pip install matplotlib)") \
            from exc

    rows = list(pairs)[::-1]
    fig, ax = plt.subplots(figsize=(7, 0.7 * len(rows) + 1.5), dpi=100)
    ys = range(len(rows))
    ax.barh([y + 0.2 for y in ys], [1e3 * p for _, p, _ in rows], height=0.4,
            color="#85c1e9", label="predicted")
    ax.barh([y - 0.2 for y in ys], [1e3 * m for _, _, m in rows], height=0.4,
            color="#2e86c1", label="measured (mean)")
    ax.set_yticks(list(ys), [name for name, _, _ in rows])
    ax.set_xlabel("step time (ms)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", metadata={"Software": None})
    plt.close(fig)
    atomic_write_bytes(path, buffer.getvalue())
