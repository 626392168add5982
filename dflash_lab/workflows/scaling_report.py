"""A scaling study's results as a table and curves: real tau against training conversations, per series (matched
steps, matched epochs, depth), prompt set and block size, with each point's 95% bootstrap interval over prompts.

Reads only `<out>/scaling.json` (scaling.py writes it), so the committed raw JSON re-renders anywhere, CPU included.
"""

from __future__ import annotations

import html
import io
import math
from pathlib import Path

from dflash_lab.config import ConfigError
from dflash_lab.runs.plots import PngImage
from dflash_lab.runs.rundir import PROJECT_ROOT
from .scaling import RESULTS_FILE, read_study

SERIES_STYLE = {"steps": ("matched steps", "o-"), "epochs": ("matched epochs", "s--"), "depth": ("depth", "^"),
                "variant": ("variant", "D")}


def load_results(path: str | Path) -> dict:
    """A scaling.json (the file or its folder); a relative path not found from here is read under the project root
    (a notebook's kernel runs in its own folder)."""
    p = Path(path).expanduser()
    if not p.is_absolute() and not p.exists():
        p = PROJECT_ROOT / p
    p = p / RESULTS_FILE if p.is_dir() else p
    if not p.is_file():
        raise ConfigError(f"{path} is no scaling study ({p} does not exist). Fix: pass a study's scaling.json or its "
                          "folder, e.g. bench/results/2026-12-01-h200-scaling4-smollm2/scaling.json.")
    return read_study(p)


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


def _label(results: dict, point: dict) -> str:
    """A point's name, with its pool where a merged study's points came from more than one pool."""
    pools = {p.get("pool") for p in results["points"]}
    return f"{point['name']} ({point['pool']} pool)" if len(pools) > 1 and point.get("pool") else point["name"]


def markdown_table(results: dict, eval_key: str = "b16-t0") -> str:
    """Points as rows, prompt sets as columns: `tau [lo, hi]` at one evaluation setting, plus the final training
    loss."""
    rs = [r for r in rows(results) if r["eval"] == eval_key]
    sets = sorted({r["prompt_set"] for r in rs})
    head = "| point | conversations | steps | epochs | depth | " + " | ".join(f"tau {s}" for s in sets) + \
           " | final loss |"
    lines = [head, "|" + "---|" * (6 + len(sets))]
    for p in results["points"]:
        mine = {r["prompt_set"]: r for r in rs if r["point"] == p["name"]}
        if not mine:
            lines.append(f"| {_label(results, p)} | {p['conversations']} | {p['steps']} | {p['epochs']} | "
                         f"{p['depth']} | " + " | ".join("-" for _ in sets) + f" | {p.get('status')} |")
            continue
        cells = []
        for s in sets:
            r = mine.get(s)
            cells.append("-" if r is None else f"{_fmt(r['tau'])} [{_fmt(r['tau_lo'])}, {_fmt(r['tau_hi'])}]")
        loss = (p.get("train") or {}).get("final_loss")
        lines.append(f"| {_label(results, p)} | {p['conversations']} | {p['steps']} | {p['epochs']} | {p['depth']} | " +
                     " | ".join(cells) + f" | {_fmt(loss, 3)} |")
    return "\n".join(lines)


def final_rows(results: dict) -> list[dict]:
    """The batch-1 evaluation of the best point (scaling.final_eval): one row per (setting, prompt set) with tau,
    its interval, speedup over the target alone, tokens/s and the lossless verdict counts."""
    final = results.get("final") or {}
    out = []
    for key, sets in (final.get("evals") or {}).items():
        for name, r in sets.items():
            if isinstance(r, dict):
                out.append({"setting": key, "prompt_set": name, **{k: r.get(k) for k in (
                    "prompts", "tau", "tau_low", "tau_high", "speedup", "tokens_per_s", "identical_to_target",
                    "near_ties", "real_mismatches")}})
    return out


def final_markdown(results: dict) -> str:
    """final_rows as a markdown table (empty string when the study has no final evaluation)."""
    rs = final_rows(results)
    if not rs:
        return ""
    final = results["final"]
    lines = [f"best point `{final['point']}`, block size {final['block_size']}, batch 1", "",
             "| setting | prompt set | prompts | tau [95%] | speedup | tokens/s | identical | near-ties | "
             "real mismatches |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rs:
        sp = f"{r['speedup']:.2f}x" if r.get("speedup") else "-"
        lines.append(f"| {r['setting']} | {r['prompt_set']} | {r['prompts']} | {_fmt(r['tau'])} "
                     f"[{_fmt(r['tau_low'])}, {_fmt(r['tau_high'])}] | {sp} | {_fmt(r['tokens_per_s'], 0)} | "
                     f"{_fmt(r['identical_to_target'])} | {_fmt(r['near_ties'])} | {_fmt(r['real_mismatches'])} |")
    return "\n".join(lines)


def training_figure(results: dict):
    """Per point against optimizer steps: the training loss (is it still falling at the last step? then steps
    limit the point) and the held-out real tau of the training-time check where it ran."""
    from matplotlib import colormaps
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10.5, 3.4), layout="constrained")
    loss_ax, tau_ax = fig.subplots(1, 2)
    for i, p in enumerate(results["points"]):
        train = p.get("train") or {}
        label = p["name"] + (f" ({p['pool']} pool)" if p.get("pool") else "")
        color = colormaps["tab20"](i % 20)  # one colour per point in both panels (a merged study has > 10)
        losses = train.get("loss_curve") or []
        if len(losses) >= 2:
            loss_ax.plot([r["step"] for r in losses], [r["loss"] for r in losses], lw=1, label=label, color=color)
        curve = [r for r in train.get("curve", []) if r.get("real_tau") is not None]
        if len(curve) >= 2:
            tau_ax.plot([r["step"] for r in curve], [r["real_tau"] for r in curve], marker=".", label=label,
                        color=color)
    loss_ax.set_ylabel("training loss (one batch)")
    tau_ax.set_ylabel("held-out real tau (training-time check)")
    for ax in (loss_ax, tau_ax):
        ax.set_xlabel("optimizer step")
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=7)
    if not tau_ax.lines:
        tau_ax.text(0.5, 0.5, "not measured in this study", ha="center", va="center", transform=tau_ax.transAxes)
    if loss_ax.lines:
        loss_ax.set_ylim(0.0, min(8.0, loss_ax.get_ylim()[1]))  # the first steps' loss (~50) would flatten the rest
    return fig


def html_table(results: dict, eval_key: str = "b16-t0") -> str:
    """The markdown table as a narrow HTML table (for notebooks)."""
    md = markdown_table(results, eval_key).splitlines()
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in md if not line.startswith("|---")]
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cells[0])
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in cells[1:])
    return f"<table style='font-size:12px'><tr>{head}</tr>{body}</table>"


def curves_figure(results: dict, eval_key: str = "b16-t0"):
    """One panel per prompt set: real tau (with 95% intervals) against conversations, one line per series."""
    rs = [r for r in rows(results) if r["eval"] == eval_key and r["tau"] is not None]
    sets = sorted({r["prompt_set"] for r in rs})
    # a set measured at one size only has no curve against data (steps_figure shows its points)
    sets = [s for s in sets if len({r["conversations"] for r in rs if r["prompt_set"] == s}) > 1] or sets
    fig, axes = _panels(len(sets))
    for ax, s in zip(axes, sets):
        for series, (label, style) in SERIES_STYLE.items():
            pts = sorted((r for r in rs if r["prompt_set"] == s and r["series"] == series),
                         key=lambda r: r["conversations"])
            if series == "epochs":
                pts += _shared_largest(rs, s, pts)
            if not pts:
                continue
            if series in ("depth", "variant"):  # single points at the largest size: one marker each, side by side
                for k, r in enumerate(pts):
                    tag = (f"depth {r['depth']}" if series == "depth" else r["point"].removeprefix("variant-")) \
                        + f" ({r['steps']:,} steps)"
                    _errorbar(ax, [r], "DvspX*"[k % 6] if series == "variant" else style, tag,
                              shift=1.06 ** (k + (1 if series == "variant" else 0)))
                continue
            _errorbar(ax, pts, style, label)
        ax.set_xscale("log")
        ax.set_xlabel("training conversations")
        ax.set_ylabel(f"real tau ({eval_key})")
        ax.set_title(s)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return fig


def _panels(n: int, cols: int = 3):
    """A figure of n panels, at most `cols` a row (a merged study may carry six prompt sets)."""
    from matplotlib.figure import Figure

    ncols, nrows = min(max(1, n), cols), max(1, math.ceil(n / cols))
    fig = Figure(figsize=(4.2 * ncols, 3.4 * nrows), layout="constrained")
    axes = list(fig.subplots(nrows, ncols, squeeze=False).flat)
    for ax in axes[n:]:
        ax.set_visible(False)
    return fig, axes


def steps_rows(results: dict, eval_key: str = "b16-t0") -> list[dict]:
    """The steps lever: the points at the largest size and the base depth that change nothing but the steps (the
    matched-steps point and the "more steps" variants), one row per (point, prompt set)."""
    rs = [r for r in rows(results) if r["eval"] == eval_key and r["tau"] is not None]
    if not rs:
        return []
    largest = max(r["conversations"] for r in rs)
    base = [r["depth"] for r in rs if r["series"] == "steps"] or [r["depth"] for r in rs]
    only_steps = {p["name"] for p in results["points"] if set(p.get("overrides") or {}) <= {"steps"}}
    return sorted((r for r in rs if r["conversations"] == largest and r["depth"] == max(set(base), key=base.count)
                   and r["series"] in ("steps", "variant") and r["point"] in only_steps), key=lambda r: r["steps"])


def steps_figure(results: dict, eval_key: str = "b16-t0"):
    """Real tau against optimizer steps at the largest size, one panel per prompt set. A set named "X (note)" (the
    same file under another prompt selection) is drawn in X's panel as its own line: its prompts differ, so its
    points join only each other."""
    rs = steps_rows(results, eval_key)
    panels = sorted({r["prompt_set"].split(" (")[0] for r in rs})
    fig, axes = _panels(len(panels))
    for ax, panel in zip(axes, panels):
        for s in sorted({r["prompt_set"] for r in rs if r["prompt_set"].split(" (")[0] == panel}):
            pts = [r for r in rs if r["prompt_set"] == s]
            err = [[r["tau"] - (r["tau_lo"] or r["tau"]) for r in pts], [(r["tau_hi"] or r["tau"]) - r["tau"]
                                                                          for r in pts]]
            ax.errorbar([r["steps"] for r in pts], [r["tau"] for r in pts], yerr=err, fmt="o-", capsize=3,
                        label=s)
        ax.set_xscale("log")
        ticks = sorted({r["steps"] for r in rs})
        ax.set_xticks(ticks, [f"{t:,}" for t in ticks])
        ax.minorticks_off()
        ax.set_xlabel(f"optimizer steps ({rs[0]['conversations']:,} conversations)")
        ax.set_ylabel(f"real tau ({eval_key})")
        ax.set_title(panel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return fig


def _shared_largest(rs: list[dict], prompt_set: str, epochs_pts: list[dict]) -> list[dict]:
    """The matched-steps point at the largest size, when the matched-epochs series shares it (plan_points trains a
    point once when both series give it the same steps), so the epochs line ends where its epochs come from."""
    if not epochs_pts:
        return []
    steps = [r for r in rs if r["prompt_set"] == prompt_set and r["series"] == "steps"]
    largest = max((r["conversations"] for r in steps), default=None)
    if largest is None or any(r["conversations"] == largest for r in epochs_pts):
        return []
    return [r for r in steps if r["conversations"] == largest and
            math.isclose(r["epochs"], epochs_pts[-1]["epochs"], rel_tol=0.05)]


def _errorbar(ax, pts: list[dict], style: str, label: str, shift: float = 1.0) -> None:
    """Tau with its 95% interval against conversations (x scaled by `shift`, so points at one size stay apart)."""
    err = [[r["tau"] - (r["tau_lo"] if r["tau_lo"] is not None else r["tau"]) for r in pts],
           [(r["tau_hi"] if r["tau_hi"] is not None else r["tau"]) - r["tau"] for r in pts]]
    ax.errorbar([r["conversations"] * shift for r in pts], [r["tau"] for r in pts], yerr=err, fmt=style, capsize=3,
                label=label)


FIGURES = {"curves": lambda results, key: curves_figure(results, key),
           "steps": lambda results, key: steps_figure(results, key),
           "training": lambda results, key: training_figure(results)}


def figure(results: dict, name: str, eval_key: str = "b16-t0", *, save_in: str | Path = "") -> PngImage:
    """One of FIGURES as a PNG a notebook shows; also written to `<save_in>/<name>.png` when save_in is given (so a
    study re-rendered from a committed scaling.json writes nothing unless asked)."""
    if name not in FIGURES:
        raise ConfigError(f"figure name={name!r} is unknown. Fix: one of {sorted(FIGURES)}.")
    buf = io.BytesIO()
    FIGURES[name](results, eval_key).savefig(buf, format="png", dpi=110)
    png = PngImage(buf.getvalue())
    if save_in:
        png.path = png.save(Path(save_in) / f"{name}.png")
    return png


def save_curves(results: dict, path: str | Path, eval_key: str = "b16-t0") -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    curves_figure(results, eval_key).savefig(path, dpi=110)
    return path


def save_steps(results: dict, path: str | Path, eval_key: str = "b16-t0") -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    steps_figure(results, eval_key).savefig(path, dpi=110)
    return path


def save_training(results: dict, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    training_figure(results).savefig(path, dpi=110)
    return path
