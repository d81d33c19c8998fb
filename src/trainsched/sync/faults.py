"""Injected stragglers: the fault-injection text ``RANK:DELAY[:FROM-TO]`` as a value.

The runtime (which sleeps or slows a rank) and the simulator (which stretches the rank's step
times) read the same :class:`Straggler`:

* ``1:50ms`` — rank 1 takes 50 ms longer every step (a delay: any duration ``units`` reads);
* ``2:3x`` — rank 2's local step takes 3 times as long (a slowdown factor, ``x`` suffix);
* ``1:20ms@link`` — a delayed link: every message rank 1 sends (a push or pull to the
  parameter server, its part of an all-reduce round, a local-SGD average) leaves 20 ms late;
  its computation is not slowed. A link takes a delay, not a factor;
* ``2:3x:100-400`` — only for steps 100 to 399: the window is ``FROM-TO`` with ``TO``
  excluded, like a Python range (``100-`` runs from step 100 to the end).

A compute delay and a delayed link cost the same under BSP (one all-reduce per step), but not
under the server protocols (a push and a pull per step: twice the delay) nor under local SGD
(one average every H steps: a H-th of it).

Steps are the rank's own step count from the start of the run (0-based). Several stragglers
are written separated by commas (``1:50ms,2:3x:100-400``) and read by
:func:`parse_stragglers`; :func:`format_straggler` writes the canonical text back.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from trainsched.errors import TrainschedError
from trainsched.units import is_int, parse_duration

__all__ = ["Straggler", "format_straggler", "link_delay_s", "parse_straggler",
           "parse_stragglers", "slowed_s"]

_FORM = "RANK:DELAY[:FROM-TO], e.g. 1:50ms, 2:3x, 1:20ms@link or 2:3x:100-400"
#: The suffix of a delayed link's delay.
_LINK = "@link"


@dataclass(frozen=True, kw_only=True)
class Straggler:
    """Rank ``rank`` is slowed in steps ``from_step <= step < to_step`` (``to_step`` ``None``:
    to the end): by ``delay_s`` seconds added to each step, or by ``factor`` times its local
    time (exactly one of the two). With ``link``, ``delay_s`` delays every message the rank
    sends instead (a delayed link; its local time is untouched)."""

    rank: int
    delay_s: float | None = None
    factor: float | None = None
    from_step: int = 0
    to_step: int | None = None
    link: bool = False

    def __post_init__(self) -> None:
        if not (is_int(self.rank) and self.rank >= 0):
            raise TrainschedError(f"straggler: rank must be a whole number >= 0, got "
                                  f"{self.rank!r}")
        if (self.delay_s is None) == (self.factor is None):
            raise TrainschedError("straggler: give either a delay (seconds added per step) or "
                                  "a slowdown factor, not both or neither")
        value = self.delay_s if self.factor is None else self.factor
        if isinstance(value, bool) or not isinstance(value, int | float) or \
                not math.isfinite(value) or value < 0:
            raise TrainschedError(f"straggler: the delay or factor must be a finite number >= "
                                  f"0, got {value!r}")
        if not isinstance(self.link, bool):
            raise TrainschedError(f"straggler: link must be true or false, got {self.link!r}")
        if self.link and self.factor is not None:
            raise TrainschedError(f"straggler: a delayed link holds each message for a time "
                                  f"(e.g. {self.rank}:20ms@link), not a factor")
        if self.factor is not None and self.factor < 1:
            raise TrainschedError(f"straggler: a slowdown factor must be >= 1 (3x is three "
                                  f"times slower), got {self.factor!r}")
        if not (is_int(self.from_step) and self.from_step >= 0):
            raise TrainschedError(f"straggler: from_step must be a whole number >= 0, got "
                                  f"{self.from_step!r}")
        if self.to_step is not None and not (is_int(self.to_step)
                                             and self.to_step > self.from_step):
            raise TrainschedError(f"straggler: the window {self.from_step}-{self.to_step} is "
                                  f"empty; write FROM-TO with TO > FROM (TO excluded)")

    def active(self, step: int) -> bool:
        """Whether the rank is slowed in step ``step``."""
        return self.from_step <= step and (self.to_step is None or step < self.to_step)

    def local_s(self, step: int, base_s: float) -> float:
        """The rank's local time in ``step`` when it would take ``base_s`` unslowed (a delayed
        link leaves it alone)."""
        if self.link or not self.active(step):
            return base_s
        return base_s * self.factor if self.factor is not None else base_s + self.delay_s

    def message_s(self, step: int) -> float:
        """How long each message the rank sends in ``step`` is held (0 unless a delayed link
        active in that step)."""
        if not self.link or not self.active(step):
            return 0.0
        assert self.delay_s is not None
        return self.delay_s


def slowed_s(stragglers: Iterable[Straggler], rank: int, step: int, base_s: float) -> float:
    """``base_s`` with every straggler of ``rank`` active in ``step`` applied (in the order
    given: factors multiply, delays add)."""
    for s in stragglers:
        if s.rank == rank:
            base_s = s.local_s(step, base_s)
    return base_s


def link_delay_s(stragglers: Iterable[Straggler], rank: int, step: int) -> float:
    """How long each message ``rank`` sends in ``step`` is held: the delays of its delayed
    links active in that step, added."""
    return sum((s.message_s(step) for s in stragglers if s.rank == rank), 0.0)


def _fail(text: str, column: int, message: str) -> TrainschedError:
    return TrainschedError(f"straggler {text!r}, column {column}: {message}; write {_FORM}")


_FACTOR = re.compile(r"(\d+(?:\.\d*)?|\.\d+)x")
_WINDOW = re.compile(r"(\d+)-(\d*)")


def parse_straggler(text: str, *, column: int = 1, source: str | None = None) -> Straggler:
    """The straggler written ``text`` (``RANK:DELAY[:FROM-TO]``); errors give the column (1-based,
    counted from ``column``) of the part that is wrong, quoting ``source`` (the whole text
    ``text`` is part of; default ``text``)."""
    whole = text if source is None else source
    if not isinstance(text, str):
        raise TrainschedError(f"straggler: expected text like {_FORM}, got {text!r}")
    parts = text.split(":")
    starts = [column]
    for part in parts[:-1]:
        starts.append(starts[-1] + len(part) + 1)
    if len(parts) not in (2, 3):
        at = starts[3] - 1 if len(parts) > 3 else column + len(text)
        raise _fail(whole, at, f"expected 2 or 3 parts separated by ':', got {len(parts)}")
    rank_text, delay_text = parts[0].strip(), parts[1].strip()
    if not rank_text.isdigit():
        raise _fail(whole, starts[0], f"the rank must be a whole number >= 0, got {rank_text!r}")
    options: dict[str, object] = {"rank": int(rank_text)}
    at = delay_text.find("@")
    if at >= 0:
        suffix = delay_text[at:]
        where = starts[1] + (len(parts[1]) - len(parts[1].lstrip())) + at
        if suffix.lower() != _LINK:
            raise _fail(whole, where, f"a delay may be put on the rank's link only "
                                      f"({_LINK}), got {suffix!r}")
        delay_text = delay_text[:at].strip()
        options["link"] = True
        if _FACTOR.fullmatch(delay_text.lower()):
            raise _fail(whole, starts[1], f"a delayed link holds each message for a time "
                                          f"(e.g. 20ms{_LINK}), not a factor ({delay_text})")
    factor = _FACTOR.fullmatch(delay_text.lower())
    if factor is not None:
        options["factor"] = float(factor.group(1))
    else:
        try:
            options["delay_s"] = parse_duration(delay_text)
        except TrainschedError as exc:
            raise _fail(whole, starts[1], f"the delay must be a duration (50ms) or a factor "
                                         f"(3x): {exc}") from None
    if len(parts) == 3:
        window = _WINDOW.fullmatch(parts[2].strip())
        if window is None:
            raise _fail(whole, starts[2], f"the step window must be FROM-TO or FROM-, got "
                                         f"{parts[2]!r}")
        options["from_step"] = int(window.group(1))
        options["to_step"] = int(window.group(2)) if window.group(2) else None
    try:
        return Straggler(**options)  # type: ignore[arg-type]
    except TrainschedError as exc:
        raise TrainschedError(f"straggler {whole!r}, column {column}: {exc}") from None


def parse_stragglers(text: str | Sequence[str]) -> tuple[Straggler, ...]:
    """Stragglers separated by commas (``1:50ms,2:3x:100-400``), or a list of such texts (a
    repeated command-line flag)."""
    items = [text] if isinstance(text, str) else list(text)
    out = []
    for item in items:
        column = 1
        for part in item.split(","):
            out.append(parse_straggler(part, column=column, source=item))
            column += len(part) + 1
    return tuple(out)


def format_straggler(straggler: Straggler) -> str:
    """The canonical text of ``straggler`` (read back equal by :func:`parse_straggler`)."""
    if straggler.factor is not None:
        how = f"{straggler.factor!r}x"
    else:
        assert straggler.delay_s is not None
        how = f"{straggler.delay_s!r}s" + (_LINK if straggler.link else "")
    window = ""
    if straggler.from_step or straggler.to_step is not None:
        end = "" if straggler.to_step is None else str(straggler.to_step)
        window = f":{straggler.from_step}-{end}"
    return f"{straggler.rank}:{how}{window}"
