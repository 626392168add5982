# Writes the source of notebooks/results/variants-long-smollm2-h100.ipynb; execute it with
# papermill /tmp/nbgen/variants-long-smollm2-h100-src.ipynb notebooks/results/variants-long-smollm2-h100.ipynb --cwd . -k python3
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ab_notebook import write  # noqa: E402  (bench/results/ab_notebook.py: the shared A/B layout)

INTRO = """# DFlash and DSpark on the long preset's data for the same GPU-minutes (SmolLM2-135M-Instruct, one NVIDIA H100)

Two drafters trained one after the other, each ALONE on the GPU for the same 120 s, on the recipe's long-preset
data pool (59,453 conversations, 52,571 of them target-written): the recipe's DFlash drafter (`dflash`) and the same
drafter with DSpark's two heads (`dspark`: a rank-256 Markov head drafting the block slot after slot, a confidence
head, DeepSpec's loss). Then real speculative decoding at T=0 on three held-out sets (decoded alone: speeds are
speeds) and at T=1 with drafts sampled from the drafter (the two arms side by side on the GPU: tau holds, their
speeds do not). DSpark at its published block 8 did not run on this data (device time); it is in
`notebooks/results/variants-ab-smollm2-h100.ipynb`, on half of it.

Library: the device tree at `9e59b07`; script `bench/variants_ab.sh`, raw files and the calls in
`bench/results/2026-12-07-h100-variants-long/` (its README). This notebook only reads that folder through
`dflash_lab.workflows.ab_report` and was executed on a CPU."""

EVALUATION = """Batch 1, bf16, block 16, 128 new tokens, the static decoder with CUDA graphs, 64 prompts of every set at
both temperatures. T=1 rows: the two arms shared the GPU, so read only their tau."""

ARMS = """One row per arm at its last validation check (no training-time real tau: the time went to training).
`val chain tau` is comparable between the arms; `val acc` is each variant's own slot accuracy. `last loss` is not
comparable: DFlash's is the D-PACE-weighted distilled CE, DSpark's the published 0.1 CE + 0.9 L1 + 1.0 BCE. Both
arms stopped on their time budget halfway through their cosine (`status`)."""

FIGURE = """## Tau against GPU-minutes

Held-out chain tau at every validation check (250 steps apart) against the GPU-minutes each arm had spent, and the
final real tau on held-out chitchat (T=0, 64 prompts) at its last minute."""

READING = """- **No interval separates the arms on any set at either temperature.** T=0: chitchat 2.36 [2.20, 2.52]
  against 2.49 [2.29, 2.71], target-written 1.99 / 1.96, general 1.74 / 1.71; T=1: 1.50 / 1.46, 1.57 / 1.54,
  1.52 / 1.53. The presets keep DFlash (`dflash_lab/workflows/recipe_config.py`).
- **The chain-tau curves put `dspark` above `dflash` at every check** (2.21 against 2.03 at step 500, 2.31
  against 2.25 at step 750), the same order as the half-data run's, and the gap narrows as both train.
- **Step time**, the target's forward in both (no step read the feature store): 45.5 ms for `dflash`, 50.2 ms for
  `dspark` (1.10x; 1.22x with features from the store in the half-data run). Speedup at batch 1, T=0: 1.88x / 1.85x
  on chitchat, 1.58x / 1.46x on target-written, 1.36x / 1.26x on general: DSpark's slot-by-slot drafting costs speed
  where its tau gains nothing.
- **What limits it: minutes, and most of them were not training.** Of each arm's 120 s, ~46 s tokenized the 59,453
  conversations, ~30 s loaded the target, sized the store and captured the first step's CUDA graphs, and ~45 s ran
  its ~790 steps, all in the first epoch, both cosines cut at lr 3.0-3.5e-4. The half-data run's arms took 2,978 /
  2,642 steps in the same 120 s and read 2.86 / 3.13 on chitchat. The issue's aims (T=0 3.5 / 3.0 / 3.0, T=1 2.0,
  2.5x / 2.0x) need the long preset's ~11.5 GPU-minutes of training; they are not met here."""

write("variants-long-smollm2-h100", "bench/results/2026-12-07-h100-variants-long", intro=INTRO, evaluation=EVALUATION,
      arms=ARMS, reading=READING, tau_figure=FIGURE, arms_heading="The arms")
