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

import argparse
import contextlib
import io
import os
import sys
from pathlib import Path

import pytest

from trainsched.cli import VERBS, build_parser, main

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


def _option_block(help_text: str, option: str) -> str:
    """The lines of ``--help`` that describe ``option`` (its line and the indented ones after)."""
    lines = help_text.splitlines()
    start = next(k for k, line in enumerate(lines) if line.lstrip().startswith(option))
    block = [lines[start]]
    for line in lines[start + 1:]:
        if not line.startswith(" " * 10) or line.lstrip().startswith("-"):
            break
        block.append(line)
    return "\n".join(block)


def test_every_option_with_a_default_shows_it(monkeypatch):
    """Walk every verb's options: one with a default other than None/False says it in --help."""
    monkeypatch.setenv("COLUMNS", "100")
    parser = build_parser()
    checked = 0
    for verb, sub in parser.verbs.items():
        text = sub.format_help()
        for action in sub.options:
            if (not action.option_strings or action.help == argparse.SUPPRESS
                    or action.default in (None, False, argparse.SUPPRESS)):
                continue
            block = _option_block(text, action.option_strings[-1])
            assert "default" in block, f"{verb} {action.option_strings[-1]}: {block}"
            checked += 1
    assert checked >= 10  # the walk saw the options (a broken walk checks nothing)


def test_former_spellings_still_parse_but_are_hidden(monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    parser = build_parser()
    old = parser.parse_args(["train", "mlp", "--nproc", "3", "--comm", "fifo",
                             "--timeline", "t"])
    new = parser.parse_args(["train", "mlp", "--ranks", "3", "--comm-policy", "fifo",
                             "--trace-dir", "t"])
    assert (old.ranks, old.comm_policy, old.trace_dir) == (new.ranks, new.comm_policy,
                                                          new.trace_dir) == (3, "fifo", "t")
    for verb, former in (("train", "--nproc"), ("train", "--timeline"), ("place", "--comm"),
                         ("cluster", "--comm")):
        assert former not in parser.verbs[verb].format_help()
    assert parser.parse_args(["place", "g.json", "--cluster", "cpu", "--comm",
                              "sequential"]).channels == "sequential"
