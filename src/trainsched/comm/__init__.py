"""Communication scheduling: how a step's gradients become collectives, queued and credited.

Plain Python (no torch): the policies here are plan parts that the simulator
(:func:`trainsched.sim.simulate_data_parallel`) predicts and the runtime will execute. The
public names are those of :mod:`trainsched.comm.policy`, listed once there.
"""

from trainsched.comm.policy import *  # noqa: F403
from trainsched.comm.policy import __all__  # noqa: F401
