"""checkpoint.py: atomic directory writes, rotation (last K + best), full-disk failures, optimiser/RNG round trips."""

import errno
import hashlib
import json
import random

import pytest
import torch

from dflash_lab import checkpoint
from dflash_lab.optim import MasterAdamW


def _state(step, loss):
    return {"format_version": checkpoint.FORMAT_VERSION, "step": step, "loss_avg": loss}


def _write(root, step, loss=1.0):
    t = {"w": torch.full((4,), float(step))}
    return checkpoint.write_checkpoint(root, step, {checkpoint.DRAFTER_FILE: t, checkpoint.OPTIMIZER_FILE: t,
                                                    checkpoint.RNG_FILE: {"torch_cpu": torch.get_rng_state()}},
                                       _state(step, loss))


def _digest(folder):
    return {p.name: hashlib.sha1(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def test_write_is_a_complete_folder_and_listing_ignores_partial_writes(tmp_path):
    root = tmp_path / "run" / "checkpoints"
    p = _write(root, 5)
    assert p.name == "step-0000005"
    assert sorted(f.name for f in p.iterdir()) == sorted([checkpoint.DRAFTER_FILE, checkpoint.OPTIMIZER_FILE,
                                                          checkpoint.RNG_FILE, checkpoint.STATE_FILE])
    (root / "step-0000009.tmp").mkdir()  # a write killed half-way
    (root / "step-0000010").mkdir()  # no state.json: not a checkpoint
    assert checkpoint.list_checkpoints(tmp_path / "run") == [p]
    assert checkpoint.resolve_checkpoint(tmp_path / "run") == p
    assert checkpoint.resolve_checkpoint(p) == p
    assert checkpoint.read_tensors(p, checkpoint.DRAFTER_FILE)["w"].tolist() == [5.0] * 4


def test_rotation_keeps_last_k_plus_best(tmp_path):
    root = tmp_path / "checkpoints"
    for step, loss in [(1, 3.0), (2, 0.5), (3, 2.0), (4, 1.9), (5, 1.8)]:
        _write(root, step, loss)
    (root / "step-0000006.tmp").mkdir()
    removed = checkpoint.rotate(root, keep=2)
    assert sorted(p.name for p in removed) == ["step-0000001", "step-0000003"]
    assert [p.name for p in checkpoint.list_checkpoints(root)] == ["step-0000002", "step-0000004", "step-0000005"]
    assert checkpoint.best_checkpoint(root).name == "step-0000002"
    assert not (root / "step-0000006.tmp").exists()


def test_full_disk_mid_write_leaves_previous_checkpoint_intact(tmp_path, monkeypatch):
    root = tmp_path / "checkpoints"
    prev = _write(root, 2)
    before = _digest(prev)
    real, calls = checkpoint._write_tensors, []

    def write_then_fail(path, tensors):
        calls.append(path.name)
        if len(calls) == 2:  # the second file of the new checkpoint: the disk is full
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        real(path, tensors)

    monkeypatch.setattr(checkpoint, "_write_tensors", write_then_fail)
    with pytest.raises(checkpoint.CheckpointError) as err:
        _write(root, 4)
    msg = str(err.value)
    assert "step-0000002" in msg and "intact" in msg and "free disk space" in msg
    assert sorted(p.name for p in root.iterdir()) == ["step-0000002"]  # no step-4, no leftover .tmp
    assert _digest(prev) == before


def test_same_step_rewrite_replaces_atomically(tmp_path):
    root = tmp_path / "checkpoints"
    _write(root, 3, loss=1.0)
    p = checkpoint.write_checkpoint(root, 3, {checkpoint.DRAFTER_FILE: {"w": torch.zeros(2)}}, _state(3, 0.25))
    assert checkpoint.read_state(p)["loss_avg"] == 0.25
    assert sorted(q.name for q in root.iterdir()) == ["step-0000003"]


def _module(dtype):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Linear(5, 3)).to(dtype)
    return m


def _train(m, opt, steps, start):
    losses = []
    for s in range(start, start + steps):
        x = torch.randn(8, 6, generator=torch.Generator().manual_seed(s)).to(next(m.parameters()).dtype)
        opt.zero_grad()
        loss = m(x).float().pow(2).mean()
        loss.backward()
        opt.step(lr=1e-2, grad_clip=1.0)
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_optimizer_round_trip_continues_identically(tmp_path, dtype):
    """fp32 masters (separate for bf16 params) + AdamW moments + step counts survive a safetensors round trip."""
    m = _module(dtype)
    opt = MasterAdamW(m.parameters(), lr=1e-2)
    _train(m, opt, 3, 0)
    names = checkpoint.trainable_names(m)
    tensors, groups = checkpoint.optimizer_tensors(opt, names)
    p = checkpoint.write_checkpoint(tmp_path, 3, {checkpoint.OPTIMIZER_FILE: tensors},
                                    {**_state(3, 1.0), "groups": groups})
    expected = _train(m, opt, 4, 3)

    m2 = _module(dtype)  # fresh weights and optimiser, then restore
    opt2 = MasterAdamW(m2.parameters(), lr=1e-2)
    loaded = checkpoint.read_tensors(p, checkpoint.OPTIMIZER_FILE)
    checkpoint.restore_optimizer(opt2, names, loaded, json.loads(json.dumps(checkpoint.read_state(p)["groups"])))
    assert _train(m2, opt2, 4, 3) == expected
    if dtype == torch.bfloat16:
        assert all(mm.dtype == torch.float32 for mm in opt2.masters)


def test_rng_state_round_trip():
    tensors, meta = checkpoint.rng_state([torch.device("cpu")])
    meta = json.loads(json.dumps(meta))  # it must survive JSON
    a = (torch.rand(3).tolist(), random.random())
    torch.manual_seed(123)
    random.seed(5)
    checkpoint.restore_rng(tensors, meta)
    assert (torch.rand(3).tolist(), random.random()) == a


def test_config_differences_name_each_field(tmp_path):
    old = {"seq_len": 64, "lr": 1e-3, "layer_types": ["full_attention"], "steps": 10}
    new = {"seq_len": 128, "lr": 1e-3, "layer_types": ("full_attention",), "steps": 99}
    diffs = checkpoint.config_differences(old, new)
    assert diffs == [("seq_len", 64, 128)]  # tuple vs list is no difference; steps may change
    msg = checkpoint.format_differences(tmp_path, diffs)
    assert "seq_len: 64 (checkpoint) -> 128 (now)" in msg


def test_resolve_checkpoint_errors_name_the_fix(tmp_path):
    with pytest.raises(checkpoint.CheckpointError, match="does not exist"):
        checkpoint.resolve_checkpoint(tmp_path / "nope")
    (tmp_path / "checkpoints" / "step-0000004.tmp").mkdir(parents=True)
    with pytest.raises(checkpoint.CheckpointError, match="no complete checkpoint.*step-0000004.tmp"):
        checkpoint.resolve_checkpoint(tmp_path)
