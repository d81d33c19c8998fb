"""TEMP shim: the old ``trainsched.coarsen`` path until cli.py imports ``trainsched.graph``."""

from trainsched.graph.coarsen import *  # noqa: F403
