"""A sweep's results: one row per variant from its run's own metrics, ranked by held-out real tau; table and PNG.

Everything here is read back from files (sweep.json, each run's metrics.jsonl and summary.json), so the table of a
finished, interrupted or resumed sweep is the same, and the notebook's figure renders on GitHub (PNG, matplotlib).

A rank alone overstates what a sweep decided: each final real tau carries its 95% bootstrap interval over the
held-out prompts (logged with it while training), and variants whose intervals overlap are marked as not
separated from each other ("separated: no (b, c)"), so a reader does not pick a winner that the prompts cannot
tell apart. Each row also carries the sha256 of the prompts its real tau was measured on (`real_tau_sha256`).
"""

from __future__ import annotations

import csv
import html
import io
import json
import math
from pathlib import Path

from dflash_lab.evaluation.intervals import TauInterval, not_separated, stored_interval
from dflash_lab.runs.plots import PngImage
from dflash_lab.runs.rundir import METRICS_FILE, write_json
from dflash_lab.runs.run_files import read_json, read_metrics

SWEEP_FILE = "sweep.json"
RESULT_COLUMNS = ("rank", "variant", "status", "final_real_tau", "final_real_tau_low", "final_real_tau_high",
                  "real_tau_prompts", "real_tau_sha256", "not_separated_from", "best_real_tau", "best_tau_step",
                  "val_sim_tau", "final_loss", "tokens_per_s", "supervised_tokens_per_s", "wall_s", "steps",
                  "overrides", "run_dir", "error", "warning")
DEAD_MIN_ROWS = 2  # logged rows in a row with zero gradient and zero accuracy before a run counts as dead


def read_sweep(sweep_dir: str | Path) -> dict:
    """sweep.json of a sweep folder; a cut-off one raises RunFileError naming the file."""
    return read_json(Path(sweep_dir) / SWEEP_FILE)


def dead_from(rows: list[dict]) -> int | None:
    """The step from which a run stopped learning: every logged row from there on has grad_norm 0 and accuracy 0
    (an lr far too high zeroes the update yet the run "finishes"), or None."""
    start = None
    for r in rows:
        dead = r.get("grad_norm") == 0 and r.get("acc") == 0
        start = (start or r["step"]) if dead else None
    tail = [r for r in rows if start is not None and r["step"] >= start]
    return start if len(tail) >= DEAD_MIN_ROWS else None


def _last(rows: list[dict], key: str):
    vals = [r[key] for r in rows if r.get(key) is not None]
    return vals[-1] if vals else None


def variant_row(variant: dict, overrides: dict) -> dict:
    """A variant's figures from its run dir: final/best real tau (and the step of the best), last val_sim_tau,
    last loss, steady tokens/s (summary.json; else the last logged rate), wall time."""
    row = {"variant": variant["name"], "status": variant["status"], "wall_s": variant.get("wall_s"),
           "overrides": json.dumps(overrides, sort_keys=True), "run_dir": variant.get("run_dir"),
           "error": variant.get("error")}
    run_dir = Path(variant["run_dir"]) if variant.get("run_dir") else None
    rows = read_metrics(run_dir / METRICS_FILE) if run_dir else []
    warnings = [rows.note()] if run_dir and rows.note() else []
    if run_dir is not None and not run_dir.is_dir():
        row["status"] = f"{variant['status']} (run folder missing)"
        warnings.append(f"its run folder {run_dir} is gone: no figures (rerun the sweep to train it again)")
    if (dead := dead_from(rows)) is not None:
        warnings.append(f"dead run: grad_norm 0 and accuracy 0 from step {dead} on (the updates vanished: lr too "
                        "high?); its figures are not a result")
    row["warning"] = "; ".join(warnings) or None
    taus = [(r["step"], r["real_tau"]) for r in rows if isinstance(r.get("real_tau"), (int, float))]
    best = max(taus, key=lambda t: (t[1], -t[0])) if taus else (None, None)  # the earliest step among ties
    final = next((r for r in reversed(rows) if isinstance(r.get("real_tau"), (int, float))), {})
    try:
        summary = read_json(run_dir / "summary.json") if run_dir else {}
    except ValueError:  # missing or cut off: the figures come from metrics.jsonl
        summary = {}
    row.update(final_real_tau=taus[-1][1] if taus else None, final_real_tau_low=final.get("real_tau_low"),
               final_real_tau_high=final.get("real_tau_high"), real_tau_prompts=final.get("real_tau_prompts"),
               real_tau_sha256=final.get("real_tau_sha256"),
               best_real_tau=best[1], best_tau_step=best[0],
               val_sim_tau=_last(rows, "val_sim_tau"), final_loss=_last(rows, "loss"),
               tokens_per_s=summary.get("steady_tokens_per_s") or _last(rows, "tokens_per_s"),
               supervised_tokens_per_s=supervised_rate(rows), steps=_last(rows, "step"))
    return row


def supervised_rate(rows: list[dict]) -> float | None:
    """Loss-carrying tokens per second over the logged steps after the first 20% (warm-up and capture left out).

    tokens/s counts every position of the fixed-shape window, padding included, so it cannot show what packing buys;
    this counts only the tokens the drafter learns from."""
    logged = [r for r in rows if r.get("supervised_tokens") is not None and r.get("step_time_s")]
    steady = logged[len(logged) // 5:] or logged
    seconds = sum(r["step_time_s"] for r in steady)
    return round(sum(r["supervised_tokens"] for r in steady) / seconds, 1) if seconds > 0 else None


def rank_rows(rows: list[dict]) -> list[dict]:
    """Best final held-out real tau first (ties: best real tau, then lower loss); variants without one last."""
    def key(r):
        tau, best, loss = r["final_real_tau"], r["best_real_tau"], r["final_loss"]
        return (tau is None, -(tau or 0.0), -(best or 0.0), loss if loss is not None else math.inf)

    ranked = sorted(rows, key=key)
    for i, r in enumerate(ranked, 1):
        r["rank"] = i if r["final_real_tau"] is not None else None
    overlap = not_separated({r["variant"]: _interval(r) for r in ranked})
    for r in ranked:  # None: no interval to compare (not measured, or logged before intervals were)
        r["not_separated_from"] = overlap[r["variant"]] if _interval(r) is not None else None
    return [{c: r.get(c) for c in RESULT_COLUMNS} for r in ranked]


def _interval(row: dict) -> TauInterval | None:
    return stored_interval(row.get("final_real_tau"), row.get("final_real_tau_low"), row.get("final_real_tau_high"),
                           row.get("real_tau_prompts"))


def results(sweep_dir: str | Path) -> list[dict]:
    """The ranked rows of a sweep directory (see RESULT_COLUMNS)."""
    state = read_sweep(sweep_dir)
    spec = {v["name"]: {k: x for k, x in v.items() if k != "name"} for v in state["spec"]["variants"]}
    return rank_rows([variant_row(v, v.get("overrides", spec.get(v["name"], {}))) for v in state["variants"]])


def write_results(sweep_dir: str | Path) -> list[dict]:
    """results.json and results.csv in the sweep directory; returns the ranked rows."""
    sweep_dir = Path(sweep_dir)
    rows = results(sweep_dir)
    write_json(sweep_dir / "results.json", {"ranked_by": "final_real_tau", "separated_by": "95% bootstrap intervals "
                                            "over the held-out prompts that do not overlap", "rows": rows})
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=RESULT_COLUMNS, lineterminator="\n")
    w.writeheader()
    w.writerows({**r, "not_separated_from": " ".join(r["not_separated_from"] or [])} for r in rows)
    (sweep_dir / "results.csv").write_text(buf.getvalue())
    return rows


def _fmt(x, spec: str = ".3f") -> str:
    if x is None:
        return "-"
    return format(x, spec) if isinstance(x, float) else str(x)


TABLE_COLUMNS = (("rank", "rank", "d"), ("variant", "variant", ""), ("status", "status", ""),
                 ("final_real_tau", "real tau (final)", ".3f"), ("interval", "95% interval", ""),
                 ("separated", "separated", ""), ("best_real_tau", "real tau (best)", ".3f"),
                 ("best_tau_step", "best at step", "d"), ("val_sim_tau", "val sim tau", ".3f"),
                 ("final_loss", "loss", ".4f"), ("tokens_per_s", "steady tokens/s", ".0f"),
                 ("supervised_tokens_per_s", "supervised tokens/s", ".0f"), ("wall_s", "wall s", ".1f"),
                 ("overrides", "overrides", ""))


class ResultsTable:
    """The ranked rows, shown as an HTML table in a notebook (GitHub renders it) and as markdown in text."""

    def __init__(self, rows: list[dict]):
        self.rows = rows

    def _cells(self, r: dict) -> list[str]:
        shown = {**r, **shown_interval(r)}
        cells = [_fmt(shown.get(k), spec) for k, _, spec in TABLE_COLUMNS]
        if r.get("error"):
            cells[2] = f"{cells[2]}: {r['error'][:160]}"
        if r.get("warning"):
            cells[2] = f"{cells[2]} (WARNING: {r['warning'][:200]})"
        return cells

    def to_markdown(self) -> str:
        head = [h for _, h, _ in TABLE_COLUMNS]
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(c.replace("|", "/") for c in self._cells(r)) + " |" for r in self.rows]
        return "\n".join(lines)

    def _repr_markdown_(self) -> str:
        return self.to_markdown()

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{html.escape(h)}</th>" for _, h, _ in TABLE_COLUMNS)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in self._cells(r)) + "</tr>"
                       for r in self.rows)
        return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"

    def __repr__(self) -> str:
        return self.to_markdown()


def shown_interval(row: dict) -> dict:
    """The table's `interval` ("[2.10, 2.52] n=32") and `separated` ("yes" / "no (b, c)") cells of a ranked row."""
    if row.get("not_separated_from") is None:
        return {"interval": None, "separated": None}
    n = f" n={row['real_tau_prompts']}" if row.get("real_tau_prompts") else ""
    others = row["not_separated_from"]
    lo, hi = row["final_real_tau_low"], row["final_real_tau_high"]
    shown = f"[{lo:.2f}, {hi:.2f}]" if lo is not None and hi is not None else "[n/a]"  # too few prompts
    return {"interval": f"{shown}{n}",
            "separated": "yes" if not others else f"no ({', '.join(others)})"}


def results_table(sweep_dir: str | Path) -> ResultsTable:
    return ResultsTable(results(sweep_dir))


def plot_sweep(sweep_dir: str | Path, out: str | Path | None = None) -> PngImage:
    """Loss and held-out real tau against step, one colour per variant (PNG for result notebooks)."""
    from matplotlib.figure import Figure

    state = read_sweep(sweep_dir)
    fig = Figure(figsize=(14, 4))
    ax_loss, ax_tau = fig.subplots(1, 2)
    for i, v in enumerate(state["variants"]):
        rows = read_metrics(Path(v["run_dir"]) / METRICS_FILE) if v.get("run_dir") else []
        loss = [(r["step"], r["loss"]) for r in rows if r.get("loss") is not None]
        tau = [(r["step"], r["real_tau"]) for r in rows if r.get("real_tau") is not None]
        band = [(r["step"], r["real_tau_low"], r["real_tau_high"]) for r in rows
                if r.get("real_tau") is not None and r.get("real_tau_low") is not None]
        label = v["name"] + ("" if v["status"] == "finished" else f" ({v['status']})")
        if loss:
            ax_loss.plot(*zip(*loss), lw=1.4, color=f"C{i}", label=label)
        if tau:
            ax_tau.plot(*zip(*tau), "o-", ms=4, lw=1.2, color=f"C{i}", label=label)
        if band:  # the 95% interval over the held-out prompts
            ax_tau.fill_between(*zip(*band), color=f"C{i}", alpha=0.15, lw=0)
    for ax, title, unit in ((ax_loss, "training loss (decayed CE)", "loss"),
                            (ax_tau, "real tau on the held-out prompts (95% intervals)", "accepted tokens per block")):
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        ax.set_ylabel(unit, fontsize=9)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    img = PngImage(buf.getvalue())
    if out:
        img.path = img.save(out)
    return img
