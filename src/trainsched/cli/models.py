"""``trainsched models``: list the model zoo (imports torch, through the zoo)."""

from __future__ import annotations

import argparse

from trainsched.cli.common import Subcommands, add_json, dump
from trainsched.report.tables import model_list

NAME = "models"


def add_parser(sub: Subcommands) -> None:
    p = sub.add_parser(NAME, help="list the model zoo")
    add_json(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from trainsched.capture.zoo import MODELS

    rows = [{"name": n, "family": e.family, "default_batch_size": e.default_batch_size,
             "description": e.description} for n, e in MODELS.items()]
    print(dump(rows) if args.json else model_list(rows))
    return 0
