"""Real ``torch.distributed`` runs on this host. With ``capture``, the only package that imports
torch (and only inside the worker processes it spawns, or for a CUDA check).

``calibrate(...)`` measures p2p and all-reduce times and fits α–β links (see
:mod:`trainsched.runtime.calibrate`).
"""

from trainsched.runtime.calibrate import Calibration, Row, calibrate

__all__ = ["Calibration", "Row", "calibrate"]
