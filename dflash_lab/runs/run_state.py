"""What state a run is in, from its folder and its lock: running, finished, stopped (resumable), interrupted, killed,
failed or diverged, and for a run that ended early the checkpoint it can continue from.

Recent writes alone do not say a run is alive: a run stopped with Ctrl-C 36 s ago still looks fresh. The lock does:
the process that trains a run dir holds `run.lock` (lock.py) until it exits, and the kernel drops it when that
process dies in any way. So a run is "running" only while its lock is held; once it is not, the last lifecycle event
in events.jsonl says how it ended (`stopped`, `interrupted`, `finished`, `failed`), and a run with none of them was
killed. Runs written before the lock existed, or whose holder is on another host (a shared filesystem's locks may not
reach across hosts), fall back to the age of their newest write.
"""

from __future__ import annotations

import re
import socket
import time
from pathlib import Path

from . import lock as run_lock, rundir
from .run_files import RunFileError, read_json

# a run stopped at a step boundary with a checkpoint (time budget, STOP file): resume_from continues it
STOPPED_RESUMABLE = "stopped (resumable)"

LIVE_WINDOW_S = 120.0  # without a usable lock: a run whose metrics/events changed this recently counts as running
_ENDS = {"stopped", "interrupted", "finished", "finish", "failed", "diverged"}
_STARTS = {"start", "resumed"}
_CHECKPOINT = re.compile(r"^step-(\d+)$")


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def newest_checkpoint_step(run_dir: Path) -> int | None:
    """The step of the newest complete checkpoint (a `step-N` folder with its state.json), read from names only."""
    root = Path(run_dir) / "checkpoints"
    steps = [int(m.group(1)) for p in (root.iterdir() if root.is_dir() else ())
             if (m := _CHECKPOINT.match(p.name)) and (p / "state.json").is_file()]
    return max(steps, default=None)


def process_alive(run_dir: Path) -> bool | None:
    """Whether the process that owns the run dir is alive: True (it holds run.lock), False (run.lock was released,
    or nobody holds it and it names a holder on this host), None (never locked, or its holder is another host's)."""
    lock_file = Path(run_dir) / run_lock.LOCK_FILE
    if not lock_file.is_file():  # released and removed by its holder, or never taken (nothing written yet)
        return False if (Path(run_dir) / rundir.EVENTS_FILE).is_file() else None
    if run_lock.is_held(lock_file):
        return True
    holder = run_lock.read_holder_file(lock_file)
    if not holder:
        return False  # released cleanly (an empty record)
    if holder.get("host") != socket.gethostname():
        return None
    return False  # the OS lock is free: its holder on this host is gone (or no longer holds it)


def _summary_status(run_dir: Path, events: list[dict]) -> str | None:
    """summary.json's status when it describes the run's newest point, else None."""
    summary_file = run_dir / "summary.json"
    if not summary_file.is_file():
        return None
    try:
        summary = read_json(summary_file)
    except RunFileError:
        return "summary.json unreadable"
    last_resume = max((e["time"] for e in events if e.get("event") == "resumed" and _is_number(e.get("time"))),
                      default=0)
    logged = max((r["step"] for r in rundir.read_jsonl(run_dir / rundir.METRICS_FILE) if _is_number(r.get("step"))),
                 default=0)
    # a summary older than a resume, or than steps trained after it, describes an earlier point of the run
    steps = summary.get("steps")
    if summary_file.stat().st_mtime >= last_resume and (not _is_number(steps) or steps >= logged):
        return str(summary.get("status", "finished"))
    return None


def _ended(run_dir: Path, events: list[dict]) -> str:
    """How a run whose process is gone ended, from its last lifecycle event; "killed" when it has none after its
    (re)start, unless its newest checkpoint is at the configured last step (trained to the end, never finished)."""
    checkpoint_step = newest_checkpoint_step(run_dir)
    last = next((e for e in reversed(events) if e.get("event") in _ENDS | _STARTS), {})
    kind = last.get("event")
    try:
        steps = read_json(run_dir / rundir.CONFIG_FILE).get("steps")
    except RunFileError:
        steps = None
    if kind not in _ENDS and checkpoint_step is not None and checkpoint_step == steps:
        return "finished"
    ckpt = f"ckpt @{checkpoint_step}" if checkpoint_step is not None else "no ckpt"
    if kind == "stopped":
        return STOPPED_RESUMABLE if last.get("resumable", checkpoint_step is not None) else "stopped"
    if kind in ("finished", "finish"):
        return "finished"
    if kind in ("failed", "diverged"):
        return kind
    if kind == "interrupted":
        return f"interrupted ({ckpt})"
    return f"killed ({ckpt})"


def run_status(run_dir: str | Path) -> str:
    """finished | stopped (resumable) | interrupted (ckpt @N) | killed (ckpt @N / no ckpt) | failed | diverged |
    running | incomplete; a cut-off summary.json reads "summary.json unreadable" (that run only)."""
    run_dir = Path(run_dir)
    events = rundir.read_jsonl(run_dir / rundir.EVENTS_FILE)
    if any(e.get("event") == "diverged" for e in events[-3:]):
        return "diverged"
    alive = process_alive(run_dir)
    summary = _summary_status(run_dir, events)
    if summary is not None and not alive:
        return summary
    if alive:
        return "running" if summary is None else summary
    if alive is False:
        return _ended(run_dir, events)
    newest = max((f.stat().st_mtime for f in (run_dir / rundir.METRICS_FILE, run_dir / rundir.EVENTS_FILE)
                  if f.is_file()), default=0)
    if time.time() - newest < LIVE_WINDOW_S and not any(e.get("event") in _ENDS for e in events[-1:]):
        return "running"
    return _ended(run_dir, events) if events else "incomplete"
