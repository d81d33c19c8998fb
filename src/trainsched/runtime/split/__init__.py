"""Split backward for any ``nn.Module``: input gradients (dX) now, weight gradients (dW) later.

Every layer's backward is two computations: dX, which the layer below waits for, and dW,
which only the gradient's communication and the optimizer wait for. :func:`split_backward`
splits a model's backward so that dW goes to a queue (:class:`WGradQueue`) run in an order
of :mod:`trainsched.backprop.deferral` (``standard``, ``reverse_first_k``, ``fifo``,
``priority``, ``memory_capped``):

    split = split_backward(model, order="fifo")
    loss_fn(split(x)).backward()   # dX only; dW queued
    split.drain()                  # dW now, accumulated into .grad
    optimizer.step()

Two backends: custom autograd functions for Linear, Conv1d/2d/3d and Embedding
(:mod:`.functions`), and a ``GradientEdge`` split of any other module's autograd graph
(:mod:`.graph`). :mod:`.model` picks the layers and refuses stock DDP and compiled modules;
:mod:`.queue` holds the closures and counts the bytes they keep alive. :class:`SlottedModel`
(:mod:`.slots`) trains a single device with each layer's dW in its slot (inline, on a second
stream beside the following dX, or deferred into the next step after a chosen forward).
"""

from trainsched.runtime.split.model import (
    BACKENDS,
    NORMS,
    SplitLayer,
    SplitModel,
    count_layers,
    find_layers,
    split_backward,
)
from trainsched.runtime.split.queue import QueueListener, WGradQueue, storage_sizes
from trainsched.runtime.split.slots import SlottedModel

__all__ = ["BACKENDS", "NORMS", "QueueListener", "SlottedModel", "SplitLayer", "SplitModel",
           "WGradQueue",
           "count_layers", "find_layers", "split_backward", "storage_sizes"]
