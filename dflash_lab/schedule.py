"""The learning-rate schedule of a run, including what happens when a resume changes `steps`.

A fresh run: linear warm-up over `warmup_ratio * steps`, then a cosine from `lr` to `min_lr_ratio * lr` at `steps`
(optim.lr_at). A resume that changes `steps` (to extend a finished run, or end one earlier) does NOT re-plan the
whole cosine (that made the lr jump back up mid-run): from the resumed step on, the lr continues from the value it had
there under the earlier plan and follows a half cosine down to the floor at the new `steps`:

    lr(s) = peak * (floor + (r0 - floor) * 0.5 * (1 + cos(pi * (s - s0) / (steps - s0))))    for s >= s0

with s0 the resumed step and r0 = lr(s0) / peak under the earlier plan. The "tail" (s0, r0) is saved in every later
checkpoint, so stopping and resuming an extended run again continues the same curve. An explicit `lr` override on
resume scales the whole curve (the schedule is kept as a fraction of the peak).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from .optim import lr_at


@dataclass(frozen=True)
class LRSchedule:
    peak: float
    total_steps: int
    warmup_steps: int
    min_ratio: float = 0.0
    tail_from: int | None = None  # step where a resume changed `steps`
    tail_ratio: float | None = None  # lr / peak at tail_from under the earlier plan

    @classmethod
    def of(cls, config, tail: dict | None = None) -> "LRSchedule":
        """The schedule of a TrainConfig, with a tail read from a checkpoint's `scheduler` state if it has one."""
        tail = tail or {}
        return cls(peak=config.lr, total_steps=config.steps, warmup_steps=config.warmup_steps,
                   min_ratio=config.min_lr_ratio, tail_from=tail.get("tail_from"), tail_ratio=tail.get("tail_ratio"))

    def lr(self, step: int) -> float:
        """Learning rate of optimizer step `step` (0-based)."""
        if self.tail_from is None or step < self.tail_from:
            return lr_at(step, peak=self.peak, total_steps=self.total_steps, warmup_steps=self.warmup_steps,
                         min_ratio=self.min_ratio)
        span = max(1, self.total_steps - self.tail_from)
        progress = min(1.0, (step - self.tail_from) / span)
        ratio = self.min_ratio + (self.tail_ratio - self.min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
        return self.peak * ratio

    def extended(self, step: int, new_config) -> "LRSchedule":
        """The schedule after a resume at `step` that changes `steps` (and maybe `lr`): continue from here."""
        ratio = self.lr(step) / self.peak
        return LRSchedule(peak=new_config.lr, total_steps=new_config.steps, warmup_steps=new_config.warmup_steps,
                          min_ratio=new_config.min_lr_ratio, tail_from=step, tail_ratio=ratio)

    def to_dict(self) -> dict:
        return asdict(self)
