"""Action and Schedule: the per-rank ordered action lists of a pipeline plan.

A :class:`Schedule` is a per-rank ordered list of :class:`Action` s (``0F0 0F1 0B0 ...``),
written like PyTorch pipelining writes them, so the same schedule moves between trainsched's text
form, PyTorch's CSV files and its runtime. :meth:`Schedule.validate` proves a schedule complete
and deadlock-free before the simulator or the runtime executes it (``docs/plans.md``).
"""


from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from trainsched.errors import TrainschedError
from trainsched.units import is_int

COMPUTE_KINDS = ("F", "I", "W", "B")
COMM_KINDS = ("SEND_F", "RECV_F", "SEND_B", "RECV_B")
# Stage-level actions PyTorch writes in its "compute_comms" CSVs; they take no micro-batch.
STAGE_KINDS = ("UNSHARD", "RESHARD", "REDUCE_GRAD")
ACTION_KINDS = COMPUTE_KINDS + COMM_KINDS + STAGE_KINDS

_ACTION_RE = re.compile(r"([0-9]+)(" + "|".join(ACTION_KINDS) + r")([0-9]*)")
_MAX_LISTED = 20  # problems shown in one error message



# --- Action ------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Action:
    """One scheduled thing on a rank: ``kind`` for pipeline ``stage`` and ``microbatch``.

    Kinds: ``F`` forward, ``I`` input-gradient backward, ``W`` weight-gradient backward, ``B``
    full backward (I then W fused); ``SEND_F``/``RECV_F`` move activations to/into a stage,
    ``SEND_B``/``RECV_B`` gradients; ``UNSHARD``/``RESHARD``/``REDUCE_GRAD`` are stage-level
    (no micro-batch) and accepted so that PyTorch's own CSV files load. ``str(action)`` is
    PyTorch's text form (``1F3``, ``0SEND_B2``, ``1REDUCE_GRAD``); :meth:`parse` reads it back.
    """

    stage: int
    kind: str
    microbatch: int | None = None

    def __post_init__(self) -> None:
        if not is_int(self.stage) or self.stage < 0:
            raise TrainschedError(f"action stage must be an integer >= 0, got {self.stage!r}")
        if self.kind not in ACTION_KINDS:
            raise TrainschedError(
                f"unknown action kind {self.kind!r}; expected one of {', '.join(ACTION_KINDS)}"
            )
        if self.kind in STAGE_KINDS:
            if self.microbatch is not None:
                raise TrainschedError(
                    f"action {self.stage}{self.kind} takes no micro-batch, "
                    f"got {self.microbatch!r}"
                )
        elif not is_int(self.microbatch) or self.microbatch < 0:
            raise TrainschedError(
                f"action {self.stage}{self.kind}: micro-batch must be an integer >= 0, "
                f"got {self.microbatch!r}"
            )

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{'' if self.microbatch is None else self.microbatch}"

    @classmethod
    def parse(cls, token: str) -> Action:
        """Read the text form ``<stage><kind><micro-batch>``, e.g. ``1F3`` or ``0SEND_B2``."""
        match = _ACTION_RE.fullmatch(token.strip()) if isinstance(token, str) else None
        if match is None:
            hint = " (fused OVERLAP_F_B actions are not supported)" if "(" in str(token) else ""
            raise TrainschedError(
                f"bad action {token!r}: expected <stage><kind><micro-batch> like 1F3 or 0SEND_B2, "
                f"kind one of {', '.join(ACTION_KINDS)}{hint}"
            )
        stage, kind, microbatch = match.groups()
        if kind in STAGE_KINDS and microbatch:
            raise TrainschedError(f"bad action {token!r}: {kind} takes no micro-batch")
        if kind not in STAGE_KINDS and not microbatch:
            raise TrainschedError(
                f"bad action {token!r}: {kind} needs a micro-batch, like {stage}{kind}0"
            )
        return cls(stage=int(stage), kind=kind, microbatch=int(microbatch) if microbatch else None)


# --- Schedule ----------------------------------------------------------------------------------

Key = tuple[int, str, int | None]  # (stage, kind, micro-batch): an action without its rank

# What completing an action provides to others: I and B both provide the gradient ("G").
_PROVIDES = {"F": "F", "I": "G", "B": "G", "W": "W", **{k: k for k in COMM_KINDS}}
# The explicit send that each receive pairs with: kind and stage offset.
_PARTNER = {"RECV_F": ("SEND_F", -1), "SEND_F": ("RECV_F", 1),
            "RECV_B": ("SEND_B", 1), "SEND_B": ("RECV_B", -1)}  # fmt: skip
# What the other kinds wait for: (provided kind, stage offset), same micro-batch.
_NEEDS = {"W": ("G", 0), "SEND_F": ("F", 0), "SEND_B": ("G", 0),
          "RECV_F": ("SEND_F", -1), "RECV_B": ("SEND_B", 1)}  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class Schedule:
    """Per-rank ordered action lists for a pipeline of ``num_stages`` stages.

    ``ranks[r]`` is what rank ``r`` runs, in order; ``None`` is an idle slot (as in PyTorch's
    CSVs; it orders nothing). ``stage_to_rank[s]`` is the rank that owns stage ``s``; left out,
    it is the loop placement ``s % num_ranks``. Built without checks beyond types and ranges;
    :meth:`validate` proves it complete and deadlock-free.
    """

    ranks: tuple[tuple[Action | None, ...], ...]
    num_stages: int
    num_microbatches: int
    stage_to_rank: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        ranks = tuple(tuple(row) for row in self.ranks)
        if not ranks:
            raise TrainschedError("a schedule needs at least one rank")
        for r, row in enumerate(ranks):
            for i, action in enumerate(row):
                if action is not None and not isinstance(action, Action):
                    raise TrainschedError(
                        f"rank {r}, position {i}: expected an Action or None (idle), "
                        f"got {action!r}"
                    )
        for name in ("num_stages", "num_microbatches"):
            value = getattr(self, name)
            if not is_int(value) or value < 1:
                raise TrainschedError(f"schedule: {name} must be an integer >= 1, got {value!r}")
        if self.stage_to_rank is None:
            mapping = tuple(s % len(ranks) for s in range(self.num_stages))
        else:
            mapping = tuple(self.stage_to_rank)
        if len(mapping) != self.num_stages:
            raise TrainschedError(
                f"schedule: stage_to_rank has {len(mapping)} entries for {self.num_stages} "
                "stages; give one rank per stage"
            )
        for s, r in enumerate(mapping):
            if not is_int(r) or not 0 <= r < len(ranks):
                raise TrainschedError(
                    f"schedule: stage_to_rank[{s}] = {r!r} is not a rank 0..{len(ranks) - 1}"
                )
        object.__setattr__(self, "ranks", ranks)
        object.__setattr__(self, "stage_to_rank", mapping)

    @property
    def num_ranks(self) -> int:
        return len(self.ranks)

    def compute_actions(self, rank: int) -> tuple[Action, ...]:
        """Rank ``rank``'s F, I, W and B actions in order: no communication, idle or stage-level."""
        if not is_int(rank) or not 0 <= rank < self.num_ranks:
            raise TrainschedError(f"rank {rank!r} is outside 0..{self.num_ranks - 1}")
        return tuple(a for a in self.ranks[rank] if a is not None and a.kind in COMPUTE_KINDS)

    # --- text and CSV --------------------------------------------------------------------------

    def to_text(self) -> str:
        """One line per rank, actions separated by single spaces, idle slots as ``_``."""
        return "".join(" ".join("_" if a is None else str(a) for a in row) + "\n"
                       for row in self.ranks)  # fmt: skip

    @classmethod
    def from_text(
        cls,
        text: str,
        *,
        num_stages: int | None = None,
        num_microbatches: int | None = None,
        stage_to_rank: Sequence[int] | None = None,
        source: str = "<text>",
    ) -> Schedule:
        """Read :meth:`to_text`'s form: a line per rank (an empty line: a rank with no actions).

        Tokens may be separated by any whitespace. ``num_stages`` and ``num_microbatches``
        default to one more than the largest index used.
        """
        rows = [line.split() for line in text.splitlines()]
        return cls._from_rows(rows, "_", ("line", "token"), source,
                              num_stages, num_microbatches, stage_to_rank)  # fmt: skip

    def to_csv(self) -> str:
        """The CSV PyTorch's ``_dump_csv`` writes: a row per rank, a cell per action, empty =
        idle, ``\\r\\n`` line ends (the csv module's default dialect)."""
        out = io.StringIO()
        writer = csv.writer(out)
        for row in self.ranks:
            writer.writerow(["" if a is None else str(a) for a in row])
        return out.getvalue()

    @classmethod
    def from_csv(
        cls,
        text: str,
        *,
        num_stages: int | None = None,
        num_microbatches: int | None = None,
        stage_to_rank: Sequence[int] | None = None,
        source: str = "<csv>",
    ) -> Schedule:
        """Read a schedule CSV as PyTorch's ``_load_csv`` does (empty cell = idle slot)."""
        try:
            rows = [[cell.strip() for cell in row] for row in csv.reader(io.StringIO(text))]
        except csv.Error as exc:
            raise TrainschedError(f"{source}: malformed CSV: {exc}") from None
        return cls._from_rows(rows, "", ("row", "cell"), source,
                              num_stages, num_microbatches, stage_to_rank)  # fmt: skip

    @classmethod
    def _from_rows(
        cls,
        rows: list[list[str]],
        idle: str,
        units: tuple[str, str],
        source: str,
        num_stages: int | None,
        num_microbatches: int | None,
        stage_to_rank: Sequence[int] | None,
    ) -> Schedule:
        ranks: list[list[Action | None]] = []
        for r, tokens in enumerate(rows):
            ranks.append([])
            for i, token in enumerate(tokens):
                try:
                    ranks[-1].append(None if token == idle else Action.parse(token))
                except TrainschedError as exc:
                    raise TrainschedError(
                        f"{source}: {units[0]} {r + 1} (rank {r}), {units[1]} {i + 1}: {exc}"
                    ) from None
        actions = [a for row in ranks for a in row if a is not None]
        if num_stages is None:
            if not actions:
                raise TrainschedError(f"{source}: no actions to count stages from; pass num_stages")
            num_stages = max(a.stage for a in actions) + 1
        if num_microbatches is None:
            used = [a.microbatch for a in actions if a.microbatch is not None]
            if not used:
                raise TrainschedError(
                    f"{source}: no micro-batch actions to count from; pass num_microbatches"
                )
            num_microbatches = max(used) + 1
        try:
            return cls(ranks=tuple(map(tuple, ranks)), num_stages=num_stages,
                       num_microbatches=num_microbatches,
                       stage_to_rank=None if stage_to_rank is None else tuple(stage_to_rank))
        except TrainschedError as exc:  # fmt: skip
            raise TrainschedError(f"{source}: {exc}") from None

    # --- validation ----------------------------------------------------------------------------

    def validate(self) -> None:
        """Raise a TrainschedError listing every problem, or the deadlock, if there is one.

        Checks, in order: indices in range; each action on the rank of its stage; per (stage,
        micro-batch) exactly one F and either one B or one I and one W; on each rank F before
        its I or B and I before its W; explicit sends and receives in pairs. Then executes the
        rank lists (each in order, waiting on cross-rank dependencies) and reports, per rank,
        the action that can never run and what it waits for. Linear in the number of actions.
        """
        places: dict[Key, list[tuple[int, int]]] = {}
        problems = self._placement_problems(places)
        if not problems:
            problems = self._coverage_problems(places) + self._order_problems(places)
        if problems:
            problems = self._sizes_problems() + problems
            raise TrainschedError(
                _listing(f"schedule is invalid ({len(problems)} problem(s)):", problems)
                + "\nfix the rank lists (docs/plans.md lists what a valid schedule needs)"
            )
        self._check_progress(places)

    def _sizes_problems(self) -> list[str]:
        """A schedule written for other stage or micro-batch counts than it is declared for:
        one line naming the counts it was written for, ahead of the problems that follow."""
        actions = [a for row in self.ranks for a in row if a is not None]
        used = [a.microbatch for a in actions if a.microbatch is not None]
        if not used:
            return []
        problems = []
        stages, micro = max(a.stage for a in actions) + 1, max(used) + 1
        for what, written, claimed in (("stages", stages, self.num_stages),
                                       ("micro-batches", micro, self.num_microbatches)):
            if written == claimed:
                continue
            name = "num_stages" if what == "stages" else "num_microbatches"
            problems.append(
                f"the actions are for {written} {what} (0..{written - 1}) but the schedule is "
                f"declared for {claimed} ({name}={claimed}): regenerate it for {claimed} "
                f"{what} or declare {name}={written}")
        return problems

    def _placement_problems(self, places: dict[Key, list[tuple[int, int]]]) -> list[str]:
        """Range and rank problems; fills ``places`` with where each action occurs."""
        problems = []
        last, m = self.num_stages - 1, self.num_microbatches
        for r, row in enumerate(self.ranks):
            for i, a in enumerate(row):
                if a is None:
                    continue
                if a.stage <= last and (a.microbatch or 0) < m and self.stage_to_rank[a.stage] == r:
                    places.setdefault((a.stage, a.kind, a.microbatch), []).append((r, i))
                    continue
                at = f"{a} (rank {r}, position {i})"
                if a.stage > last:
                    problems.append(f"{at}: stage {a.stage} is outside 0..{last} "
                                    f"(num_stages={self.num_stages})")  # fmt: skip
                elif (a.microbatch or 0) >= m:
                    problems.append(f"{at}: micro-batch {a.microbatch} is outside 0..{m - 1} "
                                    f"(num_microbatches={m})")  # fmt: skip
                else:
                    home = self.stage_to_rank[a.stage]
                    problems.append(f"{at}: stage {a.stage} runs on rank {home} "
                                    f"(stage_to_rank); move it to rank {home}")  # fmt: skip
        return problems

    def _coverage_problems(self, places: dict[Key, list[tuple[int, int]]]) -> list[str]:
        """Duplicates, missing F/backward actions, unpaired sends and receives."""
        problems = []
        for (s, kind, mb), where in places.items():
            text = f"{s}{kind}{'' if mb is None else mb}"
            if len(where) > 1 and kind not in STAGE_KINDS:
                spots = ", ".join(f"rank {r} position {i}" for r, i in where)
                problems.append(f"{text} appears {len(where)} times ({spots}); keep one")
            if kind in _PARTNER:
                other, step = _PARTNER[kind]
                if not 0 <= s + step < self.num_stages:
                    problems.append(f"{text}: stage {s} has no stage {s + step} to pair with")
                elif (s + step, other, mb) not in places:
                    partner = f"{s + step}{other}{mb}"
                    problems.append(f"{text} has no matching {partner}; add it to rank "
                                    f"{self.stage_to_rank[s + step]}")  # fmt: skip
        for s in range(self.num_stages):
            rank = self.stage_to_rank[s]
            for m in range(self.num_microbatches):
                has = {k for k in COMPUTE_KINDS if (s, k, m) in places}
                if "F" not in has:
                    problems.append(f"stage {s} micro-batch {m} has no forward: "
                                    f"add {s}F{m} to rank {rank}")  # fmt: skip
                if not has - {"F"}:
                    problems.append(f"stage {s} micro-batch {m} has no backward: add {s}B{m} "
                                    f"(or {s}I{m} and {s}W{m}) to rank {rank}")  # fmt: skip
                elif "B" in has and has & {"I", "W"}:
                    problems.append(f"stage {s} micro-batch {m} has both {s}B{m} and a split "
                                    f"backward ({s}I{m}/{s}W{m}); keep one form")  # fmt: skip
                elif "B" not in has and len(has & {"I", "W"}) == 1:
                    there, lacking = ("I", "W") if "I" in has else ("W", "I")
                    problems.append(f"{s}{there}{m} has no {s}{lacking}{m}: a split backward "
                                    f"needs both; add it to rank {rank}")  # fmt: skip
        return problems

    def _order_problems(self, places: dict[Key, list[tuple[int, int]]]) -> list[str]:
        """On each rank, a backward after its forward and a W after its I."""
        problems = []
        for (s, kind, mb), where in places.items():
            need = {"I": "F", "B": "F", "W": "I"}.get(kind)
            before = places.get((s, need, mb)) if need else None
            if before and before[0][1] > where[0][1]:
                rank, i = where[0]
                problems.append(f"rank {rank}: {s}{kind}{mb} at position {i} comes before "
                                f"{s}{need}{mb} at position {before[0][1]}; "
                                f"a {kind} must follow its {need}")  # fmt: skip
        return problems

    def _needs(self, a: Action, present: Mapping[Key, Any]) -> list[Key]:
        """What must be done before ``a`` runs, as (stage, provided kind, micro-batch) keys."""
        s, kind, m = a.stage, a.kind, a.microbatch
        if kind == "F":
            needs = [(s - 1, "F", m)] if s > 0 else []
            return [*needs, (s, "RECV_F", m)] if (s, "RECV_F", m) in present else needs
        if kind in ("I", "B"):
            needs = [(s, "F", m)] if s == self.num_stages - 1 else [(s, "F", m), (s + 1, "G", m)]
            return [*needs, (s, "RECV_B", m)] if (s, "RECV_B", m) in present else needs
        if kind in _NEEDS:
            need, step = _NEEDS[kind]
            return [(s + step, need, m)]
        return []  # stage-level actions wait for nothing

    def _check_progress(self, places: dict[Key, list[tuple[int, int]]]) -> None:
        """Run every rank's list in order; raise if all stop with actions left (a deadlock).

        A rank blocked on a key is woken once, when that key is done, so the whole run costs
        O(actions + dependencies). Sends never block (PyTorch issues them asynchronously).
        """
        provider = {(s, _PROVIDES[k], m): where[0] for (s, k, m), where in places.items()
                    if k in _PROVIDES}  # fmt: skip
        done: set[Key] = set()
        waiting: dict[Key, list[int]] = {}
        position = [0] * self.num_ranks
        blocked_on: dict[int, Key] = {}
        ready = list(range(self.num_ranks - 1, -1, -1))
        while ready:
            r = ready.pop()
            row = self.ranks[r]
            while position[r] < len(row):
                a = row[position[r]]
                if a is not None:
                    missing = next((k for k in self._needs(a, provider) if k not in done), None)
                    if missing is not None:
                        blocked_on[r] = missing
                        waiting.setdefault(missing, []).append(r)
                        break
                    if a.kind in _PROVIDES:
                        key = (a.stage, _PROVIDES[a.kind], a.microbatch)
                        done.add(key)
                        ready.extend(waiting.pop(key, ()))
                position[r] += 1
        left = sum(len(row) - p for row, p in zip(self.ranks, position, strict=True))
        if left == 0:
            return
        lines = []
        for r, row in enumerate(self.ranks):
            if position[r] == len(row):
                lines.append(f"rank {r}: finished")
                continue
            key = blocked_on[r]
            if key in provider:
                pr, pi = provider[key]
                what = f"{self.ranks[pr][pi]} " + (
                    f"later on this rank (position {pi})" if pr == r
                    else f"on rank {pr} (position {pi}, not reached)")  # fmt: skip
            else:
                what = f"stage {key[0]} {key[1]} of micro-batch {key[2]}, which no rank runs"
            lines.append(f"rank {r}: {row[position[r]]} (position {position[r]}) waits for {what}")
        raise TrainschedError(
            _listing(f"schedule deadlocks: no rank can make progress, {left} slot(s) left:", lines)
            + "\nreorder the rank lists so that what each action waits for can run before it"
        )


def _listing(head: str, lines: Iterable[str]) -> str:
    lines = list(lines)
    shown = "".join(f"\n  {line}" for line in lines[:_MAX_LISTED])
    more = len(lines) - _MAX_LISTED
    return head + shown + (f"\n  ... and {more} more" if more > 0 else "")
