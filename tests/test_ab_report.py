"""ab_report on the committed H200 distillation A/B: the tables and the figure carry the folder's own numbers, and the
committed result notebook shows them as static PNG and markdown outputs."""

import json
from pathlib import Path

import pytest

from dflash_lab.config import ConfigError
from dflash_lab.workflows import ab_report

REPO = Path(__file__).resolve().parent.parent
FOLDER = REPO / "bench" / "results" / "2026-12-02-h200-distill-ab"
NOTEBOOK = REPO / "notebooks" / "results" / "distill-ab-smollm2-h200.ipynb"

pytestmark = pytest.mark.skipif(not (FOLDER / ab_report.AB_FILE).is_file(), reason="the A/B folder is not here")


@pytest.fixture(scope="module")
def ab():
    return ab_report.load_ab("bench/results/2026-12-02-h200-distill-ab")  # relative: read under the project root


def _static_outputs(name: str) -> str:
    """A committed result notebook's markdown outputs, after checking what GitHub needs to render it: no error
    output, one PNG, no widget state (GitHub refuses some notebooks with it)."""
    nb = json.loads((REPO / "notebooks" / "results" / name).read_text())
    outputs = [o for c in nb["cells"] if c["cell_type"] == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o["output_type"] == "error"] and "widgets" not in nb["metadata"]
    assert sum("image/png" in o.get("data", {}) for o in outputs) == 1
    return "\n".join("".join(o.get("data", {}).get("text/markdown", "")) for o in outputs)


def test_final_rows_are_the_six_drafter_measurements(ab):
    rows = ab_report.final_rows(ab)
    assert [(r["arm"], r["prompt_set"]) for r in rows] == [
        (arm, s) for arm in ("hard", "distill") for s in ("chitchat-heldout", "self-heldout", "general")]
    by = {(r["arm"], r["prompt_set"]): r for r in rows}
    assert round(by["hard", "general"]["tau"], 2) == 2.01
    assert (round(by["hard", "chitchat-heldout"]["tau_low"], 2), round(by["hard", "chitchat-heldout"]["tau_high"], 2)
            ) == (2.68, 3.19)
    assert round(by["distill", "self-heldout"]["tau"], 2) == 2.34
    assert {r["steps"] for r in rows if r["arm"] == "hard"} == {4636}
    assert {r["steps"] for r in rows if r["arm"] == "distill"} == {3941}
    assert round(by["hard", "chitchat-heldout"]["target_tokens_per_s"], 1) == 262.9  # the target alone, same set
    assert all(r["not_separated_from"] == ["distill" if r["arm"] == "hard" else "hard"] for r in rows)
    md = ab_report.final_markdown(ab)
    assert md.count("\n") == 7 and "| hard | 4,636 | general | 0 | 64 | 2.01 [1.92, 2.11] |" in md
    assert "2.02 [1.92, 2.12]" in md and "2.17x" in md and "no (hard)" in md


def test_curves_minutes_and_the_arms_table(ab):
    cs = ab_report.curves(ab)
    assert [r["step"] for r in cs["hard"]][:2] == [1, 50] and cs["hard"][-1]["step"] == 4636
    assert len(cs["hard"]) == 94 and len(cs["distill"]) == 80
    assert round(cs["hard"][-1]["minutes"], 2) == 2.64 and round(cs["distill"][-1]["minutes"], 2) == 2.59
    md = ab_report.arms_markdown(ab)
    assert "| hard | 0 | stopped (resumable) | 4,636 / 6,000 | 0.63 | 2.64 |" in md
    assert "| distill | 0.5 | stopped (resumable) | 3,941 / 6,000 | 0.82 | 2.59 |" in md
    assert "3.15 [2.67, 3.76] n=16" in md and "3.06 [2.68, 3.47] n=16" in md
    assert "7.94e-05" in md and "1.70e-04" in md  # neither reached the cosine's end (lr 0)


def test_settings_differ_only_in_distill_weight(ab):
    md = ab_report.settings_markdown(ab)
    assert [line.split("|")[1].strip() for line in md.splitlines() if "**differs**" in line] == ["distill_weight"]
    assert "29,677 conversations (chitchat 6,882, self 22,795)" in md
    assert "temperatures asked [0.0, 1.0], measured [0.0]" in md and "NVIDIA H200" in md


def test_speed_rows(ab):
    rows = ab_report.speed_rows(ab)
    assert [r["label"] for r in rows] == ["full", "store16k", "store16k-distill", "store16k-compile",
                                          "store16k-compile-b64"]
    assert rows[2]["distill_weight"] == 0.5 and rows[0]["distill_weight"] is None
    assert "| store16k-distill | 32 | 16384 | 4 | 0.5 | False | 27.6 | 371,012 |" in ab_report.speed_markdown(ab)


def test_training_figure_has_steps_and_minutes_rows(ab):
    fig = ab_report.training_figure(ab)
    axes = fig.axes
    assert len(axes) == 8
    assert [ax.get_xlabel() for ax in axes] == ["optimizer step"] * 4 + ["GPU wall-clock minutes since step 1"] * 4
    for ax in (axes[0], axes[1], axes[4], axes[5]):  # loss, accuracy: raw + mean, per arm
        assert len(ax.lines) == 4
    loss = axes[0].lines[1]
    assert loss.get_xdata()[-1] == 4636 and loss.get_label() == "hard (4,636 steps)"
    assert round(axes[4].lines[3].get_xdata()[-1], 2) == 2.59  # distill's last minute
    held_out = {line.get_label(): (int(line.get_xdata()[0]), round(float(line.get_ydata()[0]), 3))
                for line in axes[2].lines}
    assert held_out == {"hard": (3000, 0.28), "distill": (3000, 0.296)}  # one validation check each
    assert ab_report.differing_settings(ab) == ["distill_weight"]
    tau = axes[3]  # per arm: one check errorbar + one per set -> 2 * 4 containers
    assert len(tau.containers) == 8
    ys = sorted(round(float(c.lines[0].get_ydata()[0]), 2) for c in tau.containers)
    assert ys == [2.01, 2.02, 2.34, 2.38, 2.85, 2.92, 3.06, 3.15]
    assert [t.get_text() for t in tau.get_legend().get_texts()] == [
        "training-time check (n=16)", "final eval: chitchat-heldout (n=64)",
        "final eval: self-heldout (n=64)", "final eval: general (n=64)"]
    assert ab_report.figure_png(fig).data[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_folder_without_the_files_names_the_fix(tmp_path):
    with pytest.raises(ConfigError, match="eval/ab.json.*Fix: pass the folder"):
        ab_report.load_ab(tmp_path)


def test_the_committed_notebook_shows_the_tables_and_a_png():
    nb = json.loads(NOTEBOOK.read_text())
    outputs = [o for c in nb["cells"] if c["cell_type"] == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o["output_type"] == "error"]
    assert sum("image/png" in o.get("data", {}) for o in outputs) == 1
    text = "\n".join("".join(o.get("data", {}).get("text/markdown", "")) for o in outputs)
    assert "2.92 [2.68, 3.19]" in text and "2.02 [1.92, 2.12]" in text and "store16k-compile-b64" in text
    assert "widgets" not in nb["metadata"]  # GitHub refuses some notebooks with widget state
    prose = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")
    assert "276d54e" in prose and "no T=1 figure" in prose and "4,636" in prose and "3,941" in prose


def test_one_arm_at_two_temperatures_reads_each_baseline_at_its_own_temperature():
    long = ab_report.load_ab("bench/results/2026-12-02-h200-long-arms")
    by = {(r["prompt_set"], r["temperature"]): r for r in ab_report.final_rows(long)}
    assert sorted(by) == [("chitchat-heldout", 0.0), ("chitchat-heldout", 1.0), ("general", 0.0),
                          ("self-heldout", 0.0)]
    assert round(by["chitchat-heldout", 0.0]["target_tokens_per_s"], 1) == 276.7  # not the T=1 baseline's 205.0
    assert round(by["chitchat-heldout", 1.0]["target_tokens_per_s"], 1) == 205.0
    assert round(by["chitchat-heldout", 1.0]["tau"], 2) == 1.25 and round(by["general", 0.0]["tau"], 2) == 2.11
    assert all(r["not_separated_from"] is None for r in by.values())  # one arm: nothing to tell apart
    tau = ab_report.training_figure(long).axes[3]  # T=0 panel: the three T=0 sets and the check, not the T=1 row
    ys = sorted(round(float(c.lines[0].get_ydata()[0]), 2) for c in tau.containers)
    assert ys == [2.11, 2.48, 2.87, 3.02]
    md = ab_report.final_markdown(long)
    assert "| distill-b64x5k | 5,000 | chitchat-heldout | 1 | 64 | 1.25 [1.22, 1.27] | 205.1 | 205.0 | 1.00x | - |" in md


def test_the_committed_long_arm_notebook_shows_both_temperatures_and_a_png():
    nb = json.loads((REPO / "notebooks" / "results" / "long-arm-b64-smollm2-h200.ipynb").read_text())
    outputs = [o for c in nb["cells"] if c["cell_type"] == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o["output_type"] == "error"]
    assert sum("image/png" in o.get("data", {}) for o in outputs) == 1 and "widgets" not in nb["metadata"]
    text = "\n".join("".join(o.get("data", {}).get("text/markdown", "")) for o in outputs)
    assert "3.02 [2.77, 3.29]" in text and "| 1 | 64 | 1.25 [1.22, 1.27] |" in text and "store16k-compile-overlap" in text
    prose = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")
    assert "1.52 [1.48, 1.57]" in prose and "7728dd4" in prose and "571.8k" in prose


def test_the_knob_grid_folder_reads_back_with_its_figures():
    grid = ab_report.load_ab("bench/results/2026-12-03-h200-knob-grid")
    assert ab_report.differing_settings(grid) == ["num_draft_layers", "loss_weighting"]  # not the time budget
    by = {(r["arm"], r["prompt_set"]): r for r in ab_report.final_rows(grid)}
    assert sorted({a for a, _ in by}) == ["base", "dpace"]  # layers5 stopped before its evaluation
    sets = ("chitchat-heldout", "self-heldout", "general")
    assert [round(by["dpace", s]["tau"] - by["base", s]["tau"], 2) for s in sets] == [0.19, 0.11, 0.10]  # unrounded
    assert all(r["speedup"] is None and r["tokens_per_s"] is None for r in by.values())  # measured beside others
    md = ab_report.final_markdown(grid)
    assert "| dpace | 10,000 | chitchat-heldout | 0 | 64 | 3.20 [2.92, 3.51] | - | - | - | no (base) |" in md
    arms = ab_report.arms_markdown(grid)
    assert "| layers5 | 5 / decay | stopped (resumable) | 9,650 / 10,000 |" in arms
    assert "| dpace | 3 / dpace | finished | 10,000 / 10,000 |" in arms and "3.56 [3.10, 4.13] n=32" in arms
    speed = {r["label"]: r for r in ab_report.speed_rows(grid)}
    assert round(speed["b128-dpace"]["tokens_per_s"] / speed["issue-engine"]["tokens_per_s"], 2) == 2.50
    text = _static_outputs("knob-grid-smollm2-h200.ipynb")
    assert "3.00 [2.74, 3.30]" in text and "618,481" in text


def test_the_sampled_answers_folder_reads_back_with_its_figures():
    """Two pools differing in their training answers only (greedy / sampled at T=1): the same TrainConfig in both
    arms (the time budget where each call stopped aside), T=0 only, 24 prompts a set."""
    sa = ab_report.load_ab("bench/results/2026-12-04-h200-sampled-answers")
    assert ab_report.differing_settings(sa) == []
    by = {(r["arm"], r["prompt_set"]): r for r in ab_report.final_rows(sa)}
    sets = ("chitchat-heldout", "self-heldout", "general")
    assert [round(by["dpace-sa-t1", s]["tau"] - by["dpace-sa-greedy", s]["tau"], 2) for s in sets] == \
        [-0.59, -0.44, -0.16]
    assert {r["temperature"] for r in by.values()} == {0.0} and {r["prompts"] for r in by.values()} == {24}
    md = ab_report.final_markdown(sa)
    assert "| dpace-sa-greedy | 3,000 | chitchat-heldout | 0 | 24 | 2.62 [2.32, 3.04] | - | - | - | yes |" in md
    assert "| dpace-sa-t1 | 3,000 | general | 0 | 24 | 1.74 [1.65, 1.85] | - | - | - | no (dpace-sa-greedy) |" in md
    assert "24 prompts per set" in ab_report.settings_markdown(sa)
    val = {arm: [round(r["val_acc"], 3) for r in rs if r.get("val_acc") is not None]
           for arm, rs in ab_report.curves(sa).items()}
    assert val == {"dpace-sa-greedy": [0.262, 0.294, 0.336], "dpace-sa-t1": [0.145, 0.156, 0.156]}
    text = _static_outputs("sampled-answers-smollm2-h200.ipynb")
    assert "2.03 [1.91, 2.18]" in text and "1.93 [1.81, 2.07]" in text


def test_the_batch128_and_coupled_t1_folder_reads_back_with_its_figures():
    """A fresh D-PACE baseline and batch 128 at equal tokens (T=0, alone on the GPU, speeds kept), and the baseline
    at T=1 with argmax and coupled drafts (decoded beside a training job: speeds left out)."""
    g2 = ab_report.load_ab("bench/results/2026-12-05-knob-grid2")
    assert ab_report.differing_settings(g2) == ["steps", "batch_size", "lr", "val_every", "real_tau_every"]
    rows = ab_report.final_rows(g2)
    t0 = {(r["arm"], r["prompt_set"]): r for r in rows if r["temperature"] == 0}
    sets = ("chitchat-heldout", "self-heldout", "general")
    assert [round(t0["b128-dpace", s]["tau"] - t0["dpace", s]["tau"], 2) for s in sets] == [-0.10, -0.08, -0.06]
    assert {t0["dpace", s]["prompts"] for s in sets} == {t0["b128-dpace", s]["prompts"] for s in sets} == {64}
    assert round(t0["dpace", "chitchat-heldout"]["speedup"], 2) == 2.38  # decoded alone: speed kept
    t1 = {r["arm"]: r for r in rows if r["temperature"] == 1}
    argmax, coupled = t1["dpace"], t1["dpace (coupled drafts)"]
    assert (argmax["prompts"], coupled["prompts"]) == (32, 25)  # coupled cut by its time budget
    assert coupled["tau_low"] > argmax["tau_high"]  # coupled drafts above argmax, intervals apart
    assert coupled["speedup"] is None and argmax["tokens_per_s"] is None
    md = ab_report.final_markdown(g2)
    assert "| b128-dpace | 2,500 | chitchat-heldout | 0 | 64 | 3.12 [2.85, 3.43] | 588.9 | 268.7 | 2.31x |" in md
    assert "| dpace (coupled drafts) | 10,000 | chitchat-heldout | 1 | 25 | 1.44 [1.39, 1.50] |" in md
    val = {arm: [round(r["val_acc"], 3) for r in rs if r.get("val_acc") is not None]
           for arm, rs in ab_report.curves(g2).items()}
    assert val["dpace"][-1] == 0.395 and val["b128-dpace"][-1] == 0.387 and len(val["b128-dpace"]) == 10
    text = _static_outputs("knob-grid2-smollm2-h100.ipynb")
    assert "3.22 [2.92, 3.53]" in text and "1.24 [1.19, 1.29]" in text


def test_the_layers5_and_anchors128_folder_reads_back_with_its_figures():
    """Two knobs on the distilled baseline (whose arm comes from the day's other run on the same data pool): speeds
    kept only for rows decoded alone, the baseline's T=0 rows read against this folder's target-only rows."""
    la = ab_report.load_ab("bench/results/2026-12-06-h100-layers5-anchors128")
    assert ab_report.differing_settings(la) == ["num_anchors", "num_draft_layers", "feature_store_gib"]
    rows = ab_report.final_rows(la)
    t0 = {(r["arm"], r["prompt_set"]): r for r in rows if r["temperature"] == 0}
    sets = ("chitchat-heldout", "self-heldout", "general")
    base = "distill1-dpace"
    assert [round(t0["layers5-distill1", s]["tau"] - t0[base, s]["tau"], 2) for s in sets] == [0.14, 0.14, 0.08]
    assert [round(t0["anchors128-distill1", s]["tau"] - t0[base, s]["tau"], 2) for s in sets] == [-0.1, 0.03, 0.03]
    assert {t0[a, s]["prompts"] for a in ("layers5-distill1", "anchors128-distill1", base) for s in sets} == {64}
    assert [t0["layers5-distill1", s]["speedup"] and round(t0["layers5-distill1", s]["speedup"], 2)
            for s in sets] == [2.38, 2.06, None]  # general never decoded alone
    assert all(t0[base, s]["speedup"] is None for s in sets)  # decoded beside other jobs: speeds left out
    t1 = {r["arm"]: r for r in rows if r["temperature"] == 1}
    assert t1["layers5-distill1 (sample drafts)"]["prompts"] == t1[base + " (sample drafts)"]["prompts"] == 32
    assert round(t1["layers5-distill1 (sample drafts)"]["tau"], 2) == round(t1[base + " (sample drafts)"]["tau"], 2)
    val = {arm: [round(r["val_acc"], 3) for r in rs if r.get("val_acc") is not None]
           for arm, rs in ab_report.curves(la).items()}
    assert (val[base][-1], val["layers5-distill1"][-1], val["anchors128-distill1"][-1]) == (0.394, 0.424, 0.393)
    assert all(a > b for a, b in zip(val["layers5-distill1"], val[base]))  # ahead at every check
    text = _static_outputs("layers5-anchors128-smollm2-h100.ipynb")
    assert "3.27 [2.98, 3.60]" in text and "1.59 [1.54, 1.64]" in text and "2.31x" in text


def test_the_vocab_and_topk64_folder_reads_back_with_its_figures():
    """The draft vocabulary and the distillation top-k on the distilled baseline: no row decoded alone, so no speed
    anywhere; the top-64 arm's general row is the 24 prompts its evaluation's time budget allowed."""
    vt = ab_report.load_ab("bench/results/2026-12-06-h100-vocab-topk64")
    assert ab_report.differing_settings(vt) == ["draft_vocab_size", "feature_store_gib", "distill_top_k"]
    rows = ab_report.final_rows(vt)
    assert all(r["speedup"] is None and r["tokens_per_s"] is None for r in rows)
    t0 = {(r["arm"], r["prompt_set"]): r for r in rows if r["temperature"] == 0}
    sets = ("chitchat-heldout", "self-heldout", "general")
    base = "distill1-dpace"
    assert [round(t0["vocab-full-distill1", s]["tau"] - t0[base, s]["tau"], 2) for s in sets] == [-0.07, 0.03, 0.0]
    assert [t0["topk64-distill1", s]["prompts"] for s in sets] == [64, 64, 24]
    assert all(t0[a, s]["not_separated_from"] for a in ("vocab-full-distill1", "topk64-distill1") for s in sets)
    t1 = {r["arm"]: round(r["tau"], 2) for r in rows if r["temperature"] == 1}
    assert (t1[base + " (sample drafts)"], t1["vocab-full-distill1 (sample drafts)"],
            t1["topk64-distill1 (sample drafts)"]) == (1.59, 1.6, 1.66)
    val = {arm: [round(r["val_acc"], 3) for r in rs if r.get("val_acc") is not None]
           for arm, rs in ab_report.curves(vt).items()}
    assert (val[base][-1], val["vocab-full-distill1"][-1], val["topk64-distill1"][-1]) == (0.394, 0.39, 0.392)
    assert max(abs(a - b) for a, b in zip(val["vocab-full-distill1"], val[base])) < 0.02  # level at every check
    text = _static_outputs("vocab-topk64-smollm2-h100.ipynb")
    assert "3.06 [2.80, 3.34]" in text and "1.66 [1.59, 1.74]" in text and "2.13 [1.94, 2.40]" in text


def test_long_preset5_notebook_shows_its_folder_figures():
    """The long preset's end-to-end run (a recipe results.json, not an A/B folder): the committed notebook's tables
    carry the folder's final taus and training-time checks, rendered statically."""
    from dflash_lab.runs.generalisation import checks_table
    from dflash_lab.runs.plots import read_metrics
    from dflash_lab.workflows.recipe_results import results_html

    folder = REPO / "bench" / "results" / "2026-12-06-h100-long-preset5" / "call3-train-eval"
    results = json.loads((folder / "results.json").read_text())
    assert results["phases"]["train"]["status"] == "finished" and results["phases"]["export"]["config"][
        "num_hidden_layers"] == 5
    html = results_html(results)
    for figure in ("3.25 [2.97, 3.56]", "2.93 [2.73, 3.16]", "2.43 [2.29, 2.58]", "1.67 [1.62, 1.72]", "2.37x"):
        assert figure in html
    table = checks_table(list(read_metrics(folder / "metrics.jsonl")))
    assert [(r["step"], round(r["val_acc"], 3), round(r["real_tau"], 2)) for r in table] == [
        (2500, 0.368, 3.22), (5000, 0.408, 3.57), (7500, 0.421, 3.70)]
    nb = json.loads((REPO / "notebooks" / "results" / "long-preset5-smollm2-h100.ipynb").read_text())
    outputs = [o for c in nb["cells"] if c["cell_type"] == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o["output_type"] == "error"] and "widgets" not in nb["metadata"]
    assert sum("image/png" in o.get("data", {}) for o in outputs) == 1
    shown = "\n".join("".join(o.get("data", {}).get(k, "")) for o in outputs for k in ("text/html", "text/markdown"))
    assert "3.25 [2.97, 3.56]" in shown and "3.70 [3.23, 4.27]" in shown and "3.45 [3.09, 3.90]" in shown


def test_the_variants_on_the_long_data_read_back_with_each_arms_block_and_target_alone_pass():
    """Three arms of two sessions (bench/recipe_ab.py collect): DSpark at block 8 decoded at its own block, every
    drafter row's speedup and target-alone speed its own session's, the real-tau panel naming both blocks."""
    data = ab_report.load_ab("bench/results/2026-12-07-h100-variants-long")
    rows = {(r["arm"], r["prompt_set"]): r for r in ab_report.final_rows(data) if r["temperature"] == 0}
    assert {a: rows[(a, "chitchat-heldout")]["block_size"] for a in ("dflash", "dspark", "dspark8")} == \
        {"dflash": 16, "dspark": 16, "dspark8": 8}
    assert [round(rows[(a, "general")]["target_tokens_per_s"], 1) for a in ("dflash", "dspark8")] == [295.2, 301.9]
    assert round(rows[("dspark8", "chitchat-heldout")]["tau"], 2) == 2.48
    assert rows[("dspark8", "self-heldout")]["not_separated_from"] == ["dflash", "dspark"]
    fig = ab_report.training_figure(data)
    assert fig.axes[3].get_title() == "real tau at T=0, each arm at its own block (8, 16) (95% bootstrap intervals)"
    assert "[16] asked, [8, 16] decoded (each arm at its own)" in ab_report.settings_markdown(data)
