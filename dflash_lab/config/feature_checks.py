"""Checks of TrainConfig's feature knobs, one function per feature: loss weighting, optimizer, draft vocabulary,
distillation, packing, metric sinks (and the refusal to resume under another optimizer). Plain Python, no torch:
the config validates with them at construction, and the features themselves (drafter/loss_weights.py, train/muon.py,
data/draft_vocab.py, data/packing.py, runs/sinks.py) read the same constants from here."""

from __future__ import annotations

import importlib.util

from .errors import ConfigError, fail

LOSS_WEIGHTINGS = ("decay", "dpace")
LOSS_NORMALIZERS = ("valid_anchors", "anchor_budget")
OPTIMIZERS = ("adamw", "muon")
# name -> (module that must import, pip command that installs it)
SINK_PACKAGES = {"tensorboard": ("tensorboard", "pip install tensorboard==2.21.0"),
                 "wandb": ("wandb", "pip install wandb")}


def check_loss_weighting_fields(cfg) -> None:
    """The loss-weighting knobs of a TrainConfig (raises ConfigError naming the fix)."""
    c = "TrainConfig"
    if cfg.loss_weighting is not None and cfg.loss_weighting not in LOSS_WEIGHTINGS:  # None: chosen for the target
        fail(c, "loss_weighting", cfg.loss_weighting, "unknown loss weighting",
             'use "decay" (the paper\'s exp(-(k-1)/gamma)) or "dpace" (D-PACE)')
    alpha = cfg.dpace_alpha
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 < alpha <= 1:
        fail(c, "dpace_alpha", alpha, "must be in (0, 1]: q~ = (1 - alpha) * q + alpha; 0 would let one confident "
             "miss zero the whole block", "use 0.5 (default); 1 gives the linear weights B - j")
    if cfg.loss_normalizer not in LOSS_NORMALIZERS:
        fail(c, "loss_normalizer", cfg.loss_normalizer, "unknown loss normaliser",
             f"use one of {LOSS_NORMALIZERS} (both are global counts fixed before the batch is split)")


def check_optimizer_fields(cfg) -> None:
    """TrainConfig's optimizer knobs: optimizer, muon_lr, muon_momentum (raises ConfigError naming the fix)."""
    c = "TrainConfig"
    if cfg.optimizer not in OPTIMIZERS:
        fail(c, "optimizer", cfg.optimizer, "unknown optimizer", f"use one of {OPTIMIZERS} (\"adamw\" is the paper's)")
    if cfg.muon_lr is not None and not cfg.muon_lr > 0:  # finiteness: field_types
        fail(c, "muon_lr", cfg.muon_lr, "must be None or a positive number",
             "leave it None (Muon then uses `lr`, on AdamW's scale) or use e.g. 6e-4")
    if not 0 <= cfg.muon_momentum < 1:
        fail(c, "muon_momentum", cfg.muon_momentum, "must be in [0, 1)", "use 0.95 (Muon's default)")
    if cfg.optimizer != "muon":
        for name, default in (("muon_lr", None), ("muon_momentum", 0.95)):
            if getattr(cfg, name) != default:
                fail(c, name, getattr(cfg, name), f'it has no effect with optimizer="{cfg.optimizer}"',
                     f'set optimizer="muon" as well, or leave {name}={default}')


def check_resume_optimizer(checkpoint_path, saved_config: dict, requested, explicit: set[str]) -> None:
    """Refuse a resume that asks for another optimizer than the checkpoint's: its state would not map (Muon keeps
    one momentum buffer per matrix, AdamW two moments and a step count per tensor)."""
    saved = saved_config.get("optimizer", "adamw")  # checkpoints from before the optimizer knob were all AdamW
    if "optimizer" in explicit and requested.optimizer != saved:
        raise ConfigError(f"cannot resume from {checkpoint_path}: it was trained with optimizer={saved!r}, and you "
                          f"asked for optimizer={requested.optimizer!r}; its optimizer state cannot continue under "
                          f"another optimizer. Fix: leave optimizer unset (or {saved!r}) to resume, or start a fresh "
                          f"run (resume_from=None) to train with {requested.optimizer!r}.")


def check_draft_vocab_fields(cfg) -> None:
    """TrainConfig.draft_vocab_size: None or an integer > 1 (the upper bound, the target's vocabulary, is checked by
    DrafterConfig once the target's config is known)."""
    d = cfg.draft_vocab_size
    if d is not None and (isinstance(d, bool) or not isinstance(d, int) or d < 2):
        fail("TrainConfig", "draft_vocab_size", d, "a draft vocabulary needs at least 2 ids",
             "use None (the full target vocabulary) or e.g. 32768")


def check_draft_vocab_size(d: int | None, vocab_size: int) -> None:
    """DrafterConfig.draft_vocab_size against the target's vocabulary: 1 < d <= vocab_size."""
    if d is not None and (isinstance(d, bool) or not isinstance(d, int) or not 1 < d <= vocab_size):
        fail("DrafterConfig", "draft_vocab_size", d, f"it must be in (1, {vocab_size}] (the target's vocabulary)",
             f"use None for the full vocabulary or a value <= {vocab_size}")


def check_distill_fields(cfg) -> None:
    """distill_weight in [0, 1], top-k in [1, 1024], temperature > 0; distillation needs the target's logits, which
    an offline feature cache does not hold."""
    c, w = "TrainConfig", cfg.distill_weight
    if not 0 <= w <= 1:
        fail(c, "distill_weight", w, "must be in [0, 1] (the share of the loss against the target's distribution)",
             "use 0 (hard labels only) or e.g. 0.5")
    k = cfg.distill_top_k
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= 1024:
        fail(c, "distill_top_k", k, "must be an integer in [1, 1024]", "use e.g. 16")
    if not cfg.distill_temperature > 0:
        fail(c, "distill_temperature", cfg.distill_temperature, "must be > 0",
             "use the serving temperature, e.g. 1.0 (T=0 serving is what hard labels train for)")
    if w > 0 and cfg.feature_cache is not None:
        fail(c, "distill_weight", w, f"feature_cache={cfg.feature_cache!r} holds features but not the target's "
             "logits, which distillation needs", "set feature_cache=None (online features; feature_store_gib keeps "
             "them on the GPU across epochs), or distill_weight=0")


def check_distill_vocab(cfg, vocab_size: int) -> None:
    """distill_top_k within the target's vocabulary: the config alone cannot know it, so preparation checks it as
    soon as the target's config is read, before any weight loads (it failed at step 0 after the target loaded)."""
    if cfg.distill_weight > 0 and cfg.distill_top_k > vocab_size:
        fail("TrainConfig", "distill_top_k", cfg.distill_top_k, f"is larger than the vocabulary of {vocab_size} ids "
             f"of target {cfg.target!r}", f"use distill_top_k <= {vocab_size}, e.g. 16")


def check_pack_fields(cfg) -> None:
    """pack_sequences needs features computed online: a feature cache holds one conversation per row, unpacked."""
    if cfg.pack_sequences and cfg.feature_cache is not None:
        fail("TrainConfig", "pack_sequences", cfg.pack_sequences,
             f"feature_cache={cfg.feature_cache!r} holds features of unpacked rows (one conversation each, looked up "
             "by input ids), which packed windows do not match",
             "set pack_sequences=False to train from the cache, or feature_cache=None to pack with online features")


def sink_problem(name: str) -> str | None:
    """Why sink `name` cannot be used here (unknown name, package missing), or None."""
    if name not in SINK_PACKAGES:
        return f"unknown metric sink {name!r}; use a subset of {tuple(SINK_PACKAGES)}"
    module, pip = SINK_PACKAGES[name]
    if importlib.util.find_spec(module) is None:
        return f"the {name} sink needs the {module!r} package, which is not installed; run `{pip}`"
    return None
