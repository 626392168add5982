"""Training against held-out: do more steps still pay, or has the drafter started to learn its data by heart?

A run logs its training accuracy every `log_every` steps (one batch, noisy) and, every `real_tau_every` steps,
held-out validation accuracy and real speculative decoding on held-out prompts (trainer.py, validation.py). Past
some number of epochs the training figures keep rising while the held-out ones stop: from there more steps on the
same data buy nothing, and more data (or fewer epochs) is the lever. This module lines the two up per check,
finds where the held-out accuracy stopped rising, and draws the curves for result notebooks.
"""

from __future__ import annotations

from pathlib import Path

from .plots import PngImage, new_figure, save_png


def checks_table(rows: list[dict], *, window: int = 10) -> list[dict]:
    """One row per held-out check (a metrics row with `val_acc` or `real_tau`): the step, its epoch, the training
    accuracy and simulated tau as the mean of the last `window` logged batches up to that step (one batch is too
    noisy to set against a held-out figure), the held-out ones, the gap, and real tau with its interval."""
    if window < 1:
        raise ValueError(f"window={window}: the number of logged batches averaged must be >= 1 (e.g. 10)")
    logged = sorted((r for r in rows if r.get("acc") is not None), key=lambda r: r["step"])
    out = []
    for r in sorted(rows, key=lambda r: r["step"]):
        if r.get("val_acc") is None and r.get("real_tau") is None:
            continue
        recent = [x for x in logged if x["step"] <= r["step"]][-window:]
        train_acc = sum(x["acc"] for x in recent) / len(recent) if recent else None
        sims = [x["sim_tau"] for x in recent if x.get("sim_tau") is not None]
        out.append({"step": r["step"], "epoch": r.get("epoch"), "train_acc": train_acc,
                    "train_sim_tau": sum(sims) / len(sims) if sims else None,
                    "val_acc": r.get("val_acc"), "val_sim_tau": r.get("val_sim_tau"),
                    "gap": None if train_acc is None or r.get("val_acc") is None else train_acc - r["val_acc"],
                    "real_tau": r.get("real_tau"), "real_tau_low": r.get("real_tau_low"),
                    "real_tau_high": r.get("real_tau_high"), "real_tau_prompts": r.get("real_tau_prompts")})
    return out


def held_out_stopped_at(table: list[dict], *, tol: float = 0.01) -> int | None:
    """The first check from which held-out accuracy never rises more than `tol` again while training accuracy
    rises by more than `tol` after it: where the run became data-limited. None while held-out accuracy still
    rises (or the run has fewer than three checks with both figures)."""
    both = [r for r in table if r["val_acc"] is not None and r["train_acc"] is not None]
    if len(both) < 3:
        return None
    for i, r in enumerate(both[:-1]):
        later = both[i + 1:]
        if (max(x["val_acc"] for x in later) <= r["val_acc"] + tol
                and later[-1]["train_acc"] > r["train_acc"] + tol):
            return r["step"]
    return None


def checks_markdown(table: list[dict]) -> str:
    """The checks as a Markdown table (result notebooks, READMEs)."""
    def f(v, d=3):
        return "-" if v is None else f"{v:.{d}f}"

    lines = ["| step | epoch | train acc | held-out acc | gap | train sim tau | held-out sim tau | real tau [95%] |",
             "|---|---|---|---|---|---|---|---|"]
    for r in table:
        real = "-" if r["real_tau"] is None else (
            f"{r['real_tau']:.2f} [{f(r['real_tau_low'], 2)}, {f(r['real_tau_high'], 2)}]")
        lines.append(f"| {r['step']:,} | {'-' if r['epoch'] is None else r['epoch']} | {f(r['train_acc'])} | "
                     f"{f(r['val_acc'])} | {f(r['gap'])} | {f(r['train_sim_tau'], 2)} | {f(r['val_sim_tau'], 2)} | "
                     f"{real} |")
    return "\n".join(lines)


def plot_generalisation(runs: dict[str, list[dict]], *, window: int = 10,
                        out: str | Path | None = None) -> PngImage:
    """Per run (label -> metrics rows): accuracy on training batches (line, mean of `window`) and held out
    (markers), the same for simulated tau, and real tau with its interval, all against step."""
    fig, axes = new_figure(17, 3.8, 3)
    for i, (label, rows) in enumerate(runs.items()):
        color = f"C{i}"
        logged = sorted((r for r in rows if r.get("acc") is not None), key=lambda r: r["step"])
        steps = [r["step"] for r in logged]
        for ax, key in ((axes[0], "acc"), (axes[1], "sim_tau")):
            vals = [r.get(key) for r in logged]
            smooth = [sum(v for v in vals[max(0, j - window + 1):j + 1] if v is not None)
                      / max(1, sum(v is not None for v in vals[max(0, j - window + 1):j + 1]))
                      for j in range(len(vals))]
            ax.plot(steps, smooth, lw=1.3, color=color, label=f"{label}: training batches")
        table = checks_table(rows, window=window)
        val = [r for r in table if r["val_acc"] is not None]
        axes[0].plot([r["step"] for r in val], [r["val_acc"] for r in val], "o--", ms=5, color=color,
                     label=f"{label}: held out")
        axes[1].plot([r["step"] for r in val], [r["val_sim_tau"] for r in val], "o--", ms=5, color=color,
                     label=f"{label}: held out")
        real = [r for r in table if r["real_tau"] is not None]
        if real:
            ys = [r["real_tau"] for r in real]
            err = [[y - (r["real_tau_low"] if r["real_tau_low"] is not None else y) for y, r in zip(ys, real)],
                   [(r["real_tau_high"] if r["real_tau_high"] is not None else y) - y for y, r in zip(ys, real)]]
            axes[2].errorbar([r["step"] for r in real], ys, yerr=err, fmt="o-", ms=5, capsize=3, color=color,
                             label=label)
    for ax, title in zip(axes, ("accuracy: training batches (line) and held out (markers)",
                                "simulated tau: training (line) and held out (markers)",
                                "real tau on held-out prompts (95% interval)")):
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if runs:
            ax.legend(fontsize=7)
    fig.tight_layout()
    return save_png(fig, out)
