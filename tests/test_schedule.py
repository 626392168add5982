"""schedule.py: the schedule is optim.lr_at of (step, config); changing steps on resume re-plans it for the new total."""

import pytest

from dflash_lab import TrainConfig
from dflash_lab.train.optim import lr_at
from dflash_lab.train.schedule import LRSchedule


def test_schedule_is_warmup_then_cosine_of_the_config():
    s = LRSchedule.of(TrainConfig(steps=100, lr=1e-3, warmup_ratio=0.04))
    for step in (0, 3, 4, 50, 99):
        assert s.lr(step) == lr_at(step, peak=1e-3, total_steps=100, warmup_steps=4)


def test_extended_run_follows_the_longer_runs_curve():
    short, long = LRSchedule.of(TrainConfig(steps=400, lr=6e-4)), LRSchedule.of(TrainConfig(steps=800, lr=6e-4))
    assert short.lr(400) == pytest.approx(0.0, abs=1e-12)  # the finished run had decayed to 0
    assert long.lr(400) == pytest.approx(6e-4 / 2, rel=0.1)  # the extension goes on at about lr/2 (warm-up shifts it)
    assert long.lr(799) < long.lr(600) < long.lr(400)


def test_wsd_holds_the_peak_then_decays_linearly_over_the_last_fraction():
    s = LRSchedule.of(TrainConfig(steps=100, lr=1e-3, warmup_ratio=0.1, lr_schedule="wsd", decay_ratio=0.2))
    assert [s.lr(k) for k in (0, 9)] == pytest.approx([1e-4, 1e-3])  # warm-up, as the cosine
    assert {s.lr(k) for k in (10, 50, 79)} == {1e-3}  # stable
    assert [s.lr(k) for k in (80, 89, 99)] == pytest.approx([0.95e-3, 0.5e-3, 0.0])  # 20 decay steps to 0


def test_wsd_run_extended_in_its_stable_phase_keeps_its_lr():
    """What makes WSD the schedule for runs longer than one job: doubling `steps` at step 600 of 1,000 changes no lr
    before the old decay start, where a cosine moves the whole tail."""
    old, new = (LRSchedule.of(TrainConfig(steps=n, lr=6e-4, lr_schedule="wsd", decay_ratio=0.2)) for n in (1000, 2000))
    assert all(old.lr(k) == new.lr(k) for k in range(80, 800))  # past both warm-ups (40 and 80 steps)
    cos_old, cos_new = LRSchedule.of(TrainConfig(steps=1000, lr=6e-4)), LRSchedule.of(TrainConfig(steps=2000, lr=6e-4))
    assert abs(cos_old.lr(600) - cos_new.lr(600)) > 1e-4


def test_schedule_knobs_are_checked():
    from dflash_lab.config import ConfigError

    with pytest.raises(ConfigError, match="lr_schedule='linear' is invalid"):
        TrainConfig(lr_schedule="linear")
    with pytest.raises(ConfigError, match="decay_ratio=0.0 is invalid"):
        TrainConfig(lr_schedule="wsd", decay_ratio=0.0)
