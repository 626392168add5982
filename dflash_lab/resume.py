"""The Trainer side of checkpoint.py: write a Trainer's full state as a checkpoint, and put it back exactly.

Exact resume needs every input of the next step to be what it would have been without the interruption:
- weights and optimiser: the fp32 masters and AdamW moments/step counts (bf16 parameters are re-derived from the
  masters, exactly as the optimiser does after each step), identical in every replica;
- the learning rate: a pure function of (step, config), plus a manual override (`controls.new_lr`) if one was set;
- the batch: a pure function of (seed, step) (data.BatchSampler), checked against a fingerprint of the data;
- RNG: torch CPU/CUDA, python and numpy states (the step itself draws nothing random today; kept for safety).
"""

from __future__ import annotations

import time
from pathlib import Path

from . import checkpoint


def save(trainer, reason: str) -> Path:
    """Write `trainer`'s state into <run_dir>/checkpoints/step-XXXXXXX/ (atomic), rotate, record the event."""
    t0 = time.perf_counter()
    cfg = trainer.config
    module = trainer.drafter  # the uncompiled module of replica 0; every replica holds the same weights
    names = checkpoint.trainable_names(module)
    opt_tensors, groups = checkpoint.optimizer_tensors(trainer.workers[0].optimizer, names)
    rng_tensors, rng_meta = checkpoint.rng_state([w.device for w in trainer.workers])
    epoch, index = trainer.sampler.position(trainer.step_count)
    losses = trainer._recent_losses
    state = {
        "format_version": checkpoint.FORMAT_VERSION, "step": trainer.step_count, "reason": reason,
        "time": time.time(), "loss": (trainer.last_metrics or {}).get("loss"),
        "loss_avg": sum(losses) / len(losses) if losses else None,  # rotation keeps the best by this
        "data": {"epoch": epoch, "index_in_epoch": index, **checkpoint.data_fingerprint(trainer.data, trainer.sampler)},
        "scheduler": {"next_step": trainer.step_count, "next_lr": trainer.current_lr(),
                      "lr_override": trainer.controls.new_lr, "total_steps": cfg.steps, "warmup_steps": cfg.warmup_steps},
        "optimizer": {"param_names": names, "param_groups": groups},
        "rng": rng_meta,
        "config": cfg.to_dict(), "drafter_config": trainer.drafter_config.to_dict(),
    }
    drafter = {k: v.detach().to("cpu").contiguous() for k, v in module.state_dict().items()
               if not k.startswith("rotary_emb.")}
    root = trainer.run_dir / checkpoint.CHECKPOINTS_DIR
    path = checkpoint.write_checkpoint(root, trainer.step_count, {
        checkpoint.DRAFTER_FILE: drafter, checkpoint.OPTIMIZER_FILE: opt_tensors, checkpoint.RNG_FILE: rng_tensors},
        state)
    removed = checkpoint.rotate(root, cfg.keep_checkpoints)
    trainer._event("checkpoint", step=trainer.step_count, path=str(path), reason=reason,
                   seconds=round(time.perf_counter() - t0, 3), removed=[p.name for p in removed])
    return path


def restore(trainer, resume: checkpoint.Checkpoint) -> list[tuple[str, object, object]]:
    """Load drafter, masters + AdamW state, RNG, step and lr override into every replica; returns changed settings."""
    for w in trainer.workers:
        checkpoint.restore_replica(getattr(w.drafter, "_orig_mod", w.drafter), w.optimizer, resume)
    checkpoint.restore_rng(resume.rng, resume.state.get("rng", {}))
    trainer.step_count = resume.step
    trainer.controls.new_lr = resume.state.get("scheduler", {}).get("lr_override")
    changed = checkpoint.config_differences(resume.state["config"], trainer.config.to_dict(),
                                            fields=tuple(trainer.config.to_dict()))
    changed = [c for c in changed if c[0] != "resume_from"]
    trainer._event("resumed", step=resume.step, checkpoint=str(resume.path), changed=[list(c) for c in changed])
    trainer.log(f"resumed from {resume.path} at step {resume.step}"
                + (f" (changed: {', '.join(f'{f} {a!r} -> {b!r}' for f, a, b in changed)})" if changed else ""))
    return changed
