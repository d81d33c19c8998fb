"""Out-of-order backprop policies: backward orders and pipeline schedule generators.

Plain Python (no torch): the policies produce plan parts (``trainsched.plan.Schedule``) that the
simulator predicts and the runtime executes. ``schedules`` holds the pipeline generators and
``stages`` cuts a model into the contiguous stages they run, with each stage's costs;
``deferral`` holds the orders in which a split backward's deferred weight gradients run
(``standard``, ``reverse_first_k``, ``fifo``, ``priority``, ``memory_capped``).
"""
