"""TEMP shim: the old ``trainsched.stages`` path until cli.py imports backprop.stages."""

from trainsched.backprop.stages import *  # noqa: F403
