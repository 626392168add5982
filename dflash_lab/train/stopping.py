"""A run's wall-time budget and how the next job continues it: checked at step boundaries, named in the stop.

A lent GPU runs one job for ten minutes; a 100,000-step run does not fit. With `time_budget_s` the loop stops at
the first step boundary after the budget is spent, writes a checkpoint and says the command that continues it
(`resume_from` is exact: checkpoint.py, resume.py), so a long run is a chain of jobs on the same machine. The clock
starts when the trainer is built, so target loading counts: the budget is the job's, not only the loop's. One check
is one monotonic clock read (well under a microsecond), cheap enough for every step.
"""

from __future__ import annotations

import shlex
import time
from pathlib import Path

from dflash_lab.runs.checkpoint import checkpoint_step, latest_checkpoint
from dflash_lab.runs.rundir import find_papermill_output

STOPPED_EVENT = "stopped"  # events.jsonl: {"step", "reason", "checkpoint", "resumable"}; runs list reads it
BUDGET_REASON = "time budget"


def now() -> float:
    """The budget's clock (monotonic seconds), read here only so one clock starts and checks a budget."""
    return time.monotonic()


class TimeBudget:
    """`seconds` of wall time from `started` (a time.monotonic() reading); None never runs out.

    `reserve_s`: the budget's last seconds, kept for what the same job does after a FINISHED run (the recipe's
    evaluation in a lent GPU's call): the budget is spent that much earlier, unless `release` finds that the run
    cannot finish before the whole budget ends at its measured speed. Then nothing after training runs in this job
    anyway (a stopped run is not evaluated), and the reserve goes to training instead of being left unused."""

    def __init__(self, seconds: float | None, started: float | None = None, reserve_s: float = 0.0):
        self.seconds = seconds
        self.started = now() if started is None else started
        self.reserve_s = reserve_s
        self.released = False

    def elapsed(self) -> float:
        return now() - self.started

    def spent(self) -> bool:
        held = 0.0 if self.released else self.reserve_s
        return self.seconds is not None and self.elapsed() >= self.seconds - held

    def release(self, finish_s: float | None) -> bool:
        """At the point where the budget less its reserve is spent: give the reserve to training (True) when the run
        needs `finish_s` seconds to finish (None: not measured yet, kept), more than the whole budget has left."""
        if self.released or self.seconds is None or not self.reserve_s or finish_s is None:
            return False
        if self.elapsed() >= self.seconds or finish_s <= self.seconds - self.elapsed():
            return False
        self.released = True
        return True

    def describe(self) -> str:
        if self.reserve_s and not self.released:
            return (f"time budget of {self.seconds - self.reserve_s:g} s ({self.seconds:g} s less the "
                    f"{self.reserve_s:g} s kept for after training) spent after {self.elapsed():.0f} s")
        return f"time budget of {self.seconds:g} s spent after {self.elapsed():.0f} s"


def resume_hint(run_dir: str | Path, *, torchrun: bool = False) -> str:
    """How to continue a stopped run from where this process runs: the papermill flag under papermill, the CLI flag
    for `python -m dflash_lab.train`, the TrainConfig field otherwise (a notebook kernel, a script)."""
    run_dir = str(run_dir)
    if torchrun:
        return (f"continue with: python -m dflash_lab.train --config {shlex.quote(run_dir + '/config.json')} "
                f"--resume {shlex.quote(run_dir)}")
    if find_papermill_output() is not None:
        return f"continue with: papermill notebooks/train.ipynb OUT.ipynb -p resume_from {shlex.quote(run_dir)}"
    return f"continue with resume_from={run_dir!r} (papermill: -p resume_from {shlex.quote(run_dir)})"


def stop_reason(trainer) -> str | None:
    """Why the Trainer's loop should stop before its next step, or None: a stop request (dashboard, STOP file), both
    consumed so a resume does not stop again, or the time budget. Read at step boundaries only."""
    source = trainer.controls.consume_stop(trainer.run_dir)
    if source is not None:
        trainer._event("stop_requested", step=trainer.step_count, source=source)
        if source != "controls.stop":
            trainer.log(f"STOP file found at step {trainer.step_count}: checkpointing and stopping")
        return "STOP file" if source != "controls.stop" else "stop button"
    budget = trainer.budget
    if budget.spent():
        finish_s = trainer.seconds_to_finish()
        if budget.release(finish_s):
            left = budget.seconds - budget.elapsed()
            trainer.log(f"time budget: {left:.0f} s left with the {budget.reserve_s:.0f} s kept for after training, "
                        f"and the {trainer.config.steps - trainer.step_count} steps left need ~{finish_s:.0f} s at "
                        "this speed: the run cannot finish in this job, so it trains on")
            trainer._event("budget_reserve_released", step=trainer.step_count, reserve_s=budget.reserve_s,
                           finish_s=round(finish_s, 1))
            return None
        trainer.log(f"{budget.describe()} at step {trainer.step_count}: checkpointing and stopping")
        return BUDGET_REASON
    return None


def end_stopped(trainer, reason: str) -> Path | None:
    """The loop stopped before its target: the last step logged, a checkpoint, a `stopped` event, the next command."""
    trainer.phase = "stopped"
    trainer._log_last_step()
    saved = trainer._checkpoint_or_warn("stop") if trainer.run_dir else None
    # a stop checkpoint that could not be written (a full disk) leaves the earlier ones intact (checkpoint.py writes
    # atomically): the run continues from the newest, training the steps after it again, instead of counting as
    # not resumable and being started over
    kept = saved or (latest_checkpoint(trainer.run_dir) if trainer.run_dir else None)
    trainer._event(STOPPED_EVENT, step=trainer.step_count, reason=reason, checkpoint=str(kept) if kept else None,
                   resumable=kept is not None)
    if saved:
        said = f"; checkpoint {saved}"
    elif kept:
        said = (f"; its checkpoint could not be written, so the run continues from step {checkpoint_step(kept)} "
                f"({kept}, intact)")
    elif trainer.run_dir:
        said = "; no checkpoint could be written, so the run cannot be continued"
    else:
        said = ""  # a Trainer without a run directory keeps nothing to continue from
    trainer.log(f"stopped at step {trainer.step_count} ({reason}){said}"
                + (f"; {resume_hint(trainer.run_dir)}" if kept else ""))
    return saved


def end_interrupted(trainer) -> Path | None:
    """An interrupt (Ctrl-C, a kernel interrupt) ended the loop: the step in flight is booked, then a checkpoint."""
    trainer.phase = "interrupted"
    trainer._settle()
    trainer._log_last_step()
    saved = trainer._checkpoint_or_warn("interrupt") if trainer.run_dir else None
    trainer._event("interrupted", step=trainer.step_count, checkpoint=str(saved) if saved else None)
    trainer.log(f"interrupted at step {trainer.step_count}" + (f"; checkpoint {saved}" if saved else "") + "; "
                + after_interrupt(trainer.run_dir if saved else None, "the trainer is usable: call train() to continue"))
    return saved


def after_interrupt(run_dir, interactive: str) -> str:
    """What to do after an interrupt: in a live kernel the trainer goes on (`interactive`); under papermill the
    kernel ends with the cell, so the next job resumes from the run dir."""
    if find_papermill_output() is None:
        return interactive
    return resume_hint(run_dir) if run_dir else "the run has no checkpoint to continue from"
