"""Reading a run's files back: JSONL rows with every skipped line counted per file, metric rows checked and kept in
step order, JSON objects whose damage names the file.

A run directory is written by processes that can be killed mid-line, resumed, or share a disk that fills up, and is
read by `runs list`, compare, the dashboard, resume and sweep results. One torn or garbage line (`123`, `null`, a
string, a step "abc") must cost that line, never the listing of every run, and never silently: each reader gets the
rows plus `skipped` ({reason: [line numbers]}) and `note()`, one sentence naming the file.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

REASONS = {
    "torn_last_line": "torn last line (a writer killed mid-line, or still writing)",
    "not_json": "line(s) that are not JSON",
    "not_an_object": "line(s) that are JSON but not an object",
    "bad_step": "row(s) whose step is not an integer >= 1",
    "bad_loss": "row(s) whose loss is not a number",
    "non_finite_loss": "row(s) with a NaN/inf loss before the last row (only a diverged run's last row has one)",
    "past_steps": "row(s) past the run's configured steps",
    "superseded": "row(s) recomputed later (a resume went back to an earlier step; the later rows are kept)",
}


class RunFileError(ValueError):
    """A run file (config.json, summary.json, sweep.json) is cut off or not a JSON object; names the file."""


class JsonlRows(list):
    """The rows of a JSONL file (a list of dicts) and what was left out of it: `skipped` {reason: [line numbers]}."""

    def __init__(self, rows=(), path: Path | None = None, skipped: dict | None = None):
        super().__init__(rows)
        self.path = path
        self.skipped: dict[str, list[int]] = skipped if skipped is not None else {}

    def skip(self, reason: str, lineno: int) -> None:
        self.skipped.setdefault(reason, []).append(lineno)

    @property
    def skipped_count(self) -> int:
        return sum(len(v) for v in self.skipped.values())

    def note(self) -> str | None:
        """One sentence naming the file and every kind of line left out (with up to 5 line numbers), or None."""
        if not self.skipped:
            return None
        parts = []
        for reason, lines in self.skipped.items():
            where = ", ".join(map(str, lines[:5])) + (" ..." if len(lines) > 5 else "")
            parts.append(f"{len(lines)} {REASONS.get(reason, reason)} (line {where})")
        return f"{self.path}: kept {len(self)} rows, skipped " + "; ".join(parts)


def _lines(path: Path):
    """(line number, text or None if undecodable, whether the line ended with a newline) of a file."""
    data = path.read_bytes()
    raw = data.split(b"\n")
    last = len(raw) - 1
    for i, line in enumerate(raw):
        if i == last and not line:
            break  # the file ended with a newline
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        yield i + 1, text, i < last


def parse_jsonl(path: str | Path):
    """(rows, lines): the JSON objects of a file as JsonlRows (bad lines counted) and their raw text, in order."""
    p = Path(path)
    rows, lines = JsonlRows(path=p), []
    if not p.is_file():
        return rows, lines
    for lineno, text, complete in _lines(p):
        if text is not None and not text.strip():
            continue
        try:
            if text is None:
                raise ValueError("not UTF-8")
            obj = json.loads(text)
        except ValueError:  # json.JSONDecodeError is one
            rows.skip("not_json" if complete else "torn_last_line", lineno)
            continue
        if not isinstance(obj, dict):
            rows.skip("not_an_object", lineno)
            continue
        obj["_line"] = lineno
        rows.append(obj)
        lines.append(text)
    return rows, lines


def read_jsonl(path: str | Path) -> JsonlRows:
    """The JSON objects of a JSONL file; torn, non-JSON and non-object lines are skipped and counted (`.note()`)."""
    rows, _ = parse_jsonl(path)
    for r in rows:
        r.pop("_line")
    return rows


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def clean_metrics(rows: JsonlRows, *, max_step: int | None = None) -> JsonlRows:
    """Metric rows in step order: a row needs an integer step >= 1 (and <= max_step when given) and a numeric loss
    (NaN only on the last row, where a diverged run stops); when a step goes back (a resume recomputed from there)
    the later rows replace the earlier ones. Rows must still carry `_line` (parse_jsonl)."""
    out = JsonlRows(path=rows.path, skipped=rows.skipped)
    for i, r in enumerate(rows):
        step, loss = r.get("step"), r.get("loss", 0.0)
        if isinstance(step, bool) or not isinstance(step, int) or step < 1:
            out.skip("bad_step", r["_line"])
        elif max_step is not None and step > max_step:
            out.skip("past_steps", r["_line"])
        elif not _number(loss):
            out.skip("bad_loss", r["_line"])
        elif not math.isfinite(loss) and i != len(rows) - 1:
            out.skip("non_finite_loss", r["_line"])
        else:
            while out and out[-1]["step"] >= step:
                out.skip("superseded", out.pop()["_line"])
            out.append(r)
    for reason in out.skipped:
        out.skipped[reason].sort()
    return out


def read_metrics(path: str | Path, *, max_step: int | None = None) -> JsonlRows:
    """metrics.jsonl as checked rows in step order (clean_metrics), every line left out counted in `.note()`."""
    rows, _ = parse_jsonl(path)
    out = clean_metrics(rows, max_step=max_step)
    for r in out:
        r.pop("_line")
    return out


def read_json(path: str | Path, *, missing: dict | None = None) -> dict:
    """A JSON object file; `missing` (if given) when there is no file; RunFileError naming a cut-off or odd one."""
    p = Path(path)
    if missing is not None and not p.is_file():
        return missing
    try:
        obj = json.loads(p.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise RunFileError(f"{p} cannot be read ({type(e).__name__}: {e}).") from None
    if not isinstance(obj, dict):
        raise RunFileError(f"{p} holds a JSON {type(obj).__name__}, not an object.")
    return obj
