"""`make lab` serves working copies (lab/, gitignored), never the tracked notebooks; and it starts as root, remotely.

A JupyterLab session autosaves outputs into the notebook it runs; on the tracked notebooks/ that made `git status`
say modified. The browser test runs a whole session on such a copy; these tests pin the copy rules and the command
`make lab` runs, in well under a second."""

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from widgets.workspace import make_copies, report

ROOT = Path(__file__).resolve().parents[1]


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_copies_are_made_updated_when_unused_and_kept_when_used(tmp_path):
    src = tmp_path / "notebooks"
    shutil.copytree(ROOT / "notebooks", src)
    tracked = {p: _sha(p) for p in src.rglob("*.ipynb")}
    lab = tmp_path / "lab"

    first = make_copies(lab, src)
    assert "explore.ipynb" in first["copied"] and "recipes/smollm2.ipynb" in first["copied"]
    assert not any(r.startswith("results/") for r in first["copied"])  # executed examples are not drivers
    assert (lab / "explore.ipynb").read_bytes() == (src / "explore.ipynb").read_bytes()
    assert make_copies(lab, src)["current"] == first["copied"]

    (src / "train.ipynb").write_text((src / "train.ipynb").read_text().replace("Train a DFlash", "Train a new"))
    second = make_copies(lab, src)  # a pull changed train.ipynb; the copy was never used: it follows
    assert second["updated"] == ["train.ipynb"] and "Train a new" in (lab / "train.ipynb").read_text()

    (lab / "explore.ipynb").write_text((lab / "explore.ipynb").read_text() + " ")  # a lab session saved outputs
    (src / "explore.ipynb").write_text((src / "explore.ipynb").read_text().replace("# Explore", "# Explore!"))
    third = make_copies(lab, src)
    assert third["kept"] == ["explore.ipynb"] and (lab / "explore.ipynb").read_text().endswith(" ")
    assert "rename or delete lab/explore.ipynb" in report(third, lab)
    del tracked[src / "train.ipynb"], tracked[src / "explore.ipynb"]  # the two this test edited itself
    assert all(_sha(p) == h for p, h in tracked.items())  # making copies never writes to the source


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_lab_serves_the_copies_as_root_on_a_chosen_port(tmp_path):
    venv = tmp_path / "venv"
    # --no-print-directory: under `make test` this make is a sub-make, which would print "make[1]: Entering ..."
    out = subprocess.run(["make", "--no-print-directory", "-n", "-o", f"{venv}/.installed", "lab", f"VENV={venv}", f"LAB_DIR={tmp_path}/lab",
                          "LAB_PORT=8890", "LAB_ARGS=--no-browser --ip=127.0.0.1"], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[0] == f"{venv}/bin/python -m widgets.workspace --into {tmp_path}/lab"
    # once per environment: the announcements plugin (the news pop-up) off in the environment's page_config
    assert lines[1].startswith(f"{venv}/bin/jupyter labextension disable --level=sys_prefix "
                               "@jupyterlab/apputils-extension:announcements")
    lab = lines[2].split()
    assert lab[:3] == [f"{venv}/bin/jupyter", "lab", f"--notebook-dir={tmp_path}/lab"]
    assert "--port=8890" in lab and lab[-2:] == ["--no-browser", "--ip=127.0.0.1"]
    assert ("--allow-root" in lab) == (os.geteuid() == 0)  # "Running as root is not recommended" stopped it
    assert "/lab/" in (ROOT / ".gitignore").read_text().splitlines()


def test_runs_are_reachable_from_the_served_root_through_a_link(tmp_path, capsys):
    from widgets.workspace import link_runs, main

    runs, lab = tmp_path / "runs", tmp_path / "lab"
    lab.mkdir()
    assert link_runs(lab, runs) == f"runs/ -> {runs}" and (lab / "runs").resolve() == runs.resolve()
    (runs / "20260101T000000Z-x-abc123").mkdir()
    assert [p.name for p in (lab / "runs").iterdir()] == ["20260101T000000Z-x-abc123"]  # the runs, browsable
    assert link_runs(lab, runs) == f"runs/ -> {runs}"  # again: nothing to do
    other = tmp_path / "elsewhere"
    assert link_runs(lab, other) == f"runs/ -> {other}" and (lab / "runs").resolve() == other.resolve()
    own = tmp_path / "lab2" / "runs"
    own.mkdir(parents=True)
    assert link_runs(own.parent, runs).startswith(f"kept {own} (a folder of its own")
    assert os.environ.get("DFLASH_LAB_RUNS")  # tests/conftest.py: the command links the session's runs, not the user's
    assert main(["--into", str(tmp_path / "made")]) == 0
    assert f"runs: runs/ -> {os.environ['DFLASH_LAB_RUNS']}" in capsys.readouterr().out


def test_result_notebooks_open_from_the_lab(tmp_path):
    """`make lab` copies the result notebooks too (lab/results/, lab/recipes/results/): the file browser serves lab/
    only, so without a copy a newcomer could not open them."""
    from widgets.workspace import RESULTS, main

    lab = tmp_path / "lab"
    assert main(["--into", str(lab)]) == 0
    for folder in ("results", "recipes/results"):
        made = sorted(p.name for p in (lab / folder).glob("*.ipynb"))
        assert made == sorted(p.name for p in (ROOT / "notebooks" / folder).glob("*.ipynb")) and made
    again = make_copies(lab, patterns=RESULTS)
    assert not again["copied"] and len(again["current"]) == len(list((lab / "results").glob("*.ipynb"))) + len(
        list((lab / "recipes" / "results").glob("*.ipynb")))
