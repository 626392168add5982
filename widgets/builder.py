"""Build a Trainer in a background thread so a dashboard can show the load (phase, each target replica's progress).

Loading a 30B target takes minutes; a dashboard made after `Trainer(config)` returns would never show it. The
builder keeps a reference to the Trainer while its `__init__` runs (object created first, then initialised), so
the dashboard reads the phase the Trainer sets as it goes ("loading data", "loading targets", ...); per-replica
progress comes from the loader's progress callback when the Trainer accepts one (`progress=`), or from a
`load_progress` attribute. No ipywidgets here.
"""

from __future__ import annotations

import inspect
import threading
import time


class TrainerBuilder:
    def __init__(self, config, *, trainer_cls=None, **trainer_kwargs):
        if trainer_cls is None:
            from dflash_lab.train.trainer import Trainer as trainer_cls
        self.config, self.trainer_cls, self.kwargs = config, trainer_cls, trainer_kwargs
        self.partial = None  # the Trainer while its __init__ runs
        self.trainer = None  # the Trainer once built
        self.error: str | None = None
        self.exception: BaseException | None = None
        self.progress: dict[int, object] = {}  # replica -> latest progress report
        self.seconds: float | None = None
        self._thread: threading.Thread | None = None
        self._done = threading.Event()
        try:
            self._accepts_progress = "progress" in inspect.signature(trainer_cls.__init__).parameters
        except (TypeError, ValueError):
            self._accepts_progress = False

    def _on_progress(self, p) -> None:
        key = getattr(p, "replica", None)
        self.progress[key if key is not None else len(self.progress)] = p

    def run(self) -> object:
        """Build in this thread; returns the Trainer (raises what the Trainer raised)."""
        t0 = time.perf_counter()
        try:
            kwargs = dict(self.kwargs)
            if self._accepts_progress and "progress" not in kwargs:
                kwargs["progress"] = self._on_progress
            obj = self.trainer_cls.__new__(self.trainer_cls)
            self.partial = obj
            obj.__init__(self.config, **kwargs)
            self.trainer = obj
            return obj
        except BaseException as e:  # noqa: BLE001 - recorded for the dashboard, re-raised to the caller
            self.exception = e
            self.error = f"building the Trainer failed: {type(e).__name__}: {e}"
            raise
        finally:
            self.seconds = time.perf_counter() - t0
            self._done.set()

    def start(self) -> "TrainerBuilder":
        def body():
            try:
                self.run()
            except BaseException:  # noqa: BLE001 - kept in self.error / self.exception
                pass

        self._thread = threading.Thread(target=body, name="dflash-build-trainer", daemon=True)
        self._thread.start()
        return self

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float | None = None):
        """Block until built; returns the Trainer or re-raises the build error."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"the Trainer is still loading after {timeout} s (phase: {self.phase()})")
        if self.exception is not None:
            raise self.exception
        return self.trainer

    def phase(self) -> str:
        if self.error:
            return "failed"
        obj = self.trainer or self.partial
        return str(getattr(obj, "phase", "starting")) if obj is not None else "starting"

    def replica_progress(self):
        if self.progress:
            return [self.progress[k] for k in sorted(self.progress, key=lambda k: (k is None, k))]
        obj = self.trainer or self.partial
        return getattr(obj, "load_progress", None) if obj is not None else None
