"""``trainsched search-sync``: the offline BSP fraction from real runs of a built-in task."""

from __future__ import annotations

import json

import pytest

from trainsched.cli import main


@pytest.mark.parametrize(("argv", "words"), [
    (["mlp"], "unknown task 'mlp'; the sync runtime trains the built-in tasks: teacher-student"),
    (["teacher-student", "--relaxed", "hogwild"], "unknown sync protocol 'hogwild'"),
    (["teacher-student", "--repeats", "1"], "--repeats 1: give at least 2"),
    # one update of both protocols is 64 samples; fractions down to 1/64 need 64 of them
    (["teacher-student", "--samples", "1000"], "--samples 1000: give at least 4096"),
])
def test_bad_searches_are_one_line(argv, words, capsys):
    assert main(["search-sync", *argv]) == 2
    assert words in capsys.readouterr().err


pytest.importorskip("torch")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_search_reports_every_real_trial_and_a_policy_to_reuse(capsys):
    assert main(["search-sync", "teacher-student", "--samples", "1024", "--repeats", "2",
                 "--min-fraction", "0.5", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    # two reference runs at f = 1, then two at the one candidate, f = 1/2
    assert [t["fraction"] for t in doc["trials"]] == [1.0, 1.0, 0.5, 0.5]
    assert [c["fraction"] for c in doc["candidates"]] == [0.5]
    passed = doc["candidates"][0]["passed"]
    assert doc["policy"] == ("bsp:0.5,asp:0.5" if passed else "bsp")
    assert doc["total_wall_s"] == pytest.approx(sum(t["wall_s"] for t in doc["trials"]))
