"""TEMP shim: the old ``trainsched.training`` path until cli.py imports ``trainsched.graph``."""

from trainsched.graph.training import *  # noqa: F403
