"""Several captures of one model merged into one graph (:func:`trainsched.graph.median_costs`)."""

from __future__ import annotations

import pytest

from trainsched.errors import TrainschedError
from trainsched.graph import CAPTURE_PASSES, Edge, Graph, Op, median_costs


def _capture(a_s: float, b_s: float, b_dw: float, *, eager_s: float, samples: int = 5) -> Graph:
    """A two-op capture: ``a`` (forward only) feeding ``b`` (with dX and dW times)."""
    ops = [Op(name="a", kind="forward", compute_s=a_s, compute_p10_s=a_s * 0.9,
              compute_p90_s=a_s * 1.2, samples=samples),
           Op(name="b", kind="forward", compute_s=b_s, backward_input_s=2 * b_s,
              backward_weight_s=b_dw, samples=samples)]
    return Graph(ops, [Edge(src="a", dst="b", size_bytes=16)], {"model": "m", "eager": eager_s})


def test_each_time_is_the_median_of_that_op_over_the_captures():
    merged = median_costs([_capture(1.0, 10.0, 4.0, eager_s=1),
                           _capture(3.0, 30.0, 2.0, eager_s=2),
                           _capture(2.0, 50.0, 9.0, eager_s=3)])
    a, b = merged.ops
    # worked out by hand: the middle of each op's three values, field by field
    assert a.compute_s == 2.0 and b.compute_s == 30.0
    assert a.compute_p10_s == pytest.approx(1.8) and a.compute_p90_s == pytest.approx(2.4)
    assert b.backward_input_s == 60.0 and b.backward_weight_s == 4.0
    assert a.samples == b.samples == 15
    assert merged.edges == (Edge(src="a", dst="b", size_bytes=16),)


def test_the_meta_is_the_median_captures_and_counts_the_passes():
    # totals 11, 53 and 33 ms: the capture of total 33 is the middle one
    merged = median_costs([_capture(1.0, 10.0, 1.0, eager_s=1),
                           _capture(3.0, 50.0, 1.0, eager_s=2),
                           _capture(3.0, 30.0, 1.0, eager_s=3)])
    assert merged.meta["eager"] == 3
    assert merged.meta[CAPTURE_PASSES] == 3


def test_one_capture_is_returned_as_it_is():
    graph = _capture(1.0, 2.0, 3.0, eager_s=1)
    assert median_costs([graph]) is graph


def test_captures_of_different_models_are_refused():
    other = Graph([Op(name="a", kind="forward", compute_s=1.0),
                   Op(name="c", kind="forward", compute_s=1.0)],
                  [Edge(src="a", dst="c", size_bytes=16)], {})
    with pytest.raises(TrainschedError, match=r"capture 2 is not of the same model.*op 1"):
        median_costs([_capture(1.0, 2.0, 3.0, eager_s=1), other])


def test_a_time_measured_in_one_capture_only_is_refused():
    plain = Graph([Op(name="a", kind="forward", compute_s=1.0),
                   Op(name="b", kind="forward", compute_s=2.0)],
                  [Edge(src="a", dst="b", size_bytes=16)], {})
    with pytest.raises(TrainschedError, match="op 'a': compute_p10_s was measured in some"):
        median_costs([_capture(1.0, 2.0, 3.0, eager_s=1), plain])


def test_no_capture_is_an_error():
    with pytest.raises(TrainschedError, match="at least one"):
        median_costs([])
