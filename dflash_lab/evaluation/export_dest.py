"""Where an export may go: refuse to replace a folder that is not ours to replace, then swap the new one in atomically.

A non-empty destination is refused unless `force`; a folder holding a model (e.g. the target: config.json that is not
a DFlash export, tokenizer files, sharded weights) or a training run (metrics.jsonl, checkpoints/, a config.json with
a `target`) is refused even then, as is a folder containing the drafter being exported.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
from pathlib import Path


class ExportRefused(ValueError):
    """The destination folder holds something an export must not replace; the message says what and the fix."""


_RUN_MARKERS = ("metrics.jsonl", "state.json", "drafter_config.json", "events.jsonl", "checkpoints")
_MODEL_MARKERS = ("tokenizer.json", "tokenizer_config.json", "model.safetensors.index.json", "generation_config.json",
                  "pytorch_model.bin")


def guard_destination(out: Path, force: bool, *, source: Path | None = None) -> None:
    """Refuse to replace a non-empty folder unless `force`; refuse even then a target model, a run, or the source."""
    if out.exists() and not out.is_dir():
        raise ExportRefused(f"out dir {out} exists and is a file. Fix: pass a directory path.")
    if source is not None and source.resolve().is_relative_to(out.resolve()):
        raise ExportRefused(f"out dir {out} contains the drafter being exported ({source}); replacing it would "
                            "delete the source. Fix: pass a new directory, e.g. <run dir>/export.")
    entries = sorted(p.name for p in out.iterdir()) if out.is_dir() else []
    if not entries:
        return
    held = [m for m in _RUN_MARKERS if (out / m).exists()]
    if held or _is_run_config(out / "config.json"):
        raise ExportRefused(f"out dir {out} is a training run (holds {held or ['config.json with a target']}); an "
                            "export never replaces a run, even with --force. Fix: pass a new directory, e.g. "
                            "<run dir>/export.")
    model = [m for m in _MODEL_MARKERS if (out / m).exists()]
    if model or ((out / "config.json").is_file() and not _is_export(out / "config.json")):
        raise ExportRefused(f"out dir {out} holds a model ({model or ['config.json']}), e.g. the target; an export "
                            "never replaces it, even with --force. Fix: pass a new directory.")
    if not force:
        shown = ", ".join(entries[:5]) + (f" (+{len(entries) - 5} more)" if len(entries) > 5 else "")
        raise ExportRefused(f"out dir {out} is not empty ({shown}). Fix: pass a new or empty directory, or --force "
                            "(force=True) to replace it (a folder holding a model or a run is never replaced).")


def _config_of(path: Path) -> dict:
    try:
        d = json.loads(path.read_text()) if path.is_file() else {}
    except (json.JSONDecodeError, UnicodeDecodeError):
        return {}
    return d if isinstance(d, dict) else {}


def _is_run_config(path: Path) -> bool:
    return "target" in _config_of(path)


def _is_export(path: Path) -> bool:
    return "DFlashDraftModel" in (_config_of(path).get("architectures") or [])


def swap_into_place(tmp: Path, out: Path) -> None:
    """Rename the finished temp folder to `out`; an existing (already vetted) `out` is moved aside first and removed
    only once the new one is in place."""
    if out.is_dir() and not any(out.iterdir()):
        out.rmdir()
    if not out.exists():
        os.rename(tmp, out)
        return
    old = out.with_name(f".{out.name}.replaced-{secrets.token_hex(4)}")
    os.rename(out, old)
    try:
        os.rename(tmp, out)
    except OSError:
        os.rename(old, out)
        raise
    shutil.rmtree(old, ignore_errors=True)
