"""The dependency rules: only capture/ and runtime/ import torch; runtime/ never imports sim/;
the policy packages import neither sim/ nor runtime/; no module imports another package's
private names."""

from __future__ import annotations

import ast
import pkgutil
import subprocess
import sys
from pathlib import Path

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


# --- the package rules, read from the source (imports inside functions count too) ----------

SRC = Path(trainsched.__file__).parent
POLICY_PACKAGES = ("comm", "backprop", "placement", "sync")


def _imports() -> list[tuple[str, str, tuple[str, ...]]]:
    """(importing module, imported module, names) for every import in the package."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        parts = path.relative_to(SRC.parent).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        package = module if parts[-1] == "__init__" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found += [(module, alias.name, ()) for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: resolve against this module's package
                    anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, *([base] if base else [])])
                found.append((module, base, tuple(a.name for a in node.names)))
    return found


def _top(module: str) -> str:
    """The first-level package (or module) of trainsched a module belongs to."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "trainsched" else ""


def _breaches(importers: tuple[str, ...], forbidden: tuple[str, ...]) -> list[str]:
    return [f"{src} imports {dst}" for src, dst, _ in _imports()
            if _top(src) in importers and _top(dst) in forbidden]


def test_the_runtime_never_imports_the_simulator():
    assert _breaches(("runtime",), ("sim",)) == []


def test_policy_packages_never_import_the_simulator_or_the_runtime():
    assert _breaches(POLICY_PACKAGES, ("sim", "runtime")) == []


def test_no_module_imports_another_packages_private_names():
    breaches = []
    for src, dst, names in _imports():
        if not dst.startswith("trainsched") or _top(src) == _top(dst):
            continue
        private = [n for n in names if n.startswith("_") and not n.startswith("__")]
        private += [p for p in dst.split(".") if p.startswith("_") and not p.startswith("__")]
        if private:
            breaches.append(f"{src} imports {', '.join(private)} from {dst}")
    assert breaches == []


def test_the_rules_see_a_breach(tmp_path):
    """The scanner itself: a runtime module importing the simulator is found."""
    path = SRC / "runtime" / "_layering_probe.py"
    path.write_text("def f():\n    from trainsched.sim import simulate\n"
                    "from trainsched.comm.policy import _check_bytes\n")
    try:
        assert _breaches(("runtime",), ("sim",)) == [
            "trainsched.runtime._layering_probe imports trainsched.sim"]
        private = [(s, d, n) for s, d, n in _imports() if s.endswith("_layering_probe")
                   and any(x.startswith("_") for x in n)]
        assert private == [("trainsched.runtime._layering_probe", "trainsched.comm.policy",
                            ("_check_bytes",))]
    finally:
        path.unlink()
