"""How a run is steered from outside its loop: pause / stop / checkpoint events (a dashboard), the STOP file, and
the count of loops in progress. The training loop reads them at step boundaries only.

Every manual control is a `control` event in events.jsonl (`action`: run, pause, resume, step_n, set_lr, stop,
checkpoint; with the step it was given at), and the loop adds an `lr_override` event at the first step that used a
new learning rate, so `lr_history(run_dir)` rebuilds the learning rate of every step from config.json and events.jsonl
alone: a run steered by hand can still be told apart from its schedule afterwards.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

from dflash_lab.config import TrainConfig
from dflash_lab.runs import rundir
from .schedule import LRSchedule

STOP_FILE = "STOP"
CONTROL_EVENT = "control"
LR_OVERRIDE_EVENT = "lr_override"  # {"step": first step (1-based, as in metrics.jsonl) with this lr, "lr": value}


def counted_loop(fn):
    """Counts step()/train() calls in progress in `trainer.loops_running` (a dashboard's Run button checks it so it
    never starts a second loop on a trainer that a busy cell or thread is driving)."""

    def wrapper(self, *args, **kwargs):
        self.loops_running += 1
        try:
            return fn(self, *args, **kwargs)
        finally:
            self.loops_running -= 1

    wrapper.__name__, wrapper.__doc__, wrapper.__wrapped__ = fn.__name__, fn.__doc__, fn
    return wrapper


class Controls:
    """Events a dashboard or a STOP file sets; the training loop reads them at step boundaries only.

    `record(action, **fields)` (the Trainer's: a `control` event with the step) is called by every `request_*` /
    `set_lr` / `add_paused_steps` method, so a dashboard that uses them leaves a trace of each click."""

    def __init__(self, record=None):
        self.record = record or (lambda action, **fields: None)
        self.pause = threading.Event()
        self.stop = threading.Event()
        self.checkpoint = threading.Event()
        self.new_lr: float | None = None
        # -- dashboard semantics --
        # Stop ends the run: later step()/train() calls from cells (Run All) return at once until a Run / Step N
        # button (or `controls.stopped.clear()`) says to go on.
        self.stopped = threading.Event()
        self.paused_steps = 0  # Step N while paused: the paused loop takes this many steps, then stays paused
        self._lock = threading.Lock()

    # -- the manual controls (each one recorded) -------------------------------------------------------------------
    def request_pause(self) -> None:
        self.pause.set()
        self.record("pause")

    def request_resume(self) -> None:
        self.pause.clear()
        self.record("resume")

    def request_stop(self) -> None:
        self.stop.set()
        self.record("stop")

    def request_checkpoint(self) -> None:
        self.checkpoint.set()
        self.record("checkpoint")

    def set_lr(self, lr: float) -> None:
        """Override the schedule from the next step on (the loop records the step that first uses it)."""
        previous, self.new_lr = self.new_lr, float(lr)
        self.record("set_lr", lr=self.new_lr, previous_override=previous)

    def note_run(self, to_step: int) -> None:
        """Run (or Step N) from idle or after Stop: the run goes on, so it is no longer stopped."""
        self.stop.clear()
        self.stopped.clear()
        self.pause.clear()
        self.record("run", to_step=to_step)

    def add_paused_steps(self, n: int) -> None:
        with self._lock:
            self.paused_steps += n
        self.record("step_n", n=n, while_paused=True)

    def take_paused_step(self) -> bool:
        with self._lock:
            if self.paused_steps > 0:
                self.paused_steps -= 1
                return True
            return False

    def consume_stop(self, run_dir: Path | None) -> str | None:
        """The source of a stop request ("controls.stop" or the STOP file's path), consumed so that a resume does not
        stop again, or None. Sets `stopped`. One stat per step: microseconds."""
        if self.stop.is_set():
            self.stop.clear()
            self.stopped.set()
            return "controls.stop"
        stop = run_dir / STOP_FILE if run_dir else None
        if stop is not None and stop.exists():
            try:
                os.replace(stop, run_dir / "STOP.done")
            except OSError:
                pass
            self.stopped.set()
            return str(stop)
        return None


def lr_history(run_dir: str | Path) -> dict[int, float]:
    """step (1-based, as in metrics.jsonl) -> the learning rate that step used, for every step up to the last one
    logged: the schedule of config.json, replaced from each `lr_override` event on by its value. (A resume that
    changed `steps` or `lr` rewrote config.json: the steps before it are then rebuilt with the new plan.)"""
    run_dir = Path(run_dir)
    schedule = LRSchedule.of(TrainConfig.from_dict(json.loads((run_dir / rundir.CONFIG_FILE).read_text())))
    overrides = sorted((e["step"], e["lr"]) for e in rundir.read_jsonl(run_dir / rundir.EVENTS_FILE)
                       if e.get("event") == LR_OVERRIDE_EVENT)
    last = max((r["step"] for r in rundir.read_jsonl(run_dir / rundir.METRICS_FILE) if "step" in r), default=0)
    out, k, lr = {}, 0, None
    for step in range(1, last + 1):
        while k < len(overrides) and overrides[k][0] <= step:
            lr, k = overrides[k][1], k + 1
        out[step] = lr if lr is not None else schedule.lr(step - 1)
    return out
