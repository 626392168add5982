"""Optional metric sinks (sinks.py): TensorBoard event files read back with TensorBoard's own reader; config checks."""

import importlib.util
import json

import pytest

from dflash_lab.config import ConfigError, TrainConfig
from dflash_lab.runs.sinks import scalars

HAS_TB = importlib.util.find_spec("tensorboard") is not None
HAS_WANDB = importlib.util.find_spec("wandb") is not None


def test_unknown_or_missing_sinks_fail_at_config_time_naming_the_fix():
    with pytest.raises(ConfigError, match=r"metric_sinks=\('mlflow',\).*unknown metric sink 'mlflow'.*'tensorboard'"):
        TrainConfig(metric_sinks=("mlflow",))
    with pytest.raises(ConfigError, match=r"use \('tensorboard',\)"):
        TrainConfig(metric_sinks="tensorboard")
    if not HAS_WANDB:  # the common case: W&B is not a dependency
        with pytest.raises(ConfigError, match=r"needs the 'wandb' package.*run `pip install wandb`"):
            TrainConfig(metric_sinks=("wandb",))
    assert TrainConfig.from_dict(TrainConfig(metric_sinks=[]).to_dict()).metric_sinks == ()


def test_scalars_keep_finite_numbers_only():
    rec = {"step": 3, "time": 1.0, "loss": 2.5, "lr": 1e-3, "slot_acc": [0.5], "throughput_state": "steady",
           "grad_norm": float("nan"), "mem_gb/cuda:0": 1.25, "flag": True}
    assert scalars(rec) == {"loss": 2.5, "lr": 1e-3, "mem_gb/cuda:0": 1.25}


@pytest.mark.skipif(not HAS_TB, reason="tensorboard is not installed (pip install tensorboard==2.21.0; a test extra)")
def test_tensorboard_events_hold_the_metrics_jsonl_numbers(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from dflash_lab import Trainer

    cfg = TrainConfig(target="tiny", data="tiny", seq_len=64, batch_size=2, block_size=8, num_anchors=4,
                      num_draft_layers=1, steps=6, log_every=2, runs_dir=str(tmp_path), metric_sinks=("tensorboard",))
    t = Trainer(cfg, log=lambda *a: None)
    try:
        t.train()
    finally:
        t.close()  # closes the sinks: the event file is flushed
    rows = [json.loads(x) for x in (t.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 4, 6]
    acc = EventAccumulator(str(t.run_dir / "tensorboard"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"loss", "lr", "sim_tau", "acc", "grad_norm", "tokens_per_s"} <= tags
    for key in ("loss", "sim_tau", "lr"):
        events = acc.Scalars(key)
        assert [e.step for e in events] == [1, 2, 4, 6]
        # float32 in the event file
        assert [e.value for e in events] == pytest.approx([r[key] for r in rows], rel=1e-6)
        assert events[0].wall_time == pytest.approx(rows[0]["time"], abs=1e-3)
