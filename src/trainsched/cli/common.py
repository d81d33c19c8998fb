"""What several verbs share: the ``--json`` and tuner flags, their parsing, and small helpers.

*Which flags apply*: every verb that has modes (``simulate --parallelism``, ``train --comm-policy``,
``--plan``, a vision or a text model, ``--run``...) declares a table of :class:`Applies` rules,
one per group of flags, saying in which modes they are used; :func:`check_applicable` refuses
every flag given outside its mode, naming each and the mode that would take it, so that no flag
is ever silently ignored. A flag whose default would hide whether it was given defaults to
``None`` in argparse and gets its real default in the verb (its help says which).

Kept light (no library imports at module level) so that building the parser stays cheap and
torch-free; each helper imports what it needs when called.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from trainsched.errors import TrainschedError
from trainsched.graph import OPTIMIZERS, gc_paused
from trainsched.precision import PRECISIONS


class Subcommands(Protocol):
    """What a verb's ``add_parser`` is given: the object ``add_subparsers()`` returns."""

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser: ...


def add_json(p: argparse.ArgumentParser) -> None:
    """The ``--json`` flag every verb has."""
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")


#: The tuner flags' defaults (argparse destination -> value), given in code so that a tuner
#: flag given without the tuner is seen.
TUNE_DEFAULTS = {"tune_trials": 15, "tune_partition": "1MiB-128MiB",
                 "tune_credit": "1MiB-256MiB", "tune_seed": 0}
TUNE_FLAGS = tuple(TUNE_DEFAULTS)


def add_tune_args(p: argparse.ArgumentParser, flag: str) -> None:
    """The tuner's flags (trials, ranges, seed), their help naming ``flag`` that enables it."""
    d = TUNE_DEFAULTS
    p.add_argument("--tune-trials", type=int, default=None,
                   help=f"{flag}: trials (the first 10 random, the rest guided; default "
                   f"{d['tune_trials']})")
    p.add_argument("--tune-partition", default=None,
                   help=f"{flag}: LOW-HIGH (default {d['tune_partition']})")
    p.add_argument("--tune-credit", default=None,
                   help=f"{flag}: LOW-HIGH (default {d['tune_credit']})")
    p.add_argument("--tune-seed", type=int, default=None,
                   help=f"{flag}: sampler seed (default {d['tune_seed']})")


def dump(doc: Any) -> str:
    """``doc`` as the CLI's JSON: indented, keys sorted, strict (no ``NaN`` or ``Infinity``:
    a value that is not finite is a user error naming where it is, e.g. costs so large that
    their sums overflow)."""
    try:
        return json.dumps(doc, indent=2, sort_keys=True, allow_nan=False)
    except ValueError:
        where = _non_finite(doc, "")
        raise TrainschedError(f"the result holds a value that is not a finite number "
                              f"({where or 'somewhere'}): are the inputs' costs or sizes "
                              f"(e.g. compute_s) too large?") from None


def _non_finite(doc: Any, path: str) -> str | None:
    """The path (``a.b[2]``) of the first float in ``doc`` that is not finite, if any."""
    if isinstance(doc, float) and not math.isfinite(doc):
        return path or "the top level"
    items: Any = ()
    if isinstance(doc, Mapping):
        items = ((f"{path}.{k}" if path else str(k), v) for k, v in doc.items())
    elif isinstance(doc, list | tuple):
        items = ((f"{path}[{k}]", v) for k, v in enumerate(doc))
    for sub, value in items:
        found = _non_finite(value, sub)
        if found:
            return found
    return None


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
    return [flag(n) for n in names if getattr(args, n) not in (None, False)]


#: ``--costs`` of ``profile`` and ``compare``: ``auto`` picks the tier from what else is given
#: (a device kind or cluster to cost for: roofline; else measured on this host).
COST_CHOICES = ("auto", "measured", "roofline", "static")


def add_alias(p: argparse.ArgumentParser, old: str, dest: str, **kwargs: Any) -> None:
    """``old``: a former spelling of the option whose destination is ``dest``, still accepted
    for one release and left out of ``--help``."""
    p.add_argument(old, dest=dest, default=None, help=argparse.SUPPRESS, **kwargs)


def flag(dest: str) -> str:
    """The flag of an argparse destination: ``credit_mode`` -> ``--credit-mode``."""
    return f"--{dest.replace('_', '-')}"


@dataclass(frozen=True, kw_only=True)
class Applies:
    """A rule of a verb's table: the options ``flags`` (argparse destinations) are used only in
    the modes where each fact named in ``when`` has one of the values listed for it; ``where``
    says which modes those are, for the error (e.g. ``"with --parallelism data"``)."""

    flags: tuple[str, ...]
    when: Mapping[str, Collection[Any]]
    where: str


@dataclass(frozen=True, kw_only=True)
class Fact:
    """One fact of a run's mode (the value the rules test) and how to say it, e.g.
    ``Fact(value="single", text="with --parallelism single")``."""

    value: Any
    text: str


def check_applicable(args: argparse.Namespace, rules: Sequence[Applies],
                     facts: Mapping[str, Fact]) -> None:
    """Refuse every flag given where it does not apply (module docstring): one error naming
    each such flag, the facts of this run that rule it out, and where it would apply."""
    seen: set[str] = set()
    offending: list[tuple[list[str], Applies, list[str]]] = []
    for rule in rules:
        assert not seen & set(rule.flags), f"a flag in two rules: {seen & set(rule.flags)}"
        seen |= set(rule.flags)
        against = [k for k, values in rule.when.items() if facts[k].value not in values]
        flags = given(args, rule.flags) if against else []
        if flags:
            offending.append((flags, rule, against))
    if not offending:
        return
    every = [f for flags, _, _ in offending for f in flags]
    mode = ", ".join(dict.fromkeys(facts[k].text for _, _, ks in offending for k in ks))
    if len(every) == 1:
        where = f"it applies only {offending[0][1].where}"
    else:
        where = "; ".join(f"{', '.join(flags)} only {rule.where}" for flags, rule, _ in offending)
    raise TrainschedError(f"{', '.join(every)} {'does' if len(every) == 1 else 'do'} not apply "
                          f"{mode}: {where}; drop {'it' if len(every) == 1 else 'them'}")


def size_rules_and_facts(model: str | None) -> tuple[list[Applies], dict[str, Fact]]:
    """The rules of ``--seq-len`` and ``--image-size`` and the facts of ``model`` (a zoo name
    or ``path.py:function``; ``None``: a graph file, which has its sizes already). Imports the
    zoo (torch) for a model."""
    if model is None:
        takes: tuple[str, ...] = ()
        text = "to a graph file"
        taking = {"seq_len": "to models (not graph files)",
                  "image_size": "to vision models (not graph files)"}
    else:
        from trainsched.capture import models_taking, size_options

        takes = size_options(model)
        text = f"to model {model!r}"
        taking = {"seq_len": f"to {', '.join(models_taking('seq_len'))} and model files",
                  "image_size": f"to {', '.join(models_taking('image_size'))}"}
    rules = [Applies(flags=(option,), when={f"takes_{option}": (True,)}, where=where)
             for option, where in taking.items()]
    facts = {f"takes_{option}": Fact(value=option in takes, text=text) for option in taking}
    return rules, facts


def check_count(option: str, value: int | None, low: int, high: int | None = None,
                why: str = "") -> None:
    """A count flag's value (``None``: not given) within ``low``..``high``, else a user error
    saying what to give (``why`` explains ``high``)."""
    if value is None or (low <= value and (high is None or value <= high)):
        return
    span = f"{low} to {high}" if high is not None else f"at least {low}"
    raise TrainschedError(f"{option} {value}: give {span}{f' ({why})' if why else ''}")


def tune_ranges(args: argparse.Namespace) -> tuple[tuple[int, int], tuple[int, int]]:
    """``--tune-partition`` and ``--tune-credit``, each LOW-HIGH, in bytes (their defaults
    where not given); also fills in the other tuner flags' defaults on ``args``."""
    from trainsched.units import parse_size

    for dest, default in TUNE_DEFAULTS.items():
        if getattr(args, dest) is None:
            setattr(args, dest, default)
    ranges = []
    for flag_, text in (("--tune-partition", args.tune_partition),
                        ("--tune-credit", args.tune_credit)):
        r = tuple(parse_size(v) for v in text.split("-", 1)) if "-" in text else None
        if r is None or not 0 < r[0] <= r[1]:
            raise TrainschedError(f"{flag_} takes LOW-HIGH with 0 < LOW <= HIGH, e.g. "
                                  f"1MiB-64MiB")
        ranges.append(r)
    if args.tune_trials < 1:
        raise TrainschedError(f"--tune-trials must be >= 1, got {args.tune_trials}")
    return ranges[0], ranges[1]


#: ``--optimizer``'s default (given in code: on a training graph the flag does not apply).
OPTIMIZER_DEFAULT = "sgd"


def add_precision(p: argparse.ArgumentParser) -> None:
    """``--precision`` of the verbs that capture a model."""
    p.add_argument("--precision", default=None, choices=PRECISIONS,
                   help="how training computes and stores: fp32 (default), tf32 (fp32 "
                   "storage, TF32 matmuls), bf16/fp16 (16-bit weights, activations and "
                   "gradients, fp32 master weights), amp-bf16/amp-fp16 (autocast)")


def add_optimizer(p: argparse.ArgumentParser) -> None:
    """``--optimizer`` of the verbs that turn a forward graph into a training graph."""
    p.add_argument("--optimizer", default=None, choices=OPTIMIZERS,
                   help=f"the optimizer ops a forward-only graph gets (default "
                   f"{OPTIMIZER_DEFAULT})")


def as_training(graph: Any, args: argparse.Namespace, *, runs: bool = False) -> Any:
    """``graph`` as a training graph: a forward graph gets its backward ops and the optimizer
    ops of ``--optimizer``; a training graph has its own, so the flag does not apply (unless
    ``runs``: the model also trains for real with that optimizer)."""
    from trainsched.graph import to_training

    forward = graph.forward_only()
    check_applicable(args, [Applies(flags=("optimizer",), when={"graph": (True,)},
                                    where="to a forward-only graph (trainsched profile writes "
                                    "one)")],
                     {"graph": Fact(value=forward or runs, text="to a training graph (it has "
                                    "its optimizer ops)")})
    return to_training(graph, optimizer=args.optimizer or OPTIMIZER_DEFAULT) if forward \
        else graph


#: A graph of this many ops or more is kept out of the garbage collector's passes once read.
FROZEN_OPS = 100_000


@contextlib.contextmanager
def collector_paused(ops: Callable[[], int]) -> Iterator[None]:
    """Pause the cyclic garbage collector while reading or simulating a graph; after, if it
    has :data:`FROZEN_OPS` or more (``ops()``), move every object made so far out of the
    collector's reach (``gc.freeze``) before it runs again.

    A large graph and a simulation's result live as long as the command and hold no reference
    cycles: the collector's next passes would walk their millions of objects, several times
    over, for nothing (seconds at a million ops). Frozen objects are still freed as usual when
    no longer referenced."""
    with gc_paused():
        yield
        if ops() >= FROZEN_OPS:
            gc.freeze()


#: A model argument ending in one of these is a graph file (JSON text, or the binary format).
GRAPH_SUFFIXES = (".json", ".tsg")


def load_graph(path: str, args: argparse.Namespace) -> Any:
    """A graph file, read with a progress bar on stderr when it is a terminal (never with
    ``--json``): a graph of a million ops takes a while. A missing file named like a model
    rather than a graph file is an error that says how to make the graph."""
    from trainsched.graph import Graph
    from trainsched.report.progress import ProgressBar

    if not path.endswith(GRAPH_SUFFIXES) and not Path(path).exists():
        raise TrainschedError(
            f"{path}: no such graph file; this command reads a graph (.tsg or .json). For a "
            f"model, capture it first: trainsched profile {path} -o graph.tsg (trainsched "
            f"models lists the zoo), or run trainsched compare {path}, which captures it")
    graph = None
    with collector_paused(lambda: len(graph) if graph is not None else 0), \
            ProgressBar(f"reading {path}", enabled=not getattr(args, "json", False)) as bar:
        graph = Graph.load(path, progress=bar.update)
    return graph


def training_graph(path: str, args: argparse.Namespace) -> Any:
    """A graph file as a training graph (:func:`as_training`)."""
    graph = load_graph(path, args)
    with error_context(f"{path} with its backward and optimizer ops"):
        return as_training(graph, args)
