"""`Trainer`: the facade a notebook drives. Build from a TrainConfig, call `step(n)`, inspect state between calls.

    trainer = Trainer(TrainConfig(target="tiny", steps=200))
    trainer.step(10)          # -> metrics of the last step
    trainer.train()           # run to config.steps, honouring pause / stop events, the STOP file, checkpoints
    trainer.drafter, trainer.last_batch, trainer.history   # inspectable between calls

It wires config -> tokenizer/targets -> data -> drafter replicas -> engine -> metrics/run dir and holds no step
logic of its own (that lives in step.py and engine.py). The loop around the steps lives here: checkpoints every
`checkpoint_every` steps and on stop/finish (checkpoint.py), exact resume (`resume_from`), the STOP file, a NaN/inf
guard, and interrupts: each step runs on a small driver thread while the calling thread waits, so a Ctrl-C / kernel
interrupt lands in the wait, the step in flight completes and is booked, and only then is KeyboardInterrupt raised:
the trainer is never left between "weights updated" and "step counted". With config.overlap_steps the next step
starts on the device before the finished one is booked (step_overlap.py); an interrupt books both.
"""

from __future__ import annotations

import concurrent.futures as cf
import math
import time
from pathlib import Path

from dflash_lab.runs import checkpoint, lock as run_lock, rundir
from . import resume as resume_state, stopping
from dflash_lab.config import TrainConfig
from .controls import CONTROL_EVENT, STOP_FILE, Controls, counted_loop
from dflash_lab.drafter.model import DFlashDrafter
from .engine_build import build_engine
from dflash_lab.runs.gpu_time import TrainClock
from dflash_lab.runs.metrics import MetricsLogger, Throughput
from .prepare import prepare_run
from .progress import device_memory, progress_line
from dflash_lab.runs.run_end import finish_run, refinish_if_stale, save_drafter
from dflash_lab.runs.sinks import with_sinks
from dflash_lab.target.load import load_targets
from .step_overlap import Launched, launch, may_start_next, read_step_values
from .validation import Validator, validate_when_due


class TrainingDiverged(RuntimeError):
    """The loss or gradient norm became NaN/inf; the run stopped and the last good checkpoint was kept."""


def _print_flush(*args) -> None:
    print(*args, flush=True)  # flushed so `papermill --log-output` and `tail -f` show each line as it happens


class Trainer:
    def __init__(self, config: TrainConfig, *, run_dir: str | Path | None = None, write_run_dir: bool = True,
                 log=_print_flush, explicit=None, overwrite_run_dir: bool = False, clock=time.monotonic):
        """`explicit`: on resume, the fields you set (only these override the checkpoint's); None = those that differ
        from TrainConfig's defaults (the notebook passes the parameters you set). `overwrite_run_dir`: empty a
        `run_dir` holding another run first. `clock`: the wall clock of the GPU time on metrics rows (tests feed one)."""
        self.log = log
        built = clock()
        started = stopping.now()  # a time budget counts from here: loading is part of the job
        if write_run_dir and run_dir and config.resume_from is None and not overwrite_run_dir:
            rundir.refuse_used_run_dir(run_dir)  # refused now, not after minutes of loading targets
        self.phase = "loading data"
        # Everything but the weights, shared with torchrun ranks (prepare.py); a resume takes the checkpoint's config
        self.prepared = prep = prepare_run(config, explicit=explicit, log=log)
        self.config = cfg = prep.config
        self.tokenizer, self.drafter_config, self.placement = prep.tokenizer, prep.drafter_config, prep.placement
        self.memory_estimate, self.data, self.sampler = prep.memory_estimate, prep.data, prep.sampler
        self.schedule, self.budget = prep.schedule, stopping.TimeBudget(cfg.time_budget_s, started)
        resume = prep.resume
        self.phase = "loading targets"
        self.load_progress, self._load_logged = {}, {}  # replica -> targets.LoadProgress (widgets read it)
        t0 = time.perf_counter()
        targets = load_targets(cfg.target, self.placement.target_devices, seed=cfg.seed, dtype=prep.dtype,
                               progress=self._on_load_progress)
        self.target_load_seconds = time.perf_counter() - t0
        self.target = targets[0]

        # Identical drafter replicas (seeded init), target replicas and one worker thread per device (engine_build.py).
        self.engine = build_engine(cfg, self.placement, targets, self.drafter_config, target_config=prep.target_config,
                                   log=self.log, draft_vocab=prep.draft_vocab, store_rows=prep.feature_store_rows,
                                   store_host_rows=prep.feature_store_host_rows)
        self.workers, self._prefetched = self.engine.workers, None  # _prefetched: (step, batch) staged ahead

        self.run_dir: Path | None = None
        previous_rows: list[dict] = []
        if write_run_dir:
            self.run_dir, previous_rows = rundir.open_run_dir(
                run_dir, runs_dir=cfg.runs_dir, name=cfg.run_name,
                resume_from=checkpoint.run_dir_of(resume.path) if resume is not None else None,
                resume_step=resume.step if resume is not None else 0, overwrite=overwrite_run_dir)
            rundir.write_json(self.run_dir / rundir.CONFIG_FILE, cfg.to_dict())
            rundir.write_json(self.run_dir / "drafter_config.json", self.drafter_config.to_dict())
            rundir.write_json(self.run_dir / rundir.ENV_FILE, rundir.environment_info())
            rundir.write_json(self.run_dir / "data_report.json", self.data.report)
        self.metrics = MetricsLogger(self.run_dir / rundir.METRICS_FILE if self.run_dir else None)
        self.metrics.sink = with_sinks(self.metrics.sink, cfg.metric_sinks, self.run_dir, config=cfg.to_dict(), log=log)
        for row in previous_rows:
            self.metrics.ring.append(row)
        self.gpu_clock = TrainClock(devices=len(self.placement.devices), previous=previous_rows, clock=clock,
                                    started=built)
        self.throughput = Throughput()
        self.controls = Controls(record=lambda action, **f: self._event(CONTROL_EVENT, action=action,
                                                                         step=self.step_count, **f))
        self._lr_override_logged: float | None = None  # the override value last written as an lr_override event
        self.finished_at: int | None = None  # the step of the last finish(): a later loop finishes again (run_end)
        self.loops_running = 0  # step()/train() calls in progress (see controls.counted_loop)
        self.step_count = 0
        self.last_batch = None
        self.last_metrics: dict | None = previous_rows[-1] if previous_rows else None
        self.last_checkpoint: Path | None = None
        self.last_checkpoint_step: int | None = None
        self.diverged_at: int | None = None
        self.resumed_at: int | None = resume.step if resume is not None else None
        self._recent_losses: list[float] = []
        self._driver = cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix="dflash-step")
        self._inflight: cf.Future | None = None
        self._ahead: Launched | None = None  # a step started on the device, not booked yet (config.overlap_steps)
        self._ahead_until: int | None = None  # the step count the running loop trains to: nothing starts beyond it
        self._logged_step = 0  # last step written to metrics.jsonl
        self.monitor = None
        self.validator: Validator | None = None  # made at the first step; reads the held-out set when first due
        if resume is not None:
            resume_state.restore(self, resume)
            self.last_checkpoint, self.last_checkpoint_step = resume.path, resume.step
            self._event("resumed", step=resume.step, checkpoint=str(resume.path),
                        changed=[list(o) for o in prep.overrides])
        if prep.settings is not None and prep.settings.choices:  # what was chosen for the fields left unset, and why
            self._event("settings", chosen=prep.settings.as_dict())
        if self.run_dir is not None:
            self._start_monitor()
        self.phase = "ready"

    # ----------------------------------------------------------------------------------------------------------
    @property
    def drafter(self) -> DFlashDrafter:
        d = self.workers[0].drafter
        return getattr(d, "_orig_mod", d)

    @property
    def history(self) -> list[dict]:
        return self.metrics.ring.snapshot()

    def current_lr(self, step: int | None = None) -> float:
        """The lr of step index `step` (default: the next one, `step_count`): the dashboard's override or the
        schedule."""
        if self.controls.new_lr is not None:
            return self.controls.new_lr
        return self.schedule.lr(self.step_count if step is None else step)

    @counted_loop
    def step(self, n: int = 1) -> dict:
        """Run n optimizer steps; returns the metrics of the last one.

        Interrupt-safe: a KeyboardInterrupt while a step runs lets that step finish and be counted, then re-raises;
        the trainer stays usable (call step/train again). A NaN/inf loss raises TrainingDiverged.
        """
        if n < 1:
            raise ValueError(f"step(n={n}): n must be >= 1.")
        if self.diverged_at is not None:
            raise TrainingDiverged(self._diverged_message())
        outermost = self.loops_running == 1  # not a step of train()'s loop
        if self.controls.stopped.is_set() and outermost:  # a cell after Stop: the run stays stopped
            self.log(f"step({n}) skipped: this run was stopped at step {self.step_count}; press Run or Step N "
                     "(or call trainer.controls.stopped.clear()) to train further")
            return self.last_metrics
        self.phase = "training"
        if outermost:
            self._ahead_until = self.step_count + n
        try:
            for _ in range(n):
                self._inflight = self._driver.submit(self._one_step)
                self._wait(self._inflight)
        finally:
            if outermost:
                self._ahead_until = None
        if outermost:  # hand steps are over: nothing trains now (no ETA, no "training" on a dashboard)
            self.phase = "finished" if self.step_count >= self.config.steps else "idle"
            refinish_if_stale(self)
        return self.last_metrics

    def _settle(self) -> None:
        """Wait for a step still running on the driver thread (an interrupt can land between submit and wait), then
        book a step started ahead (overlap_steps): afterwards the weights are those of step `step_count`."""
        fut = self._inflight
        if fut is not None and not fut.done():
            cf.wait([fut])
        if self._ahead is not None:
            self._driver.submit(self._one_step, False).result()

    def _wait(self, fut: cf.Future):
        """Wait for the driver thread; an interrupt here waits for the step to finish, then re-raises."""
        interrupted = False
        while True:
            try:
                result = fut.result()
                break
            except KeyboardInterrupt:
                if not interrupted:
                    self.log(f"interrupt: finishing step {self.step_count + 1} so the trainer stays consistent ...")
                interrupted = True
        if interrupted:
            self._settle()  # a step started ahead is booked too: nothing is left running on the device
            self.phase = "interrupted"
            raise KeyboardInterrupt(f"interrupted after step {self.step_count}; the trainer is consistent; "
                                    + stopping.after_interrupt(self.run_dir, "call step() or train() to continue"))
        return result

    def _one_step(self, start_next: bool = True) -> dict:
        """Book one optimizer step, on the driver thread (never split by an interrupt): the step started ahead by the
        previous call if any, else a new one. With config.overlap_steps the following step is started on the device
        before this one's bookkeeping (`start_next`; step_overlap.may_start_next)."""
        launched = self._ahead if self._ahead is not None else launch(self, self.step_count)
        self._ahead = None
        values = read_step_values(launched.out)  # the one host sync of the step
        dt = time.perf_counter() - launched.t0
        ahead_error = None
        if start_next and may_start_next(self, values):
            try:
                self._ahead = launch(self, self.step_count + 1)
            except BaseException as e:  # noqa: BLE001 - book the finished step first, then raise
                ahead_error = e
        record = self._book(launched, values, dt)
        if ahead_error is not None:
            raise ahead_error
        return record

    def _book(self, launched: Launched, values: dict, dt: float) -> dict:
        """The host side of a finished step: throughput, the metrics record, validation when due, logging, the
        divergence check."""
        cfg, batch, loss = self.config, launched.batch, values["loss"]
        self.last_batch = batch
        tokens = batch.input_ids.numel()
        self.throughput.update(dt, tokens)
        self.step_count += 1
        record = {
            "step": self.step_count, "loss": loss, "lr": launched.lr, "grad_norm": values["grad_norm"],
            "acc": values["acc"], "sim_tau": values["sim_tau"], "slot_acc": values["slot_acc"],
            **values.get("terms", {}),  # a variant's own loss terms (DSpark: markov_ce, confidence_acc, ...)
            "step_time_s": dt, "tokens": tokens, "draft_positions": batch.draft_ids.numel(),
            "supervised_tokens": int(batch.loss_mask.sum()),  # real, loss-carrying tokens (padding and prompts out)
            "epoch": self.sampler.position(self.step_count - 1)[0], **self.throughput.as_dict(),
            **self.engine.metrics(tokens_per_s=self.throughput.steady_tps or self.throughput.instant_tps),
            **device_memory(w.device for w in self.workers), **self.gpu_clock.fields(),
        }
        finite = math.isfinite(loss) and math.isfinite(record["grad_norm"])
        if finite and cfg.eval_every and self.step_count % cfg.eval_every == 0:
            from dflash_lab.evaluation.evaluate import heldout_tau  # real speculative decoding, 8 held-out prompts x 64 tokens

            self.phase, record["eval_tau"] = "evaluating", heldout_tau(self)
            self.phase = "training"
        if finite:
            validate_when_due(self, record)  # held-out validation / real tau on their steps (validation.py)
        self.last_metrics = record
        if (not finite or self.step_count % cfg.log_every == 0 or self.step_count == cfg.steps or self.step_count == 1
                or "eval_tau" in record or "val_acc" in record or "real_tau" in record):
            self.metrics.log(record)
            self._logged_step = self.step_count
        else:
            self.metrics.ring.append(record)
        if not finite:  # the optimiser already applied this step: the weights in memory are no longer trustworthy
            self.diverged_at = self.step_count
            self.phase = "diverged"
            self._event("diverged", step=self.step_count, loss=loss, grad_norm=record["grad_norm"],
                        last_good_checkpoint=str(self.last_checkpoint) if self.last_checkpoint else None)
            raise TrainingDiverged(self._diverged_message())
        self._recent_losses = (self._recent_losses + [loss])[-100:]
        return record

    def _diverged_message(self) -> str:
        m = self.last_metrics or {}
        good = (f"the last good checkpoint is {self.last_checkpoint} (step {self.last_checkpoint_step}), kept as is"
                if self.last_checkpoint else "no checkpoint was written before it")
        return (f"training stopped: loss={m.get('loss')} grad_norm={m.get('grad_norm')} at step {self.diverged_at} "
                f"(not finite); {good}. The weights in memory are no longer trustworthy, so this trainer refuses "
                "further steps and checkpoints. Fix: resume_from the last good checkpoint with a lower lr or "
                "grad_clip, or check the data around this step.")

    def _on_load_progress(self, p) -> None:
        """Target loading progress: kept in `load_progress` (widgets) and logged every ~5 s and when a replica is done."""
        self.load_progress[p.replica] = p
        last = self._load_logged.get(p.replica)
        if p.done or last is None or p.seconds - last >= 5.0:
            self._load_logged[p.replica] = p.seconds
            self.log(p.line())

    def seconds_to_finish(self) -> float | None:
        """The steps left to config.steps at the steady step time measured in this job (None while warming up)."""
        t = self.throughput.steady_step_time
        return None if t is None else max(0, self.config.steps - self.step_count) * t

    @counted_loop
    def train(self, steps: int | None = None, *, progress_every_s: float = 10.0, progress_every_steps: int = 0,
              callbacks=()) -> dict | None:
        """Run until `steps` (default config.steps) total steps; returns the last step's metrics.

        Between steps: `callbacks` (each `cb(trainer)`, on this thread), a progress line every `progress_every_s`
        seconds or `progress_every_steps` steps (0 = time only), a checkpoint every config.checkpoint_every steps or
        when `controls.checkpoint` is set, and a stop (after a checkpoint) on `controls.stop` or a `STOP` file in
        the run dir. Reaching config.steps writes a final checkpoint. An interrupt finishes the step in flight,
        writes a checkpoint, and re-raises KeyboardInterrupt with the trainer still usable.
        """
        cfg = self.config
        target = steps if steps is not None else cfg.steps
        if self.diverged_at is not None:
            raise TrainingDiverged(self._diverged_message())
        if self.controls.stopped.is_set():  # a cell after Stop (Run All): the run stays stopped
            self.log(f"train() skipped: this run was stopped at step {self.step_count}; press Run (or call "
                     "trainer.controls.stopped.clear()) to continue")
            return self.last_metrics
        last_print = time.monotonic()
        self.log(f"training from step {self.step_count} to {target}"
                 + (f" | run dir {rundir.shown_path(self.run_dir)}" if self.run_dir else "")
                 + (f" | touch {rundir.shown_path(self.run_dir / STOP_FILE)} to stop after a checkpoint"
                    if self.run_dir else ""))
        self._ahead_until = target  # steps may start ahead of their bookkeeping up to here (overlap_steps)
        try:
            while self.step_count < target:
                if (stop_reason := stopping.stop_reason(self)) is not None:
                    break
                if self.controls.pause.is_set() and not self.controls.take_paused_step():
                    self._settle()  # paused with the weights of a booked step, nothing running
                    if self.phase != "paused":  # where the loop stopped stepping: the dashboard's pause marker
                        self._event("paused", step=self.step_count)
                    self.phase = "paused"
                    if self.run_dir and self.controls.checkpoint.is_set():  # "Checkpoint now" acts while paused
                        self._checkpoint_or_warn("requested")
                        self.controls.checkpoint.clear()
                    time.sleep(0.05)
                    continue
                self.step(1)
                if self.run_dir and (self.controls.checkpoint.is_set() or (
                        cfg.checkpoint_every and self.step_count % cfg.checkpoint_every == 0)):
                    self._checkpoint_or_warn("requested" if self.controls.checkpoint.is_set() else "periodic")
                    self.controls.checkpoint.clear()
                for cb in callbacks:
                    cb(self)
                now = time.monotonic()
                if (now - last_print >= progress_every_s or self.step_count == target
                        or (progress_every_steps and self.step_count % progress_every_steps == 0)):
                    last_print = now
                    self.log(self.progress_line(target))
            self._settle()  # a step started ahead is booked before the end (stop or target) is handled
        except KeyboardInterrupt:
            stopping.end_interrupted(self)
            raise
        finally:
            self._ahead_until = None
            if self._ahead is not None:  # an error between steps (e.g. in a callback): book the started step
                self._settle()
        if self.step_count >= target:
            self.phase = "finished"
            if self.step_count >= cfg.steps and self.run_dir:
                self._checkpoint_or_warn("finish")
        else:
            stopping.end_stopped(self, stop_reason)
        if self.loops_running == 1:
            refinish_if_stale(self)  # e.g. Run pressed after the finish cell: summary, drafter and plots follow
        return self.last_metrics

    # ----------------------------------------------------------------------------------------------------------
    def _log_last_step(self) -> None:
        """On stop / interrupt / finish, the last step goes to metrics.jsonl even off the log_every grid."""
        m = self.last_metrics
        if m is not None and self.run_dir is not None and m.get("step") == self.step_count != self._logged_step:
            self.metrics.log(m)
            self._logged_step = self.step_count

    def save_checkpoint(self, reason: str = "manual") -> Path:
        """Full checkpoint (drafter, optimiser, scheduler, RNG, data position, step) into <run_dir>/checkpoints/."""
        if self.run_dir is None:
            raise checkpoint.CheckpointError("this Trainer has no run directory. Fix: build it with "
                                             "write_run_dir=True (the default).")
        if self.diverged_at is not None:
            raise checkpoint.CheckpointError("refusing to checkpoint: " + self._diverged_message())
        self._settle()
        if self.last_checkpoint_step == self.step_count and self.last_checkpoint and self.last_checkpoint.is_dir():
            return self.last_checkpoint
        t0 = time.perf_counter()
        path, removed = resume_state.save(self, reason, self._recent_losses)
        self._event("checkpoint", step=self.step_count, path=str(path), reason=reason,
                    seconds=round(time.perf_counter() - t0, 3), removed=[p.name for p in removed])
        self.last_checkpoint, self.last_checkpoint_step = path, self.step_count
        self._recent_losses = []
        return path

    def _checkpoint_or_warn(self, reason: str) -> Path | None:
        """save_checkpoint for the loop: a failed write is reported and training goes on (the old one is intact)."""
        try:
            return self.save_checkpoint(reason)
        except checkpoint.CheckpointError as e:
            self.log(f"WARNING: {e}")
            self._event("checkpoint_failed", step=self.step_count, reason=reason, error=str(e))
            return None

    def _event(self, event: str, **fields) -> None:
        if self.run_dir is not None:
            try:
                rundir.log_event(self.run_dir, event, **fields)
            except OSError as e:  # events are a record, not a reason to stop training (e.g. a full disk)
                self.log(f"WARNING: could not append {event!r} to events.jsonl ({e})")

    def _start_monitor(self) -> None:
        """system.jsonl: the NVML sampler thread (gpu_monitor.py; host CPU/RAM only on a machine without GPUs)."""
        from dflash_lab.runs.gpu_monitor import GpuMonitor

        try:
            self.monitor = GpuMonitor(interval_s=1.0, jsonl_path=self.run_dir / rundir.SYSTEM_FILE)
            self.monitor.start()
        except Exception as e:  # noqa: BLE001 - monitoring must never stop training
            self.log(f"WARNING: GPU monitor did not start ({type(e).__name__}: {e}); system.jsonl stays empty")
            self.monitor = None

    def progress_line(self, target: int | None = None) -> str:
        return progress_line(self.last_metrics or {}, step=self.step_count, target=target or self.config.steps,
                             steady_step_time=self.throughput.steady_step_time, phase=self.phase)

    def save_drafter(self, path: str | Path | None = None) -> Path:
        """Drafter weights only (safetensors, export names, no embedding/head)."""
        path = Path(path) if path else (self.run_dir / "checkpoints" / "drafter.safetensors")
        return save_drafter(self.drafter, path, self.step_count)

    def finish(self) -> dict:
        """End of a run: save the drafter, plot the curves, copy the executed notebook; returns a summary (run_end.py).

        A diverged run keeps its last good checkpoint and saves no drafter (its weights are not finite).
        """
        summary = finish_run(self)
        self.finished_at = self.step_count
        self._event("finish", status=summary["status"], step=self.step_count)
        return summary

    def close(self) -> None:
        if self.monitor is not None:
            try:
                self.monitor.stop()
            finally:
                self.monitor = None
        self._driver.shutdown(wait=True)
        self.engine.shutdown()
        self.metrics.close()
        if self.run_dir is not None:  # the run dir is free for another process
            run_lock.release(self.run_dir)
