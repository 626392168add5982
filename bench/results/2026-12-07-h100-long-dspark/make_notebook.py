# Writes the source of notebooks/results/long-dspark-smollm2-h100.ipynb; execute it with
# papermill /tmp/nbgen/long-dspark-smollm2-h100-src.ipynb notebooks/results/long-dspark-smollm2-h100.ipynb --cwd . -k python3
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ab_notebook import write  # noqa: E402  (bench/results/ab_notebook.py: the shared A/B layout)

INTRO = """# DSpark against DFlash at the long preset's GPU-minutes (SmolLM2-135M-Instruct, H100)

The recipe's `long` preset trained twice on the same 59,453 conversations, 5 draft layers, batch 64 x 320, lr 8.5e-4
cosine, distilled on the target's top 16, compiled, feature store, one H100 alone: as DFlash (`dflash-long`, the
preset's own run of 2026-12-06, adopted from `bench/results/2026-12-06-h100-long-preset5/`) and as DSpark
(`dspark-long`: the same drafter with a rank-256 Markov head drafting slot after slot and a confidence head,
DeepSpec's 0.1 CE + 0.9 L1 + 1.0 BCE loss, decayed slot weights), given the three time budgets the DFlash run's
calls had (98.2 + 490.1 + 99.4 s, each tokenizing, loading and refilling its store). Then real speculative decoding
at T=0 on three held-out sets (the target alone decoded too: speedups are speeds) and at T=1 with sampled drafts.

Library: device tree `8cb3691` (`dspark-long`, 2026-12-07) and `b3f7fd2` (`dflash-long`); scripts
`bench/long_arm.sh` over `bench/recipe_ab.py`; raw files and the calls in
`bench/results/2026-12-07-h100-long-dspark/` (its README). This notebook only reads that folder through
`dflash_lab.workflows.ab_report` and was executed on a CPU."""

EVALUATION = """Batch 1, bf16, block 16, 128 new tokens, the static decoder with CUDA graphs, 64 prompts of every set (the
same files by sha256 for both arms). Each speedup is over the target alone in the same process and session."""

ARMS = """One row per training-time check that decoded (32 held-out chitchat prompts, a trend, not the final figure).
`val chain tau` (simulated from per-slot accuracies on held-out windows, not decoding) compares the two: a DSpark
slot is scored with the Markov bias of the true previous token, which is the drafted one wherever the chain is
still accepted. `val acc` and `last loss` are each variant's own (DFlash's loss is the D-PACE-weighted distilled
CE). `GPU min` counts the logged training rows; `wall s` each run's summed training phases, loading included."""

FIGURE = """## Tau against GPU-minutes

Held-out chain tau (simulated from per-slot accuracies on held-out windows, not decoding) at every validation check
against the GPU-minutes each arm had spent (DSpark checked every 500 steps, DFlash every 2,500), and the final real
tau (speculative decoding) on held-out chitchat (T=0, 64 prompts) at its last minute."""

READING = """- **T=0: DSpark reads higher on every set, no interval apart.** Chitchat 3.64 [3.27, 4.03] against 3.25
  [2.97, 3.56] (+0.39), target-written 3.19 [2.96, 3.47] against 2.93 [2.73, 3.16] (+0.26), general 2.56 [2.40,
  2.74] against 2.43 [2.29, 2.58] (+0.13). The training-time real tau on 32 prompts says the same at equal steps:
  3.52 / 3.97 at steps 2,500 / 5,000 against 3.22 / 3.57.
- **T=1 (sampled drafts): DSpark 1.60 [1.55, 1.65] against 1.67 [1.62, 1.72]**, overlapping.
- **Speed: level.** 2.40x / 2.14x / 1.72x against 2.37x / 2.14x / 1.75x: DSpark accepts more per verification but
  each of its verification cycles took 5.75 ms on chitchat (3.64 tokens at 633.0 tokens/s) against DFlash's 4.89 ms
  (3.25 at 664.6): the 16 slot-after-slot Markov steps of its drafting. Training step at the filled store: ~61.5 ms
  (333k tokens/s) against DFlash's 55-57 ms (361-373k).
- **The minutes were not equal in DSpark's favour.** Both had ~11.5 minutes (713.2 s against 687.7 s of training
  phases), but this arm's three jobs tokenized the 59,453 conversations at 890-1,550 a second (~45 + ~62 + ~40 s)
  where the DFlash run's calls tokenized at 4,291-4,937 (~13 s each): the bench script had switched the fast
  tokenizer's threads off (`TOKENIZERS_PARALLELISM=false`). Its first job also spent ~70 s loading, sizing its store and
  compiling before step 1 (DFlash's first step: 28 s) and trained one step: in the curves' bottom row DSpark's
  second logged step sits at ~2.8 GPU-minutes, DFlash's at ~0.5. So DSpark took 5,977 steps of its 6,800-step cosine
  (lr 3.3e-5 left) where DFlash finished 7,500.
- **The presets keep DFlash**: the rule is a win with intervals apart, and T=1 reads lower. DSpark is one setting
  away (`drafter_variant="dspark"`) for anyone who wants the +0.1 to +0.4 at T=0.
- **Aims (64 held-out prompts, bf16, one GPU, ~11.5 GPU-minutes of training):** T=0 chitchat >= 3.5: **met** (3.64,
  its interval reaching down to 3.27); target-written >= 3.0: **met** (3.19, down to 2.96); general >= 3.0: missed
  (2.56; general prompts are far from both training sources, and held-out accuracy still rose at the end); T=1 >=
  2.0: missed (1.60; the top-16 distilled DFlash drafter's sampled-draft bound was 2.26); speedup 2.5x chitchat / 2.0x
  general: missed (2.40x / 1.72x: the drafting cost above on a 135M target whose own step is ~3.6 ms); a gain with
  intervals apart: missed (64 prompts give chitchat intervals 0.6-0.8 wide; the gain is 0.39)."""

write("long-dspark-smollm2-h100", "bench/results/2026-12-07-h100-long-dspark", intro=INTRO, evaluation=EVALUATION,
      arms=ARMS, reading=READING, tau_figure=FIGURE, arms_heading="The arms")
