"""Real tau of several runs side by side, each with its interval and prompts, and which of them can be told apart.

One row per measurement: the newest evaluation of each run (one row per prompt set, trained drafter), the last
real tau logged while training, and the best one (best.json). Rows are compared only within a group measured the
same way: the same prompts (sha256), block size and new tokens per prompt; within a group, `not_separated_from`
lists the other runs whose 95% intervals overlap. Rows measured before intervals were recorded show none.
An eval.json that cannot be read (cut off while written, edited by hand) is skipped with a note naming it, and the
run's newest readable evaluation is shown instead: one damaged file must not cost the table of every run.
compare.ipynb shows this table.
"""

from __future__ import annotations

import json
from pathlib import Path

from dflash_lab.runs.evals import EVAL_FILE, eval_dirs
from dflash_lab.runs.rundir import CONFIG_FILE, METRICS_FILE, read_jsonl
from dflash_lab.runs.run_files import RunFileError, read_json
from .intervals import TauInterval, not_separated, stored_interval

COLUMNS = ("run", "measured", "prompt_set", "prompts", "sha256", "block_size", "new_tokens", "step", "tau",
           "tau_low", "tau_high", "not_separated_from")


def _config(run_dir: Path) -> dict:
    try:
        return json.loads((run_dir / CONFIG_FILE).read_text())
    except (OSError, ValueError):
        return {}


def _training_rows(run_dir: Path) -> list[dict]:
    cfg = _config(run_dir)
    logged = [r for r in read_jsonl(run_dir / METRICS_FILE) if r.get("real_tau") is not None]
    best = None
    try:
        best = json.loads((run_dir / "best.json").read_text())
    except (OSError, ValueError):
        pass
    out = []
    for what, r in (("training (last)", logged[-1] if logged else None), ("training (best)", best)):
        if r:
            out.append({"measured": what, "prompt_set": "held-out (training)", "prompts": r.get("real_tau_prompts"),
                        "sha256": r.get("real_tau_sha256"), "block_size": cfg.get("block_size"),
                        "new_tokens": r.get("real_tau_new_tokens", cfg.get("real_tau_new_tokens")),
                        "step": r.get("step"), "tau": r["real_tau"], "tau_low": r.get("real_tau_low"),
                        "tau_high": r.get("real_tau_high")})
    return out


def _evaluation_rows(path: Path) -> list[dict]:
    """The trained drafter's rows of one eval.json; RunFileError naming the file when it cannot be read."""
    d = read_json(path)
    try:
        return [{"measured": f"evaluation {path.parent.name}", "prompt_set": r["prompt_set"],
                 "prompts": r.get("prompts"), "sha256": r.get("prompt_set_sha256"), "block_size": r.get("block_size"),
                 "new_tokens": d.get("max_new_tokens"), "step": d.get("step"), "tau": float(r["tau"]),
                 "tau_low": r.get("tau_low"), "tau_high": r.get("tau_high")}
                for r in d.get("summary", []) if r["decoder"] == "trained"]
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise RunFileError(f"{path} has a summary row without its figures ({type(e).__name__}: {e}).") from None


def _newest_readable_evaluation(run_dir: Path, log) -> list[dict]:
    legacy = run_dir / EVAL_FILE
    candidates = [p / EVAL_FILE for p in reversed(eval_dirs(run_dir))] or ([legacy] if legacy.is_file() else [])
    for path in candidates:
        try:
            return _evaluation_rows(path)
        except RunFileError as e:
            log(f"tau table: skipped {e}")
    return []


def run_taus(run_dirs, *, log=print) -> list[dict]:
    """The rows of COLUMNS for run directories (see the module docstring); `log` gets one line per skipped file."""
    rows = []
    for d in map(Path, [run_dirs] if isinstance(run_dirs, (str, Path)) else run_dirs):
        rows += [{"run": d.name, **r} for r in _newest_readable_evaluation(d, log) + _training_rows(d)]
    groups: dict[tuple, dict[str, TauInterval | None]] = {}
    for i, r in enumerate(rows):
        iv = stored_interval(r["tau"], r["tau_low"], r["tau_high"], r["prompts"])  # < 5 prompts: n/a, not apart
        if r["sha256"] and iv is not None:
            key = (r["sha256"], r["block_size"], r["new_tokens"], r["measured"].split(" ")[0])
            groups.setdefault(key, {})[i] = iv
    for members in groups.values():
        for i, others in not_separated(members).items():
            rows[i]["not_separated_from"] = sorted({rows[j]["run"] for j in others} - {rows[i]["run"]})
    return [{c: r.get(c) for c in COLUMNS} for r in rows]


def tau_table(run_dirs, *, log=print) -> "pandas.DataFrame":  # noqa: F821
    """run_taus as a DataFrame with short checksums ("-" where a figure was not recorded)."""
    import pandas as pd

    rows = run_taus(run_dirs, log=log)
    for r in rows:
        r["sha256"] = (r["sha256"] or "-")[:12]
        r["not_separated_from"] = "-" if r["not_separated_from"] is None else (", ".join(r["not_separated_from"])
                                                                              or "separated from all")
    return pd.DataFrame(rows, columns=list(COLUMNS)).round({"tau": 3, "tau_low": 3, "tau_high": 3})
