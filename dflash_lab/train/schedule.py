"""The learning-rate schedule of a run: linear warm-up over `warmup_ratio * steps`, then a cosine from `lr` to
`min_lr_ratio * lr` at `steps`, or, with `lr_schedule="wsd"`, `lr` held until the last `decay_ratio * steps` steps,
which decay linearly (optim.lr_at). One object that the notebook Trainer, torchrun ranks and checkpoints share, a
pure function of (step, config), so a resumed run continues exactly.

Why WSD for long runs: a run extended while it is still in its stable phase keeps exactly the lr it had (only the
decay moves to the new end), where a cosine's whole tail is re-planned; and the drafter of any stable-phase
checkpoint can be finished with a short decay.

Changing `steps` on resume (extending a run, or ending it earlier) re-plans the cosine for the new total: from the
resumed step on, the lr is what a run planned with the new `steps` from the start uses at that step, so the rest of
an extended run matches a run of that length. At the resumed step the lr therefore moves from the old curve to the
new one (a finished 400-step run extended to 800 steps continues at lr/2, the 800-step curve's value at step 400);
resume.py prints that change. An explicit `lr` override on resume scales the whole curve.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from .optim import lr_at


@dataclass(frozen=True)
class LRSchedule:
    peak: float
    total_steps: int
    warmup_steps: int
    min_ratio: float = 0.0
    shape: str = "cosine"
    decay_steps: int = 0  # "wsd": the last steps, in which the lr falls linearly

    @classmethod
    def of(cls, config) -> "LRSchedule":
        return cls(peak=config.lr, total_steps=config.steps, warmup_steps=config.warmup_steps,
                   min_ratio=config.min_lr_ratio, shape=config.lr_schedule,
                   decay_steps=int(round(config.decay_ratio * config.steps)) if config.lr_schedule == "wsd" else 0)

    def lr(self, step: int) -> float:
        """Learning rate of optimizer step `step` (0-based)."""
        return lr_at(step, peak=self.peak, total_steps=self.total_steps, warmup_steps=self.warmup_steps,
                     min_ratio=self.min_ratio, shape=self.shape, decay_steps=self.decay_steps)

    def to_dict(self) -> dict:
        return asdict(self)
