"""One run folder, one answer: explore.ipynb's path through the dashboard's buttons on a real Trainer.

Stop mid-run, the finish cell, then Run to the target: summary.json, drafter.safetensors, plots/training.png,
`runs list`, the live dashboard and an attached view all name the final step and state (before, summary.json,
the drafter and the plot stayed at the step of the first finish while the dashboard said "finished 400 / 400").
Every button leaves a `control` event in events.jsonl, and the learning rate of every step can be rebuilt from
config.json and events.jsonl alone (Set LR used to leave no trace).
"""

import json
import time

import pytest
from safetensors import safe_open

from dflash_lab.train.controls import lr_history
from dflash_lab.train.progress import progress_line

SMALL = dict(target="tiny", data="tiny", steps=40, seq_len=64, batch_size=2, block_size=8, num_anchors=4,
             num_draft_layers=1, log_every=5, lr=3e-3)


def _until(cond, timeout: float, what: str) -> None:
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


def _drafter_step(run) -> int:
    with safe_open(str(run / "checkpoints" / "drafter.safetensors"), "pt") as f:
        return int(f.metadata()["step"])


def test_buttons_after_the_finish_cell_leave_one_answer_and_a_full_event_trail(tmp_path):
    from dflash_lab import TrainConfig, Trainer
    from dflash_lab.runs.listing import runs_table
    from widgets import AttachedView, TrainingView

    trainer = Trainer(TrainConfig(**SMALL, runs_dir=str(tmp_path)), log=lambda *a: None)
    view = TrainingView(trainer, mode="static", monitor=False)
    c, run = view.controls, trainer.run_dir
    try:
        assert c.run() == "training to step 40"
        _until(lambda: trainer.step_count >= 4, 60, "4 steps")
        c.pause()
        _until(lambda: trainer.phase == "paused", 30, "the pause")
        paused_at = trainer.step_count
        view.state()  # a dashboard refresh settles the message
        assert c.message == f"paused at step {paused_at}"
        c.set_lr(1e-4)
        c.step_n(3)
        # the step count moves before the loop is back in its pause: wait for both, as the message does
        _until(lambda: trainer.step_count == paused_at + 3 and trainer.phase == "paused", 30, "3 steps while paused")
        view.state()
        assert c.message == f"took the steps; paused at step {paused_at + 3}"  # not "stepping 3 while paused"
        c.checkpoint()
        _until(lambda: trainer.last_checkpoint_step == paused_at + 3, 30, "the checkpoint")
        assert c.run() == "resumed"
        _until(lambda: trainer.step_count >= paused_at + 6, 30, "steps after resume")
        c.stop()
        c.join(60)
        stopped_at = trainer.step_count
        assert trainer.phase == "stopped" and stopped_at < 40
        line = trainer.progress_line()  # the hand-step cell's line after Stop: no warm-up, no ETA
        assert "warming up" not in line and "ETA" not in line and line.endswith("| stopped"), line
        state = view.state()
        assert "warming up" not in state.summary_line() and state.eta_text == "-"
        first = trainer.finish()  # the finish cell
        assert first["status"] == "stopped (resumable)" and first["steps"] == stopped_at

        c.run()  # Run after the finish cell: trains to 40 and finishes again
        c.join(120)
        assert c.error is None and trainer.step_count == 40

        summary = json.loads((run / "summary.json").read_text())
        assert (summary["status"], summary["steps"]) == ("finished", 40)
        assert _drafter_step(run) == 40
        assert (run / "plots" / "training.png").stat().st_mtime >= (run / "summary.json").stat().st_mtime - 5
        row = runs_table([run]).iloc[0]
        assert (row["status"], int(row["step"]), int(row["steps"])) == ("finished", 40, 40)
        live = view.state()
        assert (live.phase, live.step) == ("finished", 40)
        attached = AttachedView(run, mode="static").state()
        assert (attached.phase, attached.step) == ("finished", 40)

        events = [json.loads(x) for x in (run / "events.jsonl").read_text().splitlines()]
        controls = [(e["action"], e["step"]) for e in events if e["event"] == "control"]
        assert [a for a, _ in controls] == ["run", "pause", "set_lr", "step_n", "checkpoint", "resume", "stop", "run"]
        steps = [s for _, s in controls]
        assert steps[0] == 0 and steps[1] <= paused_at and steps[2:4] == [paused_at, paused_at]
        assert steps[4:6] == [paused_at + 3, paused_at + 3] and steps[6] <= stopped_at and steps[7] == stopped_at
        assert [e["event"] for e in events].count("finish") == 2
        override = [e for e in events if e["event"] == "lr_override"]
        assert [(e["step"], e["lr"]) for e in override] == [(paused_at + 1, 1e-4)]
        # The learning rate of every step, rebuilt from the run folder, is the one each step used
        used = {r["step"]: r["lr"] for r in trainer.history}
        assert len(used) == 40 and lr_history(run) == pytest.approx(used, rel=1e-12)
    finally:
        view.close()
        trainer.close()


def test_progress_line_says_warm_up_and_eta_only_while_training():
    m = {"tokens_per_s": 4200.0, "throughput_state": "warming_up", "loss": 2.0, "acc": 0.3, "sim_tau": 1.5,
         "step_time_s": 0.5}
    training = progress_line(m, step=10, target=250, steady_step_time=None, phase="training")
    assert "4.2k tok/s (warming up)" in training and "ETA ~0h02m00s" in training  # warm-up ETA: estimated
    steady = progress_line({**m, "throughput_state": "steady"}, step=10, target=250, steady_step_time=0.5,
                           phase="training")
    assert "(warming up)" not in steady and "ETA 0h02m00s" in steady
    for phase in ("stopped", "paused", "finished", "idle"):
        line = progress_line(m, step=10, target=250, steady_step_time=None, phase=phase)
        assert "warming up" not in line and "ETA" not in line and line.endswith(f"| {phase}"), line


def test_the_heldout_fix_names_a_parameter_of_the_notebooks_it_names(tmp_path):
    """Training on a data file with no held-out split says how to give one; each notebook the message names has that
    parameter (train.ipynb had none: `-p heldout_data` stopped the run)."""
    import re
    import shutil

    from dflash_lab import TrainConfig, Trainer
    from dflash_lab.config.notebook_params import parameter_defaults
    from dflash_lab.tiny import tiny_data_path

    data = tmp_path / "mine.jsonl"  # no heldout.jsonl next to it
    shutil.copy(tiny_data_path(), data)
    lines = []
    trainer = Trainer(TrainConfig(**{**SMALL, "data": str(data), "steps": 2, "val_every": 1},
                                  runs_dir=str(tmp_path / "runs")), log=lines.append)
    try:
        trainer.step(1)
    finally:
        trainer.close()
    (note,) = [x for x in lines if "validation and real tau are off" in x]
    assert "-p heldout_data FILE.jsonl" in note, note
    named = re.findall(r"(\w+\.ipynb)", note)
    assert set(named) == {"train.ipynb", "explore.ipynb"}
    for nb in named:
        assert parameter_defaults(nb)["heldout_data"] == "auto", nb
