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
    short, long = LRSchedule.of(TrainConfig(steps=400)), LRSchedule.of(TrainConfig(steps=800))
    assert short.lr(400) == pytest.approx(0.0, abs=1e-12)  # the finished run had decayed to 0
    assert long.lr(400) == pytest.approx(6e-4 / 2, rel=0.1)  # the extension goes on at about lr/2 (warm-up shifts it)
    assert long.lr(799) < long.lr(600) < long.lr(400)
