"""A recipe in a bounded call (dflash_lab/workflows/recipe_clock.py): training's room in the call, from how much is
left and, for a resumed run, the speed it measured; whether an evaluation pass may start. Numbers, no GPU."""

import json
import time

import pytest

from dflash_lab.workflows.recipe_clock import CALL_MARGIN_S, START_S, CallClock
from dflash_lab.workflows.recipe_config import RecipeConfig


def _clock(spent: float, budget: float | None = 480.0) -> CallClock:
    cfg = RecipeConfig(model="tiny", call_time_budget_s=budget, eval_budget_s=180.0)
    return CallClock(cfg, started=time.perf_counter() - spent)


def _stopped_run(tmp_path, *, steps: int, target: int, rate: float | None, metrics_rate: float | None = None):
    run = tmp_path / f"run-{steps}"
    run.mkdir()
    (run / "summary.json").write_text(json.dumps({"status": "stopped (resumable)", "steps": steps,
                                                  "target_steps": target, "steady_tokens_per_s": rate}))
    (run / "config.json").write_text(json.dumps({"batch_size": 64, "seq_len": 320, "steps": target}))
    rows = [{"step": steps, "loss": 1.0, "tokens_per_s": metrics_rate}] if metrics_rate else []
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


def test_no_bound_leaves_everything_as_configured():
    clock = _clock(1000.0, budget=None)
    assert clock.left() is None and clock.train_share() is None and clock.pass_may_start(10_000.0)


def test_a_new_run_keeps_evaluation_its_budget():
    room = _clock(100.0).train_share()[0]
    assert room == pytest.approx(480 - 100 - CALL_MARGIN_S - 180, abs=1.0)  # 140 s


def test_a_resumed_run_that_cannot_also_be_evaluated_here_trains_the_whole_call(tmp_path):
    # 6,500 steps of 64 x 320 tokens at 335k tokens/s: ~397 s + START_S, more than the 400 s left beside evaluation
    run = _stopped_run(tmp_path, steps=1_000, target=7_500, rate=335_000.0)
    assert CallClock.finish_s(run) == pytest.approx(6_500 * 64 * 320 / 335_000 + START_S)
    assert _clock(20.0).train_share(run)[0] == pytest.approx(480 - 20 - CALL_MARGIN_S, abs=1.0)  # 400 s: no reserve


def test_the_share_kept_for_evaluation_is_what_the_training_room_leaves_out(tmp_path):
    room, kept = _clock(100.0).train_share()  # a new run: evaluation's 180 s kept (the training budget's reserve)
    assert (round(room), kept) == (140, 180.0)
    long = _stopped_run(tmp_path, steps=1_000, target=7_500, rate=335_000.0)  # cannot finish here: nothing kept
    room, kept = _clock(20.0).train_share(long)
    assert (round(room), kept) == (400, 0.0) and _clock(20.0, budget=None).train_share() is None


def test_a_resumed_run_that_finishes_here_keeps_evaluation_its_budget(tmp_path):
    run = _stopped_run(tmp_path, steps=7_000, target=7_500, rate=335_000.0)  # ~31 s + START_S to finish
    assert _clock(20.0).train_share(run)[0] == pytest.approx(480 - 20 - CALL_MARGIN_S - 180, abs=1.0)  # 220 s


def test_a_run_without_a_steady_rate_is_timed_by_its_last_logged_rate_or_not_at_all(tmp_path):
    logged = _stopped_run(tmp_path, steps=1_000, target=7_500, rate=None, metrics_rate=200_000.0)
    assert CallClock.finish_s(logged) == pytest.approx(6_500 * 64 * 320 / 200_000 + START_S)
    unmeasured = _stopped_run(tmp_path, steps=10, target=7_500, rate=None)
    assert CallClock.finish_s(unmeasured) is None
    assert _clock(20.0).train_share(unmeasured)[0] == pytest.approx(480 - 20 - CALL_MARGIN_S - 180, abs=1.0)


def test_a_pass_starts_only_with_the_margin_or_the_last_pass_time_left():
    clock = _clock(480.0 - 100.0)  # 100 s left
    assert clock.pass_may_start(None) and clock.pass_may_start(90.0)
    assert not clock.pass_may_start(150.0)  # the last pass took 150 s: it would overrun the call
    assert not _clock(480.0 - 50.0).pass_may_start(None)  # under the 60 s margin
