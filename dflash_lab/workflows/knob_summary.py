"""Every knob measured at 10,000 steps on SmolLM2, in one table and one figure: each arm against the baseline it was
trained beside on the same data pool, read from the committed A/B folders (ab_report.load_ab), with what the recipe
trains with today.

One knob changes between an arm and its baseline; the baselines themselves moved as knobs won (decay -> D-PACE ->
D-PACE with distillation), so each row says which baseline it was measured against. Deltas are real tau at T=0 on
the three held-out sets (and T=1 with sampled drafts where both arms were evaluated so), with whether the two 95%
intervals overlap; held-out accuracy is the run's validation at its last check. Curves (held-out accuracy and real
tau) are drawn against training tokens (batch x sequence length x steps: a batch-128 arm and a batch-32 one meet at
equal tokens) and against the GPU minutes each arm logged in its own run (arms that shared a GPU with another arm or
an evaluation logged slower minutes; the per-run notebooks say which).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dflash_lab.evaluation.intervals import stored_interval
from dflash_lab.runs.plots import PngImage
from dflash_lab.workflows.ab_report import curves, figure_png, final_rows, load_ab
from dflash_lab.workflows.recipe_config import RecipeConfig

SETS = ("chitchat-heldout", "self-heldout", "general")


@dataclass(frozen=True)
class Knob:
    """One knob's A/B: `arm` against `baseline` in `folder` (under bench/results), `setting` the TrainConfig field
    that differs between them."""

    name: str
    folder: str
    arm: str
    baseline: str
    setting: str


KNOBS = (
    Knob("loss weighting: D-PACE vs decay", "2026-12-03-h200-knob-grid", "dpace", "base", "loss_weighting"),
    Knob("batch 128 and lr x2 at equal tokens", "2026-12-05-knob-grid2", "b128-dpace", "dpace", "batch_size"),
    Knob("distillation (top-16, weight 1.0)", "2026-12-06-h100-distill-t1", "distill1-dpace", "dpace",
         "distill_weight"),
    Knob("schedule: WSD vs cosine", "2026-12-06-h100-distill-t1", "wsd-dpace", "dpace", "lr_schedule"),
    Knob("5 vs 3 draft layers", "2026-12-06-h100-layers5-anchors128", "layers5-distill1", "distill1-dpace",
         "num_draft_layers"),
    Knob("128 vs 64 anchors", "2026-12-06-h100-layers5-anchors128", "anchors128-distill1", "distill1-dpace",
         "num_anchors"),
    Knob("draft vocabulary: all 49,152 ids vs 16,384", "2026-12-06-h100-vocab-topk64", "vocab-full-distill1",
         "distill1-dpace", "draft_vocab_size"),
    Knob("distillation target: top-64 vs top-16", "2026-12-06-h100-vocab-topk64", "topk64-distill1",
         "distill1-dpace", "distill_top_k"),
)


def _tau(rows: list[dict], arm: str, prompt_set: str, temperature: float) -> dict | None:
    label = arm if temperature == 0 else f"{arm} (sample drafts)"
    return next((r for r in rows if r["arm"] == label and r["prompt_set"] == prompt_set
                 and r["temperature"] == temperature), None)


def _compare(a: dict | None, b: dict | None) -> dict | None:
    """arm row a against baseline row b: both taus, the delta, prompts, and whether the intervals are apart."""
    if a is None or b is None:
        return None
    ia, ib = (stored_interval(r["tau"], r["tau_low"], r["tau_high"], r["prompts"]) for r in (a, b))
    return {"tau": a["tau"], "base_tau": b["tau"], "delta": a["tau"] - b["tau"], "prompts": a["prompts"],
            "base_prompts": b["prompts"], "separated": bool(ia and ib and not ia.overlaps(ib))}


def _last_val(rs: list[dict]) -> float | None:
    return next((r["val_acc"] for r in reversed(rs) if r.get("val_acc") is not None), None)


def knob_rows(results_dir: str | Path = "bench/results") -> list[dict]:
    """One row per KNOBS entry: the arm's and baseline's settings, T=0 comparisons per set, the T=1 one (None where
    either arm was not evaluated at T=1 with sampled drafts), last held-out accuracies, the GPU, and the value the
    recipe trains with now (the 10-minute defaults and the long preset)."""
    default, long = (c.train_config(Path("data.jsonl")) for c in (RecipeConfig(), RecipeConfig.from_preset("long")))
    loaded, out = {}, []
    for k in KNOBS:
        data = loaded.setdefault(k.folder, load_ab(Path(results_dir) / k.folder))
        rows, cs = final_rows(data), curves(data)
        out.append({
            "knob": k.name, "folder": k.folder, "arm": k.arm, "baseline": k.baseline, "setting": k.setting,
            "arm_value": data["configs"][k.arm].get(k.setting),
            "base_value": data["configs"][k.baseline].get(k.setting),
            "t0": {s: _compare(_tau(rows, k.arm, s, 0.0), _tau(rows, k.baseline, s, 0.0)) for s in SETS},
            "t1": _compare(_tau(rows, k.arm, SETS[0], 1.0), _tau(rows, k.baseline, SETS[0], 1.0)),
            "val_acc": _last_val(cs[k.arm]), "base_val_acc": _last_val(cs[k.baseline]),
            "gpu": data["env"][0].split(",")[0] if data["env"] else None,
            "recipe": getattr(default, k.setting), "recipe_long": getattr(long, k.setting)})
    return out


def _cell(c: dict | None) -> str:
    if c is None:
        return "-"
    n = f", n={c['prompts']}" if c["prompts"] != c["base_prompts"] else ""
    return f"{c['tau']:.2f} vs {c['base_tau']:.2f} ({c['delta']:+.2f}{', apart' if c['separated'] else ''}{n})"


def knob_markdown(rows: list[dict]) -> str:
    """knob_rows as a markdown table: per set `arm vs baseline (delta)`, ", apart" where the intervals do not
    overlap, n where the arm decoded fewer prompts than its baseline."""
    head = ["knob", "arm / baseline value", "held-out chitchat", "held-out target-written", "general",
            "T=1 chitchat, sampled drafts", "held-out acc", "GPU", "recipe now (10 min / long)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        acc = "-" if r["val_acc"] is None else f"{r['val_acc']:.3f} vs {r['base_val_acc']:.3f}"
        cells = [r["knob"], f"{r['arm_value']} / {r['base_value']}", *(_cell(r["t0"][s]) for s in SETS),
                 _cell(r["t1"]), acc, r["gpu"] or "-", f"{r['recipe']} / {r['recipe_long']}"]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


def knob_figure(results_dir: str | Path = "bench/results"):
    """One column per knob, the arm solid and its baseline dashed: held-out accuracy against training tokens (top),
    real tau against training tokens (middle) and against the GPU minutes each logged in its run (bottom). Real tau:
    the training-time checks on the run's held-out chitchat prompts (filled, with intervals) and the final T=0
    evaluation on held-out chitchat (hollow) at the last step."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(3.2 * len(KNOBS), 9.0), layout="constrained")
    axes = fig.subplots(3, len(KNOBS), sharey="row")
    loaded = {}
    for col, k in enumerate(KNOBS):
        data = loaded.setdefault(k.folder, load_ab(Path(results_dir) / k.folder))
        cs, finals = curves(data), final_rows(data)
        for i, (arm, style) in enumerate(((k.arm, "-"), (k.baseline, "--"))):
            cfg, color = data["configs"][arm], f"C{i}"
            per_step = cfg["batch_size"] * cfg["seq_len"] / 1e6
            val = [r for r in cs[arm] if r.get("val_acc") is not None]
            axes[0, col].plot([r["step"] * per_step for r in val], [r["val_acc"] for r in val], "o" + style, ms=3,
                              color=color, label=arm)
            checks = [r for r in cs[arm] if r.get("real_tau") is not None]
            final = _tau(finals, arm, SETS[0], 0.0)
            for ax, x in ((axes[1, col], lambda r: r["step"] * per_step), (axes[2, col], lambda r: r["minutes"])):
                ax.errorbar([x(r) for r in checks], [r["real_tau"] for r in checks], fmt="o" + style, ms=3,
                            color=color, capsize=2, yerr=_yerr(checks))
                if final is not None:
                    ax.plot([x(cs[arm][-1])], [final["tau"]], "s", mfc="white", color=color, ms=6)
        axes[0, col].set_title(k.name, fontsize=8)
        axes[0, col].legend(fontsize=7)
        for row, label in enumerate(("training tokens (M)", "training tokens (M)", "GPU minutes in its run")):
            axes[row, col].set_xlabel(label, fontsize=8)
            axes[row, col].grid(alpha=0.3)
    axes[0, 0].set_ylabel("held-out accuracy")
    axes[1, 0].set_ylabel("real tau, T=0 (square: final, chitchat)")
    axes[2, 0].set_ylabel("real tau, T=0")
    return fig


def _yerr(checks: list[dict]) -> list[list[float]]:
    lo = [r["real_tau"] - (r.get("real_tau_low") or r["real_tau"]) for r in checks]
    return [lo, [(r.get("real_tau_high") or r["real_tau"]) - r["real_tau"] for r in checks]]


def knob_png(results_dir: str | Path = "bench/results") -> PngImage:
    return figure_png(knob_figure(results_dir), dpi=80)
