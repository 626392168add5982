"""`python -m dflash_lab.train`: its help points to notebooks/train.ipynb, and `--data FILE` starts a NEW run (it used to
need an existing run dir's config.json, and said nothing of the notebook)."""

import json
import subprocess
import sys
from pathlib import Path

from dflash_lab.runs import rundir
from dflash_lab.tiny import tiny_data_path

CMD = [sys.executable, "-m", "dflash_lab.train"]
REPO = Path(__file__).resolve().parent.parent


def test_help_names_the_notebook_and_both_ways_in():
    out = subprocess.run([*CMD, "--help"], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert out.returncode == 0
    text = " ".join(out.stdout.split())
    assert "notebooks/train.ipynb" in text and "papermill notebooks/train.ipynb out.ipynb" in text
    assert "--config CONFIG | --data DATA" in text and "--set FIELD=VALUE" in text
    bare = subprocess.run(CMD, capture_output=True, text=True, timeout=60, cwd=REPO)
    assert bare.returncode == 2 and "one of the arguments --config --data is required" in bare.stderr


def test_a_fresh_run_from_a_data_file(tmp_path):
    out = subprocess.run([*CMD, "--data", str(tiny_data_path()), "--steps", "3", "--runs-dir", str(tmp_path),
                          "--run-name", "cli", "--set", "seq_len=64", "--set", "batch_size=2", "--set", "num_anchors=4",
                          "--set", "num_draft_layers=1"], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    (run,) = [p for p in tmp_path.iterdir() if "-cli-" in p.name]
    cfg = json.loads((run / rundir.CONFIG_FILE).read_text())
    assert (cfg["data"], cfg["steps"], cfg["seq_len"], cfg["num_draft_layers"]) == (str(tiny_data_path()), 3, 64, 1)
    assert [r["step"] for r in rundir.read_jsonl(run / rundir.METRICS_FILE)][-1] == 3
    assert out.stdout.startswith(f"new run dir {run} (config.json)")
    bad = subprocess.run([*CMD, "--data", str(tiny_data_path()), "--set", "seqlen=64", "--runs-dir", str(tmp_path)],
                         capture_output=True, text=True, timeout=60, cwd=REPO)
    assert bad.returncode == 2 and bad.stderr.startswith("error: TrainConfig got unknown fields ['seqlen']")
    assert bad.stderr.count("\n") == 1  # one line, no traceback
