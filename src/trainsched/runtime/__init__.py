"""Real ``torch.distributed`` runs on this host. With ``capture``, the only package that imports
torch (and only inside the worker processes it spawns, or for a CUDA check).

``run(plan, ...)`` runs a plan and measures its steps, the twin of ``trainsched.sim.simulate``
(see :mod:`trainsched.runtime.run`). ``calibrate(...)`` measures p2p and all-reduce times and
fits α–β links (see
:mod:`trainsched.runtime.calibrate`). ``PlacedModule`` runs a model placed across devices (see
:mod:`trainsched.runtime.placed`); it is imported on first use, so importing this package stays
torch-free.
"""

from typing import Any

from trainsched.runtime.calibrate import calibrate
from trainsched.runtime.calibration import Calibration, Row
from trainsched.runtime.run import RunResult, run, runnable

__all__ = ["Calibration", "PlacedModule", "Row", "RunResult", "calibrate", "run", "runnable"]


def __getattr__(name: str) -> Any:
    if name == "PlacedModule":
        from trainsched.runtime.placed import PlacedModule

        return PlacedModule
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
