"""The memory timeline where a workspace is freed the instant it is made, at byte counts that
fit in 64-bit integers and at ones that do not (the two ways the levels are added up)."""

from __future__ import annotations

import pytest

from trainsched.graph import Edge, Graph, Op
from trainsched.sim import simulate_single


def instant_workspace(scale: int) -> Graph:
    # a takes no time and uses 50 units of workspace; b starts when a ends (at 0) and makes
    # 10 units of output that nothing frees.
    return Graph([Op(name="a", compute_s=0.0, temp_bytes=50 * scale),
                  Op(name="b", compute_s=1.0, output_bytes=10 * scale)],
                 [Edge(src="a", dst="b", size_bytes=0)])


@pytest.mark.parametrize("scale", [1, 2**62], ids=["int64", "beyond-int64"])
def test_a_workspace_freed_the_instant_it_is_made_shows_its_high(scale):
    result = simulate_single(instant_workspace(scale), allow_forward_only=True)
    # At 0: a's workspace (+50) and b's output (+10) are made, then a's workspace goes (-50):
    # the high of 60 and then the level 10, both at 0 (no separate resident point at 0).
    assert result.memory_timeline["device0"] == ((0.0, 60 * scale), (0.0, 10 * scale))
    assert result.peak_memory_bytes["device0"] == 60 * scale
    assert result.peak_op["device0"] == "b"
