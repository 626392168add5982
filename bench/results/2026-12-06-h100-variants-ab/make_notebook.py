# Writes the source of notebooks/results/variants-ab-smollm2-h100.ipynb; execute it with
# papermill /tmp/nbgen/variants-ab-src.ipynb notebooks/results/variants-ab-smollm2-h100.ipynb --cwd . -k python3
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ab_notebook import write  # noqa: E402  (bench/results/ab_notebook.py: the shared A/B layout)

INTRO = """# DFlash, DSpark and DSpark at block 8 for the same GPU-minutes (SmolLM2-135M-Instruct, one NVIDIA H100)

Three drafters trained one after the other, each ALONE on the GPU for the same 120 s (about 2 GPU-minutes; the
cosine schedule over 3,000 steps, which the block-8 arm finished in 108 s), on one data pool: the recipe's DFlash
drafter (`dflash`), the same drafter with DSpark's two heads (`dspark`: a rank-256 Markov head drafting the block slot
after slot, a confidence head), and DSpark at its published block size 8 (`dspark8`). Then real speculative decoding
at T=0 on three held-out sets (decoded alone: speeds are speeds) and at T=1 with drafts sampled from the drafter
(the three arms side by side on the GPU: tau holds, their speeds do not).

Library: the device tree at `94f06d6` (`dflash_lab/` unchanged since `87af8a1`); script `bench/variants_ab.sh`, raw
files and the calls in `bench/results/2026-12-06-h100-variants-ab/` (its README). This notebook only reads that
folder through `dflash_lab.workflows.ab_report` and was executed on a CPU."""

EVALUATION = """Batch 1, bf16, 128 new tokens, the static decoder with CUDA graphs, each drafter at its own block size.
The evaluation passes had time budgets: the general set was cut at 47 prompts for `dflash` / `dspark` and at 10
for `dspark8` (the first 10 of the same file: harder prompts than the 47's average, so its `separated: yes` compares
different prompts and means nothing). T=1 rows: 17 / 13 / 17 held-out chitchat prompts (a 41 s budget per arm), and
their tokens/s and speedups were measured with the three arms sharing the GPU: read only their tau."""

ARMS = """One row per arm at its last validation check (no training-time real tau: the time went to training).
`val chain tau` is comparable between the arms; `val acc` is each variant's own slot accuracy. `last loss` is not
comparable: DFlash's is the D-PACE-weighted distilled CE, DSpark's the published 0.1 CE + 0.9 L1 + 1.0 BCE."""

FIGURE = """## Tau against GPU-minutes

Held-out chain tau at every validation check (250 steps apart) against the GPU-minutes each arm had spent, and the
final real tau on held-out chitchat (T=0, 64 prompts) at its last minute."""

READING = """- **At equal GPU-minutes no variant separates from DFlash on real tau.** Held-out chitchat, T=0: `dflash`
  2.86 [2.63, 3.11], `dspark` 3.13 [2.83, 3.46], `dspark8` 3.08 [2.79, 3.39]; target-written 2.32 / 2.36 / 2.41,
  all intervals overlapping; general (47 prompts) 1.93 / 1.92. The presets keep DFlash
  (`dflash_lab/workflows/recipe_config.py` unchanged).
- **The chain-tau curves order them** `dspark8` > `dspark` > `dflash` at every check from 0.6 GPU-minutes on
  (2.99 / 2.95 / 2.86 at the end), the same order as the real tau on chitchat; more prompts or more minutes would be
  needed to call it.
- **Step time** (steady sequence tokens/s alone, batch 32 x 320 tokens): `dflash` 408.3k (25.1 ms a step),
  `dspark` 335.9k (30.5 ms, 1.22x DFlash's: the Markov embedding and projection at every slot), `dspark8` 514.5k
  (19.9 ms: half the draft rows). In 120 s `dspark` took 2,642 steps against 2,978.
- **Speedup at batch 1** (T=0, decoded alone): chitchat 2.23x / 2.27x / 2.34x; target-written 1.82x / 1.74x / 1.87x:
  the slot-by-slot Markov drafting costs `dspark` the speed its tau gains on the harder set.
- **T=1, sampled drafts** (13-17 prompts): 1.59 [1.52, 1.67] / 1.49 [1.41, 1.60] / 1.64 [1.54, 1.79]: level.
- **What limits it**: minutes. Each arm had 2 GPU-minutes against the long preset's ~11.5 of training (25 with
  data and evaluation), and all three curves still rise at the end. The issue's aims (T=0 3.5 / 3.0 / 3.0, T=1 2.0,
  2.5x / 2.0x) are not met here."""

write("variants-ab", "bench/results/2026-12-06-h100-variants-ab", intro=INTRO, evaluation=EVALUATION, arms=ARMS,
      reading=READING, tau_figure=FIGURE, arms_heading="The arms")
