"""Validation of TrainConfig's optimizer knob (issue 17: optimizer, muon_lr, muon_momentum) and the refusal to
resume a checkpoint under another optimizer. No torch here: config.py imports it. The optimizer itself is muon.py."""

from __future__ import annotations

from .errors import ConfigError, fail

OPTIMIZERS = ("adamw", "muon")


def check_optimizer_fields(cfg) -> None:
    """TrainConfig's optimizer knob (issue 17): optimizer, muon_lr, muon_momentum (raises ConfigError naming the fix)."""
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
    saved = saved_config.get("optimizer", "adamw")  # checkpoints from before issue 17 were all AdamW
    if "optimizer" in explicit and requested.optimizer != saved:
        raise ConfigError(f"cannot resume from {checkpoint_path}: it was trained with optimizer={saved!r}, and you "
                          f"asked for optimizer={requested.optimizer!r}; its optimizer state cannot continue under "
                          f"another optimizer. Fix: leave optimizer unset (or {saved!r}) to resume, or start a fresh "
                          f"run (resume_from=None) to train with {requested.optimizer!r}.")
