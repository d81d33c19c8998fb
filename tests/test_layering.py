"""The dependency rule: only capture/ (and later runtime/) may import torch."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import trainsched

TORCH_PACKAGES = ("trainsched.capture", "trainsched.runtime")


def _torch_free_modules() -> list[str]:
    names = []
    for info in pkgutil.walk_packages(trainsched.__path__, "trainsched."):
        if not info.name.startswith(TORCH_PACKAGES):
            names.append(info.name)
    return sorted(names)


def test_policy_modules_import_without_torch():
    modules = _torch_free_modules()
    assert "trainsched.graph" in modules and "trainsched.cli" in modules
    code = ("import sys\n"
            "sys.modules['torch'] = None  # any 'import torch' now raises ImportError\n"
            f"for name in {modules!r}:\n"
            "    __import__(name)\n"
            "print('ok')\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_cli_show_and_cluster_work_without_torch(tmp_path):
    code = ("import sys\n"
            "sys.modules['torch'] = None\n"
            "from trainsched.cli import main\n"
            "sys.exit(main(['cluster', 'dgx-h100:2', '--json']))\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert '"nodes": 2' in result.stdout
