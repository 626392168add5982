"""An exported folder's serving side: the command each engine serves it with, and the engines that cannot.

export.py prints both when it writes a folder; these read a folder written earlier (the recipe's results do). The
rules behind them are serving_engines.py's.
"""

from __future__ import annotations

import json
from pathlib import Path

from dflash_lab.target.load import TargetLoadError, resolve_target_path
from .serving_engines import engine_readings, serving_commands


def serving_target(target: str | None) -> str:
    """The model path or hub id the serving engines load the target from ("tiny" -> its embedded folder)."""
    if target is None:
        return "<target model>"
    try:
        return resolve_target_path(target)
    except TargetLoadError:
        return target


def cannot_serve(out_dir: str | Path) -> dict:
    """{engine: one line why it cannot serve this export, and the alternative} for the engines that cannot."""
    from safetensors import safe_open

    out = Path(out_dir).expanduser()
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    readings = engine_readings(json.loads((out / "config.json").read_text()), names)
    return {e: r["cannot_serve"] for e, r in readings.items() if r["cannot_serve"]}


def export_commands(out_dir: str | Path, target: str | None = None, **drafting) -> dict:
    """{engine: command} serving an existing export (the ones export_drafter printed); the target defaults to the
    one its config.json names. `drafting`: a DSpark drafter's decoding as it was evaluated (draft_sampling,
    draft_topk, adaptive_verification: serving_engines.serving_commands), when not evaluate's defaults."""
    out = Path(out_dir).expanduser().resolve()
    cfg = json.loads((out / "config.json").read_text())
    return serving_commands(cfg, out, serving_target(target or (cfg.get("dflash_lab") or {}).get("target")),
                            **drafting)
