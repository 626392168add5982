"""checkpoint.py: atomic directory writes, rotation (last K + best), full-disk failures, optimiser/RNG round trips."""

import errno
import hashlib
import json
import random

import pytest
import torch

from dflash_lab.runs import checkpoint, resume_checks, train_state
from dflash_lab.train.optim import MasterAdamW


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
    names = train_state.trainable_names(m)
    tensors, groups = train_state.optimizer_tensors(opt, names)
    p = checkpoint.write_checkpoint(tmp_path, 3, {checkpoint.OPTIMIZER_FILE: tensors},
                                    {**_state(3, 1.0), "groups": groups})
    expected = _train(m, opt, 4, 3)

    m2 = _module(dtype)  # fresh weights and optimiser, then restore
    opt2 = MasterAdamW(m2.parameters(), lr=1e-2)
    loaded = checkpoint.read_tensors(p, checkpoint.OPTIMIZER_FILE)
    train_state.restore_optimizer(opt2, names, loaded, json.loads(json.dumps(checkpoint.read_state(p)["groups"])))
    assert _train(m2, opt2, 4, 3) == expected
    if dtype == torch.bfloat16:
        assert all(mm.dtype == torch.float32 for mm in opt2.masters)


def test_rng_state_round_trip():
    tensors, meta = train_state.rng_state([torch.device("cpu")])
    meta = json.loads(json.dumps(meta))  # it must survive JSON
    a = (torch.rand(3).tolist(), random.random())
    torch.manual_seed(123)
    random.seed(5)
    train_state.restore_rng(tensors, meta)
    assert (torch.rand(3).tolist(), random.random()) == a


def test_config_differences_name_each_field(tmp_path):
    old = {"seq_len": 64, "lr": 1e-3, "layer_types": ["full_attention"], "steps": 10}
    new = {"seq_len": 128, "lr": 1e-3, "layer_types": ("full_attention",), "steps": 99}
    diffs = resume_checks.config_differences(old, new)
    assert diffs == [("seq_len", 64, 128)]  # tuple vs list is no difference; steps may change
    msg = resume_checks.format_differences(tmp_path, diffs)
    assert "seq_len: 64 (checkpoint) -> 128 (now)" in msg


def test_resolve_checkpoint_errors_name_the_fix(tmp_path):
    with pytest.raises(checkpoint.CheckpointError, match="does not exist"):
        checkpoint.resolve_checkpoint(tmp_path / "nope")
    (tmp_path / "checkpoints" / "step-0000004.tmp").mkdir(parents=True)
    with pytest.raises(checkpoint.CheckpointError, match="no complete checkpoint.*step-0000004.tmp"):
        checkpoint.resolve_checkpoint(tmp_path)


# --- faults keep the run ---------------------------------------------------------------------------------------------
def test_corrupt_state_in_older_checkpoint_is_reported_and_never_stops_later_saves(tmp_path):
    root = tmp_path / "checkpoints"
    first = _write(root, 1, loss=0.1)  # the best by loss: rotation would keep it
    (first / checkpoint.STATE_FILE).write_text('{"step": 1, "loss_av')  # cut off
    said = []
    for step, loss in ((2, 1.0), (3, 0.9), (4, 0.95)):
        _write(root, step, loss=loss)
        checkpoint.rotate(root, keep=2, log=said.append)
    assert [p.name for p in checkpoint.list_checkpoints(root)] == ["step-0000003", "step-0000004"]
    assert len(said) == 2 and f"{first / checkpoint.STATE_FILE} cannot be read" in said[0]
    assert "kept (among the newest)" in said[0] and "removed by rotation" in said[1]
    assert checkpoint.best_checkpoint(tmp_path) == root / "step-0000003"


def test_rotation_deletes_by_rename_so_a_killed_delete_leaks_nothing(tmp_path, monkeypatch):
    root = tmp_path / "checkpoints"
    for step in (1, 2, 3):
        _write(root, step, loss=float(step))
    real_rmtree = checkpoint.shutil.rmtree

    def killed(path, *a, **k):  # the process dies during the first removal, after part of the files are gone
        path = type(root)(path)
        (path / checkpoint.DRAFTER_FILE).unlink(missing_ok=True)
        raise KeyboardInterrupt

    monkeypatch.setattr(checkpoint.shutil, "rmtree", killed)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.rotate(root, keep=1)
    monkeypatch.setattr(checkpoint.shutil, "rmtree", real_rmtree)
    names = sorted(p.name for p in root.iterdir())
    assert names == ["step-0000001", "step-0000002.deleting", "step-0000003"]  # step 1 is the best (lowest loss)
    assert all(checkpoint.load_checkpoint(p).step for p in checkpoint.list_checkpoints(root))  # every listed one loads
    _write(root, 4, loss=4.0)
    checkpoint.rotate(root, keep=1)
    assert sorted(p.name for p in root.iterdir()) == ["step-0000001", "step-0000004"]  # best + newest, no leftovers


def test_same_step_rewrite_killed_between_renames_keeps_a_copy(tmp_path, monkeypatch):
    root = tmp_path / "checkpoints"
    _write(root, 5, loss=1.0)
    real_rename = checkpoint.os.rename

    def killed_after_first(src, dst):
        real_rename(src, dst)
        if str(dst).endswith(checkpoint.REPLACED):
            raise KeyboardInterrupt  # SIGINT / kill right after step-5 became step-5.old

    monkeypatch.setattr(checkpoint.os, "rename", killed_after_first)
    with pytest.raises(KeyboardInterrupt):
        _write(root, 5, loss=0.5)
    monkeypatch.setattr(checkpoint.os, "rename", real_rename)
    assert not (root / "step-0000005").exists()
    (copy,) = checkpoint.list_checkpoints(root)  # the old copy stands in for step 5
    assert copy.name == "step-0000005.old" and checkpoint.load_checkpoint(tmp_path).step == 5
    checkpoint.rotate(root, keep=2)  # the next save's cleanup renames it back instead of deleting it
    assert [p.name for p in root.iterdir()] == ["step-0000005"]
    assert checkpoint.read_state(root / "step-0000005")["loss_avg"] == 1.0


def _truncate(path, keep=0.5):
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


@pytest.mark.parametrize("damage", ["truncated_safetensors", "cut_off_json"])
def test_resume_error_names_the_bad_file_and_the_previous_good_checkpoint(tmp_path, damage):
    root = tmp_path / "checkpoints"
    _write(root, 1)
    good = _write(root, 2)
    bad = _write(root, 3)
    if damage == "truncated_safetensors":
        bad_file = bad / checkpoint.OPTIMIZER_FILE
        _truncate(bad_file, 0.9)
    else:
        bad_file = bad / checkpoint.STATE_FILE
        _truncate(bad_file, 0.6)
    with pytest.raises(checkpoint.CheckpointError) as e:
        checkpoint.load_checkpoint(tmp_path)
    msg = str(e.value)
    assert f"{bad_file} cannot be read" in msg and f"resume_from={str(good)!r} (step 2)" in msg
    _truncate(good / checkpoint.DRAFTER_FILE, 0.99)  # the previous one damaged too: point further back
    with pytest.raises(checkpoint.CheckpointError, match="step-0000001'.*\\(step 1\\)"):
        checkpoint.load_checkpoint(bad)


def test_checkpoint_files_follow_the_umask(tmp_path):
    import os
    import stat

    old = os.umask(0o027)
    try:
        p = _write(tmp_path, 1)
    finally:
        os.umask(old)
    assert {f.name: stat.S_IMODE(f.stat().st_mode) for f in p.iterdir()} == {
        n: 0o640 for n in (checkpoint.DRAFTER_FILE, checkpoint.OPTIMIZER_FILE, checkpoint.RNG_FILE,
                           checkpoint.STATE_FILE)}


def test_full_disk_during_metrics_writes_warns_keeps_training_and_the_last_good_checkpoint(tmp_path, monkeypatch,
                                                                                          capsys):
    import errno

    from dflash_lab import TrainConfig
    from dflash_lab.runs import metrics, rundir
    from dflash_lab.tiny import ensure_tiny_target, tiny_data_path
    from dflash_lab.train.trainer import Trainer

    ensure_tiny_target()
    data = tmp_path / "train.jsonl"
    data.write_text("".join(tiny_data_path().read_text().splitlines(keepends=True)[:60]))
    cfg = TrainConfig(target="tiny", data=str(data), steps=8, seq_len=64, batch_size=2, block_size=8, num_anchors=4,
                      num_draft_layers=2, log_every=1, checkpoint_every=2, runs_dir=str(tmp_path / "runs"))
    logs = []
    t = Trainer(cfg, log=logs.append)

    def full(real):  # the disk is full while steps 3..5 are logged and saved
        def write(*args, **kwargs):
            if 3 <= t.step_count <= 5:
                raise OSError(errno.ENOSPC, "No space left on device")
            return real(*args, **kwargs)
        return write

    monkeypatch.setattr(metrics.JsonlSink, "_write", full(metrics.JsonlSink._write))
    monkeypatch.setattr(checkpoint, "_write_tensors", full(checkpoint._write_tensors))
    monkeypatch.setattr(rundir, "log_event", full(rundir.log_event))
    t.train()
    t.close()
    assert t.step_count == 8
    rows = rundir.read_jsonl(t.run_dir / rundir.METRICS_FILE)
    assert [r["step"] for r in rows] == [1, 2, 6, 7, 8]  # the dropped rows are the full-disk ones, no torn lines
    err = capsys.readouterr().err
    assert err.count("WARNING: could not append to") == 1 and "No space left on device" in err
    assert "writing again after 3 dropped record(s)" in err
    assert any(m.startswith("WARNING") and "step-0000002 (step 2) is intact" in m for m in logs)  # step-4 save failed
    assert [p.name for p in checkpoint.list_checkpoints(t.run_dir)] == ["step-0000006", "step-0000008"]
