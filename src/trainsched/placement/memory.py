"""Device memory over time as the list scheduler sees it (:mod:`trainsched.placement.model`).

:class:`DeviceMemory` keeps, per device, the resident bytes (the parameters and state of the
co-location groups placed there) and the dynamic level as a history of breakpoints, so that a
placer can ask whether an op, started now or at a time in the past, fits under the device's
capacity from then on, and apply frees that land in the past (a tensor is freed once its last
consumer is placed, which may be after the clock has moved on).

The accounting is the simulator's: at one instant, frees of earlier allocations go first, then
allocations, then frees of allocations made at that same instant; a peak is taken after an
instant's allocations. Each breakpoint keeps its change of level (a delta, so a free far in the
past costs one insertion) and its *high*: how far the instant's level after its allocations
is above the level the breakpoint leaves.
"""

from __future__ import annotations

import heapq
import itertools
from bisect import bisect_left
from collections.abc import Sequence

__all__ = ["DeviceMemory"]


class DeviceMemory:
    """Resident bytes, the level's history and the pending frees of every device."""

    def __init__(self, capacity: Sequence[int]) -> None:
        m = len(capacity)
        self.cap = list(capacity)
        self.resident = [0] * m
        self.hist_t: list[list[float]] = [[0.0] for _ in range(m)]
        self.hist_dv: list[list[int]] = [[0] for _ in range(m)]
        self.hist_hi: list[list[int]] = [[0] for _ in range(m)]
        self.level = [0] * m
        self.peak_bound = [0] * m
        self.pending: list[tuple[float, int, int, int, int]] = []  # (t, phase, seq, dev, bytes)
        self.allocs: list[list] = []  # [device, bytes, at, free or None]
        self._counter = itertools.count()

    def allocate(self, d: int, size: int, at: float, *, together: int | None = None) -> int:
        """Allocate ``size`` bytes on d at ``at``; ``together``: a second allocation of that
        many bytes at the same instant, listed right after the first (an op's output and its
        temporary). Returns the (first) allocation's index."""
        index = len(self.allocs)
        self.allocs.append([d, size, at, None])
        total = size
        if together is not None:
            self.allocs.append([d, together, at, None])
            total += together
        if total:
            self.level_add(d, at, total)
        return index

    def level_add(self, d: int, at: float, delta: int, instant_free: bool = False) -> None:
        """Add ``delta`` bytes to device d's level from time ``at`` on (``at`` ≤ now).

        ``instant_free`` marks a free of a buffer allocated at that same instant, which leaves
        the instant's high where it was."""
        ts, dv, hi = self.hist_t[d], self.hist_dv[d], self.hist_hi[d]
        i = bisect_left(ts, at)
        if i == len(ts) or ts[i] != at:
            ts.insert(i, at)
            dv.insert(i, 0)
            hi.insert(i, 0)
        dv[i] += delta
        self.level[d] += delta
        if instant_free:
            hi[i] -= delta
        if delta > 0:
            level = self.level[d]
            high = level + hi[-1]
            for k in range(len(ts) - 1, i, -1):
                level -= dv[k]
                if level + hi[k - 1] > high:
                    high = level + hi[k - 1]
            if high > self.peak_bound[d]:
                self.peak_bound[d] = high

    def fits(self, d: int, new: int, allocs: Sequence[tuple[float, int]], extra_res: int,
             start: float | None) -> bool:
        """Whether ``new`` bytes allocated on d now (or from ``start`` on, a time in the past),
        with transfers allocating ``allocs`` (``(start, bytes)``) and ``extra_res`` resident
        bytes of a group not yet charged, stay within d's capacity from the earliest of them
        to the end."""
        ts, dv, hi = self.hist_t[d], self.hist_dv[d], self.hist_hi[d]
        allocs = list(allocs)
        if start is not None:
            allocs.append((start, new))
            new = 0
        vk = self.level[d]  # the level at breakpoint k, walking back
        worst = vk + max(0, hi[-1]) + new
        if allocs:
            starts = sorted(allocs)
            moved = sum(size for _, size in starts)
            worst += moved
            # Breakpoints before now: the instant's high plus the transfers started by then,
            # and the level until the next breakpoint plus those started before it.
            before = moved  # transfers started before ts[k + 1]
            j = len(starts) - 1
            s_min = starts[0][0]
            for k in range(len(ts) - 2, -1, -1):
                seg_end = ts[k + 1]
                if seg_end <= s_min:
                    break
                vk -= dv[k + 1]
                while j >= 0 and starts[j][0] >= seg_end:
                    before -= starts[j][1]
                    j -= 1
                at = before
                i = j
                while i >= 0 and starts[i][0] > ts[k]:
                    at -= starts[i][1]
                    i -= 1
                level = max(vk + before, vk + hi[k] + at)
                if level > worst:
                    worst = level
        if extra_res:
            worst = max(worst, self.peak_bound[d])
        return self.resident[d] + extra_res + worst <= self.cap[d]

    def free(self, d: int, at_alloc: float, when: float, size: int, index: int,
             now: float) -> bool:
        """Free allocation ``index`` (``size`` bytes on d, allocated at ``at_alloc``) at
        ``when``: applied at once if ``when`` is before ``now`` (then ``True``: the caller may
        retry what waited for memory on d), else queued for :meth:`apply_frees`."""
        self.allocs[index][3] = when
        if size == 0:
            return False
        phase = 2 if when <= at_alloc else 0
        if when < now:
            self.level_add(d, when, -size, instant_free=phase == 2)
            return True
        heapq.heappush(self.pending, (when, phase, next(self._counter), d, size))
        return False

    def apply_frees(self, upto: float, past_instant: bool) -> list[int]:
        """Apply queued frees before ``upto``, and at ``upto`` those of earlier allocations (all
        of them when the clock moves past that instant); returns the devices touched, sorted."""
        pending = self.pending
        touched = set()
        while pending and (pending[0][0] < upto or (pending[0][0] == upto and
                                                     (past_instant or pending[0][1] == 0))):
            when, phase, _, d, size = heapq.heappop(pending)
            self.level_add(d, when, -size, instant_free=phase == 2)
            touched.add(d)
        return sorted(touched)

    def peaks(self) -> list[int]:
        """Peak bytes per device over the whole schedule, by the rule of the module
        docstring (resident bytes included)."""
        changes: list[list[tuple[float, int, int]]] = [[] for _ in self.cap]
        for d, size, at, free in self.allocs:
            if size == 0:
                continue
            changes[d].append((at, 1, size))
            if free is not None:
                changes[d].append((free, 2 if free <= at else 0, -size))
        peaks = []
        for d, found in enumerate(changes):
            level = peak = self.resident[d]
            for _, _, delta in sorted(found):
                level += delta
                if level > peak:
                    peak = level
            peaks.append(peak)
        return peaks
