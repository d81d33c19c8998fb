"""Placement (JSON file, validation), Action (text form), Schedule (text, CSV, validation)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trainsched.cluster import cluster_preset
from trainsched.errors import TrainschedError
from trainsched.graph import Edge, Graph, Op
from trainsched.plan import (
    ACTION_KINDS,
    PLACEMENT_FORMAT,
    STAGE_KINDS,
    Action,
    Placement,
    Schedule,
)


def chain_graph() -> Graph:
    """c -> a -> b (listed out of topological order), a and b tied in one group."""
    ops = [Op(name="a", group="tied"), Op(name="b", group="tied"), Op(name="c")]
    edges = [Edge(src="c", dst="a", size_bytes=4), Edge(src="a", dst="b", size_bytes=4)]
    return Graph(ops, edges)


def two_device() -> Placement:
    return Placement(device_of={"c": 1, "a": 0, "b": 0}, num_devices=2, meta={"policy": "test"})


# --- Placement -----------------------------------------------------------------------------------


def test_single_places_every_op_on_one_device():
    g = chain_graph()
    p = Placement.single(g)
    assert p.num_devices == 1 and dict(p.device_of) == {"a": 0, "b": 0, "c": 0}
    p.validate(g)
    assert p.ops_on(0, g) == ("c", "a", "b")
    assert Placement.single(g, 3).num_devices == 4
    assert Placement.single(g, 1, num_devices=8).ops_on(0) == ()


def test_ops_on_orders_by_topology_or_name():
    g, p = chain_graph(), two_device()
    assert p.ops_on(0, g) == ("a", "b") and p.ops_on(1, g) == ("c",)
    assert p.ops_on(0) == ("a", "b")
    with pytest.raises(TrainschedError, match=r"device 2 is outside 0\.\.1"):
        p.ops_on(2)


def test_validate_accepts_a_good_placement_and_checks_the_cluster():
    g, p = chain_graph(), two_device()
    dgx = cluster_preset("dgx-h100")  # one node of 8 GPUs
    p.validate(g, dgx)
    wide = Placement(device_of={"a": 0, "b": 0, "c": 0}, num_devices=64)
    with pytest.raises(TrainschedError, match="uses 64 devices but cluster 'dgx-h100' has 8"):
        wide.validate(g, dgx)


@pytest.mark.parametrize(
    ("device_of", "message"),
    [
        ({"a": 0, "b": 0}, r"without a device: 'c'; give every op a device"),
        ({"a": 0, "b": 0, "c": 0, "zz": 1}, r"not in the graph: 'zz'"),
        ({"a": 0, "b": 1, "c": 0}, r"group 'tied' is split across devices \[0, 1\]: "
                                   r"'a' on 0, 'b' on 1; put all ops of a group on one device"),
    ],
    ids=["unplaced op", "unknown op", "split group"],
)  # fmt: skip
def test_validate_names_the_ops(device_of, message):
    with pytest.raises(TrainschedError, match=message):
        Placement(device_of=device_of, num_devices=2).validate(chain_graph())


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"device_of": {"a": 2}, "num_devices": 2}, r"op 'a' is on device 2, outside 0\.\.1"),
        ({"device_of": {"a": -1}, "num_devices": 2}, r"op 'a' is on device -1"),
        ({"device_of": {"a": True}, "num_devices": 2}, r"op 'a' is on device True"),
        ({"device_of": {"": 0}, "num_devices": 2}, r"non-empty strings"),
        ({"device_of": {}, "num_devices": 0}, r"num_devices must be an integer >= 1"),
        ({"device_of": [("a", 0)], "num_devices": 1}, r"device_of must map op names"),
    ],
)
def test_placement_checks_its_fields(kwargs, message):
    with pytest.raises(TrainschedError, match=message):
        Placement(**kwargs)


def test_placement_json_is_exact_and_byte_identical(tmp_path):
    p = two_device()
    text = p.to_json()
    assert text == (
        '{"format": "trainsched.placement/1",\n"num_devices": 2,\n"meta": {"policy": "test"},\n'
        '"device_of": {\n  "a": 0,\n  "b": 0,\n  "c": 1\n}}\n'
    )
    assert Placement.from_json(text) == p
    shuffled = Placement(device_of={"b": 0, "c": 1, "a": 0}, num_devices=2, meta={"policy": "test"})
    assert shuffled.to_json() == text
    p.save(tmp_path / "p.json")
    assert (tmp_path / "p.json").read_text() == text
    assert Placement.load(tmp_path / "p.json") == p
    empty = Placement(device_of={}, num_devices=1)
    assert Placement.from_json(empty.to_json()) == empty


def test_placement_is_read_only():
    p = two_device()
    with pytest.raises(TypeError):
        p.device_of["a"] = 1  # type: ignore[index]
    assert repr(p) == "<Placement: 3 ops on 2 devices>"


@given(
    st.dictionaries(st.text(min_size=1, max_size=8), st.integers(0, 7), max_size=12),
    st.dictionaries(st.text(max_size=5), st.integers() | st.text(max_size=5), max_size=3),
)
def test_placement_json_round_trip_property(device_of, meta):
    p = Placement(device_of=device_of, num_devices=8, meta=meta)
    text = p.to_json()
    back = Placement.from_json(text)
    assert back == p and back.to_json() == text
    assert text.isascii()


def _doc(**changes) -> str:
    doc = {"format": PLACEMENT_FORMAT, "num_devices": 2, "meta": {}, "device_of": {"a": 0}}
    doc.update(changes)
    return json.dumps({k: v for k, v in doc.items() if v is not ...})


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", r"f\.json: malformed JSON at line 1.*truncated\?"),
        ('{"format": "trainsched.placement/1", "num_devices": 2', r"truncated\?"),
        ("{nope}", r"f\.json: malformed JSON at line 1, column 2"),
        ("[1, 2]", r"f\.json: expected a JSON object, got a list"),
        (_doc(format=...), r"f\.json: no 'format' field; this reader supports"),
        (_doc(format="trainsched.graph/1"), r"f\.json: format 'trainsched\.graph/1'"),
        (_doc(num_devices=...), r"f\.json: missing required field 'num_devices'"),
        (_doc(device_of=...), r"f\.json: missing required field 'device_of'"),
        (_doc(devices_of={}), r"f\.json: unknown field 'devices_of' \(did you mean 'device_of'"),
        (_doc(num_devices="2"), r"f\.json: num_devices: expected an integer, got \"2\""),
        (_doc(num_devices=2.0), r"f\.json: num_devices: expected an integer, got 2\.0"),
        (_doc(device_of=[["a", 0]]), r"f\.json: device_of: expected an object .* got a list"),
        (_doc(device_of={"a": "gpu0"}), r"f\.json: device_of\['a'\]: expected an integer"),
        (_doc(device_of={"a": None}), r"device_of\['a'\]: expected an integer .* got null"),
        (_doc(meta=[]), r"f\.json: meta: expected an object, got a list"),
        (_doc(device_of={"a": 5}), r"f\.json: placement: op 'a' is on device 5, outside"),
        ('{"format": "trainsched.placement/1", "num_devices": 2, '
         '"device_of": {"a": 0, "a": 1}}', r"f\.json: key 'a' appears twice"),
    ],
    ids=["malformed", "truncated", "bad token", "not an object", "no format", "wrong format",
         "no num_devices", "no device_of", "unknown field", "string count", "float count",
         "device_of list", "device name", "device null", "meta list", "out of range",
         "placed twice"],
)  # fmt: skip
def test_bad_placement_files(text, message):
    with pytest.raises(TrainschedError, match=message):
        Placement.from_json(text, source="f.json")


def test_placement_load_errors(tmp_path):
    with pytest.raises(TrainschedError, match="no such placement file"):
        Placement.load(tmp_path / "missing.json")
    (tmp_path / "bin.json").write_bytes(b"\xff\xfe")
    with pytest.raises(TrainschedError, match="not UTF-8"):
        Placement.load(tmp_path / "bin.json")
    bad = Placement(device_of={"a": 0}, num_devices=1, meta={"x": object()})
    with pytest.raises(TrainschedError, match="not JSON-serialisable"):
        bad.save(tmp_path / "p.json")
    assert list(tmp_path.iterdir()) == [tmp_path / "bin.json"]


# --- Action --------------------------------------------------------------------------------------


def test_action_text_form():
    assert str(Action(stage=0, kind="F", microbatch=0)) == "0F0"
    assert str(Action(stage=12, kind="SEND_B", microbatch=30)) == "12SEND_B30"
    assert str(Action(stage=1, kind="REDUCE_GRAD")) == "1REDUCE_GRAD"
    assert Action.parse("1I3") == Action(stage=1, kind="I", microbatch=3)
    assert Action.parse(" 2RECV_F0 ") == Action(stage=2, kind="RECV_F", microbatch=0)
    assert Action.parse("0UNSHARD") == Action(stage=0, kind="UNSHARD")


def actions(limit: int) -> st.SearchStrategy[Action]:
    """Actions of every kind with stage and micro-batch indices up to ``limit``."""
    index = st.integers(0, limit)
    return st.one_of(
        st.builds(lambda s, k, m: Action(stage=s, kind=k, microbatch=m), index,
                  st.sampled_from([k for k in ACTION_KINDS if k not in STAGE_KINDS]), index),
        st.builds(lambda s, k: Action(stage=s, kind=k), index, st.sampled_from(STAGE_KINDS)),
    )  # fmt: skip


@given(actions(10**9))
def test_action_parse_inverts_str(action):
    assert Action.parse(str(action)) == action


@pytest.mark.parametrize(
    ("token", "message"),
    [
        ("1X3", r"bad action '1X3': expected <stage><kind><micro-batch> like 1F3"),
        ("F3", r"bad action 'F3'"),
        ("", r"bad action ''"),
        ("-1F0", r"bad action '-1F0'"),
        ("1F", r"bad action '1F': F needs a micro-batch, like 1F0"),
        ("1SEND_F", r"SEND_F needs a micro-batch"),
        ("0REDUCE_GRAD1", r"REDUCE_GRAD takes no micro-batch"),
        ("1f3", r"bad action '1f3'"),
        ("(0F0;1B0)OVERLAP_F_B", r"OVERLAP_F_B actions are not supported"),
    ],
)
def test_bad_action_tokens(token, message):
    with pytest.raises(TrainschedError, match=message):
        Action.parse(token)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"stage": -1, "kind": "F", "microbatch": 0}, "stage must be an integer >= 0"),
        ({"stage": 0, "kind": "X", "microbatch": 0}, "unknown action kind 'X'"),
        ({"stage": 0, "kind": "F"}, "micro-batch must be an integer >= 0, got None"),
        ({"stage": 0, "kind": "UNSHARD", "microbatch": 1}, "takes no micro-batch"),
    ],
)
def test_action_checks_its_fields(kwargs, message):
    with pytest.raises(TrainschedError, match=message):
        Action(**kwargs)


# --- Schedule: text and CSV ----------------------------------------------------------------------

ONE_F_ONE_B_2x3 = "0F0 0F1 0B0 0F2 0B1 0B2\n1F0 1B0 1F1 1B1 1F2 1B2\n"


def test_text_round_trip_and_defaults():
    s = Schedule.from_text(ONE_F_ONE_B_2x3)
    assert (s.num_ranks, s.num_stages, s.num_microbatches) == (2, 2, 3)
    assert s.stage_to_rank == (0, 1)
    assert s.to_text() == ONE_F_ONE_B_2x3
    assert s.compute_actions(1)[:2] == (Action.parse("1F0"), Action.parse("1B0"))
    s.validate()


def test_text_idle_slots_whitespace_and_empty_ranks():
    s = Schedule.from_text("0F0  _ 0B0\n\n_ 1F0\t1B0", num_stages=2, stage_to_rank=[0, 2])
    assert s.ranks[0][1] is None and s.ranks[1] == () and s.ranks[2][0] is None
    assert s.to_text() == "0F0 _ 0B0\n\n_ 1F0 1B0\n"
    assert Schedule.from_text(s.to_text(), num_stages=2, stage_to_rank=[0, 2]) == s
    s.validate()


def test_loop_placement_is_the_default():
    s = Schedule.from_text("0F0 2F0 2B0 0B0\n1F0 3F0 3B0 1B0\n")
    assert s.num_stages == 4 and s.stage_to_rank == (0, 1, 0, 1)
    s.validate()


def test_csv_round_trip_is_byte_identical():
    s = Schedule.from_text("0F0 0F1 _ 0I0 0W0 0I1 0W1\n_ 1F0 1F1 1I0 1W0 1I1 1W1\n")
    csv_text = s.to_csv()
    assert csv_text == ("0F0,0F1,,0I0,0W0,0I1,0W1\r\n"
                        ",1F0,1F1,1I0,1W0,1I1,1W1\r\n")  # fmt: skip
    back = Schedule.from_csv(csv_text)
    assert back == s and back.to_csv() == csv_text
    assert Schedule.from_csv(csv_text.replace("\r\n", "\n")) == s


def test_csv_edge_rows():
    s = Schedule(ranks=((None,), (), (Action.parse("0F0"), None)), num_stages=1,
                 num_microbatches=1)  # fmt: skip
    assert s.to_csv() == '""\r\n\r\n0F0,\r\n'
    assert Schedule.from_csv(s.to_csv(), num_stages=1) == s


@given(st.lists(st.lists(st.none() | actions(30), max_size=6), min_size=1, max_size=4))
def test_text_and_csv_round_trip_property(rows):
    s = Schedule(ranks=rows, num_stages=31, num_microbatches=31)
    args = {"num_stages": 31, "num_microbatches": 31}
    assert Schedule.from_text(s.to_text(), **args) == s
    assert Schedule.from_csv(s.to_csv(), **args) == s
    assert Schedule.from_csv(s.to_csv(), **args).to_csv() == s.to_csv()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0F0 0B0\n1F0 1Q0\n", r"<text>: line 2 \(rank 1\), token 2: bad action '1Q0'"),
        ("", r"no actions to count stages from; pass num_stages"),
        ("0UNSHARD\n", r"no micro-batch actions to count from; pass num_microbatches"),
    ],
)
def test_bad_schedule_text(text, message):
    with pytest.raises(TrainschedError, match=message):
        Schedule.from_text(text)


def test_bad_schedule_csv():
    with pytest.raises(TrainschedError, match=r"s\.csv: row 1 \(rank 0\), cell 2: bad action"):
        Schedule.from_csv("0F0,0G0\r\n", source="s.csv")
    with pytest.raises(TrainschedError, match="at least one rank"):
        Schedule.from_csv("", num_stages=1, num_microbatches=1)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"ranks": ()}, "at least one rank"),
        ({"ranks": (("0F0",),)}, r"rank 0, position 0: expected an Action or None"),
        ({"num_stages": 0}, "num_stages must be an integer >= 1"),
        ({"num_microbatches": 1.5}, "num_microbatches must be an integer >= 1"),
        ({"stage_to_rank": (0,)}, "stage_to_rank has 1 entries for 2 stages"),
        ({"stage_to_rank": (0, 2)}, r"stage_to_rank\[1\] = 2 is not a rank 0\.\.1"),
    ],
)
def test_schedule_checks_its_fields(kwargs, message):
    base = {"ranks": ((), ()), "num_stages": 2, "num_microbatches": 1} | kwargs
    with pytest.raises(TrainschedError, match=message):
        Schedule(**base)


def test_compute_actions_skips_comm_idle_and_stage_actions():
    s = Schedule.from_text("0UNSHARD 0F0 0SEND_F0 _ 0RECV_B0 0B0 0REDUCE_GRAD\n"
                           "1RECV_F0 1F0 1B0 1SEND_B0\n")  # fmt: skip
    assert [str(a) for a in s.compute_actions(0)] == ["0F0", "0B0"]
    with pytest.raises(TrainschedError, match=r"rank 2 is outside 0\.\.1"):
        s.compute_actions(2)
    s.validate()


# --- Schedule: validation ------------------------------------------------------------------------


def invalid(text: str, **kwargs) -> str:
    with pytest.raises(TrainschedError) as info:
        Schedule.from_text(text, **kwargs).validate()
    return str(info.value)


def test_missing_actions_are_named():
    message = invalid("0F0 0F1 0B0 0B1\n1F0 1B0 1B1\n")
    assert "schedule is invalid (1 problem(s)):" in message
    assert "stage 1 micro-batch 1 has no forward: add 1F1 to rank 1" in message
    message = invalid("0F0 0B0\n1F0\n")
    assert "stage 1 micro-batch 0 has no backward: add 1B0 (or 1I0 and 1W0) to rank 1" in message
    message = invalid("0F0 0I0\n1F0 1B0\n")
    assert "0I0 has no 0W0: a split backward needs both; add it to rank 0" in message
    message = invalid("0F0 0B0 0W0\n1F0 1B0\n")
    assert "has both 0B0 and a split backward" in message


def test_missing_microbatch_is_found_with_explicit_count():
    message = invalid("0F0 0B0\n1F0 1B0\n", num_microbatches=2)
    assert "stage 0 micro-batch 1 has no forward: add 0F1 to rank 0" in message
    assert "stage 1 micro-batch 1 has no backward" in message


def test_duplicates_are_named():
    message = invalid("0F0 0F0 0B0\n1F0 1B0\n")
    assert "0F0 appears 2 times (rank 0 position 0, rank 0 position 1); keep one" in message


def test_actions_on_the_wrong_rank_or_out_of_range():
    message = invalid("0F0 1F0 0B0\n1B0\n")
    assert "1F0 (rank 0, position 1): stage 1 runs on rank 1 (stage_to_rank); move it" in message
    message = invalid("0F0 0B0 0F5\n1F0 1B0\n", num_microbatches=1)
    assert "0F5 (rank 0, position 2): micro-batch 5 is outside 0..0" in message
    message = invalid("0F0 0B0\n1F0 1B0 3F0\n", num_stages=2)
    assert "3F0 (rank 1, position 2): stage 3 is outside 0..1 (num_stages=2)" in message


def test_order_on_a_rank():
    message = invalid("0F0 0W0 0I0\n1F0 1B0\n")
    assert ("rank 0: 0W0 at position 1 comes before 0I0 at position 2; a W must follow its I"
            in message)  # fmt: skip
    message = invalid("0B0 0F0\n1F0 1B0\n")
    assert "rank 0: 0B0 at position 0 comes before 0F0 at position 1" in message


def test_cross_rank_deadlock_is_reported_per_rank():
    # Rank 0 wants stage 1's gradient of micro-batch 0 before sending F1; rank 1 runs its
    # forwards first (GPipe order) and waits for F1 that never comes.
    message = invalid("0F0 0B0 0F1 0B1\n1F0 1F1 1B0 1B1\n")
    assert message.startswith("schedule deadlocks: no rank can make progress, 6 slot(s) left:")
    assert "rank 0: 0B0 (position 1) waits for 1B0 on rank 1 (position 2, not reached)" in message
    assert "rank 1: 1F1 (position 1) waits for 0F1 on rank 0 (position 2, not reached)" in message
    assert "reorder the rank lists" in message


def test_deadlock_lists_finished_ranks_and_same_rank_waits():
    # Stages 0 and 1 both on rank 0, listed in the wrong order; rank 1 has nothing to do.
    message = invalid("1F0 0F0 1B0 0B0\n\n", stage_to_rank=[0, 0])
    assert "rank 0: 1F0 (position 0) waits for 0F0 later on this rank (position 1)" in message
    assert "rank 1: finished" in message


def test_sends_and_receives_pair_up_and_order():
    ok = "0F0 0SEND_F0 0RECV_B0 0B0\n1RECV_F0 1F0 1B0 1SEND_B0\n"
    Schedule.from_text(ok).validate()
    message = invalid("0F0 0RECV_B0 0B0\n1RECV_F0 1F0 1B0 1SEND_B0\n")
    assert "1RECV_F0 has no matching 0SEND_F0; add it to rank 0" in message
    message = invalid("0F0 0SEND_F0 0B0 0SEND_F0\n1RECV_F0 1F0 1B0\n")
    assert "0SEND_F0 appears 2 times" in message
    message = invalid("0F0 0RECV_B0 0B0\n1F0 1B0\n", num_stages=3, stage_to_rank=[0, 1, 1])
    assert "0RECV_B0 has no matching 1SEND_B0; add it to rank 1" in message
    message = invalid("0F0 0SEND_B0 0B0\n1F0 1B0\n")
    assert "0SEND_B0: stage 0 has no stage -1 to pair with" in message
    # A receive posted before the matching send on the other rank can ever run.
    message = invalid("0F0 0RECV_B0 0SEND_F0 0B0\n1RECV_F0 1F0 1B0 1SEND_B0\n")
    assert "rank 0: 0RECV_B0 (position 1) waits for 1SEND_B0 on rank 1" in message
    assert "rank 1: 1RECV_F0 (position 0) waits for 0SEND_F0 on rank 0" in message


def test_problem_lists_are_capped():
    text = "\n".join(f"{s}F0" for s in range(30)) + "\n"
    message = invalid(text)
    assert "... and 10 more" in message and message.count("has no backward") == 20


def test_long_schedules_validate_in_linear_time():
    p, m = 8, 4000
    rows = []
    for r in range(p):
        rows.append(" ".join([f"{r}F{k}" for k in range(m)] + [f"{r}B{k}" for k in range(m)]))
    Schedule.from_text("\n".join(rows)).validate()  # 64k actions; well under a second


# --- Placement.order ----------------------------------------------------------------------------


def test_placement_order_round_trips_and_orders_each_device():
    g = chain_graph()
    p = Placement(device_of={"c": 1, "a": 0, "b": 0}, num_devices=2, order=["c", "a", "b"])
    text = p.to_json()
    assert text.endswith('"device_of": {\n  "a": 0,\n  "b": 0,\n  "c": 1\n},\n'
                         '"order": [\n  "c",\n  "a",\n  "b"\n]}\n')
    back = Placement.from_json(text)
    assert back == p and back.order == ("c", "a", "b") and back.to_json() == text
    p.validate(g)
    assert p.device_orders() == (("a", "b"), ("c",))
    assert p.order_for(g) == ("c", "a", "b")
    assert repr(p) == "<Placement: 3 ops on 2 devices, ordered>"


def test_a_file_without_order_runs_the_graphs_own_order():
    g = chain_graph()  # listed a, b, c; topological order c, a, b
    old = Placement.from_json(two_device().to_json())
    assert old.order is None and "order" not in old.to_json()
    assert old.order_for(g) == ("c", "a", "b") == g.topological_order()
    assert old.device_orders(g) == (("a", "b"), ("c",))


def test_an_order_that_runs_an_op_before_its_input_is_refused():
    p = Placement(device_of={"c": 1, "a": 0, "b": 0}, num_devices=2, order=["a", "c", "b"])
    with pytest.raises(TrainschedError, match=r"order runs 'a' before 'c'"):
        p.validate(chain_graph())


@pytest.mark.parametrize(("order", "message"), [
    (["a", "b"], r"order leaves out 1 placed op\(s\): 'c'"),
    (["a", "b", "c", "a"], r"order lists 'a' more than once"),
    (["a", "b", "c", "d"], r"order names 1 op\(s\) without a device: 'd'"),
    ("abc", r"order must be a sequence of op names, got str"),
])
def test_bad_orders(order, message):
    with pytest.raises(TrainschedError, match=message):
        Placement(device_of={"c": 1, "a": 0, "b": 0}, num_devices=2, order=order)


def test_bad_order_in_a_file():
    with pytest.raises(TrainschedError, match=r"f\.json: order: expected a list of op names"):
        Placement.from_json(_doc(order={"a": 0}), source="f.json")
    with pytest.raises(TrainschedError, match=r"f\.json: placement: order leaves out"):
        Placement.from_json(_doc(order=[]), source="f.json")
