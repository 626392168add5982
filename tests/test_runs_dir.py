"""runs_dir resolves against the project root (or an absolute path / $DFLASH_LAB_RUNS), never the working directory:
a run started from a kernel in notebooks/ is listed by `python -m dflash_lab.runs list` from anywhere."""

from pathlib import Path

from dflash_lab.runs import rundir, listing as runs

ROOT = Path(__file__).resolve().parent.parent


def test_resolution_rules(tmp_path, monkeypatch):
    monkeypatch.delenv(rundir.RUNS_ENV, raising=False)
    monkeypatch.chdir(ROOT / "notebooks")  # where a JupyterLab kernel runs
    assert rundir.resolve_runs_dir("runs") == ROOT / "runs"
    assert rundir.resolve_runs_dir("out/runs") == ROOT / "out" / "runs"
    assert rundir.resolve_runs_dir(str(tmp_path)) == tmp_path
    monkeypatch.setenv(rundir.RUNS_ENV, str(tmp_path / "elsewhere"))
    assert rundir.resolve_runs_dir("runs") == tmp_path / "elsewhere"
    assert rundir.resolve_runs_dir("mine") == ROOT / "mine"  # an explicit relative runs_dir is not redirected


def test_a_run_made_from_notebooks_is_listed_from_another_directory(tmp_path, monkeypatch):
    monkeypatch.setenv(rundir.RUNS_ENV, str(tmp_path / "runs"))
    monkeypatch.chdir(ROOT / "notebooks")
    made = rundir.new_run_dir("runs", "from-kernel")
    rundir.write_json(made / rundir.CONFIG_FILE, {"run_name": "from-kernel"})
    assert made.parent == tmp_path / "runs"  # not notebooks/runs
    monkeypatch.chdir(tmp_path)
    assert runs.list_runs("runs") == [made]
