"""Registries: the one list of names for each kind of policy.

A :class:`Registry` maps names to entries (a policy class, a schedule generator, a placer) in
registration order, with optional tags per name (``compare=True``: the strategy appears as a
row of ``trainsched compare``). The command line's choices, ``compare``'s rows and the runtime
read the registries; nothing else lists the names, so a new policy is one :meth:`register` call.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import Any, Generic, TypeVar

from trainsched.errors import TrainschedError

__all__ = ["Registry"]

T = TypeVar("T")


class Registry(Mapping[str, T], Generic[T]):
    """Names (lower case) -> entries, in registration order; ``what`` and ``plural`` name the
    kind in errors (``"comm policy"``, ``"policies"``)."""

    def __init__(self, what: str, plural: str) -> None:
        self.what = what
        self.plural = plural
        self._entries: dict[str, T] = {}
        self._tags: dict[str, Mapping[str, Any]] = {}

    def register(self, name: str, entry: T, *, replace: bool = False, **tags: Any) -> T:
        """Add ``entry`` as ``name``; a name taken already is an error unless ``replace``."""
        if not (isinstance(name, str) and name and name == name.strip().lower()):
            raise TrainschedError(f"a {self.what} name must be a non-empty lower-case string "
                                  f"without surrounding spaces, got {name!r}")
        if name in self._entries and not replace:
            raise TrainschedError(f"{self.what} {name!r} is registered already; pass "
                                  f"replace=True to redefine it")
        self._entries[name] = entry
        self._tags[name] = MappingProxyType(dict(tags))
        return entry

    def unregister(self, name: str) -> None:
        """Remove ``name`` (a test's temporary registration, say)."""
        self.lookup(name)
        del self._entries[name]
        del self._tags[name]

    def lookup(self, name: str) -> T:
        """The entry of ``name`` (case-insensitive), or an error listing the known names."""
        key = name.strip().lower() if isinstance(name, str) else name
        if key not in self._entries:
            raise TrainschedError(f"unknown {self.what} {name!r}; known {self.plural}: "
                                  f"{', '.join(self._entries)}")
        return self._entries[key]

    def tags(self, name: str) -> Mapping[str, Any]:
        self.lookup(name)
        return self._tags[name]

    def tagged(self, tag: str) -> tuple[str, ...]:
        """The names whose tag ``tag`` is set (truthy), in registration order."""
        return tuple(n for n in self._entries if self._tags[n].get(tag))

    def __getitem__(self, name: str) -> T:
        return self._entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"<Registry of {self.what}: {', '.join(self._entries)}>"
