"""Whether a checkpoint can be resumed with the current settings: the fields that must match, the data's identity,
and an error that names every difference and the fix."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import weakref
from pathlib import Path

import numpy as np

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
RECORD_DIGEST = 4  # bytes of each sample's digest: enough to find the edited one (the whole-data sha1 decides)


def _record_bytes(data) -> list:
    """Each sample's token ids, loss mask and (packed) document ids as (n, bytes) arrays: what a step reads of it."""
    n = len(data)
    columns = [data.input_ids, data.loss_mask] + ([data.doc_ids] if data.doc_ids is not None else [])
    return [c.reshape(n, -1).contiguous().numpy().view(np.uint8) for c in columns]


# The data's digests, computed once per tokenized data set (every checkpoint of a run writes them): the last one,
# held by a weak reference to its token tensor (tensors compare elementwise, so they key no dict).
_DIGESTS: list = [lambda: None, None]


def _digests(data) -> tuple[str, bytes]:
    """(sha1 of every sample's tokens, mask and document ids; 4 bytes of blake2b per sample, to name one that
    changed)."""
    if _DIGESTS[0]() is not data.input_ids:
        columns = _record_bytes(data)
        whole = hashlib.sha1()
        for c in columns:
            whole.update(c.tobytes())
        per = b"".join(hashlib.blake2b(b"".join(c[i].tobytes() for c in columns), digest_size=RECORD_DIGEST).digest()
                       for i in range(len(data)))
        _DIGESTS[:] = weakref.ref(data.input_ids), (whole.hexdigest(), per)
    return _DIGESTS[1]


def data_fingerprint(data, sampler) -> dict:
    """Identity of the tokenized data: sample count, epoch length, hash of the sample lengths, and hashes of the
    tokens themselves (an answer edited in place keeps its length when the sample is cut to seq_len), whole and
    per sample (base64, RECORD_DIGEST bytes each: 320 kB of state.json for 60k samples) to say which one changed."""
    whole, per = _digests(data)
    return {"num_samples": len(data), "steps_per_epoch": sampler.steps_per_epoch,
            "lengths_sha1": hashlib.sha1(data.lengths.numpy().tobytes()).hexdigest(),
            "tokens_sha1": whole, "record_digests": base64.b64encode(per).decode("ascii")}


def _changed_samples(old: dict, data) -> str:
    """The first samples whose tokens differ from the checkpoint's, by index and where they are in the data."""
    try:
        before = base64.b64decode(old["record_digests"])
    except (KeyError, TypeError, ValueError):
        before = b""
    now = _digests(data)[1]
    n = min(len(before), len(now)) // RECORD_DIGEST
    changed = [i for i in range(n)
               if before[i * RECORD_DIGEST:(i + 1) * RECORD_DIGEST] != now[i * RECORD_DIGEST:(i + 1) * RECORD_DIGEST]]
    if not changed:
        return "the samples' tokens differ (which one could not be told)"
    ids = list(getattr(data, "sample_ids", None) or [])
    named = [f"sample {i}" + (f" ({ids[i]})" if i < len(ids) else "") for i in changed[:3]]
    more = f" and {len(changed) - 3} more" if len(changed) > 3 else ""
    return f"{', '.join(named)}{more} {'has' if len(changed) == 1 else 'have'} other tokens than at the checkpoint"


def check_resume(resume: Checkpoint, *, data, sampler, drafter_config: dict, log=None) -> None:
    """Raise ConfigError naming every difference in the data or the drafter's shape since the checkpoint. A
    checkpoint written before the data's tokens were hashed resumes on the old identity (counts and lengths), and
    `log` says that the tokens were not checked."""
    old = resume.state.get("data", {})
    now = data_fingerprint(data, sampler)
    fix = ("The data changed since the checkpoint, so a step would not see the same batch. Fix: resume on the data "
           "the run was trained on, or")
    diffs = [(f"data.{k}", old[k], now[k]) for k in ("num_samples", "steps_per_epoch")
             if k in old and old[k] != now[k]]
    if not diffs and "tokens_sha1" in old and old["tokens_sha1"] != now["tokens_sha1"]:
        raise ConfigError(f"cannot resume from {resume.path}: {_changed_samples(old, data)}. "
                          + fix.replace("Fix: resume", "Fix: restore that record and resume") + " start a fresh "
                          "run (resume_from=None).")
    if not diffs and "tokens_sha1" not in old and old.get("lengths_sha1", now["lengths_sha1"]) != now["lengths_sha1"]:
        diffs.append(("data.lengths_sha1", old["lengths_sha1"], now["lengths_sha1"]))
    if diffs:
        raise ConfigError(format_differences(resume.path, diffs).replace("Fix:", fix))
    if "tokens_sha1" not in old and log is not None:
        log(f"note: {resume.path} was written before checkpoints hashed the data's tokens: this resume checks only "
            "the data's sample lengths, so keep the data file as it was.")
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
