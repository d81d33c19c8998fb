"""Out-of-order backprop orders: where each layer's weight-gradient op (``v:dW``) runs.

Every layer's backward is two ops of the training graph (:mod:`trainsched.graph.training`):
``v:dX``, the input gradient the layer below waits for, and ``v:dW``, the weight gradient only
the gradient's communication and ``v:opt`` wait for. A *layer* here is a forward op that has a
``v:dW`` and is not a normalisation (whose dW stays right after its dX, as the runtime's split
backward leaves norm layers whole); layers are numbered 0..L-1 in forward (topological) order
(:func:`layers`).

**Data parallel, reverse-first-k** (:func:`reverse_first_k`): the dW of layers ``< k`` leave
the dX chain and run after the last dX op, in forward order (layer 0 first); layers ``>= k``
keep their dW right after their dX. ``k = 0`` is program order (in-order backprop) exactly.
The result is a topological order of all ops: the compute priority a data-parallel simulation
(and the runtime's dW queue) follows. The gradient of layer 0 is then ready as soon as the dX
chain ends, and its all-reduce runs under the dW of layers 1..k-1.

**Single device, slots** (:data:`SLOT_KINDS`): per layer ``inline`` (dW in program order on
the main stream, the baseline), ``overlap_backward`` (dW on a second stream as soon as its
inputs exist, beside the following dX ops) or ``overlap_forward(j)`` (dW and the update of
step t run in step t+1 on the second stream, launched once forward op of layer ``j`` has
ended, ``j < i``: layer i's update must end before its own forward). :func:`parse_slot` and
:func:`format_slot` give their text form, as plan files keep it.

:data:`BACKPROP_ORDERS` is the one list of the data-parallel backprop choices (``inorder``,
``ooo``): the command line's ``--backprop`` and ``compare``'s rows read it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from trainsched.errors import TrainschedError
from trainsched.graph import Graph
from trainsched.registry import Registry
from trainsched.units import is_int

__all__ = ["BACKPROP_ORDERS", "NORM_TARGETS", "SLOT_KINDS", "Slot", "backprop_order", "check_k",
           "check_slots", "deferred_bytes", "format_slot", "in_order", "is_norm", "layers",
           "parse_slot", "reverse_first_k", "weight_ops"]


#: Fragments of the targets of normalisation ops (ATen ops at op granularity, module types at
#: module granularity): their weight gradient is tiny and stays with their input gradient.
NORM_TARGETS = ("batch_norm", "layer_norm", "group_norm", "instance_norm", "rms_norm",
                "BatchNorm", "LayerNorm", "GroupNorm", "InstanceNorm", "RMSNorm")


def is_norm(target: str) -> bool:
    """Whether an op with this ``target`` is a normalisation (see :data:`NORM_TARGETS`)."""
    return any(fragment in target for fragment in NORM_TARGETS)


def layers(graph: Graph) -> tuple[str, ...]:
    """The forward ops that own a weight gradient (a ``backward_weight`` op names them as its
    ``forward_op``) and are not normalisations, in the graph's topological order: layer i is
    the i-th. These are the layers the runtime's split backward splits (norm layers stay
    whole there), so a plan's ``k`` means the same in the simulator and in the run: ResNet-50
    has 54 (53 convolutions and the classifier)."""
    owners = {op.forward_op for op in graph.ops if op.kind == "backward_weight"}
    return tuple(name for name in graph.topological_order()
                 if graph.op(name).kind == "forward" and name in owners
                 and not is_norm(graph.op(name).target))


def weight_ops(graph: Graph) -> tuple[str, ...]:
    """The ``backward_weight`` op of every layer, in layer order (layer i's is the i-th)."""
    of = {op.forward_op: op.name for op in graph.ops if op.kind == "backward_weight"}
    return tuple(of[name] for name in layers(graph))


def check_k(graph: Graph, k: int, what: str = "k") -> int:
    """``k`` checked against the graph's layer count L (0 <= k <= L); returns L."""
    count = len(layers(graph))
    if not (is_int(k) and 0 <= k <= count):
        raise TrainschedError(f"{what} {k!r} is not a layer count of this model: it has {count} "
                              f"layers with weight gradients, so k must be in 0..{count} "
                              f"(0 is in-order backprop)")
    return count


def deferred_bytes(graph: Graph, k: int) -> int:
    """The bytes the deferred weight gradients of reverse-first-k hold at their peak, the end of
    the dX chain, when all k wait: each deferred layer keeps its input (the bytes its forward
    edges bring in) and its output gradient (its forward op's ``output_bytes``) alive until its
    dW runs. What the runtime's dW queue reports as its peak held bytes (each storage once;
    parameters not counted)."""
    check_k(graph, k)
    held = 0
    for name in layers(graph)[:k]:
        held += sum(e.size_bytes for e in graph.in_edges(name)) + graph.op(name).output_bytes
    return held


def reverse_first_k(graph: Graph, k: int) -> tuple[str, ...]:
    """The compute order of reverse-first-k (module docstring): program order, with the dW ops
    of layers ``< k`` moved after the rest of the backward chain (the last ``backward_input``
    op and the dW of layers ``>= k`` that follows it), in forward order. ``k = 0`` returns
    ``graph.topological_order()`` itself. When the first layer has no dX (its input needs no
    gradient), its dW ends the chain already: k = 1 gives the order of k = 0."""
    check_k(graph, k)
    base = graph.topological_order()
    if k == 0:
        return base
    moved = weight_ops(graph)[:k]
    key = {name: float(p) for p, name in enumerate(base)}
    deferred = set(moved)
    chain = [p for p, name in enumerate(base) if name not in deferred
             and graph.op(name).kind in ("backward_input", "backward_weight")]
    if not chain:  # nothing left in the chain to move past
        return base
    last = chain[-1]  # the last dX, or the dW of a layer >= k right after it
    for i, name in enumerate(moved):  # right after the last dX, layer 0 first
        key[name] = last + (i + 1) / (len(moved) + 1)
    return graph.ordered_by(key.__getitem__)


def in_order(graph: Graph, k: int = 0) -> tuple[str, ...]:
    """In-order backprop: program order (``k`` must be 0)."""
    if k != 0:
        raise TrainschedError(f"in-order backprop moves no weight gradient, so k must be 0, got "
                              f"{k!r}; use backprop 'ooo' to defer the first k layers")
    return graph.topological_order()


#: Data-parallel backprop orders: name -> ``(graph, k) -> compute order``. ``compare=True``:
#: ``trainsched compare`` adds a row of each cross-barrier comm policy with it.
BACKPROP_ORDERS: Registry[Callable[[Graph, int], tuple[str, ...]]] = Registry(
    "backprop order", "orders")
BACKPROP_ORDERS.register("inorder", in_order)
BACKPROP_ORDERS.register("ooo", reverse_first_k, compare=True)


def backprop_order(name: str, graph: Graph, k: int = 0) -> tuple[str, ...]:
    """The compute order the backprop order registered as ``name`` gives for ``k``."""
    return BACKPROP_ORDERS.lookup(name)(graph, k)


# -- single-device slots -----------------------------------------------------------------------

#: Where one layer's dW runs on a single device (module docstring).
SLOT_KINDS = ("inline", "overlap_backward", "overlap_forward")
_FORWARD_SLOT = re.compile(r"overlap_forward\((\d+)\)")


@dataclass(frozen=True, kw_only=True)
class Slot:
    """One layer's slot: ``kind`` among :data:`SLOT_KINDS`; ``after`` the layer whose forward
    launches a deferred dW (``overlap_forward`` only, else ``None``)."""

    kind: str
    after: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in SLOT_KINDS:
            raise TrainschedError(f"unknown dW slot {self.kind!r}; expected one of "
                                  f"{', '.join(SLOT_KINDS)}")
        deferred = self.kind == "overlap_forward"
        if deferred != (self.after is not None) or (
                deferred and not (is_int(self.after) and self.after >= 0)):
            raise TrainschedError(f"dW slot {self.kind}: give a layer index >= 0 exactly for "
                                  f"overlap_forward(j), got after={self.after!r}")

    def __str__(self) -> str:
        return format_slot(self)


def parse_slot(text: str) -> Slot:
    """``inline``, ``overlap_backward`` or ``overlap_forward(j)`` as a :class:`Slot`."""
    if not isinstance(text, str):
        raise TrainschedError(f"a dW slot is a string, got {text!r}")
    if text in ("inline", "overlap_backward"):
        return Slot(kind=text)
    m = _FORWARD_SLOT.fullmatch(text)
    if m is None:
        raise TrainschedError(f"unknown dW slot {text!r}; expected inline, overlap_backward or "
                              f"overlap_forward(j) with j a layer index")
    return Slot(kind="overlap_forward", after=int(m.group(1)))


def format_slot(slot: Slot) -> str:
    """The text :func:`parse_slot` reads."""
    return slot.kind if slot.after is None else f"{slot.kind}({slot.after})"


def check_slots(graph: Graph, slots: Sequence[Slot]) -> int:
    """``slots`` checked against the graph: one per layer, ``overlap_forward(j)`` of layer i
    with ``j < i``; returns the layer count."""
    count = len(layers(graph))
    if len(slots) != count:
        raise TrainschedError(f"{len(slots)} dW slots for a model of {count} layers with weight "
                              f"gradients; give one slot per layer (or none: all inline)")
    for i, slot in enumerate(slots):
        if slot.after is not None and slot.after >= i:
            raise TrainschedError(f"layer {i}: slot {slot} launches its dW after the forward of "
                                  f"layer {slot.after}, but its update must end before its own "
                                  f"forward (layer {i}); use overlap_forward(j) with j < {i}")
    return count

