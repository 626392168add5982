"""The knobs-at-10,000-steps summary reads the committed A/B folders back with their figures, and its notebook shows
them statically."""

import json
from pathlib import Path

import pytest

from dflash_lab.config import ConfigError
from dflash_lab.workflows import knob_summary

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def rows():
    return {r["setting"]: r for r in knob_summary.knob_rows(REPO / "bench" / "results")}


def test_every_knob_has_its_arm_its_baseline_and_the_recipes_value(rows):
    assert list(rows) == ["loss_weighting", "batch_size", "distill_weight", "lr_schedule", "num_draft_layers",
                          "num_anchors", "draft_vocab_size", "distill_top_k"]
    assert (rows["loss_weighting"]["arm_value"], rows["loss_weighting"]["base_value"]) == ("dpace", "decay")
    assert (rows["draft_vocab_size"]["arm_value"], rows["draft_vocab_size"]["base_value"]) == (None, 16384)
    # what the recipe trains with: the winners, 5 layers in the long preset only
    assert {k: (r["recipe"], r["recipe_long"]) for k, r in rows.items()} == {
        "loss_weighting": ("dpace", "dpace"), "batch_size": (32, 64), "distill_weight": (1.0, 1.0),
        "lr_schedule": ("cosine", "cosine"), "num_draft_layers": (3, 5), "num_anchors": (64, 64),
        "draft_vocab_size": (16384, 16384), "distill_top_k": (16, 16)}


def test_deltas_and_separation_are_the_folders_figures(rows):
    delta = {k: [round(r["t0"][s]["delta"], 2) for s in knob_summary.SETS] for k, r in rows.items()}
    assert delta["loss_weighting"] == [0.19, 0.11, 0.1]
    assert delta["num_draft_layers"] == [0.14, 0.14, 0.08]
    assert delta["draft_vocab_size"] == [-0.07, 0.03, 0.0]
    assert delta["batch_size"] == [-0.1, -0.08, -0.06]
    # at T=0 no pair of intervals is apart; at T=1 distillation's is, and only where both arms drew sampled drafts
    assert not any(c["separated"] for r in rows.values() for c in r["t0"].values())
    t1 = {k: r["t1"] and (round(r["t1"]["delta"], 2), r["t1"]["separated"]) for k, r in rows.items()}
    assert t1 == {"loss_weighting": None, "batch_size": None, "distill_weight": (0.18, True), "lr_schedule": None,
                  "num_draft_layers": (-0.0, False), "num_anchors": None, "draft_vocab_size": (0.02, False),
                  "distill_top_k": (0.07, False)}
    assert rows["distill_top_k"]["t0"]["general"]["prompts"] == 24  # its evaluation's time budget ran out
    acc = {k: round(r["val_acc"] - r["base_val_acc"], 3) for k, r in rows.items()}
    assert acc["loss_weighting"] == 0.031 and acc["num_draft_layers"] == 0.03
    assert max(abs(v) for k, v in acc.items() if k not in ("loss_weighting", "num_draft_layers")) <= 0.011


def test_the_table_marks_fewer_prompts_and_apart_pairs(rows):
    md = knob_summary.knob_markdown(list(rows.values()))
    assert "| 5 vs 3 draft layers | 5 / 3 | 3.27 vs 3.13 (+0.14) |" in md
    assert "1.59 vs 1.40 (+0.18, apart)" in md and "2.13 vs 2.28 (-0.14, n=24)" in md


def test_a_missing_folder_names_the_fix(tmp_path):
    with pytest.raises(ConfigError, match="no A/B results folder"):
        knob_summary.knob_rows(tmp_path)


def test_the_committed_notebook_shows_the_table_and_one_figure():
    nb = json.loads((REPO / "notebooks" / "results" / "knobs-10k-smollm2.ipynb").read_text())
    outputs = [o for c in nb["cells"] if c["cell_type"] == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o["output_type"] == "error"]
    assert sum("image/png" in o.get("data", {}) for o in outputs) == 1
    shown = "\n".join("".join(o.get("data", {}).get("text/markdown", "")) for o in outputs)
    assert "3.20 vs 3.00 (+0.19)" in shown and "1.66 vs 1.59 (+0.07)" in shown


def test_the_figure_draws_every_arms_checks_against_tokens_and_minutes():
    fig = knob_summary.knob_figure(REPO / "bench" / "results")
    axes = fig.axes
    assert len(axes) == 3 * len(knob_summary.KNOBS)
    n = len(knob_summary.KNOBS)
    for col, k in enumerate(knob_summary.KNOBS):
        acc, tau_tokens, tau_minutes = axes[col], axes[n + col], axes[2 * n + col]
        assert [line.get_label() for line in acc.get_lines()] == [k.arm, k.baseline]
        assert all(len(line.get_xdata()) == 10 for line in acc.get_lines())  # a check every 1,000 steps' tokens
        # two training-time checks per arm, and the final chitchat evaluation at the arm's last step
        assert len(tau_tokens.containers) == len(tau_minutes.containers) == 2
        assert [len(c.lines[0].get_xdata()) for c in tau_tokens.containers] == [2, 2]
        assert tau_tokens.containers[0].lines[0].get_xdata()[-1] == pytest.approx(102.4, rel=1e-3)  # 10k x 32 x 320
