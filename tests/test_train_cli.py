"""`python -m dflash_lab.train`: its help points to notebooks/train.ipynb, and `--data FILE` starts a NEW run (it used to
need an existing run dir's config.json, and said nothing of the notebook)."""

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from dflash_lab.runs import rundir
from dflash_lab.tiny import tiny_data_path

CMD = [sys.executable, "-m", "dflash_lab.train"]
REPO = Path(__file__).resolve().parent.parent


def test_help_names_the_notebook_and_both_ways_in():
    out = subprocess.run([*CMD, "--help"], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert out.returncode == 0
    text = " ".join(out.stdout.split())
    assert "notebooks/train.ipynb" in text and "papermill notebooks/train.ipynb out.ipynb" in text
    assert "--config CONFIG | --data DATA" in text and "--set FIELD=VALUE" in text
    bare = subprocess.run(CMD, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert bare.returncode == 2 and "one of the arguments --config --data is required" in bare.stderr


def test_a_fresh_run_from_a_data_file(tmp_path):
    out = subprocess.run([*CMD, "--data", str(tiny_data_path()), "--steps", "3", "--runs-dir", str(tmp_path),
                          "--run-name", "cli", "--set", "seq_len=64", "--set", "batch_size=2", "--set", "num_anchors=4",
                          "--set", "num_draft_layers=1"], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    (run,) = [p for p in tmp_path.iterdir() if p.name.startswith("cli-")]  # <name>-<UTC stamp>-<id>
    cfg = json.loads((run / rundir.CONFIG_FILE).read_text())
    assert (cfg["data"], cfg["steps"], cfg["seq_len"], cfg["num_draft_layers"]) == (str(tiny_data_path()), 3, 64, 1)
    assert [r["step"] for r in rundir.read_jsonl(run / rundir.METRICS_FILE)][-1] == 3
    first, second = out.stdout.splitlines()[:2]  # the settings chosen for the fields left unset, then the run dir
    assert first.startswith("settings: block 8, ") and second.startswith(f"new run dir {run} (config.json)")
    bad = subprocess.run([*CMD, "--data", str(tiny_data_path()), "--set", "seqlen=64", "--runs-dir", str(tmp_path)],
                         capture_output=True, text=True, timeout=300, cwd=REPO)
    assert bad.returncode == 2 and bad.stderr.startswith("error: TrainConfig got unknown fields ['seqlen']")
    assert bad.stderr.count("\n") == 1  # one line, no traceback


SMALL_SETS = ["--set", "seq_len=64", "--set", "batch_size=2", "--set", "num_anchors=4", "--set", "num_draft_layers=1",
              "--set", "log_every=1"]


def test_a_flag_and_a_set_of_the_same_field_are_refused_in_one_line(tmp_path):
    bad = subprocess.run([*CMD, "--data", "tiny", "--run-name", "a", "--set", "run_name=b", "--runs-dir",
                          str(tmp_path)], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert bad.returncode == 2 and bad.stderr.startswith("error: run_name given twice: by --set and by its own flag")
    assert bad.stderr.count("\n") == 1 and not list(tmp_path.iterdir())  # nothing written


def test_durations_of_time_budget():
    from dflash_lab.train.cli import duration_s

    assert [duration_s(t) for t in ("540", "540s", "9m", "1h30m", "2.5m")] == [540, 540, 540, 5400, 150]
    with pytest.raises(argparse.ArgumentTypeError, match="not a duration"):
        duration_s("9 minutes")


def test_a_spent_budget_touches_stop_once_and_an_unread_stop_is_taken_back(tmp_path, capsys):
    from dflash_lab.train.cli import JobStop

    stopper = JobStop(tmp_path, 0.05, time.monotonic(), main_rank=True)
    deadline = time.monotonic() + 10
    while not (tmp_path / "STOP").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert (tmp_path / "STOP").exists() and stopper.reason == "time budget of 0.05 s spent"
    (event,) = rundir.read_jsonl(tmp_path / rundir.EVENTS_FILE)
    assert (event["event"], event["source"]) == ("stop_requested", "time budget of 0.05 s spent")
    stopper.close()  # the run ended before it read STOP: a resume must not stop at once
    assert not (tmp_path / "STOP").exists() and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    assert "stopping at the next step boundary after a checkpoint" in capsys.readouterr().err


@pytest.mark.slow
def test_sigterm_stops_at_a_step_boundary_with_a_checkpoint_and_says_how_to_continue(tmp_path, capsys):
    """In this process: SIGTERM lands on the main thread like a scheduler's; `--data tiny` as in the notebooks."""
    from dflash_lab.runs.listing import run_status
    from dflash_lab.train import cli

    runs = tmp_path / "runs"

    def kill_after_three_steps():
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            found = list(runs.glob("*/metrics.jsonl"))
            if found and len(rundir.read_jsonl(found[0])) >= 3:
                os.kill(os.getpid(), signal.SIGTERM)
                return
            time.sleep(0.02)

    threading.Thread(target=kill_after_three_steps, daemon=True).start()
    rc = cli.main(["--data", "tiny", "--steps", "400", "--runs-dir", str(runs), "--run-name", "term", *SMALL_SETS])
    out = capsys.readouterr()
    (run,) = runs.iterdir()
    step = rundir.read_jsonl(run / rundir.METRICS_FILE)[-1]["step"]
    assert rc == 0 and 3 <= step < 400 and "SIGTERM: stopping at the next step boundary" in out.err
    assert (run / "checkpoints" / f"step-{step:07d}" / "state.json").is_file()
    assert f"continue with: python -m dflash_lab.train --config {run}/config.json --resume {run}" in out.out
    assert run_status(run) == "stopped (resumable)" and not (run / "STOP").exists()


def _files(folder: Path) -> dict:
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_refused_command_prints_one_line_and_leaves_the_run_folder_as_it_was(tmp_path, capsys):
    """A finished run, then commands refused before they own it: a time budget of 0, --steps 0 (was silently
    ignored), and a second process while another holds the run's lock. Each is one `error:` line, exit 2, and the
    run folder byte for byte as it was: no `failed` event or status (a refused lock wrote one into the live run,
    which then listed `failed` after a later SIGKILL instead of `killed (ckpt @N)`)."""
    from dflash_lab.runs.listing import run_status
    from dflash_lab.train import cli

    runs = tmp_path / "runs"
    assert cli.main(["--data", "tiny", "--steps", "2", "--runs-dir", str(runs), "--run-name", "done", *SMALL_SETS,
                     "--set", "checkpoint_every=0", "--set", "eval_every=0"]) == 0
    (run,) = runs.iterdir()
    config = str(run / rundir.CONFIG_FILE)
    before = _files(run)
    capsys.readouterr()
    refused = {"--time-budget 0": ["--resume", str(run), "--time-budget", "0"], "--steps 0": ["--steps", "0"]}
    for name, args in refused.items():
        assert cli.main(["--config", config, *args]) == 2, name
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, (name, err)
        assert _files(run) == before, name
    holder = subprocess.Popen([sys.executable, "-c", "import sys; from dflash_lab.runs import lock; "
                               f"lock.acquire({str(run)!r}); print('held', flush=True); sys.stdin.read()"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert holder.stdout.readline().strip() == "held"
        held = _files(run)
        assert cli.main(["--config", config, "--resume", str(run), "--steps", "4"]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: run directory {run.resolve()} is in use by") and err.count("\n") == 1, err
        assert _files(run) == held
    finally:
        holder.kill()
        holder.wait()
    events = [e["event"] for e in rundir.read_jsonl(run / rundir.EVENTS_FILE)]
    assert "failed" not in events and not list(run.glob("error.rank*.json")) and run_status(run) == "finished"


def test_a_stop_requested_before_the_process_owns_the_run_is_written_only_once_it_does(tmp_path):
    """A SIGTERM or a spent budget while the run loads (and may still be refused by another process's lock) must
    not touch STOP, which would stop the other process's run; once the process owns the run it is written."""
    from dflash_lab.train.cli import JobStop

    stopper = JobStop(tmp_path, 0.0, time.monotonic() - 1.0, main_rank=True, armed=False)
    deadline = time.monotonic() + 10
    while stopper.reason is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert stopper.reason == "time budget of 0 s spent" and not list(tmp_path.iterdir())
    stopper.arm()
    assert (tmp_path / "STOP").exists()
    assert [e["event"] for e in rundir.read_jsonl(tmp_path / rundir.EVENTS_FILE)] == ["stop_requested"]
    # the timer thread's request and arm() on the main thread can both reach the write: it happens once
    stopper._write()
    stopper.arm()
    assert [e["event"] for e in rundir.read_jsonl(tmp_path / rundir.EVENTS_FILE)] == ["stop_requested"]
    stopper.close()
    refused = JobStop(tmp_path, 0.0, time.monotonic() - 1.0, main_rank=True, armed=False)
    (tmp_path / "STOP").touch()  # another process's request: a refused one leaves it
    deadline = time.monotonic() + 10
    while refused.reason is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert refused.reason == "time budget of 0 s spent"
    refused.close()
    assert (tmp_path / "STOP").exists()
    assert [e["event"] for e in rundir.read_jsonl(tmp_path / rundir.EVENTS_FILE)] == ["stop_requested"]
