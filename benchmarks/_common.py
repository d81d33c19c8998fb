"""What every benchmark script shares: the machine it ran on and how results are written."""

from __future__ import annotations

import json
import platform
from pathlib import Path
from typing import Any


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
