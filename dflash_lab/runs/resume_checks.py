"""Whether a checkpoint can be resumed with the current settings: the fields that must match, the data's identity,
and an error that names every difference and the fix."""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

from .checkpoint import Checkpoint
from dflash_lab.config.errors import ConfigError
from dflash_lab.config.drafter_config import DrafterConfig

# Fields that change the model, the data stream or the optimiser trajectory: a resume must keep them. Every other
# TrainConfig field (steps, devices, logging, checkpointing, run naming, eval) may change when resuming; changing
# `steps` re-plans the cosine schedule from the resumed step on, so that run is no longer identical to one started
# with the new `steps`.
MUST_MATCH = ("target", "data", "seq_len", "batch_size", "block_size", "num_anchors", "num_draft_layers",
              "num_target_features", "target_layer_ids", "mask_token_id", "layer_types", "sliding_window", "lr",
              "weight_decay", "warmup_ratio", "min_lr_ratio", "grad_clip", "gamma", "seed",
              "pack_sequences", "draft_vocab_size", "drafter_variant", "markov_rank", "enable_confidence_head",
              "confidence_head_with_markov")


def data_fingerprint(data, sampler) -> dict:
    """Cheap identity of the tokenized data (sample count, epoch length, hash of the sample lengths)."""
    return {"num_samples": len(data), "steps_per_epoch": sampler.steps_per_epoch,
            "lengths_sha1": hashlib.sha1(data.lengths.numpy().tobytes()).hexdigest()}


def check_resume(resume: Checkpoint, *, data, sampler, drafter_config: dict) -> None:
    """Raise ConfigError naming every difference in the data or the drafter's shape since the checkpoint."""
    old = resume.state.get("data", {})
    diffs = [(f"data.{k}", old[k], v) for k, v in data_fingerprint(data, sampler).items() if k in old and old[k] != v]
    if diffs:
        raise ConfigError(format_differences(resume.path, diffs).replace(
            "Fix:", "The data changed since the checkpoint, so a step would not see the same batch. Fix: resume on "
            "the data the run was trained on, or"))
    # A field added since the checkpoint was written (the drafter variant's) holds its default there.
    saved = {**_drafter_defaults(), **resume.state["drafter_config"]}
    diffs = config_differences(saved, drafter_config, fields=tuple(drafter_config))
    if diffs:
        raise ConfigError(format_differences(resume.path, [(f"drafter.{f}", a, b) for f, a, b in diffs]))


def _drafter_defaults() -> dict:
    return {f.name: f.default for f in dataclasses.fields(DrafterConfig) if f.default is not dataclasses.MISSING}


def _norm(v):
    return list(v) if isinstance(v, tuple) else v


def config_differences(old: dict, new: dict, fields=MUST_MATCH) -> list[tuple[str, object, object]]:
    """(field, checkpoint value, new value) for each field in `fields` that differs."""
    return [(f, old.get(f), new.get(f)) for f in fields if _norm(old.get(f)) != _norm(new.get(f))]


def format_differences(checkpoint: Path, diffs: list[tuple[str, object, object]]) -> str:
    lines = "\n".join(f"  {f}: {old!r} (checkpoint) -> {new!r} (now)" for f, old, new in diffs)
    return (f"cannot resume from {checkpoint}: {len(diffs)} setting(s) that change the model, the data or the "
            f"optimiser trajectory differ from the checkpoint's:\n{lines}\nFix: set them back to the checkpoint's "
            "values (its state.json holds the full config), or start a fresh run (resume_from=None). Fields that "
            "may change on resume: steps, devices, target_devices, dtype, logging, checkpointing, eval and naming.")
