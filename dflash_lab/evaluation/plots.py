"""Static evaluation plots (matplotlib Figure objects, no pyplot state) as PNG files that render on GitHub.

`plot_eval(report, out_dir)` writes eval_tau.png (tau per prompt set and drafter, with its 95% interval over
prompts as an error bar), eval_acceptance.png (histogram of
accepted drafts per iteration + acceptance rate per block slot) and eval_speedup.png (vs the target alone).
"""

from __future__ import annotations

from pathlib import Path


COLORS = {"trained": "tab:blue", "untrained": "tab:gray"}


def _bars(rows: list[dict], key: str, *, ylabel: str, title: str, fmt: str, ylim=None, interval: bool = False):
    """Grouped bars: one group per prompt set, one bar per drafter; a dotted line at 1 (no gain)."""
    from matplotlib.figure import Figure

    decoders = list(dict.fromkeys(r["decoder"] for r in rows))
    sets = list(dict.fromkeys(r["prompt_set"] for r in rows))
    width = 0.8 / max(1, len(decoders))
    fig = Figure(figsize=(6, 3.6), dpi=110)
    ax = fig.add_subplot()
    for j, d in enumerate(decoders):
        mine = [next((r for r in rows if r["decoder"] == d and r["prompt_set"] == s), {}) for s in sets]
        vals = [r.get(key) or 0 for r in mine]
        err = None
        if interval and all(r.get("tau_low") is not None for r in mine):
            err = [[v - r["tau_low"] for v, r in zip(vals, mine)], [r["tau_high"] - v for v, r in zip(vals, mine)]]
        bars = ax.bar([i + j * width for i in range(len(sets))], vals, width, label=d, color=COLORS.get(d),
                      yerr=err, capsize=3 if err else 0)
        ax.bar_label(bars, fmt=fmt, fontsize=8)
    ax.axhline(1.0, color="k", lw=0.6, ls=":")
    ax.set_xticks([i + width * (len(decoders) - 1) / 2 for i in range(len(sets))], sets)
    ax.set_ylabel(ylabel)
    if ylim:
        ax.set_ylim(*ylim)
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_eval(report, out_dir: str | Path) -> dict[str, Path]:
    """Write the three PNGs into out_dir; returns {"tau", "acceptance", "speedup"} -> path."""
    from matplotlib.figure import Figure

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    B = max([report.block_size, *report.block_sizes.values()])  # compared drafters may draft blocks of their own
    rows = [r for r in report.rows() if r["decoder"] != report.baseline]
    paths = {"tau": out / "eval_tau.png", "acceptance": out / "eval_acceptance.png",
             "speedup": out / "eval_speedup.png"}

    _bars(rows, "tau", ylabel="tau (accepted + 1 per iteration)", fmt="%.2f", ylim=(0, B + 0.5), interval=True,
          title=f"Acceptance length, B={B}, T={report.temperature} (95% intervals over prompts)"
          ).savefig(paths["tau"])
    _bars(rows, "speedup", ylabel="speedup vs target alone (B=1)", fmt="%.2fx",
          title="Wall-clock speedup (same loop, block size 1 = baseline)").savefig(paths["speedup"])

    decoders = list(dict.fromkeys(r["decoder"] for r in rows))
    width = 0.8 / max(1, len(decoders))
    fig = Figure(figsize=(9, 3.6), dpi=110)
    ax1, ax2 = fig.subplots(1, 2)
    for j, d in enumerate(decoders):
        hist, rate = report.acceptance(d)
        n = max(1, sum(hist))
        ax1.bar([a + j * width for a in range(len(hist))], [h / n for h in hist], width, label=d,
                color=COLORS.get(d))
        ax2.plot(range(1, len(hist)), rate, marker="o", label=d, color=COLORS.get(d))
    ax1.set(xlabel="draft tokens accepted in an iteration", ylabel="fraction of iterations",
            title="Acceptance histogram")
    ax2.set(xlabel="block slot k", ylabel="P(slot k accepted)", ylim=(0, 1.02), title="Acceptance per block position")
    ax1.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(paths["acceptance"])
    return paths
