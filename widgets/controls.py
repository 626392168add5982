"""What the dashboard's buttons do to a Trainer: set its control events, or run steps in a background thread.

A button callback must return at once: on JupyterLab >= 4.4 with ipykernel >= 7 it runs on a kernel subshell while
the training cell is busy, and the training loop reads `trainer.controls` (threading.Events `pause`, `stop`,
`checkpoint`, and `new_lr`) at step boundaries. "Run" and "Step N" start `trainer.train()` / `trainer.step(n)` in a
background thread only when no loop is running (`trainer.loops_running`: a busy cell's `trainer.train()` counts),
so two loops never drive one trainer. No ipywidgets here.

What each button means, in every state:
- Run: resumes a paused loop, or trains to the target in a background thread (after Stop too: it clears the stop).
- Pause: the loop waits at the next step boundary.
- Stop: the loop checkpoints and ends; the run stays stopped, so later cells (Run All) skip their step()/train()
  calls instead of training on without a checkpoint, until Run or Step N.
- Checkpoint now: written at the next step boundary while training, at once while paused (the paused loop writes
  it) or idle (a background thread writes it).
- Step N: while paused, the paused loop takes N steps and stays paused; idle or stopped, a background thread takes N.
"""

from __future__ import annotations

import math
import threading
import time


class TrainingControls:
    def __init__(self, trainer=None, builder=None):
        self._trainer, self.builder = trainer, builder
        self.thread: threading.Thread | None = None
        self.error: str | None = None
        self.message = ""
        self.target_steps: int | None = None
        self._heartbeat = 0.0
        self._checkpoint_step: int | None = None
        self._saving = False  # a background "Checkpoint now" save is running
        self._pending = None  # "pause" | "stop" | ("step_n", until): a request whose message says "requested"

    @property
    def trainer(self):
        return self._trainer if self._trainer is not None else (self.builder.trainer if self.builder else None)

    def _not_ready(self) -> str | None:
        if self.trainer is not None:
            return None
        if self.builder is not None and self.builder.error:
            return self._say(f"no trainer: {self.builder.error}")
        return self._say("the trainer is still loading; try again when the phase says ready")

    # -- state ----------------------------------------------------------------------------------------------------
    def heartbeat(self) -> None:
        """Called after every step by a loop this object did not start (the view's callback)."""
        self._heartbeat = time.monotonic()
        self.check_checkpoint()

    def check_checkpoint(self) -> None:
        """Once a requested checkpoint is written, say where (the refresh thread calls this: paused loops take no steps)."""
        t = self.trainer
        if t is not None and self._checkpoint_step is not None and not t.controls.checkpoint.is_set():
            if self.thread is not None and self.thread.is_alive() and self._saving:
                return  # the background save is still writing
            at = getattr(t, "last_checkpoint_step", None)
            where = getattr(t, "last_checkpoint", None)
            self.message = (f"checkpoint written at step {at if at is not None else t.step_count}"
                            + (f": {where}" if where else ""))
            self._checkpoint_step = None

    def settle_message(self) -> None:
        """Replace a "requested" / "stepping" message by what happened, once it has (the refresh thread calls this):
        a message must never describe a state the run has left."""
        t, pending = self.trainer, self._pending
        if t is None or pending is None:
            return
        phase = getattr(t, "phase", "")
        if pending == "pause" and phase == "paused":
            self._say(f"paused at step {t.step_count}")
        elif pending == "stop" and not self.loop_active():
            self._say(f"stopped at step {t.step_count}")
        elif isinstance(pending, tuple) and ((t.step_count >= pending[1] and phase == "paused")
                                             or not self.loop_active()):
            self._say(f"took the steps; paused at step {t.step_count}" if phase == "paused"
                      else f"at step {t.step_count}")
        else:
            return
        self._pending = None

    def loop_active(self) -> bool:
        """Is something driving the trainer (our thread, a busy cell's train()/step(), a paused loop)?"""
        if self.trainer is None:
            return False
        if self.thread is not None and self.thread.is_alive():
            return True
        running = getattr(self.trainer, "loops_running", None)
        if running is not None:  # the Trainer counts step()/train() calls in progress
            return running > 0
        phase = getattr(self.trainer, "phase", "")  # older Trainers: infer from the phase and recent steps
        if phase == "paused":
            return True
        if phase == "training":
            last = getattr(self.trainer, "last_metrics", None) or {}
            grace = max(5.0, 5 * float(last.get("step_time_s") or 0.0))
            return time.monotonic() - self._heartbeat < grace
        return False

    # -- buttons --------------------------------------------------------------------------------------------------
    def run(self, steps: int | None = None) -> str:
        """Resume a paused loop, or start trainer.train(steps) in a background thread."""
        if (msg := self._not_ready()) is not None:
            return msg
        c = self.trainer.controls
        if self.loop_active():
            if c.pause.is_set():
                c.request_resume()
                self._pending = None
                return self._say("resumed")
            return self._say("already training")
        target = steps if steps is not None else self.trainer.config.steps
        if self.trainer.step_count >= target:
            return self._say(f"already at step {self.trainer.step_count} >= {target}; use Step N to go further")
        c.note_run(target)  # Run after Stop: the person wants the run to go on
        self.target_steps = target
        return self._start(lambda: self.trainer.train(target), f"training to step {target}")

    def pause(self) -> str:
        if (msg := self._not_ready()) is not None:
            return msg
        self.trainer.controls.request_pause()
        self._pending = "pause"
        return self._say(f"pause requested at step {self.trainer.step_count}")

    def stop(self) -> str:
        if (msg := self._not_ready()) is not None:
            return msg
        self.trainer.controls.request_stop()
        self._pending = "stop"
        return self._say(f"stop requested at step {self.trainer.step_count}")

    def checkpoint(self) -> str:
        if (msg := self._not_ready()) is not None:
            return msg
        t = self.trainer
        self._checkpoint_step = t.step_count
        if self.loop_active():
            t.controls.request_checkpoint()
            # paused and idle: the paused loop writes it now; paused but taking Step N's steps: after the step;
            # pause clicked but not reached yet (still training): at the step boundary where it pauses
            paused = t.controls.pause.is_set()
            when = ("at the next step boundary (the loop is taking Step N's steps)" if paused and
                    t.controls.paused_steps > 0 else
                    "now (the loop is paused)" if paused and getattr(t, "phase", "") == "paused" else
                    "at the next step boundary")
            return self._say(f"checkpoint requested at step {t.step_count} (written {when})")
        self._saving = True  # no loop: write it from a background thread (the button must return at once)
        t.controls.record("checkpoint")

        def save():
            try:
                t.save_checkpoint("requested")
            finally:
                self._saving = False

        return self._start(save, f"writing a checkpoint at step {t.step_count}")

    def set_lr(self, lr: float) -> str:
        if (msg := self._not_ready()) is not None:
            return msg
        if not isinstance(lr, (int, float)) or not math.isfinite(lr) or lr <= 0:
            return self._say(f"learning rate {lr!r} ignored: give a positive finite number, e.g. 3e-4")
        self.trainer.controls.set_lr(float(lr))
        return self._say(f"learning rate set to {lr:.3g} from the next step (overrides the schedule)")

    def step_n(self, n: int) -> str:
        if (msg := self._not_ready()) is not None:
            return msg
        if not isinstance(n, int) or n < 1:
            return self._say(f"Step N: N={n!r} must be an integer >= 1")
        c = self.trainer.controls
        if self.loop_active():
            if not c.pause.is_set():
                return self._say("a training loop is running: pause it first, then Step N steps it")
            c.add_paused_steps(n)  # the paused loop takes them, then stays paused
            self._pending = ("step_n", self.trainer.step_count + n)
            return self._say(f"stepping {n} while paused (from step {self.trainer.step_count})")
        c.note_run(self.trainer.step_count + n)  # Step N after Stop: the person asked for these steps
        c.record("step_n", n=n, while_paused=False)
        self.target_steps = max(self.target_steps or 0, self.trainer.step_count + n)
        return self._start(lambda: self.trainer.step(n), f"stepping {n}")

    # -- internals ------------------------------------------------------------------------------------------------
    def _say(self, msg: str) -> str:
        self.message = msg
        return msg

    def _start(self, fn, msg: str) -> str:
        self.error = None

        def body():
            try:
                fn()
                self._say(f"done at step {self.trainer.step_count}")
            except BaseException as e:  # noqa: BLE001 - shown on the dashboard as "failed"
                self.error = f"{type(e).__name__}: {e}"
                self._say("")

        self.thread = threading.Thread(target=body, name="dflash-dashboard-train", daemon=True)
        self.thread.start()
        return self._say(msg)

    def join(self, timeout: float | None = None) -> None:
        if self.thread is not None:
            self.thread.join(timeout)
