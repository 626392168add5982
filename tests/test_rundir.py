"""rundir.py: run dir naming, environment record, papermill output discovery, metrics cut-back, notebook copies."""

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from dflash_lab.runs import rundir


def test_new_run_dir_name_and_layout(tmp_path):
    p = rundir.new_run_dir(tmp_path, "my run/1")
    assert re.fullmatch(r"my-run-1-\d{8}T\d{6}Z-[0-9a-f]{6}", p.name)  # the name first: a file browser shows it
    assert (p / "checkpoints").is_dir() and (p / "plots").is_dir()
    q = rundir.new_run_dir(tmp_path, "my run/1")
    assert q != p  # the short id keeps two runs started in the same second apart


def test_environment_info_records_git_packages_and_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    info = rundir.environment_info()
    assert re.fullmatch(r"[0-9a-f]{40}", info["git_commit"])  # the tests run inside the repo
    assert isinstance(info["git_dirty"], bool)
    assert info["packages"]["torch"] and info["packages"]["safetensors"] and info["packages"]["dflash-lab"]
    assert info["CUDA_VISIBLE_DEVICES"] == "3,1"
    assert "driver" in info and "nvml_gpus" in info and isinstance(info["gpus"], list)


def test_papermill_output_from_argv():
    cwd = Path("/work/x")
    parse = rundir.papermill_output_from_argv
    assert parse(["/v/bin/python", "/v/bin/papermill", "in.ipynb", "out.ipynb", "-p", "steps", "5"], cwd) == \
        cwd / "out.ipynb"
    assert parse(["python", "-m", "papermill", "-p", "a.ipynb", "b.ipynb", "--log-output", "in.ipynb",
                  "/abs/out.ipynb"], cwd) == Path("/abs/out.ipynb")  # -p takes two values, even if they look like paths
    assert parse(["papermill", "--cwd", "nb", "-k", "python3", "-y", "steps: 3", "in.ipynb", "o.ipynb"], cwd) == \
        cwd / "o.ipynb"
    assert parse(["papermill", "in.ipynb", "-"], cwd) is None
    assert parse(["papermill", "in.ipynb"], cwd) is None
    assert parse(["python", "train.py", "in.ipynb", "out.ipynb"], cwd) is None


def test_find_papermill_output_prefers_the_env_var(monkeypatch, tmp_path):
    monkeypatch.setenv(rundir.NOTEBOOK_ENV, str(tmp_path / "out.ipynb"))
    assert rundir.find_papermill_output() == (tmp_path / "out.ipynb").resolve()
    monkeypatch.delenv(rundir.NOTEBOOK_ENV)
    assert rundir.find_papermill_output() is None  # pytest's parent is not papermill


def _notebook(path, end_time=None, widget=False):
    out = {"output_type": "display_data", "metadata": {},
           "data": {"text/plain": ["view"], **({"application/vnd.jupyter.widget-view+json": {"model_id": "x"}}
                                                if widget else {})}}
    nb = {"cells": [{"cell_type": "code", "source": "1", "metadata": {}, "outputs": [out], "execution_count": 1}],
          "metadata": {"papermill": {"end_time": end_time}, **({"widgets": {"state": {}}} if widget else {})},
          "nbformat": 4, "nbformat_minor": 5}
    path.write_text(json.dumps(nb))


def test_save_executed_notebook_strips_widgets_and_skips_same_file(tmp_path, monkeypatch):
    src, run = tmp_path / "out.ipynb", tmp_path / "run"
    run.mkdir()
    _notebook(src, widget=True)
    monkeypatch.setenv(rundir.NOTEBOOK_ENV, str(src))
    dst = rundir.save_executed_notebook(run, wait_for_final=False)
    nb = json.loads(dst.read_text())
    assert "widgets" not in nb["metadata"]
    assert nb["cells"][0]["outputs"][0]["data"] == {"text/plain": ["view"]}
    monkeypatch.setenv(rundir.NOTEBOOK_ENV, str(run / "train.ipynb"))  # papermill writes into the run dir itself
    assert rundir.save_executed_notebook(run) == run / "train.ipynb"


def test_a_jupyterlab_kernel_copies_its_saved_notebook_and_a_plain_process_does_not(tmp_path, monkeypatch):
    lab, run = tmp_path / "lab" / "train.ipynb", tmp_path / "run"
    lab.parent.mkdir()
    run.mkdir()
    _notebook(lab, widget=True)
    monkeypatch.delenv(rundir.NOTEBOOK_ENV, raising=False)
    monkeypatch.setenv(rundir.LAB_SESSION_ENV, str(lab))  # what jupyter_server sets for the kernel of lab/train.ipynb
    monkeypatch.delitem(sys.modules, "ipykernel", raising=False)
    assert rundir.save_executed_notebook(run) is None  # e.g. a sweep's variant started from that kernel
    monkeypatch.setitem(sys.modules, "ipykernel", sys)  # inside the kernel
    copy = rundir.save_executed_notebook(run, "train.ipynb")
    assert copy == run / "train.ipynb" and "widgets" not in json.loads(copy.read_text())["metadata"]
    assert json.loads(copy.read_text())["cells"][0]["outputs"][0]["data"] == {"text/plain": ["view"]}


def test_copy_when_final_waits_for_the_kernel_and_the_final_write(tmp_path):
    src, dst = tmp_path / "out.ipynb", tmp_path / "copy.ipynb"
    _notebook(src)
    kernel = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.6)"])
    watcher = subprocess.Popen([sys.executable, "-m", "dflash_lab.runs.rundir", "--copy-final", str(src), str(dst),
                                str(kernel.pid)])
    time.sleep(0.3)
    assert not dst.exists()  # the kernel still runs
    kernel.wait()
    time.sleep(0.8)
    assert not dst.exists()  # kernel gone, but papermill has not written the final notebook yet
    _notebook(src, end_time="2026-01-01T00:00:00")
    assert watcher.wait(timeout=300) == 0
    assert json.loads(dst.read_text())["metadata"]["papermill"]["end_time"] == "2026-01-01T00:00:00"


def test_resume_metrics_cuts_back_to_the_checkpoint(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    lines = [json.dumps({"step": s, "loss": 1.0 / s}) for s in range(1, 8)]
    (run / rundir.METRICS_FILE).write_text("\n".join(lines) + '\n{"step": 8, "lo')  # torn last line (SIGKILL)
    rows = rundir.resume_metrics(run, 4, source=run)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert [json.loads(x)["step"] for x in (run / rundir.METRICS_FILE).read_text().splitlines()] == [1, 2, 3, 4]
    other = tmp_path / "new"
    other.mkdir()
    assert [r["step"] for r in rundir.resume_metrics(other, 2, source=run)] == [1, 2]
    assert not (other / rundir.METRICS_FILE).exists()  # a new run dir starts its own file
    assert rundir.read_jsonl(run / rundir.METRICS_FILE)[-1]["step"] == 4


def test_log_event_appends_json_lines(tmp_path):
    rundir.log_event(tmp_path, "checkpoint", step=3)
    rundir.log_event(tmp_path, "resumed", step=3, changed=[["steps", 10, 20]])
    ev = rundir.read_jsonl(tmp_path / rundir.EVENTS_FILE)
    assert [e["event"] for e in ev] == ["checkpoint", "resumed"] and ev[1]["changed"] == [["steps", 10, 20]]
    assert os.path.getsize(tmp_path / rundir.EVENTS_FILE) > 0


# --- one process per run directory (run_lock.py) ---------------------------------------------------------------------
_HOLDER = ("import sys, time; from dflash_lab.runs import rundir; "
           "rundir.open_run_dir(sys.argv[1], runs_dir='unused', name='x'); print('held', flush=True); time.sleep(60)")


def _hold_in_subprocess(run_dir):
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, str(run_dir)], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    lines = []
    while (line := proc.stdout.readline().strip()) != "held":
        assert line, f"the holder process exited: {lines}"
        lines.append(line)
    return proc, lines


def test_second_process_is_refused_naming_the_holder_then_a_killed_holder_is_taken_over(tmp_path):
    import pytest

    from dflash_lab.runs import lock as run_lock

    run_dir = tmp_path / "run"
    proc, _ = _hold_in_subprocess(run_dir)
    try:
        holder = run_lock.read_holder(run_dir)
        assert holder["pid"] == proc.pid and holder["host"] and holder["start_time"] <= time.time()
        with pytest.raises(run_lock.RunDirLocked, match=rf"in use by pid {proc.pid} on host .* since "):
            rundir.open_run_dir(run_dir, runs_dir=tmp_path, name="x")
        with pytest.raises(run_lock.RunDirLocked):  # resuming into it is refused the same way
            rundir.open_run_dir(None, runs_dir=tmp_path, name="x", resume_from=run_dir, resume_step=0)
    finally:
        proc.kill()
        proc.wait()
    assert run_lock.read_holder(run_dir)["pid"] == proc.pid  # the killed process left its lock file behind
    said = []
    try:
        assert run_lock.acquire(run_dir, log=said.append)["pid"] == os.getpid()
        assert len(said) == 1 and f"stale lock of pid {proc.pid}" in said[0]
        assert rundir.open_run_dir(run_dir, runs_dir=tmp_path, name="x")[0] == run_dir  # same process: re-entrant
        assert run_lock.read_holder(run_dir)["pid"] == os.getpid()
    finally:
        run_lock.release(run_dir)
    proc, said = _hold_in_subprocess(run_dir)  # released: another process may take it
    assert said == [] and run_lock.read_holder(run_dir)["pid"] == proc.pid  # a clean release is not "stale"
    proc.kill()
    proc.wait()


def test_resume_metrics_drops_garbage_and_stray_rows_and_says_so(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    good = [json.dumps({"step": s, "loss": 1.0 / s}) for s in (1, 2, 3)]
    # garbage a crash or a disk fault left, and a stray step-6 row of a process killed before an earlier resume to 3
    text = "\n".join([good[0], "123", "null", '{"step": "abc", "loss": 1}', good[1], good[2],
                      json.dumps({"step": 6, "loss": 0.1}), json.dumps({"step": 4, "loss": 0.25})]) + "\n"
    (run / rundir.METRICS_FILE).write_text(text)
    said = []
    rows = rundir.resume_metrics(run, 4, source=run, log=said.append)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    written = [json.loads(x) for x in (run / rundir.METRICS_FILE).read_text().splitlines()]
    assert [r["step"] for r in written] == [1, 2, 3, 4]
    assert len(said) == 1 and "metrics.jsonl: kept 4 rows" in said[0] and "(line 2, 3)" in said[0]
    assert "whose step is not an integer >= 1 (line 4)" in said[0]


def _used_run(path):
    """A finished run's folder: metric rows, an event, a checkpoint, a summary."""
    import torch

    from dflash_lab.runs import checkpoint

    (path / "checkpoints").mkdir(parents=True)
    (path / rundir.CONFIG_FILE).write_text('{"steps": 4}')
    (path / rundir.METRICS_FILE).write_text("".join(json.dumps({"step": s, "loss": 1.0}) + "\n" for s in (1, 2, 4)))
    rundir.log_event(path, "checkpoint", step=4)
    t = {"w": torch.zeros(2)}
    checkpoint.write_checkpoint(path / "checkpoints", 4, {checkpoint.DRAFTER_FILE: t, checkpoint.OPTIMIZER_FILE: t,
                                                          checkpoint.RNG_FILE: t}, {"format_version": 1, "step": 4})
    (path / "summary.json").write_text('{"status": "finished"}')
    return path


def test_a_fresh_run_into_a_used_run_dir_is_refused_naming_resume_from(tmp_path):
    import pytest

    from dflash_lab.runs import lock as run_lock

    used = _used_run(tmp_path / "used")
    before = (used / rundir.METRICS_FILE).read_bytes()
    try:
        with pytest.raises(rundir.RunDirUsed, match=r"already holds a run \(metrics.jsonl, events.jsonl, "
                                                    r"checkpoints/, summary.json\).*resume_from='.*used'"):
            rundir.open_run_dir(used, runs_dir=tmp_path, name="x")
        assert (used / rundir.METRICS_FILE).read_bytes() == before  # untouched
        with pytest.raises(rundir.RunDirUsed):  # a resume of ANOTHER run into it would mix them as well
            rundir.open_run_dir(used, runs_dir=tmp_path, name="x", resume_from=tmp_path / "other", resume_step=2)
        path, rows = rundir.open_run_dir(used, runs_dir=tmp_path, name="x", resume_from=used, resume_step=2)
        assert path == used and [r["step"] for r in rows] == [1, 2]  # continuing it is the way
        path, rows = rundir.open_run_dir(used, runs_dir=tmp_path, name="x", overwrite=True)
        assert rows == [] and sorted(p.name for p in used.iterdir()) == ["checkpoints", "plots", "run.lock"]
        assert not any((used / "checkpoints").iterdir())
    finally:
        run_lock.release(used)
    fresh = tmp_path / "fresh"  # a folder holding only config.json (a sweep or a torchrun launch wrote it) is fine
    fresh.mkdir()
    (fresh / rundir.CONFIG_FILE).write_text("{}")
    try:
        assert rundir.open_run_dir(fresh, runs_dir=tmp_path, name="x")[0] == fresh
    finally:
        run_lock.release(fresh)
