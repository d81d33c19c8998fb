"""The synchronisation protocols' facts (effective batch, server rule) and their text form."""

import math

import pytest

from trainsched.errors import TrainschedError
from trainsched.sync import Asp, Bsp, KOfN, LocalSgd, Ssp, format_protocol, parse_protocol


@pytest.mark.parametrize(("protocol", "batch"), [
    (Bsp(), 4 * 32), (Asp(), 32), (Ssp(3), 32), (KOfN(3), 3 * 32), (LocalSgd(8), 4 * 32)])
def test_effective_batch_is_samples_per_shared_update(protocol, batch):
    assert protocol.effective_batch(4, 32) == batch


@pytest.mark.parametrize(("protocol", "rule"), [
    (Bsp(), (4, 0)), (Asp(), (1, math.inf)), (Ssp(2), (1, 2)), (KOfN(4), (4, 0)),
    (LocalSgd(8), None)])
def test_server_rule_is_k_fresh_gradients_and_staleness_bound(protocol, rule):
    assert protocol.server_rule(4) == rule


@pytest.mark.parametrize("text", ["bsp", "asp", "ssp(s=4)", "ssp(s=0)", "k-of-n(k=3)",
                                  "local(h=8)"])
def test_text_round_trips_exactly(text):
    assert format_protocol(parse_protocol(text)) == text


@pytest.mark.parametrize(("text", "protocol"), [
    ("ssp:4", Ssp(4)), ("k-of-n:3", KOfN(3)), ("local:8", LocalSgd(8))])
def test_the_short_form_reads_and_writes_the_same_protocol(text, protocol):
    assert parse_protocol(text) == protocol
    assert format_protocol(protocol, short=True) == text


def test_a_protocol_without_a_parameter_is_its_name_in_the_short_form_too():
    assert format_protocol(Asp(), short=True) == "asp"


def test_the_parameter_name_may_be_left_out():
    assert parse_protocol("ssp(4)") == Ssp(4)


@pytest.mark.parametrize(("text", "words"), [
    ("hogwild", "unknown sync protocol 'hogwild'"),
    ("ssp", "needs its parameter"),
    ("bsp(2)", "takes no parameter"),
    ("bsp:2", "takes no parameter"),
    ("ssp(h=2)", "has parameter 's'"),
    ("ssp(s=-1)", "cannot read"),
    ("local(h=0)", "h must be a whole number >= 1"),
])
def test_bad_protocol_text_says_what_is_wrong(text, words):
    with pytest.raises(TrainschedError, match=words.replace("(", r"\(")):
        parse_protocol(text)


def test_k_of_n_refuses_more_than_the_ranks():
    with pytest.raises(TrainschedError, match="k=5 is more than the 4 ranks"):
        KOfN(5).server_rule(4)
