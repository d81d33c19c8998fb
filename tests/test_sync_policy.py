"""Sync policies: the phase text (exact round trip, errors that point at the column), the
phase quotas in samples and the learning-rate scale."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trainsched.errors import TrainschedError
from trainsched.sync import Asp, Bsp, KOfN, LocalSgd, Ssp
from trainsched.sync.policy import SyncPolicy, format_policy, lr_scale, parse_policy
from trainsched.sync.straggler import StragglerPolicy


@pytest.mark.parametrize("text", ["bsp:0.125,asp:0.875", "bsp:0.5,ssp(s=4):0.5",
                                  "bsp:0.25,local(h=8):0.75", "asp", "k-of-n:3",
                                  "bsp:0.5,asp:0.5;straggler(relax)",
                                  "bsp;straggler(exclude,on=1.5,prior=30.0)"])
def test_canonical_text_round_trips(text):
    assert format_policy(parse_policy(text)) == text


@pytest.mark.parametrize(("text", "protocol"), [
    ("ssp:4", Ssp(4)), ("ssp:0", Ssp(0)), ("k-of-n:3", KOfN(3)), ("local:8", LocalSgd(8)),
    ("bsp", Bsp()), ("asp", Asp())])
def test_one_protocol_alone_is_written_short_and_round_trips(text, protocol):
    policy = parse_policy(text)
    assert policy == SyncPolicy(phases=((protocol, 1.0),))
    assert format_policy(policy) == text


@pytest.mark.parametrize(("text", "canonical"), [
    ("ssp(s=4)", "ssp:4"), ("ssp(4):1", "ssp:4"), ("local(h=8):1.0", "local:8"),
    ("K-OF-N : 3", "k-of-n:3"), ("ssp:2;straggler(relax)", "ssp:2;straggler(relax)")])
def test_the_long_forms_of_one_protocol_read_as_the_short_one(text, canonical):
    assert format_policy(parse_policy(text)) == canonical


def test_a_number_after_a_protocol_with_a_parameter_is_the_parameter_alone():
    # ssp:1 is ssp(s=1) for all the samples, not "ssp for fraction 1"
    assert parse_policy("ssp:1").phases == ((Ssp(1), 1.0),)
    assert parse_policy("local:1").phases == ((LocalSgd(1), 1.0),)


def test_a_number_after_a_protocol_without_a_parameter_is_still_the_fraction():
    assert parse_policy("asp:1") == parse_policy("asp")
    assert parse_policy("bsp:1").phases == ((Bsp(), 1.0),)


def test_several_phases_keep_the_parenthesised_parameter():
    policy = parse_policy("bsp:0.5,ssp(s=4):0.5")
    assert policy.phases == ((Bsp(), 0.5), (Ssp(4), 0.5))
    assert format_policy(policy) == "bsp:0.5,ssp(s=4):0.5"


def test_policy_text_reads_the_phases_in_order():
    policy = parse_policy("bsp:0.25,local(h=8):0.75")
    assert policy.phases == ((Bsp(), 0.25), (LocalSgd(8), 0.75))
    assert policy.straggler is None


def test_a_lone_protocol_is_all_the_samples():
    assert parse_policy("asp") == parse_policy("asp:1") == SyncPolicy(phases=((Asp(), 1.0),))


def test_spaces_between_parts_are_allowed():
    assert parse_policy(" bsp : 0.5 , asp:0.5 ") == parse_policy("bsp:0.5,asp:0.5")


def test_the_straggler_policy_follows_the_phases():
    policy = parse_policy("bsp;straggler(relax,p_on=4,margin=2.0)")
    assert policy.straggler == StragglerPolicy(action="relax", observations_on=4, margin=2.0)


_protocols = st.one_of(st.just(Bsp()), st.just(Asp()), st.builds(Ssp, st.integers(0, 99)),
                       st.builds(KOfN, st.integers(1, 9)),
                       st.builds(LocalSgd, st.integers(1, 99)))
_stragglers = st.one_of(st.none(), st.builds(
    StragglerPolicy, action=st.sampled_from(["exclude", "relax", "ignore"]),
    theta_on=st.floats(1.2, 3.0), observations_on=st.integers(1, 9),
    theta_off=st.just(1.1), min_dwell=st.integers(0, 9),
    prior_episode_s=st.floats(0, 1e4)))


@st.composite
def _policies(draw):
    protocols = draw(st.lists(_protocols, min_size=1, max_size=5))
    protocols = [p for k, p in enumerate(protocols) if k == 0 or p != protocols[k - 1]]
    weights = [draw(st.integers(1, 1000)) for _ in protocols]
    fractions = [w / sum(weights) for w in weights]
    return SyncPolicy(phases=tuple(zip(protocols, fractions, strict=True)),
                      straggler=draw(_stragglers))


@given(_policies())
def test_every_policy_round_trips_through_its_text(policy):
    text = format_policy(policy)
    assert parse_policy(text) == policy
    assert format_policy(parse_policy(text)) == text


@pytest.mark.parametrize(("text", "column", "words"), [
    ("bsp:0.5,hogwild:0.5", 9, "unknown sync protocol 'hogwild'"),
    ("bsp:0.5;asp:0.5", 9, "expected the straggler policy"),
    ("bsp:0.5,,asp:0.5", 9, "expected a protocol"),
    ("bsp:x,asp:1", 5, "expected the phase's fraction"),
    ("bsp:0.5 asp:0.5", 9, "expected ','"),
    ("bsp:1.5", 5, "the fraction 1.5 is not in (0, 1]"),
    ("bsp:0.5,asp", 9, "phase asp needs its fraction"),
    ("straggler(relax)", 1, "comes after the phases"),
    ("bsp;straggler(drop)", 15, "unknown action 'drop'"),
    ("bsp:0.5,ssp:0.5", 9, "in a policy of several phases write ssp's parameter in parentheses"),
    ("bsp:0.5,ssp:4", 9, "ssp(s=N):F"),
    ("local:8,bsp:0.5", 1, "in a policy of several phases"),
    ("ssp:0.5", 5, "gives ssp's parameter s, a whole number"),
    ("ssp", 1, "needs its parameter; write ssp:N or ssp(s=N)"),
    ("ssp:x", 5, "expected ssp's parameter"),
    ("k-of-n:0", 8, "k must be a whole number >= 1"),
    ("asp:2", 5, "the fraction 2 is not in (0, 1]"),
])
def test_malformed_text_points_at_the_column(text, column, words):
    with pytest.raises(TrainschedError) as info:
        parse_policy(text)
    message = str(info.value)
    assert f"column {column}" in message
    assert words in message
    assert repr(text) in message


def test_fractions_must_sum_to_one_and_the_error_says_the_sum():
    with pytest.raises(TrainschedError, match=r"sum to 0\.9, not 1"):
        parse_policy("bsp:0.5,asp:0.4")


def test_a_sum_within_the_tolerance_is_accepted():
    assert parse_policy("bsp:0.1,asp:0.2,bsp:0.7").bsp_fraction == pytest.approx(0.8)


def test_the_same_protocol_twice_in_a_row_is_refused():
    with pytest.raises(TrainschedError, match="merge them"):
        parse_policy("bsp:0.5,bsp:0.5")


def test_phase_samples_round_half_up_and_sum_to_the_total():
    # 1000 × 0.125 = 125 exactly; 1000 × (1/3) = 333.33 -> 333, the rest to the last phase.
    assert parse_policy("bsp:0.125,asp:0.875").phase_samples(1000) == (125, 875)
    thirds = SyncPolicy(phases=((Bsp(), 1 / 3), (Asp(), 1 / 3), (Ssp(2), 1 / 3)))
    assert thirds.phase_samples(1000) == (333, 334, 333)


def test_phase_boundaries_fall_on_multiples_of_the_quantum():
    # 1000 × 0.125 = 125 samples = 1.95 steps of 64 -> 2 steps = 128.
    assert parse_policy("bsp:0.125,asp:0.875").phase_samples(1000, quantum=64) == (128, 872)


def test_phase_at_follows_the_quotas():
    policy = parse_policy("bsp:0.25,asp:0.75")
    assert [policy.phase_at(s, 100) for s in (0, 24, 25, 99, 100)] == [0, 0, 1, 1, 1]


@pytest.mark.parametrize(("protocol", "scale"), [
    (Bsp(), 1.0), (Asp(), 0.25), (Ssp(3), 0.25), (KOfN(3), 0.75), (LocalSgd(8), 1.0)])
def test_lr_scale_is_effective_batch_over_bsp_batch(protocol, scale):
    assert lr_scale(protocol, 4, 32) == scale
