"""Every verb's ``--help`` text, and the top-level one, pinned against golden files.

The goldens live in ``tests/golden/help/<verb>.txt`` (``trainsched.txt`` is the top-level help).
After changing a flag or its help, regenerate them and review the diff:

    TRAINSCHED_UPDATE_GOLDEN=1 pytest tests/test_cli_help.py

which rewrites every golden, deletes those of verbs that are gone, and records the Python
version in ``PYTHON_VERSION``. argparse lays out help differently across Python versions, so the
texts are compared only on the Python minor version that wrote them (the set of verbs always).
The terminal width is fixed at 100 columns so argparse wraps the same way everywhere.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
from pathlib import Path

import pytest

from trainsched.cli import VERBS, main

GOLDEN = Path(__file__).parent / "golden" / "help"
VERSION_FILE = GOLDEN / "PYTHON_VERSION"
TOP = "trainsched"  # the golden of the top-level --help
UPDATE = os.environ.get("TRAINSCHED_UPDATE_GOLDEN") == "1"
PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"
NAMES = [verb.NAME for verb in VERBS]


@pytest.fixture(autouse=True)
def fixed_terminal(monkeypatch):
    """100 columns, no colour (newer Pythons colour help on a terminal)."""
    monkeypatch.setenv("COLUMNS", "100")
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    monkeypatch.delenv("PYTHON_COLORS", raising=False)


def help_text(name: str) -> str:
    """What ``trainsched <name> --help`` (or ``trainsched --help`` for TOP) prints."""
    argv = ["--help"] if name == TOP else [name, "--help"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 0
    return out.getvalue()


def write_golden(name: str) -> None:
    GOLDEN.mkdir(parents=True, exist_ok=True)
    (GOLDEN / f"{name}.txt").write_text(help_text(name))
    VERSION_FILE.write_text(PYTHON + "\n")


def golden_names() -> set[str]:
    return {path.stem for path in GOLDEN.glob("*.txt")}


def test_every_verb_has_a_golden_and_every_golden_a_verb():
    expected = {*NAMES, TOP}
    if UPDATE:
        for stale in golden_names() - expected:
            (GOLDEN / f"{stale}.txt").unlink()
        for name in sorted(expected - golden_names()):
            write_golden(name)
    assert golden_names() == expected, (
        "the verbs and tests/golden/help/*.txt differ; regenerate with "
        "TRAINSCHED_UPDATE_GOLDEN=1 pytest tests/test_cli_help.py")


@pytest.mark.parametrize("name", [TOP, *NAMES])
def test_help_matches_its_golden(name):
    if UPDATE:
        write_golden(name)
    written_by = VERSION_FILE.read_text().strip()
    if written_by != PYTHON:
        pytest.skip(f"goldens written by Python {written_by}, running {PYTHON}: argparse's "
                    f"layout differs across versions")
    assert help_text(name) == (GOLDEN / f"{name}.txt").read_text(), (
        f"`trainsched {name} --help` changed; if intended, regenerate with "
        "TRAINSCHED_UPDATE_GOLDEN=1 pytest tests/test_cli_help.py and review the diff")
