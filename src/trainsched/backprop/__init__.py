"""Out-of-order backprop policies: backward orders and pipeline schedule generators.

Plain Python (no torch): the policies produce plan parts (``trainsched.plan.Schedule``) that the
simulator predicts and the runtime executes. ``schedules`` holds the pipeline generators,
``stages`` cuts a model into the contiguous stages they run, with each stage's costs (where to
cut, on per-op weights alone: ``cuts``),
``reorder`` the out-of-order orders of a training graph's weight gradients (reverse-first-k for
data parallelism and the per-layer slots of one device, ``BACKPROP_ORDERS``), and ``deferral``
the orders in which a split backward's deferred weight gradients run at runtime (``standard``,
``reverse_first_k``, ``fifo``, ``priority``, ``memory_capped``).
"""
