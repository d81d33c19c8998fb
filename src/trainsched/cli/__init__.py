"""The ``trainsched`` command line: parses, calls the library, prints.

One module per verb (``profile``, ``show``, ...), each with ``add_parser(sub)`` declaring its
arguments and ``run(args) -> int``; :data:`VERBS` lists them in the order ``--help`` shows.
Their text output is formatted by :mod:`trainsched.report`. User errors
(:class:`TrainschedError`) print one line on stderr and exit with status 2; ``--json`` prints
machine-readable results on stdout. torch is imported only by the verbs that need it, when they
run. Outside this package only the entry points (the ``trainsched`` script,
``python -m trainsched``) use it, through :func:`main`.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from trainsched import __version__
from trainsched.cli import (
    calibrate,
    cluster,
    compare,
    models,
    place,
    profile,
    show,
    simulate,
    train,
)
from trainsched.errors import TrainschedError

#: The verb modules, in the order the top-level ``--help`` lists them.
VERBS = (profile, show, cluster, simulate, place, compare, calibrate, train, models)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trainsched", description="Schedule deep-learning training on PyTorch: capture "
        "a model, describe a cluster, and (in later commands) place, order and simulate.")
    parser.add_argument("--version", action="version", version=f"trainsched {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for verb in VERBS:
        verb.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except TrainschedError as exc:
        print(f"trainsched: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("trainsched: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (e.g. `| head`): stop quietly, as Unix tools do.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
