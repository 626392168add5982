"""Overlapped steps (TrainConfig.overlap_steps): step k+1 starts on the device before step k is booked on the host.

A step's bookkeeping (the metrics record, engine metrics, logging, the dashboard's callbacks) is host work of a few
milliseconds; done between steps it leaves the GPU idle (~3 ms of an 18 ms recipe-shape step on an H200). The
Trainer therefore reads the finished step's numbers (one device-to-host copy), starts the next step, and books the
finished one while the device runs. Both steps' math is unchanged: the next step's inputs never depend on the
bookkeeping. Only where a boundary needs the weights to hold still (a checkpoint, validation, real tau, evaluation,
pause, stop, the end of the loop) or the finished step is not finite does the next one wait (`may_start_next`).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from .controls import LR_OVERRIDE_EVENT, STOP_FILE


@dataclass(frozen=True)
class Launched:
    """A step started on the device: its index, batch, lr, the engine's output tensors and its host start time."""

    index: int
    batch: object
    lr: float
    out: dict
    t0: float


def read_step_values(out: dict) -> dict:
    """The engine's step outputs as Python numbers, in ONE device-to-host copy (it waits for the step to finish)."""
    names = tuple(out.get("term_names", ()))  # a variant's own loss terms (drafter/variants.py), after slot_acc
    keys = ("loss", "grad_norm", "acc", "sim_tau", "slot_acc") + (("terms",) if names else ())
    parts = [out[k].detach().reshape(-1).float() for k in keys]
    dev = parts[0].device
    v = torch.cat([p.to(dev) for p in parts]).tolist()
    slots = len(v) - 4 - len(names)
    return {"loss": v[0], "grad_norm": v[1], "acc": v[2], "sim_tau": v[3],
            "slot_acc": [round(a, 4) for a in v[4:4 + slots]], "terms": dict(zip(names, v[4 + slots:]))}


def may_start_next(trainer, values: dict) -> bool:
    """Whether step `trainer.step_count + 1` may start before step `step_count` (finished on the device, its
    `values` read, not booked yet) is: only when nothing at this boundary needs the weights to hold still or the
    loop to end, and the finished step is finite (a diverged step stops the run before anything else runs)."""
    from .validation import Validator

    cfg, done = trainer.config, trainer.step_count + 1  # the step count once the finished step is booked
    if not cfg.overlap_steps or trainer._ahead_until is None or done >= min(trainer._ahead_until, cfg.steps):
        return False
    if not (math.isfinite(values["loss"]) and math.isfinite(values["grad_norm"])):
        return False
    if trainer.validator is None:
        trainer.validator = Validator(trainer)
    if (any(trainer.validator.due(done, cfg.steps)) or (cfg.eval_every and done % cfg.eval_every == 0)
            or (cfg.checkpoint_every and done % cfg.checkpoint_every == 0)):
        return False
    c = trainer.controls
    if c.pause.is_set() or c.stop.is_set() or c.checkpoint.is_set() or c.stopped.is_set():
        return False
    if trainer.run_dir is not None and (trainer.run_dir / STOP_FILE).exists():
        return False
    return not trainer.budget.spent()


def launch(trainer, index: int) -> Launched:
    """Start step `index` (0-based) on the device: its batch, its lr, the engine's (asynchronous) step, and the
    next batch built on the host while the device runs."""
    cfg = trainer.config
    pre, trainer._prefetched = trainer._prefetched, None
    batch = pre[1] if pre is not None and pre[0] == index else trainer.sampler.batch(index)
    lr = trainer.current_lr(index)
    if trainer.controls.new_lr is not None and trainer.controls.new_lr != trainer._lr_override_logged:
        trainer._lr_override_logged = trainer.controls.new_lr  # the first step that uses it: lr_history rebuilds on it
        trainer._event(LR_OVERRIDE_EVENT, step=index + 1, lr=lr)
    # Split placements: the target side computes the next batch's features while the drafters train on this one.
    nxt = trainer.sampler.batch(index + 1) if trainer.engine.prefetches else None
    t0 = time.perf_counter()
    out = trainer.engine.step(batch, step=index, lr=lr, next_batch=nxt)
    if nxt is None and index + 1 < cfg.steps:  # host work of the next batch while the device runs
        nxt = trainer.sampler.batch(index + 1)
    if nxt is not None:
        trainer._prefetched = (index + 1, nxt)
    return Launched(index, batch, lr, out, t0)
