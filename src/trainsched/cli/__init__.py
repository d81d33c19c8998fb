"""The ``trainsched`` command line: parses, calls the library, prints.

One module per verb (``profile``, ``show``, ...), each with ``add_parser(sub)`` declaring its
arguments and ``run(args) -> int``; :data:`VERBS` lists them in the order ``--help`` shows.
Their text output is formatted by :mod:`trainsched.report`. User errors
(:class:`TrainschedError`, and an operating-system error about a path the user gave) print one
line on stderr and exit with status 2; Ctrl-C or SIGTERM prints one line and exits with 130 or
143; ``--json`` prints machine-readable results on stdout, or on failure the error object of
:mod:`trainsched.cli.failures`. Any other exception is a bug and keeps its traceback. torch is
imported only by the verbs that need it, when they run. Outside this package only the entry
points (the ``trainsched`` script, ``python -m trainsched``) use it, through :func:`main`.
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
    search_sync,
    show,
    simulate,
    train,
)
from trainsched.cli.failures import (
    Parser,
    Terminated,
    UsageExit,
    json_error,
    report,
    sigterm_interrupts,
    user_os_error,
)
from trainsched.errors import TrainschedError

#: The verb modules, in the order the top-level ``--help`` lists them.
VERBS = (profile, show, cluster, simulate, place, compare, calibrate, train, search_sync,
         models)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="trainsched", description="Schedule deep-learning training on PyTorch: capture "
        "a model, describe a cluster, compare every strategy's plan, simulate and run plans.")
    parser.add_argument("--version", action="version", version=f"trainsched {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for verb in VERBS:
        verb.add_parser(sub)
    parser.verbs = dict(sub.choices)  # name -> the verb's parser
    return parser


#: ``--flag -3GB`` is the value -3GB, not an unknown option ``-3GB``: no option starts with a
#: dash and a digit, so argparse's reading of it as an option is only ever wrong.
def _values_that_look_negative(argv: list[str]) -> list[str]:
    """``argv`` with each ``--flag -<digit>...`` pair joined as ``--flag=-<digit>...``."""
    out: list[str] = []
    k = 0
    while k < len(argv):
        token = argv[k]
        following = argv[k + 1] if k + 1 < len(argv) else ""
        if (token.startswith("--") and "=" not in token and len(following) > 1
                and following[0] == "-" and following[1].isdigit()):
            out.append(f"{token}={following}")
            k += 2
            continue
        out.append(token)
        k += 1
    return out


def main(argv: Sequence[str] | None = None) -> int:
    argv = _values_that_look_negative(list(sys.argv[1:] if argv is None else argv))
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except UsageExit as exc:
        if "--json" in argv:
            json_error(exc.message, "usage_error")
        raise
    json_out = bool(getattr(args, "json", False))
    try:
        with sigterm_interrupts():
            return args.func(args)
    except TrainschedError as exc:
        report(str(exc), "user_error", json_out=json_out)
        return 2
    except KeyboardInterrupt as exc:
        word = "terminated" if isinstance(exc, Terminated) else "interrupted"
        report(word, "interrupted", json_out=json_out, line=f"trainsched: {word}")
        return 143 if isinstance(exc, Terminated) else 130
    except BrokenPipeError:
        # The reader went away (e.g. `| head`): stop quietly, as Unix tools do.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except OSError as exc:
        message = user_os_error(exc, args)
        if message is None:  # not about a path the user gave: a bug, keep the traceback
            raise
        report(message, "file_error", json_out=json_out)
        return 2
