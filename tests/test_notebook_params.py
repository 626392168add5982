"""notebook_params.py + resume from papermill: unknown `-p` names stop the run with the known names; a resume that
sets only `resume_from` continues the original run (its steps, its schedule) to its original step count."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dflash_lab.runs import checkpoint, rundir
from dflash_lab.config import notebook_params

REPO = Path(__file__).resolve().parent.parent
NOTEBOOK = REPO / "notebooks" / "train.ipynb"
PAPERMILL = [sys.executable, "-m", "papermill", str(NOTEBOOK)]


def test_defaults_come_from_the_parameters_cell_and_set_names_are_found():
    defaults = notebook_params.parameter_defaults("train.ipynb")
    assert defaults["steps"] == 400 and defaults["resume_from"] == "" and "gpus" in defaults
    ns = {**defaults, "lr": 3e-4, "In": ["", "# Parameters\nresume_from = \"runs/x\"\nsteps = 400\n"],
          "resume_from": "runs/x"}
    params = notebook_params.check(ns, "train.ipynb")
    assert set(params.set_by_user) == {"resume_from", "steps", "lr"}  # injected (even at the default) or edited
    assert params.config_fields(gpus="devices") == {"resume_from", "steps", "lr"}
    ns["gpus"] = [0]
    assert "devices" in notebook_params.check(ns, "train.ipynb").config_fields(gpus="devices")


def test_unknown_papermill_parameter_is_refused_with_the_known_names():
    ns = {**notebook_params.parameter_defaults("train.ipynb"), "In": ["# Parameters\ncheckpoint_evry = 1000\n"]}
    with pytest.raises(notebook_params.UnknownParameterError) as err:
        notebook_params.check(ns, "train.ipynb")
    assert "['checkpoint_evry']" in str(err.value) and "'checkpoint_every'" in str(err.value)


def test_defaults_are_the_tracked_notebooks_whatever_the_working_directory_holds(tmp_path, monkeypatch):
    """A JupyterLab working copy (or an executed copy) named like a project notebook: its edited parameters cell is
    not the defaults, so an edited value still counts as set by the user."""
    nb = json.loads((REPO / "notebooks" / "train.ipynb").read_text())
    cell = next(c for c in nb["cells"] if "parameters" in c["metadata"].get("tags", []))
    cell["source"] = "".join(cell["source"]).replace("steps: int = 400", "steps: int = 7")
    (tmp_path / "train.ipynb").write_text(json.dumps(nb))
    monkeypatch.chdir(tmp_path)
    assert notebook_params.parameter_defaults("train.ipynb")["steps"] == 400
    ns = {**notebook_params.parameter_defaults("train.ipynb"), "steps": 7, "In": []}
    assert notebook_params.check(ns, "train.ipynb").set_by_user == ("steps",)
    assert notebook_params.parameter_defaults(tmp_path / "train.ipynb")["steps"] == 7  # a path is read as given


def _papermill(tmp_path, name, **params):
    cmd = [*PAPERMILL, str(tmp_path / f"{name}.ipynb"), "--no-progress-bar", "--cwd", str(REPO / "notebooks")]
    for k, v in params.items():
        cmd += ["-p", k, str(v)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def test_papermill_unknown_parameter_stops_before_training(tmp_path):
    out = _papermill(tmp_path, "typo", checkpoint_evry=1000, runs_dir=str(tmp_path / "runs"))
    assert out.returncode != 0
    assert "UnknownParameterError" in out.stderr and "checkpoint_evry" in out.stderr
    assert not (tmp_path / "runs").exists()  # nothing trained, no run directory


def test_papermill_resume_with_only_resume_from_continues_the_original_run(tmp_path):
    from dflash_lab.tiny import ensure_tiny_target

    ensure_tiny_target()
    first = _papermill(tmp_path, "first", steps=6, checkpoint_every=3, seq_len=64, batch_size=2, block_size=8,
                       num_anchors=4, num_draft_layers=1, log_every=1, lr=1e-3, run_name="orig",
                       runs_dir=str(tmp_path / "runs"))
    assert first.returncode == 0, first.stderr[-3000:]
    (run,) = (tmp_path / "runs").iterdir()
    losses = {r["step"]: r["loss"] for r in rundir.read_jsonl(run / rundir.METRICS_FILE)}
    # resume from the step-3 checkpoint: every other parameter is at the notebook's default
    again = _papermill(tmp_path, "again", resume_from=str(run / "checkpoints" / "step-0000003"))
    assert again.returncode == 0, again.stderr[-3000:]
    nb = json.loads((tmp_path / "again.ipynb").read_text())
    texts = [o.get("text", "") for c in nb["cells"] for o in c.get("outputs", [])]
    text = "".join("".join(t) if isinstance(t, list) else t for t in texts)
    assert "with the checkpoint's config (nothing overridden)" in text
    assert json.loads((run / rundir.CONFIG_FILE).read_text())["steps"] == 6
    rows = rundir.read_jsonl(run / rundir.METRICS_FILE)
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert {r["step"]: r["loss"] for r in rows} == pytest.approx(losses, rel=1e-6)
    assert checkpoint.latest_checkpoint(run).name == "step-0000006"
    assert json.loads((run / "summary.json").read_text())["status"] == "finished"


def test_a_mistyped_parameter_gets_a_did_you_mean():
    ns = {**notebook_params.parameter_defaults("explore.ipynb"), "In": ["# Parameters\nstep = 50\nzzz = 1\n"]}
    with pytest.raises(notebook_params.UnknownParameterError) as err:
        notebook_params.check(ns, "explore.ipynb")
    text = str(err.value)
    assert "'step': did you mean 'steps'?" in text and text.count("did you mean") == 1  # zzz resembles nothing
