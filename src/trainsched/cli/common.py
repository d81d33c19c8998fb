"""What several verbs share: the ``--json`` and tuner flags, their parsing, and small helpers.

Kept light (no library imports at module level) so that building the parser stays cheap and
torch-free; each helper imports what it needs when called.
"""

from __future__ import annotations

import argparse
import contextlib
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

from trainsched.errors import TrainschedError


class Subcommands(Protocol):
    """What a verb's ``add_parser`` is given: the object ``add_subparsers()`` returns."""

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser: ...


def add_json(p: argparse.ArgumentParser) -> None:
    """The ``--json`` flag every verb has."""
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")


def add_tune_args(p: argparse.ArgumentParser, flag: str) -> None:
    """The tuner's flags (trials, ranges, seed), their help naming ``flag`` that enables it."""
    p.add_argument("--tune-trials", type=int, default=15,
                   help=f"{flag}: trials (the first 10 random, the rest guided)")
    p.add_argument("--tune-partition", default="1MiB-128MiB", help=f"{flag}: LOW-HIGH")
    p.add_argument("--tune-credit", default="1MiB-256MiB", help=f"{flag}: LOW-HIGH")
    p.add_argument("--tune-seed", type=int, default=0, help=f"{flag}: sampler seed")


def dump(doc: Any) -> str:
    """``doc`` as the CLI's JSON: indented, keys sorted."""
    return json.dumps(doc, indent=2, sort_keys=True)


@contextlib.contextmanager
def error_context(what: str) -> Iterator[None]:
    """Prefix user errors raised inside with what was being worked on."""
    try:
        yield
    except TrainschedError as exc:
        raise TrainschedError(f"{what}: {exc}") from exc


def check_output_dir(output: str | None) -> None:
    """Fail before long work when ``-o``'s directory does not exist."""
    if output:
        parent = Path(output).resolve().parent
        if not parent.is_dir():
            raise TrainschedError(f"-o {output}: directory {parent} does not exist")


def parse_credit(text: str) -> float:
    """A ``--credit`` value: a size, or ``inf``/``unlimited``."""
    from trainsched.units import parse_size

    return float("inf") if text.strip().lower() in ("inf", "unlimited") else parse_size(text)


def given(args: argparse.Namespace, names: Sequence[str]) -> list[str]:
    """Which of the options ``names`` (argparse destinations) were given, as flags."""
    return [f"--{n.replace('_', '-')}" for n in names if getattr(args, n) not in (None, False)]


def tune_ranges(args: argparse.Namespace) -> tuple[tuple[int, int], tuple[int, int]]:
    """``--tune-partition`` and ``--tune-credit``, each LOW-HIGH, in bytes."""
    from trainsched.units import parse_size

    ranges = []
    for flag, text in (("--tune-partition", args.tune_partition),
                       ("--tune-credit", args.tune_credit)):
        r = tuple(parse_size(v) for v in text.split("-", 1)) if "-" in text else None
        if r is None or not 0 < r[0] <= r[1]:
            raise TrainschedError(f"{flag} takes LOW-HIGH with 0 < LOW <= HIGH, e.g. "
                                  f"1MiB-64MiB")
        ranges.append(r)
    if args.tune_trials < 1:
        raise TrainschedError(f"--tune-trials must be >= 1, got {args.tune_trials}")
    return ranges[0], ranges[1]


def training_graph(path: str, optimizer: str) -> Any:
    """A graph file as a training graph: a forward graph gets its backward and optimizer ops."""
    from trainsched.graph import Graph, to_training

    graph = Graph.load(path)
    if all(op.kind == "forward" for op in graph.ops):
        graph = to_training(graph, optimizer=optimizer)
    return graph
