"""Where a dashboard's numbers come from: a live Trainer in this kernel, or a run directory written elsewhere.

Both feed a DashboardModel and return the phase to show (`poll(model) -> dict of DashboardModel.state kwargs`).
No ipywidgets here: the attach path is testable on CPU against a real run directory.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from .model import ENDED_PHASES, DashboardModel, replica_rows
from .runstate import read_json, run_dir_state, warning_from_events

LOAD_PROGRESS_ATTRS = ("load_progress", "target_load_progress", "loading_progress")


class JsonlFollower:
    """Incremental reader of a JSONL file that another process appends to (`tail -f` semantics).

    Keeps the byte offset of the last complete line; a partial last line waits for its newline; a file that shrank
    (rotated / rewritten) is read again from the start.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.offset = 0
        self._partial = b""
        self.bad_lines = 0

    def read_new(self, max_bytes: int = 64 * 2**20) -> list[dict]:
        try:
            size = self.path.stat().st_size
        except OSError:
            return []
        if size < self.offset:
            self.offset, self._partial = 0, b""
        if size == self.offset:
            return []
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            chunk = f.read(max_bytes)
        self.offset += len(chunk)
        data = self._partial + chunk
        lines = data.split(b"\n")
        self._partial = lines.pop()  # b"" if the chunk ended with a newline
        out = []
        for line in lines:
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError):
                row = None
            # a metrics row is a JSON object; `123`, `null` or a string is a torn or foreign line, counted
            if isinstance(row, dict):
                out.append(row)
            else:
                self.bad_lines += 1
        return out


def trainer_phase(trainer, controls=None) -> dict:
    """Phase, detail, error and replica load progress of a Trainer (reads whatever the trainer exposes)."""
    phase = str(getattr(trainer, "phase", "") or "ready")
    error = None
    for name in ("error", "last_error", "failure"):
        e = getattr(trainer, name, None)
        if e:
            error = e if isinstance(e, str) else f"{type(e).__name__}: {e}"
            break
    broken = getattr(getattr(trainer, "engine", None), "broken", None)  # a worker's error (device + step)
    if error is None and broken is not None:
        error = f"{type(broken).__name__}: {broken}"
    if error is None and getattr(trainer, "diverged_at", None) is not None:
        m = getattr(trainer, "last_metrics", None) or {}
        error = (f"loss {m.get('loss')} / grad norm {m.get('grad_norm')} not finite at step {trainer.diverged_at}; "
                 "resume_from the last good checkpoint with a lower lr")
    if controls is not None and controls.error:
        error = controls.error
    if error and phase != "failed":
        phase = "failed"
    progress = None
    for name in LOAD_PROGRESS_ATTRS:
        progress = getattr(trainer, name, None)
        if progress:
            break
    if callable(progress):
        progress = progress()
    detail = ""
    rows = replica_rows(progress)
    if phase.startswith("loading targets") and rows:
        done = sum(1 for r in rows if r["fraction"] >= 1.0)
        detail = f"{done} of {len(rows)} replicas loaded"
    elif phase == "paused":
        detail = f"at step {getattr(trainer, 'step_count', '?')}"
    elif phase == "failed" and getattr(trainer, "diverged_at", None) is not None:
        detail = f"diverged at step {trainer.diverged_at}"
    if controls is not None and controls.message and phase not in ("failed",):
        detail = f"{detail}; {controls.message}" if detail else controls.message
    return {"phase": phase, "phase_detail": detail, "error": error, "replicas": progress,
            "step": getattr(trainer, "step_count", None)}


def add_samples(model: DashboardModel, ring) -> None:
    """Every monitor sample since the last refresh, not only the newest: a papermill run refreshes its static view
    rarely, and drawing the newest sample of each refresh made a straight 0 -> 100% ramp of two points out of 25."""
    for sample in ring.snapshot():
        model.add_system(sample)


class TrainerSource:
    """A Trainer in this kernel (or one still being built by a TrainerBuilder): its metrics ring buffer, the
    GpuMonitor's ring, and its phase."""

    def __init__(self, trainer=None, monitor=None, controls=None, builder=None):
        self._trainer, self.monitor, self.controls, self.builder = trainer, monitor, controls, builder
        self.events: JsonlFollower | None = None  # the run dir's events.jsonl: markers on the curves
        self._frozen = False  # the system readings of an ended run were taken in (an idle kernel's are not its own)

    @property
    def trainer(self):
        return self._trainer if self._trainer is not None else (self.builder.trainer if self.builder else None)

    def poll(self, model: DashboardModel) -> dict:
        t = self.trainer
        if t is None:  # still loading
            if self.monitor is not None:
                add_samples(model, self.monitor.ring)
            b = self.builder
            phase, progress = b.phase(), b.replica_progress()
            rows = replica_rows(progress)
            detail = ""
            if phase.startswith("loading targets") and rows:
                done = sum(1 for r in rows if r["fraction"] >= 1.0)
                detail = f"{done} of {len(rows)} replicas loaded"
            return {"phase": phase, "phase_detail": detail, "error": b.error, "replicas": progress}
        model.total_steps = getattr(getattr(t, "config", None), "steps", None) or model.total_steps
        if self.controls is not None and self.controls.target_steps:
            model.total_steps = self.controls.target_steps
        added = model.pull(t.metrics.ring)
        if self.controls is not None:
            if added:
                self.controls.heartbeat()  # new steps: a loop is running (for Trainers without loops_running)
            self.controls.check_checkpoint()  # "Checkpoint now" while paused or idle: say when it is written
            self.controls.settle_message()  # "pause requested" -> "paused at step N" once it is
        info = trainer_phase(t, self.controls)
        if info["phase"] == "training" and self.controls is not None and not self.controls.loop_active():
            info["phase"], info["phase_detail"] = "idle", f"no loop running; at step {t.step_count}"
        ended = info["phase"] in ENDED_PHASES
        if self.monitor is not None and not (ended and self._frozen):  # readings freeze once the run has ended,
            add_samples(model, self.monitor.ring)  # with the samples taken up to its end
        self._frozen = ended
        run = getattr(t, "run_dir", None)
        if run is not None:
            model.warning = warning_from_events(Path(run)) or model.warning
            if self.events is None:
                self.events = JsonlFollower(Path(run) / "events.jsonl")
            model.add_events(self.events.read_new())
        return info


class RunDirSource:
    """A run directory written by another process (papermill, torchrun): follows metrics.jsonl and system.jsonl."""

    def __init__(self, run_dir: str | Path):
        self.run_dir = Path(run_dir)
        if not self.run_dir.is_dir():
            raise FileNotFoundError(f"run directory {self.run_dir} does not exist. Fix: pass the directory that holds "
                                    "the run's config.json / metrics.jsonl (runs/<name>-<stamp>-<id>/).")
        self.metrics = JsonlFollower(self.run_dir / "metrics.jsonl")
        self.system = JsonlFollower(self.run_dir / "system.jsonl")
        self.events = JsonlFollower(self.run_dir / "events.jsonl")
        self.total_steps = None

    def _config(self) -> None:
        if self.total_steps is not None:
            return
        self.total_steps = read_json(self.run_dir / "config.json").get("steps")

    def poll(self, model: DashboardModel) -> dict:
        self._config()
        model.total_steps = self.total_steps or model.total_steps
        model.add_metrics(self._metric_rows(self.metrics.read_new()))
        samples = self.system.read_new()
        model.add_events(self.events.read_new())
        st = run_dir_state(self.run_dir, step=model.last_step, total=model.total_steps)
        if samples and (st.phase not in ENDED_PHASES or model.last_system is None):
            for sample in samples[-model.system_history.max_points:]:  # every sample: the history strips
                model.add_system(sample)  # once the run has ended, its last readings stay (no live CPU %)
        model.warning = warning_from_events(self.run_dir) or model.warning
        if self.metrics.bad_lines:
            model.warning = (f"{self.metrics.bad_lines} line(s) of {self.metrics.path.name} skipped (torn, not a "
                             f"JSON object, or no integer step <= {self.total_steps})") + \
                (f"; {model.warning}" if model.warning else "")
        return {"phase": st.phase, "phase_detail": st.detail, "error": st.error}

    def _metric_rows(self, rows: list[dict]) -> list[dict]:
        """Rows the curves can place: an integer step in 1..steps (a garbage or stray row is counted, not drawn)."""
        keep = []
        for r in rows:
            step = r.get("step")
            ok = isinstance(step, int) and not isinstance(step, bool) and step >= 1
            if ok and self.total_steps and step > self.total_steps:
                ok = False
            if ok:
                keep.append(r)
            else:
                self.metrics.bad_lines += 1
        return keep

    def request_stop(self) -> Path:
        """Cooperative stop of the remote run: the trainer checks for <run_dir>/STOP at step boundaries."""
        p = self.run_dir / "STOP"
        p.write_text(f"requested from a dashboard at {time.strftime('%Y-%m-%d %H:%M:%S')} by pid {os.getpid()}\n")
        return p
