"""m-ETF: earliest task first under memory limits (Hwang et al. 1989; Baechi's m-ETF).

Among ready ops and devices, the pair that can start earliest starts, ties by topological index
then device; a device that cannot hold the op is excluded until it frees memory. The clock loop,
channels, caching and memory live in :mod:`trainsched.placement.model`. The schedule is tried on
the first 1, 2, 4, ... and m devices and the shortest kept (``fewest_devices``), so a graph whose
transfers cost more than its parallelism gains stays on few devices.
"""

from __future__ import annotations

from trainsched.placement.model import Machine, PlacerSchedule, fewest_devices, run_schedule
from trainsched.placement.reduce import Problem


def m_etf(problem: Problem, machine: Machine) -> PlacerSchedule:
    """m-ETF's schedule of ``problem`` on ``machine`` (raises ``Stall`` when nothing fits)."""
    return fewest_devices(machine, lambda on: run_schedule(problem, on), problem)
