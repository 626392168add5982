"""Does the drafter pay on its target: speculative decoding (dynamic, and static KV caches + CUDA graphs), real tau
and lossless verdicts against target-only decoding, prompt sets, reports and plots in each run's `evals/` folder,
and export for SGLang / vLLM.

Imports `config`, `runs`, `target`, `data` and `drafter`. It sits below `train` because the trainer measures real
tau with this evaluator while it trains."""
