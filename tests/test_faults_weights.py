"""Reading a run's weights while it trains or after a fault (runs/weights.py, used by export and evaluate): a damaged
file is named together with the file used instead, and a checkpoint rotated away while it was read is replaced by
the newest complete one."""

import json
import threading

import pytest
import torch

from dflash_lab.config import DrafterConfig
from dflash_lab.drafter.model import DFlashDrafter
from dflash_lab.evaluation import export
from dflash_lab.runs import checkpoint, weights
from dflash_lab.runs.run_end import save_drafter
from tests.conftest import make_tiny_qwen3


def _drafter(seed):
    dc = DrafterConfig.from_target(make_tiny_qwen3(layers=6).config, num_draft_layers=1, num_target_features=2,
                                   block_size=4, mask_token_id=255)
    d = DFlashDrafter(dc)
    d.init_weights(torch.Generator().manual_seed(seed), std=0.1)
    return dc, d


def _run(root, dc):
    root.mkdir(parents=True)
    (root / "drafter_config.json").write_text(json.dumps(dc.to_dict()))
    (root / "config.json").write_text(json.dumps({"target": "tiny", "seed": 0}))
    return root


def _save_step(run, drafter, step, keep=None):
    state = {k: v for k, v in drafter.state_dict().items() if not k.startswith("rotary_emb.")}
    rng = {"torch_cpu": torch.get_rng_state()}
    path = checkpoint.write_checkpoint(run / "checkpoints", step, {
        checkpoint.DRAFTER_FILE: state, checkpoint.OPTIMIZER_FILE: {"step/x": torch.zeros(1)},
        checkpoint.RNG_FILE: rng}, {"format_version": checkpoint.FORMAT_VERSION, "step": step, "loss_avg": None,
                                    "drafter_config": drafter.config.to_dict()})
    if keep is not None:
        checkpoint.rotate(run / "checkpoints", keep, log=lambda *a: None)
    return path


def _same(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    return all(torch.equal(sa[k], sb[k]) for k in sa if not k.startswith("rotary_emb."))


def test_a_cut_off_final_weights_file_is_named_and_the_newest_complete_one_used(tmp_path, capsys):
    dc, d2 = _drafter(seed=2)
    _, d4 = _drafter(seed=4)
    run = _run(tmp_path / "run", dc)
    step2 = _save_step(run, d2, 2) / checkpoint.DRAFTER_FILE
    final = save_drafter(d4, run / "checkpoints" / "drafter.safetensors", step=4)
    final.write_bytes(final.read_bytes()[:-1000])  # the final save cut short by a full disk
    src, loaded = export.load_drafter(run)
    said = capsys.readouterr().out
    assert f"WARNING: {final} is damaged (cut short: " in said and f"; using {step2} instead." in said
    assert src.weights == step2 and src.step == 2 and _same(loaded, d2)
    alone = _run(tmp_path / "alone", dc)  # the damaged file is the only weights of the run
    only = save_drafter(d4, alone / "checkpoints" / "drafter.safetensors", step=4)
    only.write_bytes(only.read_bytes()[:-1000])
    with pytest.raises(checkpoint.CheckpointError, match=rf"no readable weights: {only} is damaged \(cut short"):
        export.load_drafter(alone)
    with pytest.raises(checkpoint.CheckpointError, match=rf"{only} is damaged \(cut short: .* Fix: "):
        export.load_drafter(only)  # named directly
    assert export.main([str(alone), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: no readable weights: ") and err.count("\n") == 1


def test_a_checkpoint_rotated_away_while_it_is_read_is_replaced_by_the_newest(tmp_path):
    dc, d = _drafter(seed=0)
    run = _run(tmp_path / "run", dc)
    for step in (2, 4):
        _save_step(run, d, step)
    calls = []

    def listing():  # a training run saves step 6 and rotates (keep 1) right after the reader listed its files
        found = export.checkpoint_candidates(run)
        calls.append([p.parent.name for p in found])
        if len(calls) == 1:
            _save_step(run, d, 6, keep=1)
        return found

    used, tensors = weights.read_newest_weights(listing, log=lambda *a: None)
    assert used.parent.name == "step-0000006" and calls[0] == ["step-0000004", "step-0000002"] and len(calls) == 2
    assert set(tensors) == {k for k in d.state_dict() if not k.startswith("rotary_emb.")}


def test_export_and_evaluate_read_a_run_while_it_trains(tmp_path):
    """A real writer thread saving and rotating (keep 1) as fast as it can while the reader loads the drafter."""
    dc, d = _drafter(seed=0)
    run = _run(tmp_path / "run", dc)
    _save_step(run, d, 1)
    stop, errors = threading.Event(), []

    def trainer():
        step = 1
        while not stop.is_set():
            step += 1
            _save_step(run, d, step, keep=1)

    t = threading.Thread(target=trainer)
    t.start()
    try:
        for _ in range(40):
            try:
                src, loaded = export.load_drafter(run, log=lambda *a: None)
                assert _same(loaded, d)
            except FileNotFoundError as e:
                errors.append(e)
    finally:
        stop.set()
        t.join()
    assert errors == []


def test_a_listing_that_crosses_a_rotation_is_read_again(tmp_path, monkeypatch):
    """The folder is read (step-1 there), then the run saves step 2 and rotates step 1 away before step-1/ is looked
    into: that listing finds no weights at all; reading the folder again finds step 2."""
    dc, d = _drafter(seed=0)
    run = _run(tmp_path / "run", dc)
    _save_step(run, d, 1)
    real_glob, calls = type(run).glob, []

    def glob_crossing_a_rotation(self, pattern):
        if not pattern.endswith(".safetensors"):  # the writer's own listings
            return real_glob(self, pattern)
        calls.append(pattern)
        if len(calls) == 1:
            _save_step(run, d, 2, keep=1)
            return iter([])  # what glob returns when step-1/ vanished between its listing and its look inside
        return real_glob(self, pattern)

    monkeypatch.setattr(type(run), "glob", glob_crossing_a_rotation)
    found = export.checkpoint_candidates(run)
    assert [p.parent.name for p in found] == ["step-0000002"] and len(calls) == 2
    src, loaded = export.load_drafter(run, log=lambda *a: None)
    assert src.step == 2 and _same(loaded, d)
