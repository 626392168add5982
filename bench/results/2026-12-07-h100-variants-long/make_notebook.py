# Writes the source of notebooks/results/variants-long-smollm2-h100.ipynb; execute it with
# papermill /tmp/nbgen/variants-long-smollm2-h100-src.ipynb notebooks/results/variants-long-smollm2-h100.ipynb --cwd . -k python3
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ab_notebook import write  # noqa: E402  (bench/results/ab_notebook.py: the shared A/B layout)

INTRO = """# DFlash, DSpark and DSpark at block 8 on the long preset's data for the same GPU-minutes (SmolLM2-135M-Instruct, H100)

Three drafters trained one after the other, each ALONE on the GPU for the same 120 s, on the recipe's long-preset
data pool (59,453 conversations, 52,571 of them target-written): the recipe's DFlash drafter (`dflash`), the same
drafter with DSpark's two heads (`dspark`: a rank-256 Markov head drafting the block slot after slot, a confidence
head, DeepSpec's loss), and DSpark at its published block 8 (`dspark8`). Then real speculative decoding at T=0 on
three held-out sets (decoded alone: speeds are speeds) and at T=1 with drafts sampled from the drafter (tau only).
`dflash` and `dspark` ran in one device session, `dspark8` in a second on another H100, on the same files.

Library: the device tree at `9e59b07` (session 1) and `5bec2b9` (session 2); script `bench/variants_ab.sh`, raw
files and the calls in `bench/results/2026-12-07-h100-variants-long/` (its README). This notebook only reads that
folder through `dflash_lab.workflows.ab_report` and was executed on a CPU."""

EVALUATION = """Batch 1, bf16, each drafter at its own block size, 128 new tokens, the static decoder with CUDA graphs, 64
prompts of every set at both temperatures. Each speedup is over its own session's target-alone pass (`target alone
tokens/s`). T=1 rows of session 1 shared the GPU between the two arms, so read only their tau."""

ARMS = """One row per arm at its last validation check (no training-time real tau: the time went to training).
`val chain tau` (simulated from per-slot accuracies on held-out windows, not decoding) is comparable between the
arms; `val acc` is each variant's own slot accuracy. `last loss` is not comparable: DFlash's is the D-PACE-weighted
distilled CE, DSpark's the published 0.1 CE + 0.9 L1 + 1.0 BCE. Every arm stopped on its time budget about halfway
through its cosine (`status`)."""

FIGURE = """## Tau against GPU-minutes

Held-out chain tau (simulated from per-slot accuracies on held-out windows, not decoding) at every validation check
(250 steps apart) against the GPU-minutes each arm had spent, and the final real tau (speculative decoding) on
held-out chitchat (T=0, 64 prompts) at its last minute."""

READING = """- **One pair of intervals is apart: T=1 on target-written, `dspark8` 1.64 [1.59, 1.69] against `dspark` 1.54
  [1.50, 1.58].** Against `dflash` (1.57 [1.54, 1.60]) it overlaps by 0.01; nothing else separates at either
  temperature on any set. T=0: chitchat 2.36 / 2.49 / 2.48, target-written 1.99 / 1.96 / 2.08, general 1.74 / 1.71 /
  1.81 (`dflash` / `dspark` / `dspark8`). DSpark gains nothing over DFlash here: the presets keep DFlash
  (`dflash_lab/workflows/recipe_config.py`).
- **The simulated chain-tau curves put both DSpark arms above `dflash` at every check** (step 750: 2.25 / 2.31 /
  2.35; not decoding: the real tau above does not separate them), the same order as the half-data run's, the gap
  narrowing as they train.
- **Step time**, the target's forward in all (no step read the feature store): 45.5 ms `dflash`, 50.2 ms `dspark`
  (1.10x), 38.6 ms `dspark8` (half the draft positions). At batch 1, T=0, block-16 DSpark's slot-by-slot drafting
  costs speed (1.46x against 1.58x on target-written); block 8 reads the highest speedups (1.94x / 1.64x / 1.39x).
- **What limits it: minutes, and most of them were not training.** Of each arm's 120 s, ~38-46 s tokenized the
  59,453 conversations, ~25 s loaded the target, sized the store and captured the first step's CUDA graphs, and
  ~45-55 s ran its 772-921 steps, all in the first epoch, every cosine cut about halfway. The half-data run's arms
  took 2,642-3,000 steps in the same 120 s and read 2.86-3.13 on chitchat. The issue's aims (T=0 3.5 / 3.0 / 3.0,
  T=1 2.0, 2.5x / 2.0x) need the long preset's ~11.5 GPU-minutes of training; they are not met here."""

write("variants-long-smollm2-h100", "bench/results/2026-12-07-h100-variants-long", intro=INTRO, evaluation=EVALUATION,
      arms=ARMS, reading=READING, tau_figure=FIGURE, arms_heading="The arms")
