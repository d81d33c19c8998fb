"""How a command ends when it fails: one line on stderr, an exit status, and with ``--json`` an
error object on stdout.

:func:`report` prints a failure the same way for every verb (with ``--json`` also
:func:`json_error`'s ``{"error": ..., "kind": ...}`` on stdout; :data:`KINDS` lists the kinds).
:func:`user_os_error` tells an operating-system error about a path the user gave (a read-only
folder, a full disk) from one about any other path, which is a bug and keeps its traceback.
:func:`sigterm_interrupts` turns SIGTERM into :class:`Terminated`, a :class:`KeyboardInterrupt`,
so that the clean-up that runs on Ctrl-C (removing half-written output, stopping workers) runs
on ``kill`` too.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

#: The ``kind`` of a JSON error object, and what it means.
KINDS = {
    "usage_error": "the command line itself is wrong (unknown flag, missing argument)",
    "user_error": "an input is wrong: the message says which and how to fix it",
    "file_error": "the system refused a file or folder the user named (permissions, full disk)",
    "interrupted": "stopped by Ctrl-C (SIGINT) or SIGTERM before it finished",
}

#: Errors the user can fix when they are about a path they gave.
USER_ERRNOS = frozenset(
    getattr(errno, name) for name in ("EACCES", "EPERM", "EROFS", "ENOSPC", "EDQUOT",
                                      "ENOTDIR", "EISDIR", "ENAMETOOLONG", "ELOOP", "ENOENT",
                                      "EEXIST", "ENOTEMPTY")
    if hasattr(errno, name))


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived (raised by the handler :func:`sigterm_interrupts` installs)."""


class UsageExit(SystemExit):
    """argparse's exit on a bad command line, keeping its message for the JSON error."""

    def __init__(self, message: str) -> None:
        super().__init__(2)
        self.message = message


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """``--help`` shows each option's default, unless its help already says it or it has none
    (``None``, ``False``)."""

    def _get_help_string(self, action: argparse.Action) -> str:  # argparse's extension point
        text = action.help or ""
        default = action.default
        if (action.option_strings and default not in (None, False, argparse.SUPPRESS)
                and "default" not in text):
            text += " (default: %(default)s)"
        return text


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors raise :class:`UsageExit` (after printing what
    argparse prints) so that ``main`` can add the JSON error object; its sub-parsers are of
    this class too. ``--help`` shows defaults (:class:`DefaultsHelpFormatter`); ``options``
    lists the actions added, in order."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", DefaultsHelpFormatter)
        self.options: list[argparse.Action] = []  # before __init__, which adds --help
        super().__init__(*args, **kwargs)

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        action = super().add_argument(*args, **kwargs)
        self.options.append(action)
        return action

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise UsageExit(message)


def report(message: str, kind: str, *, json_out: bool, line: str | None = None) -> None:
    """The failure's line on stderr (``trainsched: error: MESSAGE`` unless ``line`` is given)
    and, with ``json_out``, its :func:`json_error` on stdout."""
    with contextlib.suppress(OSError):
        sys.stdout.flush()
    print(line if line is not None else f"trainsched: error: {message}", file=sys.stderr)
    if json_out:
        json_error(message, kind)


def json_error(message: str, kind: str) -> None:
    """``{"error": MESSAGE, "kind": KIND}`` on one line of stdout (``kind`` from :data:`KINDS`)."""
    assert kind in KINDS, kind
    with contextlib.suppress(OSError):
        print(json.dumps({"error": message, "kind": kind}, sort_keys=True), flush=True)


def user_paths(args: argparse.Namespace) -> list[str]:
    """Every string option and argument of the command: the paths the user may have given."""
    return [v for v in vars(args).values() if isinstance(v, str) and v]


def user_os_error(exc: OSError, args: argparse.Namespace) -> str | None:
    """The one-line message of ``exc`` when it is about a path the user gave (or, except for a
    missing file, a file inside a folder they gave) and is theirs to fix; ``None`` otherwise."""
    if exc.errno not in USER_ERRNOS:
        return None
    given = [os.path.abspath(p) for p in user_paths(args)]
    for name in (exc.filename, exc.filename2):
        if not isinstance(name, (str, os.PathLike)):
            continue
        path = Path(os.path.abspath(name))
        for mine in given:
            inside = exc.errno != errno.ENOENT and Path(mine) in path.parents
            if str(path) == mine or inside:
                return f"{name}: {exc.strerror or exc}"
    return None


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """While inside, SIGTERM raises :class:`Terminated` in the main thread (once: a second
    SIGTERM kills as usual). Does nothing outside the main thread or under torchrun, whose
    workers are stopped by their launcher."""
    if (threading.current_thread() is not threading.main_thread()
            or "TORCHELASTIC_RUN_ID" in os.environ):
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        raise Terminated

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:  # None: the handler was set outside Python, restore the default then
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
