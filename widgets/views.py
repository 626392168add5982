"""`TrainingView(trainer)` and `AttachedView(run_dir)`: the live dashboard when a person watches, static PNGs when not.

    view = TrainingView(trainer)                       # display it: live widgets, or a static plot under papermill
    trainer.train(callbacks=[view.callback])            # callback: heartbeat (live) / throttled in-place PNG (static)
    view.refresh()                                      # final update (static: the plot the saved notebook keeps)

Static mode shows ONE output, `display(png, display_id=True)`, rewritten in place with `handle.update(...)` from the
main thread (the training loop's callback), at most every `static_every_s` (5 s) and never more than ~2% of the wall
time; nbclient rewrites that output in the notebook, papermill autosaves it, and the saved notebook holds a plain
image/png (no widget state), which GitHub renders.
"""

from __future__ import annotations

import base64
import threading
import time
from pathlib import Path

from dflash_lab.runs.gpu_monitor import GpuMonitor

from .controls import TrainingControls
from .env import dashboard_mode
from .model import DashboardModel, DashboardState
from .sources import RunDirSource, TrainerSource


class StaticDisplay:
    """One image output updated in place (display_id), throttled."""

    def __init__(self, source, model: DashboardModel, every_s: float = 5.0, max_share: float = 0.02):
        self.source, self.model = source, model
        self.every_s, self.max_share = every_s, max_share
        self.handle = None
        self.last_time = 0.0
        self.render_s = 0.0
        self.updates = 0
        self.state: DashboardState | None = None

    def _bundle(self) -> dict:
        """The PNG and, as its text form, the summary line: what `papermill --log-output` prints for this output
        (an IPython Image printed `<IPython.core.display.Image object>`)."""
        from .static import render_png

        kwargs = self.source.poll(self.model)
        self.state = self.model.state(**kwargs)
        t0 = time.perf_counter()
        png = base64.b64encode(render_png(self.state)).decode("ascii")  # as IPython's own PNG formatter sends it
        bundle = {"image/png": png, "text/plain": self.state.summary_line()}
        self.render_s = time.perf_counter() - t0
        return bundle

    def show(self) -> None:
        from IPython.display import display

        self.handle = display(self._bundle(), raw=True, display_id=True)
        self.last_time = time.monotonic()
        self.updates += 1

    def maybe_update(self, force: bool = False) -> bool:
        now = time.monotonic()
        # At most one render per every_s, and renders take at most max_share of wall time.
        interval = max(self.every_s, self.render_s / self.max_share)
        if not force and now - self.last_time < interval:
            return False
        if self.handle is None:
            self.show()
            return True
        self.handle.update(self._bundle(), raw=True)
        self.last_time = now
        self.updates += 1
        return True


class _View:
    mode: str
    why: str

    def __init__(self, source, model: DashboardModel, *, mode: str | None, refresh_hz: float, static_every_s: float,
                 buttons: dict | None, title: str, lr: float = 3e-4):
        if mode is None:
            mode, why = dashboard_mode()
        else:
            if mode not in ("live", "static"):
                raise ValueError(f"mode={mode!r}: use 'live', 'static' or None (detect).")
            why = "chosen by the caller"
        self.mode, self.why = mode, why
        self.source, self.model = source, model
        self.live = self.static = None
        if mode == "live":
            from .dashboard import LiveDashboard

            self.live = LiveDashboard(source, model, buttons=buttons, refresh_hz=refresh_hz, title=title, lr=lr)
        else:
            self.static = StaticDisplay(source, model, every_s=static_every_s)

    def _ipython_display_(self) -> None:
        if self.live is not None:
            from IPython.display import display

            self.live.refresh()
            display(self.live.box)
            self.live.start()
        else:
            self.static.show()

    def refresh(self) -> None:
        """Update now (static: rewrite the image in place; live: push one refresh). `.state()` gives the numbers."""
        if self.live is not None:
            self.live.refresh()
        else:
            self.static.maybe_update(force=True)

    def state(self) -> DashboardState:
        """The current DashboardState (polls the source; no display)."""
        return self.model.state(**self.source.poll(self.model))

    def close(self) -> None:
        if self.live is not None:
            self.live.stop()


class TrainingView(_View):
    """Dashboard of a Trainer in this kernel, with controls (live) or an in-place static plot (headless).

    `TrainingView(trainer)` watches a built Trainer. `TrainingView(config)` builds the Trainer itself so the
    dashboard shows the load (phase, each target replica's progress): in a background thread when live (get it
    with `view.wait_trainer()`), in this thread when static. Uses the trainer's GpuMonitor (`trainer.monitor`,
    started on GPU runs) or starts one (system.jsonl in the run dir).
    """

    def __init__(self, trainer_or_config, *, mode: str | None = None, monitor: GpuMonitor | bool = True,
                 monitor_interval_s: float = 0.5, refresh_hz: float = 2.0, static_every_s: float = 5.0,
                 max_points: int = 600, **trainer_kwargs):
        from dflash_lab.config import TrainConfig

        self.builder = None
        self._attached = threading.Event()
        trainer = trainer_or_config
        if isinstance(trainer_or_config, TrainConfig):
            from .builder import TrainerBuilder

            self.builder, trainer = TrainerBuilder(trainer_or_config, **trainer_kwargs), None
        elif trainer_kwargs:
            raise TypeError(f"TrainingView(trainer, {', '.join(trainer_kwargs)}=...): Trainer arguments only go with "
                            "a TrainConfig (TrainingView(config, run_dir=...)).")
        cfg = trainer_or_config if self.builder else getattr(trainer, "config", None)
        self._own_monitor = None
        self.monitor = None if trainer is None else self._trainer_monitor(trainer)
        if self.monitor is None and monitor:
            self.monitor = monitor if isinstance(monitor, GpuMonitor) else GpuMonitor(interval_s=monitor_interval_s)
            if not self.monitor.running:
                self.monitor.start()
            self._own_monitor = self.monitor
        self.controls = TrainingControls(trainer, builder=self.builder)
        model = DashboardModel(max_points, total_steps=getattr(cfg, "steps", None))
        if cfg is not None and getattr(cfg, "target_devices", None):  # split placement: who could give a GPU
            model.placement = (len(set(cfg.target_devices)), len(cfg.devices))
        c = self.controls
        buttons = {"run": c.run, "pause": c.pause, "stop": c.stop, "checkpoint": c.checkpoint,
                   "step_n": c.step_n, "set_lr": c.set_lr}
        self.source = TrainerSource(trainer, self.monitor, self.controls, builder=self.builder)
        super().__init__(self.source, model, mode=mode, refresh_hz=refresh_hz, static_every_s=static_every_s,
                         buttons=buttons, title="dflash-lab", lr=getattr(cfg, "lr", 3e-4))
        if trainer is not None:
            self._attach(trainer)
        elif self.mode == "live":
            threading.Thread(target=self._build, name="dflash-view-build", daemon=True).start()
        else:
            self._build(raise_errors=True)

    def _build(self, raise_errors: bool = False) -> None:
        try:
            self.builder.run()
        except BaseException:  # noqa: BLE001 - live: shown on the dashboard; wait_trainer() re-raises it
            if raise_errors:
                raise
            return
        self._attach(self.builder.trainer)

    def _attach(self, trainer) -> None:
        """The Trainer exists: prefer its monitor, send ours to <run_dir>/system.jsonl."""
        theirs = self._trainer_monitor(trainer)
        if theirs is not None and theirs is not self.monitor:
            if self._own_monitor is not None:
                self._own_monitor.stop()
                self._own_monitor = None
            self.monitor = self.source.monitor = theirs
        run = getattr(trainer, "run_dir", None)
        if self._own_monitor is not None and run is not None:
            self._own_monitor.log_to(Path(run) / "system.jsonl")
        if self.live is not None and run is not None:
            self.live.set_title(f"dflash-lab &middot; {Path(run).name}")
        self._attached.set()

    @staticmethod
    def _trainer_monitor(trainer) -> GpuMonitor | None:
        m = getattr(trainer, "monitor", None) or getattr(trainer, "gpu_monitor", None)
        if isinstance(m, GpuMonitor):
            return m if m.running else m.start()
        return None

    @property
    def trainer(self):
        return self.controls.trainer

    def wait_trainer(self, timeout: float | None = None):
        """The Trainer (blocks while it loads; the dashboard keeps updating). Re-raises a build error."""
        if self.builder is None:
            return self.controls.trainer
        trainer = self.builder.wait(timeout)
        self._attached.wait(5.0)  # _attach runs on the builder thread right after the build
        return trainer

    def callback(self, trainer=None, *args, **kwargs) -> None:
        """Call after every step from the training loop (main thread): `trainer.train(callbacks=[view.callback])`.

        Live: a heartbeat (the Run / Step N buttons then know a loop is running). Static: rewrites the plot in
        place at most every 5 s, and at once on the configured last step.
        """
        self.controls.heartbeat()
        if self.static is not None:
            t = self.controls.trainer or trainer
            target = self.controls.target_steps or getattr(t.config, "steps", None)
            self.static.maybe_update(force=target is not None and t.step_count >= target)

    def close(self) -> None:
        super().close()
        if self._own_monitor is not None:
            self._own_monitor.stop()


class AttachedView(_View):
    """Follow a run directory written by another process (papermill / torchrun job) live: metrics.jsonl and
    system.jsonl. The only control is Stop, which writes <run_dir>/STOP (the trainer stops cooperatively)."""

    def __init__(self, run_dir: str | Path, *, mode: str | None = None, refresh_hz: float = 1.0,
                 static_every_s: float = 5.0, max_points: int = 600):
        source = RunDirSource(run_dir)
        self.run_dir = source.run_dir

        def stop():
            p = source.request_stop()
            return f"wrote {p}: the run stops after its next step"

        super().__init__(source, DashboardModel(max_points), mode=mode, refresh_hz=refresh_hz,
                         static_every_s=static_every_s, buttons={"stop": stop},
                         title=f"attached to {self.run_dir}")
