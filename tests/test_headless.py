"""notebooks/train.ipynb under the papermill CLI: parameters with help, live progress lines, a complete run dir."""

import ast
import json
import subprocess
import sys
import time
from pathlib import Path

import nbformat

from dflash_lab.runs import checkpoint, rundir

REPO = Path(__file__).resolve().parent.parent
NOTEBOOK = REPO / "notebooks" / "train.ipynb"
PAPERMILL = [sys.executable, "-m", "papermill"]


def _parameter_names() -> list[str]:
    nb = nbformat.read(str(NOTEBOOK), as_version=4)
    cells = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(cells) == 1, "train.ipynb must have exactly one cell tagged `parameters`"
    names = []
    for node in ast.parse(cells[0].source).body:
        assert isinstance(node, ast.AnnAssign), f"parameters cell line {node.lineno}: use `name: type = literal`"
        ast.literal_eval(node.value)  # literals only
        names.append(node.target.id)
    return names


def test_help_notebook_lists_every_parameter_with_help():
    out = subprocess.run([*PAPERMILL, "--help-notebook", str(NOTEBOOK)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    names = _parameter_names()
    assert len(names) >= 20
    lines = out.stdout.splitlines()
    for name in names:
        at = [i for i, line in enumerate(lines) if line.strip().startswith(f"{name}: ")]
        assert at, f"papermill --help-notebook does not show parameter {name!r}:\n{out.stdout}"
        text = lines[at[0]].split(")", 1)[1].strip() or lines[at[0] + 1].strip()
        assert len(text) > 10, f"parameter {name!r} has no help text"
        assert "Unknown type" not in lines[at[0]], f"parameter {name!r} has no type annotation"


def test_papermill_cli_run_logs_progress_and_fills_the_run_dir(tmp_path):
    """Also: the kernel configuration `make env` installs (widgets/kernel_logs.py) keeps kernel noise out of the
    log; the static dashboard's text form is its summary line; `-p heldout_data` reaches the config; the run dir's
    copy of the notebook names no folder of this machine."""
    import os

    from dflash_lab.tiny import ensure_tiny_target, tiny_heldout_path
    from widgets.kernel_logs import install

    ensure_tiny_target()  # built once, outside the kernel (the notebook's default target is "tiny")
    out_nb = tmp_path / "out.ipynb"
    runs_dir = tmp_path / "runs"
    heldout = tmp_path / "my-heldout.jsonl"
    heldout.write_text(Path(tiny_heldout_path()).read_text())
    params = dict(steps=24, seq_len=64, batch_size=2, block_size=8, num_anchors=4, num_draft_layers=2,
                  log_every=4, progress_every_s=1000.0, progress_every_steps=6, checkpoint_every=8,
                  runs_dir=str(runs_dir), run_name="headless", heldout_data=str(heldout))
    cmd = [*PAPERMILL, str(NOTEBOOK), str(out_nb), "--log-output", "--no-progress-bar", "--cwd", str(REPO)]
    for k, v in params.items():
        cmd += ["-p", k, str(v)]
    install(tmp_path / "ipython" / "profile_default")  # what `make env` writes into .venv/etc/ipython
    env = {**os.environ, "IPYTHONDIR": str(tmp_path / "ipython")}
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    seen = []  # (seconds since start, line): papermill --log-output streams the kernel's output as it comes
    for line in proc.stdout:
        seen.append((time.monotonic() - t0, line.rstrip()))
    assert proc.wait(timeout=300) == 0, "\n".join(line for _, line in seen[-40:])
    progress = [line for _, line in seen if "step " in line and "tok/s" in line and "loss" in line]
    steps = [int(line.split("step ", 1)[1].split("/", 1)[0]) for line in progress]
    assert steps == [6, 12, 18, 24], progress
    assert all("ETA" in line and "sim tau" in line and "GiB" in line for line in progress)
    log = "\n".join(line for _, line in seen)
    assert "[IPKernelApp]" not in log and "<IPython.core.display.Image object>" not in log, log[-3000:]
    assert any(line.startswith("step 0/24 |") and line.endswith("| ready") for _, line in seen), log[-2000:]

    (run,) = list(runs_dir.iterdir())
    for name in ("config.json", "env.json", "metrics.jsonl", "events.jsonl", "summary.json", "plots/training.png",
                 "checkpoints/drafter.safetensors"):
        assert (run / name).is_file(), f"{name} missing from {sorted(p.name for p in run.iterdir())}"
    assert json.loads((run / "config.json").read_text())["steps"] == 24
    assert json.loads((run / "config.json").read_text())["heldout_data"] == str(heldout)
    assert [p.name for p in checkpoint.list_checkpoints(run)] == ["step-0000016", "step-0000024"]
    assert [r["step"] for r in rundir.read_jsonl(run / "metrics.jsonl")] == [1, 4, 8, 12, 16, 20, 24]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["steps"] == 24
    assert summary["notebook"] == str(run / "train.ipynb")  # found through the papermill parent process

    copy = run / "train.ipynb"  # the detached copier replaces the partial copy with papermill's final write
    deadline = time.monotonic() + 300  # a bound on a hang only: the copier is a process of its own
    while time.monotonic() < deadline and not json.loads(copy.read_text())["metadata"]["papermill"].get("end_time"):
        time.sleep(0.25)
    nb = json.loads(copy.read_text())
    assert nb["metadata"]["papermill"]["end_time"] and nb["metadata"]["papermill"]["parameters"]["steps"] == 24
    view = next(c for c in nb["cells"] if "TrainingView(trainer)" in "".join(c["source"]))
    assert [o for o in view["outputs"] if "image/png" in o.get("data", {})], "the dashboard plot is shown inline"
    pngs = sum("image/png" in o.get("data", {}) for c in nb["cells"] for o in c.get("outputs", []))
    assert pngs == 1, "one training figure (two disagreed: every step vs every 10th)"
    raw = copy.read_text()
    assert str(tmp_path) not in raw and str(REPO) not in raw  # relative: runs/<run>/..., notebooks/train.ipynb
    assert f"runs/{run.name}/checkpoints/drafter.safetensors" in raw


def test_a_project_error_under_papermill_is_one_line_and_comes_first(tmp_path):
    """`-p time_budget_s` reaches TrainConfig; its ConfigError is the cell's whole error and the first thing on the
    terminal (papermill's own traceback of its PapermillExecutionError follows); papermill exits non-zero."""
    import os

    from widgets.kernel_logs import install

    install(tmp_path / "ipython" / "profile_default")  # what `make env` writes into .venv/etc/ipython
    env = {**os.environ, "IPYTHONDIR": str(tmp_path / "ipython")}
    out = subprocess.run([*PAPERMILL, str(NOTEBOOK), str(tmp_path / "out.ipynb"), "--no-progress-bar", "-p",
                          "time_budget_s", "-5", "-p", "runs_dir", str(tmp_path / "runs")],
                         capture_output=True, text=True, timeout=300, env=env, cwd=REPO)
    line = ("ConfigError: TrainConfig.time_budget_s=-5 is invalid: must be a positive number of seconds. Fix: use "
            "e.g. 540 (a 10-minute job with room to save), or None for no limit.")
    text = out.stdout + out.stderr
    assert out.returncode != 0 and line in text, text[-3000:]
    assert text.index(line) < text.index("Traceback"), text[-3000:]  # the project's line first
    nb = json.loads((tmp_path / "out.ipynb").read_text())
    (error,) = [o for c in nb["cells"] for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert error["traceback"] == [line] and error["ename"] == "ConfigError"
