"""What a rerun of the recipe in the same work_dir keeps: data outputs complete for the same settings, and the
training run it reuses (finished) or resumes (stopped with a checkpoint).

A lent GPU runs one call for 10 minutes; the "long" preset (recipe_config.PRESETS) trains for several. Each call
runs the whole recipe again with the same work_dir, and recipe.py asks this module, phase by phase, what an earlier
call already made:
- A data phase records in results.json the settings its output depends on (RecipeConfig.data_settings) and the size
  and sha256 of every file it wrote, after the last one was written. It is reused only when all of that still
  holds: a file cut short, changed or gone, a phase with no record (it never ended), or any setting that differs
  redoes it. Hashing the ~30 MB of the default data takes well under a second; redoing costs minutes.
- The newest run under work_dir/runs continues only when its config.json holds the same training settings (all but
  the time budget) and its recipe_data.json names the sha256 of the very files training reads now (the same path
  may hold other data after a data phase was redone): finished -> reused, stopped on its budget or cut short with a
  checkpoint -> resumed (TrainConfig.resume_from; resume is exact), anything else -> a new run.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from dflash_lab.config import TrainConfig
from dflash_lab.config.recipe_defaults import RESOLVED_FIELDS
from dflash_lab.runs.listing import list_runs, run_config
from dflash_lab.runs.run_files import RunFileError, read_json
from dflash_lab.runs.run_state import STOPPED_RESUMABLE, run_status
from dflash_lab.runs.rundir import write_json

IDENTITY_FILE = "recipe_data.json"  # in a run dir: {"data": file_identity(the files it trains on)}
# TrainConfig fields that may change between the calls of one run: the call's budget, and the feature store's size,
# which is the machine's (an H200 holds every window on the GPU, an 80 GB card some in host memory) and changes no
# number the drafter sees (its storage dtype does, and is compared)
NOT_THE_RUN = ("resume_from", "time_budget_s", "feature_store_gib", "feature_store_host_gib")
EARLIER_MARKS = ("earlier_run", "earlier_settings_differ")  # recipe_results.earlier_phases' marks
FINISHED, STOPPED = "finished", STOPPED_RESUMABLE
CUT_WITH_CHECKPOINT = ("interrupted (ckpt @", "killed (ckpt @")  # run_state's names of a run cut after a checkpoint


def _same(a, b) -> bool:
    return json.dumps(a, default=str) == json.dumps(b, default=str)  # tuples read back from JSON as lists


def file_identity(paths) -> dict[str, dict]:
    """{path: {"bytes", "sha256"}} of each file."""
    out = {}
    for path in paths:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        out[str(path)] = {"bytes": Path(path).stat().st_size, "sha256": h.hexdigest()}
    return out


def settings_differ(figures: dict | None, settings: dict) -> list[str]:
    """The names of `settings` whose value differs from the one a phase's figures recorded."""
    before = (figures or {}).get("settings") or {}
    return [k for k in settings if not _same(before.get(k), settings[k])]


def why_redo(figures: dict | None, settings: dict) -> str | None:
    """None when a data phase's earlier output may be reused; otherwise why the phase runs again. `figures["files"]`
    is the identity of every file the phase read or wrote, taken when it ended: an input made again since (with
    other bytes) redoes it as surely as an output cut short."""
    if not figures:
        return "no earlier output recorded"
    if "files" not in figures or "settings" not in figures:
        return "the earlier figures do not record their settings and files (written before reuse existed)"
    differ = settings_differ(figures, settings)
    if differ:
        before = figures["settings"]
        return "settings differ: " + ", ".join(f"{k} {before.get(k)!r} -> {settings[k]!r}" for k in differ)
    for path, want in figures["files"].items():
        p = Path(path)
        if not p.is_file():
            return f"{path} is gone"
        if p.stat().st_size != want["bytes"]:
            return f"{path} has {p.stat().st_size} bytes, {want['bytes']} when the phase ended (cut short or changed)"
        if file_identity([p])[path]["sha256"] != want["sha256"]:
            return f"{path} changed since the phase ended"
    return None


def reused_figures(figures: dict) -> dict:
    """An earlier phase's figures as this run's: marked reused and by which run they were made."""
    kept = {k: v for k, v in figures.items() if k not in EARLIER_MARKS}
    return {**kept, "reused": True, "made_by_run": figures.get("made_by_run", figures.get("earlier_run"))}


def run_to_continue(config: TrainConfig, data_files, log) -> tuple[str, Path | None]:
    """("reuse" | "resume", the newest run under config.runs_dir) when that run may continue, else ("new", None);
    every refusal is logged with its reason."""
    runs = list_runs(config.runs_dir)
    if not runs:
        return "new", None
    run = runs[0]
    saved, unreadable = run_config(run)
    now = config.to_dict()
    # A field left unset (None) asks for the value chosen for the target: the run's config.json holds that choice.
    differ = [k for k in now if k not in NOT_THE_RUN and not (k in RESOLVED_FIELDS and now[k] is None)
              and not _same(saved.get(k), now[k])]
    if unreadable or differ:
        log(f"[recipe] train: a new run: the newest run {run} " + (unreadable or "trained other settings: "
                                                                     + ", ".join(differ)))
        return "new", None
    try:
        trained_on = read_json(run / IDENTITY_FILE, missing={}).get("data")
    except RunFileError:
        trained_on = None
    if trained_on != file_identity(data_files):
        log(f"[recipe] train: a new run: the newest run {run} trained on other data (or does not say which)")
        return "new", None
    status = run_status(run)
    if status == FINISHED and (run / "summary.json").is_file():
        return "reuse", run
    if status in (FINISHED, STOPPED) or status.startswith(CUT_WITH_CHECKPOINT):  # finished = trained, not finish()ed
        return "resume", run
    log(f"[recipe] train: a new run: the newest run {run} is {status}, nothing to continue")
    return "new", None


def record_data(run_dir: Path, data_files) -> None:
    """Say in the run dir which data it trains on (run_to_continue checks it on the next call)."""
    write_json(Path(run_dir) / IDENTITY_FILE, {"data": file_identity(data_files)})
