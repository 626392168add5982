"""Static training plots (matplotlib, PNG) for run directories and result notebooks that render on GitHub.

Figures are built with `matplotlib.figure.Figure` (no pyplot global state, any backend, safe from threads) and
returned as `PngImage`, which a notebook shows as a plain PNG output: GitHub and nbconvert HTML render it.
"""

from __future__ import annotations

import io
import re
from pathlib import Path

from . import run_files
from .rundir import METRICS_FILE

COMPARE_PANELS = (("loss", "training loss (decayed CE)", "loss"),
                  ("tokens_per_s", "sequence tokens/s", "tokens/s"),
                  ("memory_gb", "memory per device (GiB; CPU runs: process RSS)", "GiB"),
                  ("sim_tau", "acceptance: simulated tau (line), real tau (dots)", "tokens per block"))


class PngImage:
    """PNG bytes with `_repr_png_`, so a notebook shows it as an image; `.save(path)` writes it."""

    def __init__(self, data: bytes, path: Path | None = None):
        self.data, self.path = data, path

    def _repr_png_(self) -> bytes:
        return self.data

    def save(self, path: str | Path) -> Path:
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(self.data)
        return p

    def __repr__(self) -> str:
        return f"PngImage({len(self.data)} bytes{', ' + str(self.path) if self.path else ''})"


def new_figure(width: float, height: float, ncols: int):
    """A matplotlib Figure (no pyplot state) and its row of `ncols` axes."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height))
    return fig, fig.subplots(1, ncols)


# Shared pages (compare.html, a notebook on GitHub) are read in windows ~1,000 px wide: two panels a row, 5.5 x 3.4 in
# each at 90 dpi, is ~1,000 px in all, so 10-11 pt text stays 12-14 px on screen. Four panels in one 18 in row were
# scaled to ~0.55 of their size there: 5-6 px text.
PANEL_W_IN, PANEL_H_IN, PANELS_PER_ROW = 5.5, 3.4, 2


def new_grid(n: int, *, height: float = PANEL_H_IN):
    """A Figure with `n` panels, PANELS_PER_ROW to a row, and its axes in reading order (spare cells hidden)."""
    from matplotlib.figure import Figure

    cols = min(PANELS_PER_ROW, max(1, n))
    rows = -(-n // cols)
    fig = Figure(figsize=(PANEL_W_IN * cols, height * rows))
    axes = list(fig.subplots(rows, cols, squeeze=False).flat)
    for ax in axes[n:]:
        ax.set_visible(False)
    return fig, axes[:n]


def save_png(fig, out: str | Path | None, dpi: int = 90) -> PngImage:
    """The figure as a PngImage, also written to `out` when given."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    img = PngImage(buf.getvalue())
    if out:
        img.path = img.save(out)
    return img


def read_metrics(path: str | Path) -> list[dict]:
    """A run's metric rows in step order, torn or garbage lines left out (run_files.read_metrics)."""
    p = Path(path)
    return run_files.read_metrics(p / METRICS_FILE if p.is_dir() else p)


def plot_training(run_dir: str | Path, out: str | Path | None = None) -> Path | None:
    """Loss, LR, simulated acceptance and tokens/s against step, as one PNG in <run_dir>/plots/."""
    rows = [r for r in read_metrics(run_dir) if "loss" in r]
    if not rows:
        return None
    steps = [r["step"] for r in rows]
    fig, axes = new_figure(16, 3.4, 4)
    panels = [("loss", "training loss (decayed CE)"), ("lr", "learning rate"),
              ("sim_tau", "simulated acceptance length"), ("tokens_per_s", "sequence tokens/s")]
    for ax, (key, title) in zip(axes, panels):
        ax.plot(steps, [r.get(key) or 0.0 for r in rows], lw=1.4)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    out = Path(out) if out else Path(run_dir) / "plots" / "training.png"
    return save_png(fig, out).path


def training_image(run_dir: str | Path) -> PngImage | None:
    """The run's plots/training.png (drawn if missing) as an image a notebook displays inline."""
    png = Path(run_dir) / "plots" / "training.png"
    if not png.is_file() and plot_training(run_dir) is None:
        return None
    return PngImage(png.read_bytes(), png)


def plot_compare(frame, *, out: str | Path | None = None, smooth: int = 1) -> PngImage:
    """Runs side by side: loss, tokens/s, memory and acceptance against step, one line per run (runs.load_metrics).

    `smooth` > 1 applies a rolling mean over that many logged points per run (loss and tokens/s are noisy).
    """
    fig, axes = new_grid(len(COMPARE_PANELS))
    labels = list(dict.fromkeys(frame["label"])) if len(frame) else []
    for ax, (key, title, unit) in zip(axes, COMPARE_PANELS):
        for label in labels:
            part = frame[frame["label"] == label].sort_values("step")
            if key not in part or part[key].isna().all():
                continue
            y = part[key].astype(float)
            if smooth > 1 and key in ("loss", "tokens_per_s"):
                y = y.rolling(smooth, min_periods=1).mean()
            line, = ax.plot(part["step"], y, lw=1.4, label=label)
            if key == "sim_tau" and "eval_tau" in part and part["eval_tau"].notna().any():  # real tau, same colour
                real = part[part["eval_tau"].notna()]
                ax.plot(real["step"], real["eval_tau"].astype(float), "o--", ms=4, lw=1, color=line.get_color(),
                        label=f"{label} (real tau)")
        ax.set_title(title, fontsize=11)
        ax.set_xlabel("step", fontsize=10)
        ax.set_ylabel(unit, fontsize=10)
        ax.tick_params(labelsize=9)
        ax.grid(alpha=0.3)
    _legend_or_say(axes[0], bool(labels), "no logged steps", fontsize=9)
    fig.tight_layout()
    return save_png(fig, out)


def plot_compare_bars(table, *, out: str | Path | None = None) -> PngImage:
    """Final figures per run as bars (runs.runs_table): last loss, steady tokens/s, peak memory, simulated tau."""
    names = [str(i) for i in table.index] if len(table) else []
    fig, axes = new_grid(4, height=max(2.4, 1.2 + 0.35 * len(names)))
    short = [re.sub(r"-?\d{8}T\d{6}Z-?", "-", n).strip("-") for n in names]  # the UTC stamp out of the labels
    for ax, (key, title) in zip(axes, (("loss", "last loss"), ("tokens_per_s", "tokens/s (steady)"),
                                       ("peak_memory_gb", "peak memory (GiB)"), ("sim_tau", "last simulated tau"))):
        vals = [float(v) if v is not None and v == v else 0.0 for v in (table[key] if key in table else [])]
        ax.barh(short, vals, color=[f"C{i}" for i in range(len(vals))])
        ax.set_title(title, fontsize=11)
        ax.tick_params(labelsize=9)
        ax.locator_params(axis="x", nbins=4)  # large numbers (tokens/s) would overlap with more ticks
        ax.grid(alpha=0.3, axis="x")
        ax.invert_yaxis()
    fig.tight_layout()
    return save_png(fig, out)


def plot_tau_cost(frame, *, out: str | Path | None = None) -> PngImage:
    """Real tau measured while training (and the newest evaluation) against step and against the GPU-minutes spent
    to reach it (`gpu_seconds`, gpu_time.py): one line per run (runs.load_metrics). Runs on different GPU counts or
    speeds line up by cost on the right panel, not by step."""
    fig, axes = new_figure(PANEL_W_IN * PANELS_PER_ROW, 3.6, 2)  # ~990 px, as the compare grid
    labels = list(dict.fromkeys(frame["label"])) if len(frame) else []
    drawn = 0
    for label in labels:
        part = frame[frame["label"] == label].sort_values("step")
        tau = part["real_tau"] if "real_tau" in part else None
        if "eval_tau" in part:
            tau = part["eval_tau"] if tau is None else tau.fillna(part["eval_tau"])
        if tau is None or tau.isna().all():
            continue
        rows = part[tau.notna()]
        axes[0].plot(rows["step"], tau[tau.notna()].astype(float), "o-", ms=4, lw=1.2, label=label)
        if "gpu_seconds" in rows and rows["gpu_seconds"].notna().any():
            timed = rows[rows["gpu_seconds"].notna()]
            axes[1].plot(timed["gpu_seconds"].astype(float) / 60, tau[timed.index].astype(float), "o-", ms=4,
                         lw=1.2, label=label, color=f"C{drawn}")
        drawn += 1
    for ax, xlabel in zip(axes, ("step", "GPU-minutes (devices x wall time of training)")):
        ax.set_title("real tau on held-out prompts", fontsize=10)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("tau", fontsize=9)
        ax.grid(alpha=0.3)
    _legend_or_say(axes[0], bool(drawn), "no real tau measured", fontsize=8)
    fig.tight_layout()
    return save_png(fig, out)


def _legend_or_say(ax, drawn: bool, nothing: str, *, fontsize: int) -> None:
    """The panel's legend when it drew a line, else a word in its middle saying why it is empty."""
    if drawn:
        ax.legend(fontsize=fontsize)
    else:
        ax.text(0.5, 0.5, nothing, ha="center", va="center", transform=ax.transAxes)
