"""A scaling study's results as a table and curves: real tau against training conversations, per series (matched
steps, matched epochs, depth), prompt set and block size, with each point's 95% bootstrap interval over prompts.

Reads only `<out>/scaling.json` (scaling.py writes it), so the committed raw JSON re-renders anywhere, CPU included.
"""

from __future__ import annotations

import html
import json
from pathlib import Path

from .scaling import RESULTS_FILE

SERIES_STYLE = {"steps": ("matched steps", "o-"), "epochs": ("matched epochs", "s--"), "depth": ("depth", "^")}


def load_results(path: str | Path) -> dict:
    """A scaling.json (the file or its folder)."""
    p = Path(path)
    return json.loads((p / RESULTS_FILE if p.is_dir() else p).read_text())


def rows(results: dict) -> list[dict]:
    """One row per (point, evaluation, prompt set): conversations, steps, epochs, depth, tau and its interval."""
    out = []
    for p in results["points"]:
        for ev, sets in (p.get("evals") or {}).items():
            for name, fig in sets.items():
                if not isinstance(fig, dict):
                    continue
                lo, hi = fig.get("tau_low"), fig.get("tau_high")
                out.append({"point": p["name"], "series": p["series"], "conversations": p["conversations"],
                            "steps": p["steps"], "epochs": p["epochs"], "depth": p["depth"], "eval": ev,
                            "prompt_set": name, "prompts": fig.get("prompts"), "tau": fig.get("tau"),
                            "tau_lo": lo, "tau_hi": hi, "speedup": fig.get("speedup"),
                            "real_mismatches": fig.get("real_mismatches")})
    return out


def _fmt(v, nd=2) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{nd}f}"
    return str(v)


def markdown_table(results: dict, eval_key: str = "b16-t0") -> str:
    """Points as rows, prompt sets as columns: `tau [lo, hi]` at one evaluation setting, plus speedup."""
    rs = [r for r in rows(results) if r["eval"] == eval_key]
    sets = sorted({r["prompt_set"] for r in rs})
    head = "| point | conversations | steps | epochs | depth | " + " | ".join(f"tau {s}" for s in sets) + \
           " | speedup (first set) |"
    lines = [head, "|" + "---|" * (6 + len(sets))]
    for p in results["points"]:
        mine = {r["prompt_set"]: r for r in rs if r["point"] == p["name"]}
        if not mine:
            lines.append(f"| {p['name']} | {p['conversations']} | {p['steps']} | {p['epochs']} | {p['depth']} | " +
                         " | ".join("-" for _ in sets) + f" | {p.get('status')} |")
            continue
        cells = []
        for s in sets:
            r = mine.get(s)
            cells.append("-" if r is None else f"{_fmt(r['tau'])} [{_fmt(r['tau_lo'])}, {_fmt(r['tau_hi'])}]")
        first = mine.get(sets[0]) if sets else None
        sp = f"{first['speedup']:.2f}x" if first and first.get("speedup") else "-"
        lines.append(f"| {p['name']} | {p['conversations']} | {p['steps']} | {p['epochs']} | {p['depth']} | " +
                     " | ".join(cells) + f" | {sp} |")
    return "\n".join(lines)


def html_table(results: dict, eval_key: str = "b16-t0") -> str:
    """The markdown table as a narrow HTML table (for notebooks)."""
    md = markdown_table(results, eval_key).splitlines()
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in md if not line.startswith("|---")]
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cells[0])
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in cells[1:])
    return f"<table style='font-size:12px'><tr>{head}</tr>{body}</table>"


def curves_figure(results: dict, eval_key: str = "b16-t0"):
    """One panel per prompt set: real tau (with 95% intervals) against conversations, one line per series."""
    from matplotlib.figure import Figure

    rs = [r for r in rows(results) if r["eval"] == eval_key and r["tau"] is not None]
    sets = sorted({r["prompt_set"] for r in rs})
    fig = Figure(figsize=(4.2 * max(1, len(sets)), 3.4), layout="constrained")
    axes = fig.subplots(1, max(1, len(sets)), squeeze=False)[0]
    for ax, s in zip(axes, sets):
        for series, (label, style) in SERIES_STYLE.items():
            pts = sorted((r for r in rs if r["prompt_set"] == s and r["series"] == series),
                         key=lambda r: r["conversations"])
            if not pts:
                continue
            x = [r["conversations"] for r in pts]
            y = [r["tau"] for r in pts]
            err = [[r["tau"] - (r["tau_lo"] if r["tau_lo"] is not None else r["tau"]) for r in pts],
                   [(r["tau_hi"] if r["tau_hi"] is not None else r["tau"]) - r["tau"] for r in pts]]
            tag = label if series != "depth" else ", ".join(f"depth {r['depth']}" for r in pts)
            ax.errorbar(x, y, yerr=err, fmt=style, capsize=3, label=tag)
        ax.set_xscale("log")
        ax.set_xlabel("training conversations")
        ax.set_ylabel(f"real tau ({eval_key})")
        ax.set_title(s)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return fig


def save_curves(results: dict, path: str | Path, eval_key: str = "b16-t0") -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    curves_figure(results, eval_key).savefig(path, dpi=110)
    return path
