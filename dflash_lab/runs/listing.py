"""List run directories and load their metrics into pandas DataFrames (compare.ipynb and ad-hoc analysis).

    from dflash_lab.runs import listing as runs
    dirs = runs.list_runs("runs")            # newest first: [Path('runs/20250101T120000Z-train-a1b2c3'), ...]
    runs.runs_table(dirs)                     # one row per run: status, steps, last loss, tokens/s, memory, eval tau
    runs.compact_table(runs.runs_table(dirs)) # the same as short text columns: what `runs list` and compare show
    frame = runs.load_metrics(dirs)           # one row per logged step, column `run` names the run

Command line:
    python -m dflash_lab.runs list [--runs-dir runs]
    python -m dflash_lab.runs compare [RUN_DIR ...] [--runs-dir runs] [--newest 4] [--out runs/compare.ipynb]
        executes notebooks/compare.ipynb with papermill and writes an HTML export next to the output notebook.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from . import rundir
from .evals import eval_summary, latest_eval
from .gpu_time import best_tau
from .run_state import run_status  # noqa: F401 (listed here, where the table reads it)
from .run_files import RunFileError, read_json, read_metrics

REPO = Path(__file__).resolve().parents[2]


def is_run_dir(path: Path) -> bool:
    return path.is_dir() and (path / rundir.CONFIG_FILE).is_file()


def list_runs(runs_dir: str | Path = "runs", *, newest_first: bool = True) -> list[Path]:
    """Run directories under `runs_dir` (those with a config.json), ordered by their UTC stamp."""
    root = rundir.resolve_runs_dir(runs_dir)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if is_run_dir(p)]
    found.sort(key=lambda p: ((rundir.run_folder_parts(p) or {}).get("stamp", ""), p.stat().st_mtime),
               reverse=newest_first)
    return found


DEMO_NAME = "demo"  # `make demo`'s run folders: runs/demo-<stamp>-<id> (before: <stamp>-demo-<id>)
ENDED = ("finished", "stopped", "diverged")  # run states that compare prefers (not interrupted, killed, running)


def default_selection(found: list[Path], newest: int) -> list[Path]:
    """Which runs compare takes when none are named: finished runs first, then runs that ended otherwise (stopped,
    diverged), then the rest (interrupted, killed, running), newest first within each, and the newest demo run among
    the ended ones; shown newest first. Runs stopped after a few steps (a Stop click while trying the dashboard) or
    aborted attempts then no longer push finished runs out of the default comparison."""
    return _select(found, newest)[0]


def _select(found: list[Path], newest: int) -> tuple[list[Path], dict[Path, str]]:
    status = {p: run_status(p) for p in found}
    finished = [p for p in found if status[p].startswith("finished")]
    ended = [p for p in found if status[p].startswith(ENDED) and p not in finished]
    pick = (finished + ended)[:newest]
    demo = next((p for p in finished + ended if (rundir.run_folder_parts(p) or {}).get("name") == DEMO_NAME), None)
    if demo is not None and demo not in pick and pick:
        pick[-1] = demo
    pick += [p for p in found if p not in pick][:newest - len(pick)]
    order = {p: i for i, p in enumerate(found)}
    return sorted(pick, key=order.get), status


def selection_note(found: list[Path], newest: int) -> str:
    """What compare picked by default and what it left out, in one line: `compared 4 run(s) of 6: 3 finished,
    1 stopped (finished runs first, then other ended runs); left out 2 newer: <run> (stopped at step 17), ...`."""
    pick, status = _select(found, newest)
    counts: dict[str, int] = {}
    for p in pick:
        word = status[p].split(" ")[0]
        counts[word] = counts.get(word, 0) + 1
    said = ", ".join(f"{n} {w}" for w, n in counts.items())
    newer = [p for p in found[:found.index(pick[-1])] if p not in pick] if pick else []
    note = f"compared {len(pick)} run(s) of {len(found)}: {said} (finished runs first, then other ended runs)"
    if newer:
        left = ", ".join(f"{p.name} ({status[p]}{_at_step(p)})" for p in newer[:4])
        note += f"; left out {len(newer)} newer: {left}{' ...' if len(newer) > 4 else ''}"
    return note + ". Name runs to compare others: python -m dflash_lab.runs compare RUN_DIR ..."


def _at_step(run_dir: Path) -> str:
    rows = read_metrics(run_dir / rundir.METRICS_FILE) if (run_dir / rundir.METRICS_FILE).is_file() else []
    step = next((r["step"] for r in reversed(rows) if isinstance(r.get("step"), int)), None)
    return f", step {step}" if step is not None else ""


def resolve_runs(run_dirs=(), *, runs_dir: str | Path = "runs", newest: int = 4) -> list[Path]:
    """The given run directories (checked), or `newest` runs in `runs_dir` when none are given (default_selection)."""
    if isinstance(run_dirs, (str, Path)):
        run_dirs = [run_dirs]
    if not run_dirs:
        found = default_selection(list_runs(runs_dir), newest)
        if not found:
            raise FileNotFoundError(f"no run directories (with a config.json) under {rundir.resolve_runs_dir(runs_dir)}. "
                                    "Fix: train first (notebooks/train.ipynb) or pass run_dirs explicitly.")
        return found
    out = []
    for d in run_dirs:
        p = Path(d).expanduser()
        if not is_run_dir(p):
            raise FileNotFoundError(f"{d!r} is not a run directory (no {rundir.CONFIG_FILE}). Fix: pass folders "
                                    f"like runs/<name>-<stamp>-<id>; available: {[q.name for q in list_runs(runs_dir)][:8]}")
        out.append(p)
    return out


def run_label(run_dir: Path) -> str:
    """`<name>-<id>` plus the stamp's date and time, short enough for a legend."""
    parts = rundir.run_folder_parts(run_dir)
    if parts is None:
        return Path(run_dir).name
    stamp = parts["stamp"]
    return f"{parts['name']}-{parts['id']} ({stamp[4:8]}-{stamp[9:13]})"


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def run_config(run_dir: Path) -> tuple[dict, str | None]:
    """(config.json as a dict, None), or ({}, why) when it is cut off or not an object."""
    try:
        return read_json(Path(run_dir) / rundir.CONFIG_FILE), None
    except RunFileError as e:
        return {}, str(e)


def run_metrics(run_dir: Path, notes: list | None = None) -> list[dict]:
    """metrics.jsonl of a run as checked rows in step order (run_files.read_metrics; rows past the configured steps
    are left out); what was skipped is appended to `notes` as one line naming the file."""
    cfg, _ = run_config(run_dir)
    steps = cfg.get("steps")
    rows = read_metrics(Path(run_dir) / rundir.METRICS_FILE,
                        max_step=steps if isinstance(steps, int) and not isinstance(steps, bool) else None)
    if notes is not None and rows.note():
        notes.append(rows.note())
    return rows


def _memory_gb(row: dict) -> float | None:
    gpu = [v for k, v in row.items() if k.startswith("mem_gb/") and _is_number(v)]
    return max(gpu) if gpu else (row["rss_gb"] if _is_number(row.get("rss_gb")) else None)


def load_metrics(run_dirs, *, log=print) -> "pandas.DataFrame":  # noqa: F821
    """One row per logged step of every run; columns: run, label, step, loss, tokens_per_s, memory_gb, sim_tau, ...

    `memory_gb` is the largest per-GPU allocation of the step (process RSS for CPU runs); `slot_acc` stays a list.
    Lines of metrics.jsonl that are torn, garbage or out of step order are left out, each file's said through `log`
    (and kept in `frame.attrs["skipped"]`).
    """
    import pandas as pd

    frames, notes = [], []
    for d in ([run_dirs] if isinstance(run_dirs, (str, Path)) else run_dirs):
        d = Path(d)
        rows = run_metrics(d, notes)
        if not rows:
            continue
        for r in rows:
            r["memory_gb"] = _memory_gb(r)
        _add_latest_eval(rows, d)
        f = pd.DataFrame(rows)
        f.insert(0, "run", d.name)
        f.insert(1, "label", run_label(d))
        frames.append(f)
    _say(notes, log)
    if not frames:
        frame = pd.DataFrame(columns=["run", "label", "step", "loss", "tokens_per_s", "memory_gb", "sim_tau"])
    else:
        frame = pd.concat(frames, ignore_index=True, sort=False)
    frame.attrs["skipped"] = notes
    return frame


def _say(notes: list[str], log) -> None:
    if log is not None:
        for n in notes:
            log(f"NOTE: {n}")


def _add_latest_eval(rows: list[dict], run_dir: Path) -> None:
    """Put the latest evaluation's trained tau (evals/<...>/eval.json) on the logged row of the evaluated step, so the
    real-tau points of compare.ipynb include it; periodic eval_tau values logged while training are kept."""
    found = latest_eval(run_dir)
    if found is None:
        return
    ev = eval_summary(found)
    if ev["eval_tau"] is None:
        return
    step = ev["eval_step"] if _is_number(ev["eval_step"]) else rows[-1]["step"]
    row = min(rows, key=lambda r: abs(r["step"] - step))
    if row.get("eval_tau") is None:
        row["eval_tau"] = ev["eval_tau"]


def load_system(run_dirs) -> "pandas.DataFrame":  # noqa: F821
    """system.jsonl (GPU monitor samples) of every run, with a `run` column."""
    import pandas as pd

    frames = []
    for d in ([run_dirs] if isinstance(run_dirs, (str, Path)) else run_dirs):
        rows = rundir.read_jsonl(Path(d) / rundir.SYSTEM_FILE)
        if rows:
            f = pd.json_normalize(rows)
            f.insert(0, "run", Path(d).name)
            frames.append(f)
    return pd.concat(frames, ignore_index=True, sort=False) if frames else pd.DataFrame(columns=["run"])


def _eval_columns(run_dir: Path, metrics: list[dict]) -> dict:
    """eval_tau / eval_block_size / eval_speedup: the run's latest evaluation (trained drafter, its heldout row);
    heldout_tau: the last real tau on held-out prompts logged while training (`real_tau` of the validator, or
    `eval_tau` of eval_every), which eval_tau falls back to; val_sim_tau: the last held-out simulated tau."""
    found = latest_eval(run_dir)
    ev = eval_summary(found) if found else {}
    logged = _last_logged(metrics, "real_tau", "eval_tau")
    logged_step = next((r["step"] for r in reversed(metrics) if r.get("real_tau") is not None
                        or r.get("eval_tau") is not None), None)
    own = ev.get("eval_tau") is not None
    return {"eval_tau": ev["eval_tau"] if own else logged, "eval_step": ev.get("eval_step") if own else logged_step,
            "eval_block_size": ev.get("eval_block_size"), "eval_speedup": ev.get("eval_speedup"),
            "heldout_tau": logged, "val_sim_tau": _last_logged(metrics, "val_sim_tau")}


def _best_tau_columns(metrics: list[dict]) -> dict:
    """The best real tau measured while training, and the GPU-minutes the run had spent when it measured it."""
    best = best_tau(metrics)
    return {"best_tau": best["tau"] if best else None, "best_tau_step": best["step"] if best else None,
            "best_tau_gpu_minutes": best["gpu_minutes"] if best else None}


def _last_logged(metrics: list[dict], *keys: str):
    """The newest value any of `keys` was logged with (None if never)."""
    return next((r[k] for r in reversed(metrics) for k in keys if r.get(k) is not None), None)


def runs_table(run_dirs, *, log=print) -> "pandas.DataFrame":  # noqa: F821
    """One row per run: status, steps, final loss, simulated tau, steady tokens/s, peak memory, key settings.

    A damaged file costs only its own run's cells: a cut-off config.json leaves the settings empty (status says
    so), torn or garbage metric lines are left out; each such file is said through `log` and kept in
    `table.attrs["skipped"]`."""
    import pandas as pd

    rows, notes = [], []
    for d in ([run_dirs] if isinstance(run_dirs, (str, Path)) else run_dirs):
        d = Path(d)
        cfg, bad_config = run_config(d)
        if bad_config:
            notes.append(bad_config)
        metrics = run_metrics(d, notes)
        events = rundir.read_jsonl(d / rundir.EVENTS_FILE)
        if events.note():
            notes.append(events.note())
        last = metrics[-1] if metrics else {}
        steady = [r["steady_tokens_per_s"] for r in metrics if _is_number(r.get("steady_tokens_per_s"))]
        mem = [m for m in (_memory_gb(r) for r in metrics) if _is_number(m)]
        devices = cfg.get("devices")
        rows.append({
            "run": d.name, "status": "config.json unreadable" if bad_config else run_status(d),
            "step": last.get("step", 0), "steps": cfg.get("steps"),
            "loss": last.get("loss"), "sim_tau": last.get("sim_tau"), "acc": last.get("acc"),
            **_eval_columns(d, metrics), **_best_tau_columns(metrics),
            "tokens_per_s": steady[-1] if steady else last.get("tokens_per_s"),
            "peak_memory_gb": max(mem) if mem else None,
            "target": cfg.get("target"), "devices": ",".join(map(str, devices)) if isinstance(devices, list) else None,
            "seq_len": cfg.get("seq_len"), "batch_size": cfg.get("batch_size"), "block_size": cfg.get("block_size"),
            "num_anchors": cfg.get("num_anchors"), "lr": cfg.get("lr"),
            "resumed": any(e.get("event") == "resumed" for e in events),
        })
    _say(notes, log)
    table = pd.DataFrame(rows).set_index("run") if rows else pd.DataFrame()
    table.attrs["skipped"] = notes
    return table


# Short text columns: (header, runs_table column, format). Every missing value prints "-" (never NaN or None).
COMPACT_COLUMNS = (("status", "status", "s"), ("step", "step", "step"), ("loss", "loss", ".3f"),
                   ("sim tau", "sim_tau", ".2f"), ("val tau", "val_sim_tau", ".2f"), ("real tau", "heldout_tau", ".2f"),
                   ("eval tau", "eval_tau", "tau@step"), ("best", "best_tau", "tau@min"),
                   ("tok/s", "tokens_per_s", "rate"), ("GiB", "peak_memory_gb", ".1f"),
                   ("target", "target", "name"))


def compact_table(table) -> "pandas.DataFrame":  # noqa: F821
    """runs_table as short strings, ~110 characters for a run: what `runs list` prints and compare.ipynb shows.

    sim tau: simulated on the last training batch; val tau: simulated on held-out conversations; real tau: real
    speculative decoding on held-out prompts while training; eval tau: the newest evaluation (evals/), held-out set,
    with `@step N` when it measured an earlier step than the run's last.
    tok/s: steady sequence tokens/s; GiB: peak memory per device (CPU runs: process RSS)."""
    import pandas as pd

    rows = {}
    for run, r in table.iterrows():
        rows[run] = {head: _cell(r.get(col), fmt, r) for head, col, fmt in COMPACT_COLUMNS}
    out = pd.DataFrame.from_dict(rows, orient="index", columns=[h for h, _, _ in COMPACT_COLUMNS])
    out.index.name = "run"
    return out


def _cell(value, fmt: str, row) -> str:
    if fmt == "step":  # a cut-off config.json leaves steps unknown (NaN in the frame): the step alone
        step, total = (int(v) if _is_number(v) and v == v else None for v in (value, row.get("steps")))
        return f"{step or 0}/{total}" if total else f"{step or 0}"
    if value is None or (isinstance(value, float) and value != value):
        return "-"
    if fmt == "tau@step":  # an evaluation of an earlier step than the run's last says which step it measured
        at = row.get("eval_step")
        stale = _is_number(at) and at == at and _is_number(row.get("step")) and at < row.get("step")
        return f"{value:.2f} @step {int(at)}" if stale else f"{value:.2f}"
    if fmt == "tau@min":  # the best real tau while training, and the GPU-minutes spent to reach it
        minutes = row.get("best_tau_gpu_minutes")
        return f"{value:.2f}@{minutes:.3g}" if _is_number(minutes) and minutes == minutes else f"{value:.2f}"
    if fmt == "rate":
        v = float(value)
        return f"{v / 1e6:.2f}M" if v >= 1e6 else f"{v / 1e3:.1f}k" if v >= 1e3 else f"{v:.0f}"
    if fmt == "name":  # a folder or hub id: its last part, at most 20 characters
        name = str(value).rstrip("/").rsplit("/", 1)[-1]
        return name if len(name) <= 20 else name[:19] + "~"
    return format(value, fmt) if fmt != "s" else str(value)


_ANY_STAMP = re.compile(r"\d{8}T\d{6}Z-")


def fit_page(frame) -> "pandas.DataFrame":  # noqa: F821
    """A table of runs as it should be shown on a page: run folder names without their UTC stamp (`<name>-<id>`; the
    stamp is in `runs list`), stamps dropped from evaluation folder names, every missing value "-", headers with
    spaces so they can wrap. With full folder names a table was 1,136 px wide at a 1,024 px page (compare.ipynb)."""
    def cell(v):
        if v is None or (isinstance(v, float) and v != v):
            return "-"
        return _ANY_STAMP.sub("", v) if isinstance(v, str) else v

    out = frame.copy()
    out.index = [cell(i) for i in out.index]
    for col in out.columns:
        out[col] = [cell(v) for v in out[col]]
    out.columns = [str(c).replace("_", " ") for c in out.columns]  # headers that can wrap ("not separated from")
    return out


# ---------------------------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------------------------
def compare(run_dirs, *, runs_dir: str = "runs", newest: int = 4, out: str | Path = "runs/compare.ipynb") -> Path:
    """Execute notebooks/compare.ipynb headless into `out` and write `out` as HTML next to it; returns the HTML."""
    import nbformat
    from nbconvert import HTMLExporter

    from .notebook_exec import execute

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    selected = [str(Path(p).resolve()) for p in resolve_runs(run_dirs, runs_dir=runs_dir, newest=newest)]
    root = rundir.resolve_runs_dir(runs_dir)
    note = "" if run_dirs else selection_note(list_runs(runs_dir), newest)  # the default's choice, said on the page
    execute(REPO / "notebooks" / "compare.ipynb", out, cwd=REPO, log_output=False, relative_to=[root.parent],
            parameters={"run_dirs": selected, "runs_dir": str(root), "newest": newest})
    body, _ = HTMLExporter().from_notebook_node(nbformat.read(str(out), as_version=4))
    if note:
        import html as _html

        body = re.sub(r"(<body[^>]*>)", lambda m: m.group(1) + '<p class="dfl-selection" style="font-family:'
                      f'sans-serif;font-size:14px;margin:8px 16px">{_html.escape(note)}</p>', body, count=1)
    html = out.with_suffix(".html")
    html.write_text(body)
    return html


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dflash_lab.runs", description="List and compare run directories.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    ls = sub.add_parser("list", help="one line per run, newest first")
    ls.add_argument("--runs-dir", default="runs")
    cp = sub.add_parser("compare", help="execute notebooks/compare.ipynb and export it to HTML")
    cp.add_argument("run_dirs", nargs="*", help="run directories (default: the newest runs in --runs-dir)")
    cp.add_argument("--runs-dir", default="runs")
    cp.add_argument("--newest", type=int, default=4, help="how many newest runs when no RUN_DIR is given")
    cp.add_argument("--out", default="runs/compare.ipynb", help="executed notebook; the .html goes next to it")
    args = ap.parse_args(argv)
    if args.cmd == "list":
        table = runs_table(list_runs(args.runs_dir), log=lambda s: print(s, file=sys.stderr))
        if not len(table):
            print(f"no runs under {args.runs_dir}")
            return 0
        text = compact_table(table).reset_index()
        width = max(len(r) for r in text["run"])
        print(text.to_string(index=False, formatters={"run": lambda r: r.ljust(width)}))  # in full, never "..."
        print("sim tau: training batch | val tau: held-out, simulated | real tau: held-out, real decoding while "
              "training\nbest: best real tau while training @ the GPU-minutes (devices x wall time) spent to reach it"
              "\neval tau: newest evaluation (evals/) | tok/s: steady sequence tokens/s | GiB: peak per device"
              " (CPU runs: RSS)")
        return 0
    if not args.run_dirs:
        found = list_runs(args.runs_dir)
        if found:
            print(selection_note(found, args.newest))
    html = compare(args.run_dirs, runs_dir=args.runs_dir, newest=args.newest, out=args.out)
    print(f"wrote {Path(args.out)} and {html}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
