# Writes the source of notebooks/results/knobs-10k-smollm2.ipynb (every knob at 10,000 steps on one table, read from
# the A/B folders through dflash_lab.workflows.knob_summary); execute it with
# papermill /tmp/nbgen/knobs-10k-src.ipynb notebooks/results/knobs-10k-smollm2.ipynb --cwd . -k python3
import sys
from pathlib import Path

import nbformat as nbf

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ab_notebook import save  # noqa: E402  (bench/results/ab_notebook.py: how every results notebook is written)

INTRO = """# Every knob at 10,000 steps on SmolLM2-135M-Instruct, in one table

Each row is one A/B of the recipe's TrainConfig with one knob changed, both arms trained 10,000 steps of 32 windows
(the batch-128 arm: 2,500 steps, the same tokens) on the SmolLM2 recipe's data at its defaults (29,677
conversations, the same pool by sha256 in every H100 run), evaluated by real speculative decoding: batch 1, bf16,
block 16, 128 new tokens, 64 prompts per set (T=1: 32, drafts sampled from the drafter), 95% bootstrap intervals
over prompts. The baseline moved as knobs won (decay -> D-PACE -> D-PACE with distillation); each row names the
baseline it was trained beside. This notebook only reads the folders under `bench/results/` that the rows name
(each has a README with its calls and its own notebook with every curve), through
`dflash_lab.workflows.knob_summary`, and was executed on a CPU."""
TABLE = """## The table

`arm vs baseline (delta)` in real tau; ", apart" where the two 95% intervals do not overlap; `n=` where the arm
decoded fewer prompts than its baseline. Held-out accuracy: the run's validation on held-out chitchat sequences at
its last check. `recipe now`: the value `RecipeConfig()` and `RecipeConfig.from_preset("long")` train with."""
CURVES = """## Held-out accuracy and real tau against training tokens and against GPU minutes

Arm solid, baseline dashed. Top: held-out accuracy at every validation check. Middle and bottom: real tau at T=0,
the training-time checks at half and all of the tokens (32 prompts of the held-out chitchat conversations, 95%
intervals) and the final evaluation on 64 held-out chitchat prompts (hollow square). The bottom row is each arm's
own GPU minutes as logged in its run: arms that shared the GPU with another arm or an evaluation (two arms at a time
in the H200 grid, parts of every H100 run) logged slower minutes than they would alone, so read speed from the
folders' READMEs, not from this row."""
READING = """## Reading

- **What won**: D-PACE (+0.19 / +0.11 / +0.10, held-out accuracy +0.031), 5 draft layers on a long run (+0.14 / +0.14
  / +0.08, +0.030) and, for T=1, distillation (1.59 against 1.40 with sampled drafts, the one pair whose intervals
  are apart). The recipe trains all three (5 layers in the long preset; the 10-minute defaults keep 3, whose step is
  ~1.55x faster and whose drafts cost less to decode on a 135M target).
- **What is level**: WSD (+0.02 / +0.06 / +0.02), the full vocabulary (-0.07 / +0.03 / 0.00 at a ~1.4x slower
  step), 128 anchors (-0.10 / +0.03 / +0.03 at ~1.9x the step), the top-64 distillation target (T=1 +0.07). Batch
  128 at equal tokens with lr x2 is behind (-0.10 / -0.08 / -0.06), so the speed it buys does not come free in
  tau; the long preset's batch 64 (lr 8.5e-4) is between the two and was measured end to end only.
- **What limits the aims** (3.5 / 3.0 / 3.0 at T=0, 2.0 at T=1): no T=0 difference is outside both intervals at
  64 prompts; held-out accuracy, the steadier measure, moved by +0.03 for D-PACE and 5 layers only, by at most
  0.011 for every other knob. The 3-layer arms stop gaining held-out accuracy by ~9,000 steps on this 29,677-
  conversation pool (0.394 at 9,000 and 10,000); more data and steps (the long preset: twice the target-written
  data, 5 layers, 7,500 steps of 64) reached 3.25 / 2.93 / 2.43 with held-out accuracy still rising. At T=1 every
  lever tried leaves the trained drafter at 1.59-1.67 against 2.26-2.51 for an oracle drafter with the same top-k:
  how well it fits the target's distribution at each slot, not capacity, data or k."""

md, code = nbf.v4.new_markdown_cell, nbf.v4.new_code_cell
print(save([
    md(INTRO),
    code('results_dir: str = "bench/results"  # the A/B folders; relative: from the project root'),
    code("from pathlib import Path\n\nfrom IPython.display import Markdown, display\n\n"
         "from dflash_lab.runs.rundir import PROJECT_ROOT\n"
         "from dflash_lab.workflows.knob_summary import knob_markdown, knob_png, knob_rows\n\n"
         "folder = Path(results_dir) if Path(results_dir).is_absolute() else PROJECT_ROOT / results_dir"),
    md(TABLE),
    code("display(Markdown(knob_markdown(knob_rows(folder))))"),
    md(CURVES),
    code("knob_png(folder)"),
    md(READING),
], "knobs-10k"))
