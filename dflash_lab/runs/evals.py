"""Where a run's evaluations live: `<run>/evals/<UTC stamp>-b<B>-t<T>-<dtype>/eval.json` (one folder per evaluation,
never overwritten; a legacy `<run>/eval.json` counts when there is no folder), and the headline figures of one.
Part of the run directory's layout, so run listings read it without importing the evaluator."""

from __future__ import annotations

import datetime as _dt
import json
from pathlib import Path

EVAL_FILE = "eval.json"
EVALS_DIR = "evals"


def pooled_tau(rows: list[dict]) -> float:
    """tau over all iterations of result rows or per-prompt results (each with iterations + accepted)."""
    its = sum(r["iterations"] for r in rows)
    acc = sum(r["accepted"] if isinstance(r["accepted"], int) else sum(r["accepted"]) for r in rows)
    return acc / its + 1 if its else 1.0


def eval_dir_name(block_size: int, temperature: float, dtype: str, *, now: _dt.datetime | None = None) -> str:
    """`<UTC stamp>-b<B>-t<T>-<dtype>`, e.g. 20261130T193000Z-b16-t0-bf16."""
    stamp = (now or _dt.datetime.now(_dt.timezone.utc)).strftime("%Y%m%dT%H%M%SZ")
    short = {"bfloat16": "bf16", "float32": "fp32", "float16": "fp16"}.get(dtype, dtype)
    return f"{stamp}-b{block_size}-t{temperature:g}-{short}"


def new_eval_dir(run_dir: str | Path, block_size: int, temperature: float, dtype: str) -> Path:
    """A folder that does not exist yet: <run_dir>/evals/<name>[-2, -3, ...] (not created)."""
    base = Path(run_dir) / EVALS_DIR / eval_dir_name(block_size, temperature, dtype)
    path, k = base, 2
    while path.exists():
        path, k = base.with_name(f"{base.name}-{k}"), k + 1
    return path


def eval_dirs(run_dir: str | Path) -> list[Path]:
    """Evaluation folders of a run holding an eval.json, oldest first (the stamp leads the name)."""
    root = Path(run_dir) / EVALS_DIR
    found = [p for p in root.iterdir() if (p / EVAL_FILE).is_file()] if root.is_dir() else []
    return sorted(found, key=lambda p: p.name)


def latest_eval(run_dir: str | Path) -> Path | None:
    """The eval.json of the newest evaluation of a run (a legacy <run>/eval.json when there is no evals/ folder)."""
    dirs = eval_dirs(run_dir)
    if dirs:
        return dirs[-1] / EVAL_FILE
    legacy = Path(run_dir) / EVAL_FILE
    return legacy if legacy.is_file() else None


def eval_summary(path: str | Path) -> dict:
    """Headline figures of a saved eval.json: trained tau, block size, temperature, dtype, step, speedup. Figures of
    the "heldout" prompt set when the evaluation has one (a row of its table), else pooled over its prompt sets.
    A cut-off or garbled eval.json gives no figures and says why under "eval_error" (listings go on)."""
    try:
        d = json.loads(Path(path).read_text())
        if not isinstance(d, dict):
            raise ValueError(f"a JSON {type(d).__name__}, not an object")
        trained = [r for r in d.get("summary", []) if r["decoder"] == "trained"]
        trained = [r for r in trained if r["prompt_set"] == "heldout"] or trained
        tau = pooled_tau(trained) if trained else None
    except (OSError, ValueError, KeyError, TypeError) as e:
        return {"eval_tau": None, "eval_block_size": None, "eval_temperature": None, "eval_dtype": None,
                "eval_step": None, "eval_speedup": None, "eval_dir": str(Path(path).parent),
                "eval_error": f"{path} cannot be read ({type(e).__name__}: {e})"}
    speed = [r["speedup"] for r in trained if isinstance(r.get("speedup"), (int, float)) and r["speedup"]]
    return {"eval_tau": tau, "eval_block_size": d.get("block_size"),
            "eval_temperature": d.get("temperature"), "eval_dtype": d.get("dtype"), "eval_step": d.get("step"),
            "eval_speedup": sum(speed) / len(speed) if speed else None, "eval_dir": str(Path(path).parent)}


def temperature_table(run_dir: str | Path) -> list[dict]:
    """The trained drafter's tau on each prompt set at every temperature this run was evaluated at (T=0 beside T=1
    when both were measured): the newest evaluation of each (temperature, block size, draft sampling), T=0 first.
    A cut-off eval.json is left out (eval_summary says why where a listing shows it)."""
    newest: dict[tuple, tuple[Path, dict]] = {}
    for folder in eval_dirs(run_dir):
        try:
            d = json.loads((folder / EVAL_FILE).read_text())
            key = (float(d["temperature"]), int(d["block_size"]), draft_sampling_of(d))
        except (OSError, ValueError, KeyError, TypeError):
            continue
        newest[key] = (folder, d)  # folders are oldest first: the last one of a key is its newest
    rows = []
    for (temperature, block, sampling), (folder, d) in sorted(newest.items()):
        for r in d.get("summary", []):
            if r.get("decoder") == "trained":
                rows.append({"temperature": temperature, "block_size": block,
                             "drafts": sampling if temperature > 0 else "argmax", "prompt_set": r["prompt_set"],
                             "prompts": r.get("prompts"), "tau": r.get("tau"), "tau_low": r.get("tau_low"),
                             "tau_high": r.get("tau_high"), "speedup": r.get("speedup"), "step": d.get("step"),
                             "eval_dir": folder.name})
    return rows


def draft_sampling_of(d: dict) -> str:
    """How a saved evaluation drew its drafts: "argmax", "sample" or "coupled". Its `draft_sampling` field; an
    eval.json written before that field existed says it only in its `decoding` line, read by drafts_of."""
    recorded = d.get("draft_sampling")
    return recorded if isinstance(recorded, str) and recorded else drafts_of(d.get("decoding") or "")


def drafts_of(decoding: str) -> str:
    """How an evaluation drafted, read from its `decoding` line (the prose evaluate.py writes): "argmax", "sample"
    or "coupled". Only for eval.json files older than the `draft_sampling` field."""
    if "drafts sampled" not in decoding:
        return "argmax"
    return "coupled" if "one shared uniform" in decoding else "sample"
