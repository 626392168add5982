"""Static training plots (matplotlib, PNG) for run directories and result notebooks that render on GitHub."""

from __future__ import annotations

import json
from pathlib import Path


def read_metrics(path: str | Path) -> list[dict]:
    p = Path(path)
    if p.is_dir():
        p = p / "metrics.jsonl"
    if not p.is_file():
        return []
    rows = []
    for line in p.read_text().splitlines():
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:  # a line being written right now by a live run
                continue
    return rows


def plot_training(run_dir: str | Path, out: str | Path | None = None) -> Path | None:
    """Loss, LR, simulated acceptance and tokens/s against step, as one PNG in <run_dir>/plots/."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    rows = [r for r in read_metrics(run_dir) if "loss" in r]
    if not rows:
        return None
    steps = [r["step"] for r in rows]
    fig, axes = plt.subplots(1, 4, figsize=(16, 3.4))
    panels = [("loss", "training loss (decayed CE)"), ("lr", "learning rate"),
              ("sim_tau", "simulated acceptance length"), ("tokens_per_s", "sequence tokens/s")]
    for ax, (key, title) in zip(axes, panels):
        ax.plot(steps, [r.get(key) or 0.0 for r in rows], lw=1.4)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    out = Path(out) if out else Path(run_dir) / "plots" / "training.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out
