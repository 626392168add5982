"""The end of a notebook run: the drafter's weights alone, the training plot, the executed notebook, summary.json.

A run folder gives one answer: when training goes on after `finish()` (Run or Step N pressed after the finish cell),
the loop that trained further finishes again at its end (`refinish_if_stale`), so summary.json, drafter.safetensors
and plots/training.png name the same step as the dashboard, metrics.jsonl and the newest checkpoint."""

from __future__ import annotations

from pathlib import Path

from safetensors import SafetensorError
from safetensors.torch import save_file

from . import rundir
from .checkpoint import CheckpointError, checkpoint_step, list_checkpoints, respect_umask
from .plots import plot_training
from .run_state import STOPPED_RESUMABLE


def save_drafter(drafter, path: Path, step: int) -> Path:
    """Drafter weights only (safetensors, export names, no embedding/head), written atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to("cpu").contiguous() for k, v in drafter.state_dict().items()
             if not k.startswith("rotary_emb.")}
    tmp = path.with_name(path.name + ".tmp")
    try:
        save_file(state, str(tmp), metadata={"step": str(step)})
    except (OSError, SafetensorError) as e:  # a full disk: safetensors reports it as its own error type
        tmp.unlink(missing_ok=True)
        raise CheckpointError(_not_saved(path, step, e)) from None
    respect_umask(tmp)  # safetensors writes 0600: a server running as another user must read it
    tmp.replace(path)
    return path


def _not_saved(path: Path, step: int, e: Exception) -> str:
    """One line: which file was not written, why, and what the run still has."""
    why = e.strerror if isinstance(e, OSError) and e.strerror else str(e).splitlines()[0][:160]
    ckpts = list_checkpoints(path.parent) if path.parent.name == "checkpoints" else []
    kept = (f"the checkpoint {ckpts[-1]} (step {checkpoint_step(ckpts[-1])}) is intact" if ckpts
            else "no checkpoint exists")
    old = " and the previous drafter file is unchanged" if path.exists() else ""
    return (f"could not write the drafter's weights of step {step} to {path} ({why}); the partial file was removed, "
            f"{kept}{old}. Fix: free disk space, then call finish() again (the weights are still in memory).")


class RunSummary(dict):
    """summary.json's content as finish() returns it: a plain dict whose paths stay absolute, shown in a notebook
    with the project's own paths relative (runs/...): an executed notebook that is shared (papermill's output, the
    copy in the run folder) then carries no folder of this machine."""

    def _repr_pretty_(self, p, cycle):
        p.pretty({k: rundir.shown_path(v) if isinstance(v, str) and v.startswith("/") else v
                  for k, v in self.items()})


def finish_run(trainer) -> dict:
    """Summary of a Trainer's run; with a run directory also the drafter, plots/training.png, the notebook and
    summary.json. A diverged run keeps its last good checkpoint and saves no drafter (its weights are not finite)."""
    # resume_from continues from the newest intact checkpoint, also when the stop's own could not be written
    resumable = trainer.run_dir is not None and bool(list_checkpoints(trainer.run_dir))
    status = "diverged" if trainer.diverged_at is not None else (
        "finished" if trainer.step_count >= trainer.config.steps else
        STOPPED_RESUMABLE if resumable else "stopped")
    summary = RunSummary({"status": status, "steps": trainer.step_count, "target_steps": trainer.config.steps,
                          "run_dir": str(trainer.run_dir) if trainer.run_dir else None,
                          "last_checkpoint": str(trainer.last_checkpoint) if trainer.last_checkpoint else None,
                          "diverged_at": trainer.diverged_at})
    hist = [r for r in trainer.history if "loss" in r]
    if hist:
        summary.update(loss_first=hist[0]["loss"], loss_last=hist[-1]["loss"], sim_tau_last=hist[-1]["sim_tau"],
                       steady_tokens_per_s=trainer.throughput.steady_tps)
    if trainer.run_dir:
        summary["drafter"] = str(trainer.save_drafter()) if trainer.diverged_at is None else None
        failed: list[str] = []  # a full disk: every write is tried, then one error names what is missing
        png = _tried(failed, trainer.run_dir / "plots" / "training.png", lambda: plot_training(trainer.run_dir))
        summary["plot"] = str(png) if png else None
        # a resumed session keeps the earlier session's notebook: train.ipynb, then train.resumed-0001200.ipynb
        name = f"train.resumed-{trainer.resumed_at:07d}.ipynb" if trainer.resumed_at is not None else "train.ipynb"
        nb = _tried(failed, trainer.run_dir / name, lambda: rundir.save_executed_notebook(trainer.run_dir, name))
        summary["notebook"] = str(nb) if nb else None
        _tried(failed, trainer.run_dir / "summary.json",
               lambda: rundir.write_json(trainer.run_dir / "summary.json", summary))
        if failed:
            kept = summary["drafter"] or summary["last_checkpoint"] or "nothing"
            raise CheckpointError(f"could not write {'; '.join(failed)}; kept: {kept} (and every checkpoint). Fix: "
                                  "free disk space, then call finish() again (the weights are still in memory).")
    return summary


def _tried(failed: list[str], path: Path, write):
    """write(), or None with `path (why)` added to `failed` when the disk refuses it."""
    try:
        return write()
    except OSError as e:
        failed.append(f"{path} ({e.strerror or e})")
        return None


def refinish_if_stale(trainer) -> dict | None:
    """finish() again if the trainer has been finished before and has taken steps since; returns the new summary."""
    done = getattr(trainer, "finished_at", None)
    if done is None or done == trainer.step_count or trainer.diverged_at is not None or trainer.run_dir is None:
        return None
    trainer.log(f"the run went on after finish() at step {done}: finishing again at step {trainer.step_count} "
                "(summary.json, drafter, plots)")
    return trainer.finish()
