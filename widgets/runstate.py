"""What state a run directory is in, read from what the run records; used by the attach view (no ipywidgets).

The evidence, strongest first: `summary.json` (written by `Trainer.finish()`: its `status` and step count, checked
against the target), `status.json` (rank 0 of a torchrun job), the last `events.jsonl` event (stop_requested,
interrupted, diverged, finish), a `STOP` file, and whether the writer is alive. Alive means holding the run's lock
(runs/run_state.process_alive: the kernel drops it when the process dies, so a run interrupted 5 s ago is not
"training" however fresh its files); only where the lock says nothing (a run from before the lock, a holder on
another host) do recent writes stand in: a Trainer's GPU monitor appends to system.jsonl every 2 s while its process
lives, so files that stopped changing for WRITER_SILENT_S mean the writer is gone. Checking only for summary.json
showed a run stopped at 110/400 as "finished".
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from dflash_lab.runs.run_state import process_alive

from .model import tau_gap_text

# system.jsonl gets a line every 2 s while the writer lives: 10 missed lines mean it is gone.
WRITER_SILENT_S = 20.0
# Without system.jsonl (no monitor) only metric lines show life; a slow step may take minutes.
METRICS_SILENT_S = 300.0
ACTIVITY_FILES = ("metrics.jsonl", "system.jsonl", "system.rank0.jsonl", "events.jsonl", "status.json")


@dataclass
class RunState:
    phase: str  # training | paused | stopping | stopped | finished | failed | waiting | interrupted
    detail: str = ""
    error: str | None = None


def read_json(path: Path) -> dict:
    try:
        obj = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return obj if isinstance(obj, dict) else {}


def last_events(path: Path, max_bytes: int = 64_000) -> list[dict]:
    """The events in the last `max_bytes` of events.jsonl (the file is small: a line per checkpoint or stop)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            lines = f.read().split(b"\n")
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return [e for e in out if isinstance(e, dict)]


def last_write_age(run_dir: Path, now: float) -> tuple[float | None, bool]:
    """(seconds since any activity file changed, whether a system monitor file exists)."""
    mtimes, monitored = [], False
    for name in ACTIVITY_FILES:
        try:
            mtimes.append((run_dir / name).stat().st_mtime)
            monitored |= name.startswith("system")
        except OSError:
            continue
    return (now - max(mtimes) if mtimes else None), monitored


def _summary_state(summary: dict, step: int, total: int | None) -> RunState:
    status = str(summary.get("status", "finished"))
    steps = summary.get("steps", step)
    target = summary.get("target_steps") or total
    of = f" of {target}" if target else ""
    ckpt = Path(summary["last_checkpoint"]).name if summary.get("last_checkpoint") else None
    if status == "diverged":
        at = summary.get("diverged_at", steps)
        return RunState("failed", f"diverged at step {at}", f"loss not finite at step {at}; last good checkpoint "
                                                            f"{ckpt or '(none)'}")
    if status == "finished" and (not target or steps >= target):
        return RunState("finished", f"{steps} steps")
    return RunState("stopped", f"at step {steps}{of}" + (f"; checkpoint {ckpt}" if ckpt else ""))


def run_dir_state(run_dir: Path, *, step: int, total: int | None, now: float | None = None) -> RunState:
    """The phase to show for a run directory whose metrics reached `step` of `total`."""
    now = time.time() if now is None else now
    of = f" of {total}" if total else ""
    summary = read_json(run_dir / "summary.json")
    if summary:
        return _summary_state(summary, step, total)
    age, monitored = last_write_age(run_dir, now)
    held = process_alive(run_dir)
    alive = held if held is not None else age is not None and age < (WRITER_SILENT_S if monitored else METRICS_SILENT_S)
    gone = ("its process has exited (run.lock released)" if held is False else
            f"no file written for {age:.0f} s" if age is not None else "nothing written yet")
    status = read_json(run_dir / "status.json")
    if status.get("phase") == "failed" or status.get("error"):
        return RunState("failed", status.get("detail", ""), status.get("error"))
    events = [e for e in last_events(run_dir / "events.jsonl") if e.get("event") in
              ("stop_requested", "interrupted", "diverged", "finish", "resumed")]
    last = events[-1] if events else {}
    kind = last.get("event")
    if kind == "diverged":
        return RunState("failed", f"diverged at step {last.get('step')}",
                        f"loss {last.get('loss')} / grad norm {last.get('grad_norm')} not finite")
    if total and step >= total and (not alive or kind == "finish"):
        return RunState("finished", f"{step} steps (no summary.json: finish() was not called)")
    if kind in ("stop_requested", "interrupted") and last.get("step", -1) >= step - 1:
        word = "stopped" if kind == "stop_requested" else "interrupted"
        return RunState(word, f"at step {step}{of}" + ("" if alive else f"; the writer is gone ({gone})"))
    if (run_dir / "STOP").exists():
        return RunState("stopping" if alive else "stopped", "STOP file present" if alive else
                        f"at step {step}{of}; STOP file never consumed ({gone})")
    if status.get("phase") and alive:
        return RunState(str(status["phase"]), status.get("detail", ""))
    if not alive:
        if step == 0:
            return RunState("waiting", f"no metrics yet in {run_dir.name}/metrics.jsonl ({gone})")
        return RunState("stopped", f"at step {step}{of}: the writer is gone ({gone}) without summary.json")
    if step == 0:
        return RunState("waiting", f"no metrics yet in {run_dir.name}/metrics.jsonl")
    return RunState("training", f"following {run_dir.name}")


def warning_from_events(run_dir: Path) -> str | None:
    """The newest `tau_gap` event's text (simulated and real tau part ways), or None."""
    gaps = [e for e in last_events(run_dir / "events.jsonl") if e.get("event") == "tau_gap"]
    return tau_gap_text(gaps[-1], gaps[-1].get("step")) if gaps else None
