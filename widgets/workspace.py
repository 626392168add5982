"""Working copies of the driver notebooks for a JupyterLab session, so the tracked notebooks/ never change.

    python -m widgets.workspace [--into lab]      # `make lab` runs this, then serves lab/ (gitignored)

JupyterLab saves outputs and widget state into the notebook it runs (autosave every two minutes): a session on
notebooks/explore.ipynb turned the 7.6 kB tracked file into 29 kB and `git status` said modified. Two ways out were
weighed: nbstripout as a git filter hides outputs from git, but needs a package and a git config in every clone, and
the file on disk still changes (a `git pull` then overwrites a user's outputs silently). Working copies outside the
tracked tree need nothing but Python: the user's runs and edits stay in lab/<name>.ipynb, the tracked notebook stays
as committed, and papermill keeps reading notebooks/ (headless commands, `notebook_params` defaults).

The runs are reachable from the same root: `lab/runs` is a link to the project's runs folder (`runs/`, or
$DFLASH_LAB_RUNS), so executed notebooks, evaluations, plots and compare.html open from JupyterLab's file browser and
a run path (eval.ipynb's `run`) can be browsed for, while the tracked notebooks/ stay outside the served root. A real
folder already at lab/runs is left alone and said.

A copy is made when missing. When the tracked notebook changes later (a pull), a copy still identical to the version
it was made from is replaced by the new one; a copy someone used or edited is kept, and the message says how to take
the new version (delete the copy). What each copy was made from is in lab/.sources.json (sha256 per notebook).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
DRIVERS = ("*.ipynb", "recipes/*.ipynb")
# The executed result notebooks (what a run looks like, the measured results), copied to the same relative paths so
# the file browser opens them; the same update rules as the drivers (a copy someone ran is kept).
RESULTS = ("results/*.ipynb", "recipes/results/*.ipynb")
SOURCES = ".sources.json"
RUNS_LINK = "runs"


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def make_copies(into: str | Path = ROOT / "lab", source: Path = NOTEBOOKS,
                patterns: tuple[str, ...] = DRIVERS) -> dict[str, list[str]]:
    """Copy each notebook of `source` matching `patterns` (default: the drivers) into `into` as the rules above say;
    returns what happened to which notebook: {"copied": [...], "updated": [...], "kept": [...], "current": [...]}
    (paths relative to `into`)."""
    into = Path(into)
    into.mkdir(parents=True, exist_ok=True)
    manifest_path = into / SOURCES
    try:
        made_from = json.loads(manifest_path.read_text())
    except (OSError, ValueError):
        made_from = {}
    out: dict[str, list[str]] = {"copied": [], "updated": [], "kept": [], "current": []}
    for pattern in patterns:
        for nb in sorted(source.glob(pattern)):
            rel = nb.relative_to(source).as_posix()
            dst, sha = into / rel, _sha(nb)
            if not dst.exists():
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(nb, dst)
                made_from[rel] = sha
                out["copied"].append(rel)
            elif made_from.get(rel) == sha:
                out["current"].append(rel)
            elif made_from.get(rel) is not None and _sha(dst) == made_from[rel]:  # untouched copy of an old version
                shutil.copyfile(nb, dst)
                made_from[rel] = sha
                out["updated"].append(rel)
            else:
                out["kept"].append(rel)
    manifest_path.write_text(json.dumps(made_from, indent=1, sort_keys=True) + "\n")
    return out


def link_runs(into: str | Path, runs: Path | None = None) -> str:
    """`into/runs` -> the runs folder (made if missing); returns what was done, for the report."""
    from dflash_lab.runs.rundir import resolve_runs_dir

    runs = Path(runs) if runs is not None else resolve_runs_dir("runs")
    link = Path(into) / RUNS_LINK
    if link.is_symlink() and link.resolve() == runs.resolve():
        return f"{link.name}/ -> {runs}"
    if link.exists() and not link.is_symlink():
        return f"kept {link} (a folder of its own, not a link to {runs}): runs are in {runs}"
    runs.mkdir(parents=True, exist_ok=True)
    if link.is_symlink():  # a link to another runs folder (DFLASH_LAB_RUNS changed)
        link.unlink()
    link.symlink_to(runs, target_is_directory=True)
    return f"{link.name}/ -> {runs}"


def report(result: dict[str, list[str]], into: Path) -> str:
    lines = [f"working copies in {into}/ (the tracked notebooks/ stay unmodified)"]
    if result.get("runs"):
        lines.append(f"  runs: {result['runs']}")
    if result["copied"]:
        lines.append(f"  copied: {', '.join(result['copied'])}")
    lines.append(f"  result notebooks (executed examples, what each ran on and how to read it): {into.name}/results/, "
                 f"{into.name}/recipes/results/")
    if result["updated"]:
        lines.append(f"  updated to the new version (unused copies): {', '.join(result['updated'])}")
    for rel in result["kept"]:
        lines.append(f"  kept your {into.name}/{rel}: notebooks/{rel} has changed since; to take the new version, "
                     f"rename or delete {into.name}/{rel} and run `make lab` again")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m widgets.workspace", description=__doc__.split("\n")[0])
    ap.add_argument("--into", default=str(ROOT / "lab"), help="folder for the working copies (default: lab/)")
    args = ap.parse_args(argv)
    into = Path(args.into)
    result = make_copies(into)
    for key, names in make_copies(into, patterns=RESULTS).items():
        result[key] += names
    result["runs"] = link_runs(into)
    print(report(result, into))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
