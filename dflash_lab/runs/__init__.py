"""Run directories, the second floor: `runs/<name>-<UTC stamp>-<id>/` and its lock, checkpoints and which settings
must match on resume, metrics (JSONL, ring buffers, warm-up-aware throughput) and optional sinks, the NVML monitor,
static plots, executed notebooks, and listing runs side by side (`python -m dflash_lab.runs list`).

Imports only `dflash_lab.config`: training, evaluation and the widgets all read and write run folders through it."""
