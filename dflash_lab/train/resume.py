"""Resume: which config a resumed run uses, and the Trainer's full state written as a checkpoint and put back.

Which config: the checkpoint's. Only the fields the user set explicitly override it, each printed
(`lr: 0.0006 -> 0.0003 (set by you)`); a field that would change the model's shape or the data stream is refused with
the list (FIXED_ON_RESUME). Changing `steps` extends (or shortens) the run; the cosine is re-planned for the new
total (schedule.py says how, and the change of lr at the resumed step is printed). The same
rule holds from Python, the notebook (notebook_params.py says which parameters were set), papermill and torchrun
(`--steps`). "Set explicitly" from Python means: differs from TrainConfig's default, unless `explicit=` names them.

Exact resume needs every input of the next step to be what it would have been without the interruption:
- weights and optimiser: the fp32 masters and AdamW moments/step counts (bf16 parameters are re-derived from the
  masters, exactly as the optimiser does after each step), identical in every replica;
- the learning rate: a pure function of (step, schedule), plus a manual override (`controls.new_lr`) if one was set;
- the batch: a pure function of (seed, step) (data.BatchSampler), checked against a fingerprint of the data;
- RNG: torch CPU/CUDA, python and numpy states (the step itself draws nothing random today; kept for safety).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import NamedTuple

from dflash_lab.runs import checkpoint, resume_checks, train_state
from dflash_lab.config import ConfigError, TrainConfig
from dflash_lab.config.feature_checks import check_resume_optimizer
from .schedule import LRSchedule

# Fields that change the drafter's shape, the data stream or the batches: a resume cannot change them. Everything
# else (steps, lr and the other optimiser settings, devices, dtype, logging, checkpointing, eval, naming) may be
# overridden explicitly.
FIXED_ON_RESUME = ("target", "data", "data_format", "enable_thinking", "data_errors", "seq_len", "batch_size",
                   "block_size", "num_anchors", "num_draft_layers", "num_target_features", "target_layer_ids",
                   "mask_token_id", "layer_types", "sliding_window", "seed",
                   "pack_sequences", "draft_vocab_size", "drafter_variant", "markov_rank", "enable_confidence_head",
                   "confidence_head_with_markov")


class Override(NamedTuple):
    field: str
    checkpoint_value: object
    new_value: object

    def line(self) -> str:
        return f"{self.field}: {_show(self.checkpoint_value)} -> {_show(self.new_value)} (set by you)"


def _show(v) -> str:
    return f"{v:g}" if isinstance(v, float) else repr(v)


def _norm(v):
    return list(v) if isinstance(v, tuple) else v


def explicit_fields(config: TrainConfig) -> set[str]:
    """The fields of `config` that differ from TrainConfig's defaults (what "set explicitly" means from Python)."""
    return {f.name for f in dataclasses.fields(TrainConfig) if _norm(getattr(config, f.name)) != _norm(f.default)}


def resumed_config(resume: checkpoint.Checkpoint, requested: TrainConfig, *, explicit=None,
                   log=print) -> tuple[TrainConfig, tuple[Override, ...]]:
    """The checkpoint's config with the explicitly set fields of `requested` on top; refuses shape changes."""
    known = {f.name for f in dataclasses.fields(TrainConfig)}
    saved = {k: v for k, v in resume.state["config"].items() if k in known}  # a field added since: its default
    base = TrainConfig.from_dict({**saved, "resume_from": requested.resume_from})
    names = explicit_fields(requested) if explicit is None else set(explicit)
    unknown = sorted(names - known)
    if unknown:
        raise ConfigError(f"explicit={sorted(names)} names {unknown}, which are not TrainConfig fields. Fix: use "
                          f"field names ({sorted(known)}).")
    names.discard("resume_from")
    check_resume_optimizer(resume.path, saved, requested, names)  # AdamW state cannot continue as Muon's
    changes = [Override(n, getattr(base, n), getattr(requested, n)) for n in sorted(names)
               if _norm(getattr(base, n)) != _norm(getattr(requested, n))]
    refused = [c for c in changes if c.field in FIXED_ON_RESUME]
    if refused:
        lines = "\n".join(f"  {c.field}: {c.checkpoint_value!r} (checkpoint) -> {c.new_value!r} (set by you)"
                          for c in refused)
        raise ConfigError(f"cannot resume from {resume.path}: {len(refused)} setting(s) you set would change the "
                          f"drafter's shape or the data stream:\n{lines}\nFix: leave them unset (a resume takes the "
                          "checkpoint's values), or start a fresh run (resume_from=None). Settings that may change on "
                          "resume: steps, lr and the other optimiser settings, devices, dtype, logging, "
                          "checkpointing, eval and naming.")
    config = base.replace(**{c.field: c.new_value for c in changes}) if changes else base
    if config.steps < resume.step:  # the loop would "train from step 6 to 2", do nothing and call it finished
        raise ConfigError(f"cannot resume from {resume.path}: steps={config.steps} is below the checkpoint's step "
                          f"{resume.step}, so there is nothing to train. Fix: pass steps > {resume.step} to train on "
                          f"(steps={resume.step} only finishes the run), or resume from an earlier checkpoint.")
    if log is not None:
        log(f"resuming from {resume.path} at step {resume.step} with the checkpoint's config"
            + ("" if changes else " (nothing overridden)"))
        for c in changes:
            log("  " + c.line())
        before, after = LRSchedule.of(base).lr(resume.step), LRSchedule.of(config).lr(resume.step)
        if before != after:  # schedule.py: the curve is re-planned for the new steps / scaled by the new lr
            log(f"  lr schedule re-planned: lr at step {resume.step} {before:.3g} -> {after:.3g}, cosine to step "
                f"{config.steps}")
    return config, tuple(changes)


def save(trainer, reason: str, recent_losses: list[float]) -> tuple[Path, list[Path]]:
    """Write `trainer`'s state into <run_dir>/checkpoints/step-XXXXXXX/ (atomic) and rotate; returns the path and
    the checkpoints rotation removed."""
    cfg = trainer.config
    module = trainer.drafter  # the uncompiled module of replica 0; every replica holds the same weights
    names = train_state.trainable_names(module)
    opt_tensors, groups = train_state.optimizer_tensors(trainer.workers[0].optimizer, names)
    rng_tensors, rng_meta = train_state.rng_state([w.device for w in trainer.workers])
    state = checkpoint_state(trainer, reason, recent_losses, names=names, groups=groups, rng=rng_meta,
                             lr_override=trainer.controls.new_lr)
    drafter = {k: v.detach().to("cpu").contiguous() for k, v in module.state_dict().items()
               if not k.startswith("rotary_emb.")}
    root = trainer.run_dir / checkpoint.CHECKPOINTS_DIR
    path = checkpoint.write_checkpoint(root, trainer.step_count, {
        checkpoint.DRAFTER_FILE: drafter, checkpoint.OPTIMIZER_FILE: opt_tensors, checkpoint.RNG_FILE: rng_tensors},
        state)
    return path, checkpoint.rotate(root, cfg.keep_checkpoints)


def checkpoint_state(run, reason: str, recent_losses: list[float], *, names, groups, rng, lr_override=None,
                     extra: dict | None = None) -> dict:
    """The state.json of a checkpoint of `run` (a Trainer or a RankTrainer: config, schedule, sampler, data,
    drafter_config, step_count, last_metrics)."""
    cfg, step = run.config, run.step_count
    epoch, index = run.sampler.position(step)
    return {
        "format_version": checkpoint.FORMAT_VERSION, "step": step, "reason": reason, "time": time.time(),
        "loss": (run.last_metrics or {}).get("loss"),
        "loss_avg": sum(recent_losses) / len(recent_losses) if recent_losses else None,  # rotation keeps the best
        "data": {"epoch": epoch, "index_in_epoch": index, **resume_checks.data_fingerprint(run.data, run.sampler)},
        "scheduler": {"next_step": step, "next_lr": lr_override if lr_override is not None else run.schedule.lr(step),
                      "lr_override": lr_override, "total_steps": cfg.steps, "warmup_steps": cfg.warmup_steps},
        "optimizer": {"param_names": names, "param_groups": groups},
        "rng": rng, "config": cfg.to_dict(), "drafter_config": run.drafter_config.to_dict(), **(extra or {}),
    }


def restore(trainer, resume: checkpoint.Checkpoint) -> None:
    """Load drafter, masters + AdamW state, RNG, step and lr override into every replica."""
    for w in trainer.workers:
        train_state.restore_replica(getattr(w.drafter, "_orig_mod", w.drafter), w.optimizer, resume)
    train_state.restore_rng(resume.rng, resume.state.get("rng", {}))
    trainer.step_count = resume.step
    trainer.controls.new_lr = resume.state.get("scheduler", {}).get("lr_override")
