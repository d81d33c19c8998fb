"""The computation graph: ops, edges, their file format and the transforms every policy reads.

:mod:`~trainsched.graph.core` holds :class:`Op`, :class:`Edge` and :class:`Graph` (validated,
immutable, deterministic orders), :mod:`~trainsched.graph.fields` their fields and checks;
:mod:`~trainsched.graph.io` the graph JSON files, atomic writes and the JSON helpers of
trainsched's other formats, :mod:`~trainsched.graph.compact` the compact by-column file graphs
are written in (``trainsched.graph/2``), :mod:`~trainsched.graph.binary` the binary by-column
file for large graphs (``trainsched.graph/3``, a ``.tsg`` path),
:mod:`~trainsched.graph.fastread` ``Graph.load`` (and its lean line-by-line reader of large
``trainsched.graph/1`` files);
:mod:`~trainsched.graph.training` the forward-to-training transform (:func:`to_training`),
:mod:`~trainsched.graph.coarsen` op-to-module coarsening (:func:`coarsen_by_module`) and
:mod:`~trainsched.graph.overhead` the eager step's overhead charged to a measured graph's ops
(:func:`charge_step_overhead`) and :mod:`~trainsched.graph.passes` several captures of one model
merged, each op's times their median (:func:`median_costs`). Plain Python: no torch here.
"""

from trainsched.graph.coarsen import coarsen_by_module
from trainsched.graph.core import (
    OP_KINDS,
    PARAM_TENSORS,
    Edge,
    Graph,
    GraphTotals,
    Op,
    gc_paused,
    param_tensor_record,
)
from trainsched.graph.io import (
    FORMAT,
    FORMAT_V1,
    FORMATS,
    atomic_write_bytes,
    atomic_write_text,
    check_keys,
    dump_json,
    graph_from_json,
    graph_to_json,
    kind_of,
    nesting_guard,
    parse_json,
    read_text_file,
    show_value,
)
from trainsched.graph.overhead import STEP_OVERHEAD, charge_step_overhead, spread_gap
from trainsched.graph.passes import CAPTURE_PASSES, median_costs
from trainsched.graph.training import (
    OPTIMIZER_STEP,
    OPTIMIZERS,
    charge_optimizer_step,
    to_training,
)

__all__ = [
    "CAPTURE_PASSES",
    "FORMAT",
    "FORMATS",
    "FORMAT_V1",
    "OPTIMIZERS",
    "OPTIMIZER_STEP",
    "OP_KINDS",
    "PARAM_TENSORS",
    "STEP_OVERHEAD",
    "Edge",
    "Graph",
    "GraphTotals",
    "Op",
    "atomic_write_bytes",
    "atomic_write_text",
    "charge_optimizer_step",
    "charge_step_overhead",
    "check_keys",
    "coarsen_by_module",
    "dump_json",
    "gc_paused",
    "graph_from_json",
    "graph_to_json",
    "kind_of",
    "median_costs",
    "nesting_guard",
    "param_tensor_record",
    "parse_json",
    "read_text_file",
    "show_value",
    "spread_gap",
    "to_training",
]
