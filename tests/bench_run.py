"""Running a benchmark script as the slow smoke tests do: a subprocess with one intra-op
thread, its results file read back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def run_benchmark(script: str, *args: str, out: Path,
                  timeout_s: float = 580) -> tuple[subprocess.CompletedProcess[str], Any]:
    """Run ``benchmarks/<script>`` with ``args`` and ``--out out``; assert it exited 0 and
    return the process and the results file's JSON."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args,
                           "--out", str(out)],
                          env=env, capture_output=True, text=True, timeout=timeout_s)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc, json.loads(out.read_text())
