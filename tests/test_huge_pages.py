"""``train --huge-pages``: the ranks' THP_MEM_ALLOC_ENABLE set for the run and restored after,
and ``auto`` choosing by timing the model off and on, alternating."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from trainsched.cli import main
from trainsched.errors import TrainschedError
from trainsched.runtime import huge_pages as hp
from trainsched.runtime.launch import HUGE_PAGES_ENV, huge_pages


def test_the_setting_holds_inside_and_the_environment_is_restored(monkeypatch):
    monkeypatch.delenv(HUGE_PAGES_ENV, raising=False)
    with huge_pages("1"):
        assert os.environ[HUGE_PAGES_ENV] == "1"
    assert HUGE_PAGES_ENV not in os.environ
    monkeypatch.setenv(HUGE_PAGES_ENV, "1")
    with huge_pages("0"):
        assert os.environ[HUGE_PAGES_ENV] == "0"
    assert os.environ[HUGE_PAGES_ENV] == "1"


def test_an_unknown_setting_is_refused():
    with pytest.raises(TrainschedError, match="expected one of 0, 1, got 'yes'"), \
            huge_pages("yes"):
        pass


@pytest.mark.parametrize(("off", "on", "expected"), [
    ([1.00, 1.10], [0.80, 0.85], "1"),   # medians 1.05 and 0.825: 1.27x faster on
    ([1.00, 1.04], [1.00, 1.01], "0"),   # 1.02 and 1.005: 1.5% faster, under the 3% margin
    ([0.50, 0.52], [1.10, 1.20], "0"),   # slower on
])
def test_huge_pages_stay_on_only_where_they_are_more_than_the_margin_faster(off, on, expected):
    times = {"0": list(off), "1": list(on)}
    asked = []

    def time_step(setting):
        asked.append(setting)
        return times[setting].pop(0)

    choice = hp.choose_huge_pages(time_step, rounds=2)
    assert choice.setting == expected
    assert asked == ["0", "1", "1", "0"]  # off on, then on off
    assert (choice.off_s, choice.on_s) == (tuple(off), tuple(on))


def test_the_trial_times_stock_ddp_jobs_with_the_setting_in_the_launcher_s_environment(
        monkeypatch):
    """Each trial job starts with the setting it times in the environment the launcher reads:
    a job that sees 1 runs twice as fast, so the trial keeps huge pages on."""
    seen = []

    def fake_run_segments(model, segments, **options):
        setting = os.environ[HUGE_PAGES_ENV]
        seen.append((model, segments[0].kind, setting, options["nproc"]))
        return SimpleNamespace(first=SimpleNamespace(median_s=0.5 if setting == "1" else 1.0))

    monkeypatch.delenv(HUGE_PAGES_ENV, raising=False)
    monkeypatch.setattr("trainsched.runtime.train.run_segments", fake_run_segments)
    choice = hp.huge_pages_trial("mlp", nproc=2)
    assert choice.setting == "1" and choice.speedup == 2.0
    assert seen == [("mlp", "ddp", "0", 2), ("mlp", "ddp", "1", 2), ("mlp", "ddp", "1", 2),
                    ("mlp", "ddp", "0", 2)]
    assert HUGE_PAGES_ENV not in os.environ


@pytest.mark.parametrize(("flag", "expected"), [("on", "1"), ("off", "0")])
def test_train_runs_with_the_setting_asked_and_restores_the_environment(monkeypatch, flag,
                                                                        expected):
    seen = []
    monkeypatch.delenv(HUGE_PAGES_ENV, raising=False)
    monkeypatch.setattr("trainsched.cli.train._run",
                        lambda args: seen.append(os.environ.get(HUGE_PAGES_ENV)) or 0)
    assert main(["train", "mlp", "--huge-pages", flag]) == 0
    assert seen == [expected]
    assert HUGE_PAGES_ENV not in os.environ


def test_train_auto_runs_with_what_the_trial_chose(monkeypatch, capsys):
    seen = []
    monkeypatch.delenv(HUGE_PAGES_ENV, raising=False)
    monkeypatch.setattr("trainsched.cli.train._run",
                        lambda args: seen.append(os.environ.get(HUGE_PAGES_ENV)) or 0)
    monkeypatch.setattr(hp, "huge_pages_trial", lambda model, **options: hp.HugePagesChoice(
        setting="1", off_s=(0.9, 1.0), on_s=(0.6, 0.6)))
    assert main(["train", "vgg16", "--huge-pages", "auto"]) == 0
    assert seen == ["1"]
    assert "huge pages on: steps 950.0 ms without and 600.0 ms with them (1.583x" in \
        capsys.readouterr().err


def test_an_unknown_choice_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["train", "mlp", "--huge-pages", "maybe"])
    assert exc.value.code == 2
    assert "invalid choice: 'maybe'" in capsys.readouterr().err


def test_under_torchrun_the_flag_is_refused(monkeypatch, capsys):
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "test")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert main(["train", "mlp", "--huge-pages", "on"]) == 2
    assert "under torchrun set THP_MEM_ALLOC_ENABLE=0 or 1" in capsys.readouterr().err
