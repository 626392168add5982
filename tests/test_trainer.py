"""Trainer on the embedded tiny target: loss falls (trap h), state between step() calls, input errors."""

import json

import pytest
import torch

from dflash_lab import TrainConfig, Trainer
from dflash_lab.data.tokenize import DataError
from dflash_lab.target.load import TargetLoadError

SMALL = dict(target="tiny", data="tiny", seq_len=128, batch_size=4, block_size=8, num_anchors=12,
             num_draft_layers=2, lr=3e-3, log_every=5)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    cfg = TrainConfig(**SMALL, steps=40, runs_dir=str(tmp_path_factory.mktemp("runs")))
    tr = Trainer(cfg, log=lambda s: None)
    tr.step(1)
    first_state = {k: v.clone() for k, v in tr.drafter.state_dict().items()}
    tr.step(39)
    yield tr, first_state
    tr.close()


def test_h_loss_falls_on_the_tiny_target(trained):
    tr, _ = trained
    losses = [r["loss"] for r in tr.history]
    assert len(losses) == 40
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < 0.6 * first, (first, last)
    assert tr.history[-1]["sim_tau"] > 1.0


def test_state_is_inspectable_between_steps(trained):
    tr, first_state = trained
    assert tr.step_count == 40 and tr.last_metrics["step"] == 40
    assert tr.last_batch.draft_ids.shape == (4, 12 * 8)
    changed = [k for k, v in tr.drafter.state_dict().items() if not torch.equal(v, first_state[k])]
    assert "fc.weight" in changed and "layers.0.self_attn.q_proj.weight" in changed
    # the embedding / head stay frozen and are not part of the drafter
    assert not any("embed" in k or "lm_head" in k for k in tr.drafter.state_dict())
    assert all(not p.requires_grad for p in tr.target.parameters())


def test_run_dir_contents(trained):
    tr, _ = trained
    summary = tr.finish()
    rd = tr.run_dir
    cfg = json.loads((rd / "config.json").read_text())
    assert cfg["steps"] == 40 and cfg["block_size"] == 8
    rows = [json.loads(l) for l in (rd / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows][:3] == [1, 5, 10] and rows[-1]["step"] == 40
    assert (rd / "checkpoints" / "drafter.safetensors").is_file()
    assert summary["loss_last"] < summary["loss_first"]


def test_missing_target_directory_is_named(tmp_path):
    with pytest.raises(TargetLoadError, match="does not exist") as e:
        Trainer(TrainConfig(**{**SMALL, "target": str(tmp_path / "nope")}, steps=1), write_run_dir=False)
    assert str(tmp_path / "nope") in str(e.value) and "config.json" in str(e.value)


def test_missing_data_file_is_named(tmp_path):
    with pytest.raises(DataError, match="does not exist") as e:
        Trainer(TrainConfig(**{**SMALL, "data": str(tmp_path / "d.jsonl")}, steps=1), write_run_dir=False)
    assert str(tmp_path / "d.jsonl") in str(e.value)
