"""trainsched: schedule deep-learning training on PyTorch.

Only ``trainsched.capture`` and ``trainsched.runtime`` import torch; everything importable from
here is plain Python.
"""

from trainsched.errors import TrainschedError

__version__ = "0.1.0"

__all__ = ["TrainschedError", "__version__"]
