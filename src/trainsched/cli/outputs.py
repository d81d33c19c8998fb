"""Output folders: checked before the long work starts, never left half-written.

:func:`check_writable_dir` fails early (one line naming the flag) when a folder the command will
write cannot be: a regular file is in the way, a parent is missing or read-only.
:class:`OutputDir` is ``compare``'s ``--out-dir``: a folder that does not exist yet is written
as a hidden temporary sibling and renamed into place only once every file is in it, so a failure,
Ctrl-C or SIGTERM leaves no folder at all; an existing folder gets each file atomically and
nothing else in it is touched, nor any file the command reads (an input never becomes an output).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from trainsched.errors import TrainschedError


def check_writable_dir(path: str | os.PathLike[str], flag: str) -> None:
    """Fail unless files can be created in folder ``path``, or ``path`` can be created: the
    folder (or the nearest existing folder above it) is probed with a file that is removed at
    once, so a read-only file system is caught even where permission bits say yes."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise TrainschedError(f"{flag} {path}: exists and is not a directory; give a new or "
                              "an existing directory")
    base = _nearest_existing(path)
    if not base.is_dir():
        raise TrainschedError(f"{flag} {path}: {base} is not a directory")
    try:
        fd, probe = tempfile.mkstemp(dir=base, prefix=".trainsched-probe-")
    except OSError as exc:
        where = "" if base == Path(os.path.abspath(path)) else f" in {base}"
        raise TrainschedError(f"{flag} {path}: cannot write{where}: {exc.strerror}") from None
    os.close(fd)
    os.unlink(probe)


def _nearest_existing(path: Path) -> Path:
    """``path`` itself if it exists, else the closest folder above it that does."""
    absolute = Path(os.path.abspath(path))
    return next(p for p in (absolute, *absolute.parents) if p.exists())


class OutputDir:
    """The folder a command writes its results into, all at once at the end.

    Built before the work (``OutputDir(args.out_dir, "--out-dir", inputs=[...])`` checks it
    can be written; :meth:`check_names` the names known then); at the end,
    ``with out.writing(names) as folder:`` write each named file into ``folder``. ``inputs`` are
    the files the command reads: a name that would land on one of them is refused before
    anything is written.
    """

    def __init__(self, path: str | os.PathLike[str], flag: str,
                 inputs: Iterable[str | os.PathLike[str] | None] = ()) -> None:
        self.path = Path(path)
        self.flag = flag
        self.inputs = [Path(p) for p in inputs if p is not None]
        check_writable_dir(self.path, flag)

    @contextlib.contextmanager
    def writing(self, names: Iterable[str]) -> Iterator[Path]:
        """The folder to write ``names`` into (each with an atomic write): the output folder
        itself when it already exists, else a temporary sibling renamed to it when the block
        ends; on any failure or interrupt the temporary folder, and any parent folder made for
        it, is removed."""
        names = list(names)
        self._check_inputs(names)
        if self.path.is_dir():
            yield self.path
            return
        made = self._make_parents()
        try:
            staging = Path(tempfile.mkdtemp(dir=self.path.parent, prefix=f".{self.path.name}.",
                                            suffix=".tmp"))
        except OSError as exc:
            _remove_empty(made)
            raise TrainschedError(f"{self.flag} {self.path}: cannot create it: "
                                  f"{exc.strerror}") from None
        try:
            yield staging
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            _remove_empty(made)
            raise
        try:
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(staging, 0o777 & ~umask)  # mkdtemp made it private
            os.rename(staging, self.path)
        except BaseException as exc:  # an interrupt between the two steps included
            shutil.rmtree(staging, ignore_errors=True)
            _remove_empty(made)
            if isinstance(exc, OSError):
                raise TrainschedError(f"{self.flag} {self.path}: cannot create it: "
                                      f"{exc.strerror}") from None
            raise

    def check_names(self, names: Iterable[str]) -> None:
        """Refuse now (before the long work) names that would overwrite an input."""
        self._check_inputs(list(names))

    def _check_inputs(self, names: list[str]) -> None:
        for name in names:
            target = self.path / name
            for source in self.inputs:
                if _same_file(target, source):
                    raise TrainschedError(
                        f"{self.flag} {self.path}: writing {name} there would overwrite the "
                        f"input {source}; give another {self.flag}")

    def _make_parents(self) -> list[Path]:
        """Create the missing folders above the output folder; those made, deepest first."""
        made = []
        for parent in Path(os.path.abspath(self.path)).parents:
            if parent.exists():
                break
            made.append(parent)
        try:
            for folder in reversed(made):
                folder.mkdir()
        except OSError as exc:
            _remove_empty(made)
            raise TrainschedError(f"{self.flag} {self.path}: cannot create {exc.filename}: "
                                  f"{exc.strerror}") from None
        return made


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.abspath(a) == os.path.abspath(b)


def _remove_empty(folders: list[Path]) -> None:
    """Remove the folders (deepest first) that are still empty."""
    for folder in folders:
        with contextlib.suppress(OSError):
            folder.rmdir()
