"""Static dashboard: one matplotlib PNG of a DashboardState (papermill runs, shared notebooks, GitHub rendering).

Uses matplotlib's object API (no pyplot global state), so it is safe outside the main thread too. One render is
~0.1-0.3 s on a small CPU; callers throttle (StaticView: at most one per 5 s, and never more than ~2% of wall time).
"""

from __future__ import annotations

import io

from .history import KIND_STYLE
from .model import DashboardState, format_rate


# Logged every few hundred steps: drawn with markers. Legend names as on the live dashboard.
SPARSE = ("val_sim_tau", "real_tau")
LABELS = {"loss": "raw loss", "loss_ema": "EMA (per step)", "sim_tau": "sim. (train batch)",
          "val_sim_tau": "sim. (held-out)", "real_tau": "real decode"}


def render_png(s: DashboardState, *, dpi: int = 80) -> bytes:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    fig = Figure(figsize=(15, 6.2), dpi=dpi)
    FigureCanvasAgg(fig)
    axes = fig.subplots(2, 3)
    panels = [(axes[0, 0], ("loss", "loss_ema"), "training loss (decayed CE), EMA"),
              (axes[0, 1], ("lr",), "learning rate"),
              (axes[0, 2], ("tokens_per_s",), "tokens/s (sequence tokens)"),
              (axes[1, 0], ("sim_tau", "val_sim_tau", "real_tau"), "acceptance length tau"),
              (axes[1, 1], ("acc",), "block token accuracy")]
    for ax, keys, title in panels:
        for k in keys:
            x, y = s.series.get(k, ([], []))
            if x:
                ax.plot(x, y, lw=1.0 if k == "loss" else 1.6, alpha=0.45 if k == "loss" and "loss_ema" in keys else 1,
                        marker="o" if k in SPARSE else None, label=LABELS.get(k, k))
        seen = set()
        for m in s.markers:  # the run's events across every panel; the loss panel's legend names each kind once
            colour, dash, label = KIND_STYLE[m.kind]
            first = ax is axes[0, 0] and m.kind not in seen
            seen.add(m.kind)
            ax.axvline(m.step, color=colour, lw=0.9, alpha=0.3 if m.kind == "eval" else 0.7, ls={"dot": ":", "dash": "--", "dashdot": "-."}.get(
                dash, "-"), label=label if first else None)
        if len([k for k in keys if s.series.get(k, ([], []))[0]]) > 1 or (ax is axes[0, 0] and s.markers):
            ax.legend(fontsize=7)
        ax.set_title(title, fontsize=10)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole: no "1 2 2 3 3" at 3 steps
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3)
    ax_tps = axes[0, 2]
    if s.steady_from_step is not None:
        ax_tps.axvspan(0, s.steady_from_step, color="#9a6700", alpha=0.12, label="warm-up")
        if s.steady_tokens_per_s:
            ax_tps.axhline(s.steady_tokens_per_s, color="#1a7f37", ls="--", lw=1,
                           label=f"steady {format_rate(s.steady_tokens_per_s)}/s")
        ax_tps.legend(fontsize=7, loc="lower right")
    elif s.series.get("tokens_per_s", ([], []))[0]:
        ax_tps.text(0.02, 0.92, "warming up", transform=ax_tps.transAxes, fontsize=8, color="#9a6700")
    _memory_panel(axes[1, 2], s)
    title = s.summary_line() + (f"\nWARNING: {s.warning}" if s.warning else "")  # e.g. a tau_gap event
    fig.suptitle(title, fontsize=11, x=0.01, ha="left")
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


def _memory_panel(ax, s: DashboardState) -> None:
    history = [d for d in s.device_history if len(d.t) >= 2]
    if history:  # over time, like the live dashboard's strips: memory share (solid) and busy / CPU % (dotted)
        for i, d in enumerate(history):
            ax.plot(d.t, [100 * m for m in d.mem_frac], color=f"C{i}", lw=1.4, label=f"{d.label} memory")
            ax.plot(d.t, [u or 0 for u in d.util_pct], color=f"C{i}", lw=1.0, ls=":", label=f"{d.label} busy")
        ax.set_ylim(0, 105)
        ax.set_title("memory (% of capacity) and busy % over time", fontsize=10)
        ax.set_xlabel("seconds", fontsize=8)
        ax.legend(fontsize=7)
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3)
        return
    if s.gpus:
        labels = [g.label for g in s.gpus]
        used = [g.used_gb or 0 for g in s.gpus]
        total = [g.total_gb or 0 for g in s.gpus]
        ax.barh(labels, total, color="#eaeef2")
        ax.barh(labels, used, color="#1a7f37")
        for i, g in enumerate(s.gpus):
            ax.text(0, i, f" {g.used_gb or 0:.1f}/{g.total_gb or 0:.0f} GB, busy {g.kernel_busy_pct or 0:.0f}%",
                    va="center", fontsize=7)
        ax.set_title(f"GPU memory (NVML {s.gpus[0].mem_view})", fontsize=10)
        ax.invert_yaxis()
    elif not s.host:
        ax.text(0.5, 0.5, s.gpu_status or "no system sample yet", ha="center", va="center", fontsize=9)
        ax.set_axis_off()
        return
    else:
        h = s.host
        ax.barh(["host RAM"], [h.get("ram_total_gb") or 0], color="#eaeef2")
        ax.barh(["host RAM"], [h.get("ram_used_gb") or 0], color="#8250df")
        ax.set_title(s.gpu_status or "no NVIDIA GPU", fontsize=9)
    ax.set_xlabel("GB", fontsize=8)
    ax.tick_params(labelsize=8)
