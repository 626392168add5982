"""The end of a run on a full disk: saving the drafter's weights fails with one line naming the file, why and what
is kept (the newest checkpoint, the previous drafter file); no partial file is left behind, and a second finish()
once there is space writes the weights."""

import errno

import pytest
import torch
from safetensors import SafetensorError, safe_open

from dflash_lab.config.drafter_config import DrafterConfig
from dflash_lab.drafter.model import DFlashDrafter
from dflash_lab.runs import checkpoint, run_end
from tests.conftest import make_tiny_qwen3


def _drafter():
    dc = DrafterConfig.from_target(make_tiny_qwen3(layers=8).config, num_draft_layers=1, num_target_features=3,
                                   block_size=4, mask_token_id=255)
    return DFlashDrafter(dc)


@pytest.mark.parametrize("error", [
    SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)"),  # what it raises
    OSError(errno.ENOSPC, "No space left on device")])
def test_a_full_disk_at_finish_is_one_line_naming_the_file_and_what_is_kept(tmp_path, monkeypatch, error):
    root = tmp_path / "checkpoints"
    t = {"w": torch.zeros(4)}
    kept = checkpoint.write_checkpoint(root, 30, {checkpoint.DRAFTER_FILE: t, checkpoint.OPTIMIZER_FILE: t,
                                                  checkpoint.RNG_FILE: {"torch_cpu": torch.get_rng_state()}},
                                       {"format_version": checkpoint.FORMAT_VERSION, "step": 30})
    path, drafter = root / "drafter.safetensors", _drafter()
    run_end.save_drafter(drafter, path, 30)
    before = path.read_bytes()
    real = run_end.save_file

    def full_disk(state, name, metadata=None):
        with open(name, "wb") as f:
            f.write(b"partial")  # what a write cut short leaves
        raise error

    monkeypatch.setattr(run_end, "save_file", full_disk)
    with pytest.raises(checkpoint.CheckpointError) as e:
        run_end.save_drafter(drafter, path, 40)
    assert str(e.value) == (
        f"could not write the drafter's weights of step 40 to {path} ("
        + ("Error while serializing: I/O error: No space left on device (os error 28))"
           if isinstance(error, SafetensorError) else "No space left on device)")
        + f"; the partial file was removed, the checkpoint {kept} (step 30) is intact and the previous drafter file "
          "is unchanged. Fix: free disk space, then call finish() again (the weights are still in memory).")
    assert e.value.__cause__ is None and e.value.__suppress_context__  # one error, not two tracebacks
    assert path.read_bytes() == before and sorted(p.name for p in root.iterdir()) == ["drafter.safetensors",
                                                                                      "step-0000030"]
    monkeypatch.setattr(run_end, "save_file", real)
    run_end.save_drafter(drafter, path, 40)
    with safe_open(str(path), "pt") as f:
        assert f.metadata()["step"] == "40"


def test_a_full_disk_after_the_weights_names_every_file_not_written_and_what_is_kept(tmp_path, monkeypatch):
    """The plot, the notebook copy and summary.json are each tried; one line names those the disk refused, and
    finish() again once there is space writes them."""
    from dflash_lab.config import TrainConfig
    from dflash_lab.runs import rundir
    from dflash_lab.train.trainer import Trainer

    cfg = TrainConfig(seq_len=64, batch_size=2, block_size=8, num_anchors=4, num_draft_layers=1, steps=2,
                      runs_dir=str(tmp_path / "runs"), checkpoint_every=0)
    trainer = Trainer(cfg, log=lambda *a: None)
    try:
        trainer.train()

        def no_space(*a, **k):
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(run_end, "plot_training", no_space)
        monkeypatch.setattr(rundir, "write_json", no_space)
        with pytest.raises(checkpoint.CheckpointError) as e:
            trainer.finish()
        run = trainer.run_dir
        assert str(e.value) == (
            f"could not write {run / 'plots' / 'training.png'} (No space left on device); {run / 'summary.json'} "
            f"(No space left on device); kept: {run / 'checkpoints' / 'drafter.safetensors'} (and every "
            "checkpoint). Fix: free disk space, then call finish() again (the weights are still in memory).")
        monkeypatch.undo()
        assert trainer.finish()["status"] == "finished" and (run / "summary.json").is_file()
    finally:
        trainer.close()


def test_summary_shows_project_paths_relative_and_keeps_them_absolute():
    """An executed notebook that is shared shows `runs/...`, not this machine's folders; the values stay absolute."""
    from IPython.lib.pretty import pretty

    from dflash_lab.runs import rundir
    from dflash_lab.runs.run_end import RunSummary

    run = rundir.PROJECT_ROOT / "runs" / "x-20260101T000000Z-abc123"
    s = RunSummary({"status": "finished", "run_dir": str(run), "drafter": "/elsewhere/drafter.safetensors"})
    shown = pretty(s)
    assert "'run_dir': 'runs/x-20260101T000000Z-abc123'" in shown and str(rundir.PROJECT_ROOT) not in shown
    assert "'/elsewhere/drafter.safetensors'" in shown  # outside the project: as it is
    assert s["run_dir"] == str(run) and isinstance(s, dict)
