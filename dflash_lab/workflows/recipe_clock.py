"""How a recipe fits one bounded call (RecipeConfig.call_time_budget_s, e.g. a lent GPU's 10-minute call).

The call is counted from the Recipe's creation. Training gets what is left less CALL_MARGIN_S (export, writing the
results, a pass that runs past its start); evaluation's budget is kept out of it too when the run may finish and be
evaluated in this call, which is always assumed for a new run, as the training budget's reserve: a run that finds,
from its own measured speed, that it cannot finish before the reserve would end trains through it too. A run resumed
with a measured speed that cannot both finish and be evaluated here trains the whole call instead: its evaluation
belongs to a later call anyway, and a long run (the "long" preset) then needs fewer calls. With less than
MIN_TRAIN_S for training it does not start, and a rerun with the same work_dir goes on. An evaluation pass starts
only while the call has CALL_MARGIN_S left, or as long as the previous pass took.
"""

from __future__ import annotations

import time
from pathlib import Path

from dflash_lab.runs.listing import run_metrics
from dflash_lab.runs.run_files import read_json

# what a call keeps beyond training and evaluation, the least training worth starting, and what a resumed run
# spends before its first step (loading the target and compiling the drafter take ~40 s on a GPU)
CALL_MARGIN_S, MIN_TRAIN_S, START_S = 60.0, 60.0, 60.0


def now() -> float:
    """The call's clock (seconds), read here only, so one clock starts and reads a call (tests feed their own)."""
    return time.perf_counter()


class CallClock:
    """The call's seconds for a recipe whose config may bound them (call_time_budget_s None: no bound)."""

    def __init__(self, config, started: float | None = None):
        self.config = config
        self.started = now() if started is None else started

    def left(self) -> float | None:
        """Seconds left of call_time_budget_s (None: no bound)."""
        budget = self.config.call_time_budget_s
        return None if budget is None else budget - (now() - self.started)

    @staticmethod
    def finish_s(run_dir: Path) -> float | None:
        """Seconds a stopped run needs to train its remaining steps at the speed it measured (its steady sequence
        tokens/s, else its last logged rate), plus START_S; None when it measured none."""
        summary, config = read_json(run_dir / "summary.json", missing={}), read_json(run_dir / "config.json",
                                                                                         missing={})
        rate = summary.get("steady_tokens_per_s")
        if not rate:
            rates = [r["tokens_per_s"] for r in run_metrics(run_dir) if r.get("tokens_per_s")]
            rate = rates[-1] if rates else None
        steps_left = (summary.get("target_steps") or 0) - (summary.get("steps") or 0)
        if not rate or steps_left < 0 or not config.get("batch_size") or not config.get("seq_len"):
            return None
        return steps_left * config["batch_size"] * config["seq_len"] / rate + START_S

    def train_share(self, resumed: Path | None = None) -> tuple[float, float] | None:
        """(what the call leaves training now: left less CALL_MARGIN_S, and less evaluation's budget unless `resumed`,
        the run to continue, cannot finish and be evaluated within the call; the evaluation budget it keeps out: 0
        or eval_budget_s); None with no bound. The recipe makes the second the training budget's reserve
        (stopping.TimeBudget): a new run that turns out unable to finish in this call trains on through it, since its
        evaluation belongs to a later call anyway."""
        left = self.left()
        if left is None:
            return None
        room = left - CALL_MARGIN_S
        finish = self.finish_s(resumed) if resumed is not None else None
        kept = self.config.eval_budget_s if finish is None or finish + self.config.eval_budget_s <= room else 0.0
        return room - kept, kept

    def pass_may_start(self, last_pass_s: float | None) -> bool:
        """Whether an evaluation pass may start: the call has CALL_MARGIN_S left, or the previous pass's time."""
        left = self.left()
        return left is None or left >= max(CALL_MARGIN_S, last_pass_s or 0.0)
