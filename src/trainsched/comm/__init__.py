"""Communication scheduling: how a step's gradients become collectives, queued and credited.

Plain Python (no torch): the policies here are plan parts that the simulator
(:func:`trainsched.sim.simulate_data_parallel`) predicts and the runtime will execute.
"""

from trainsched.comm.policy import (
    COMM_POLICIES,
    CREDIT_MODES,
    DDP_BUCKET_ORDERS,
    QUEUES,
    Collective,
    CommPolicy,
    DdpBucketPolicy,
    FifoPolicy,
    Gradient,
    PriorityPolicy,
    check_plan,
    check_policy,
    comm_policy,
    graph_gradients,
    may_dispatch,
)

__all__ = [
    "COMM_POLICIES",
    "CREDIT_MODES",
    "DDP_BUCKET_ORDERS",
    "QUEUES",
    "Collective",
    "CommPolicy",
    "DdpBucketPolicy",
    "FifoPolicy",
    "Gradient",
    "PriorityPolicy",
    "check_plan",
    "check_policy",
    "comm_policy",
    "graph_gradients",
    "may_dispatch",
]
