"""How a run is steered from outside its loop: pause / stop / checkpoint events (a dashboard), the STOP file, and
the count of loops in progress. The training loop reads them at step boundaries only."""

from __future__ import annotations

import os
import threading
from pathlib import Path

STOP_FILE = "STOP"


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
    """Events a dashboard or a STOP file sets; the training loop reads them at step boundaries only."""

    def __init__(self):
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

    def add_paused_steps(self, n: int) -> None:
        with self._lock:
            self.paused_steps += n

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
