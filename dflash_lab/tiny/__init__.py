"""The embedded default target: a tiny trained Qwen3 causal LM + ChatML tokenizer + synthetic chat data, all offline.

The artefacts are committed under `dflash_lab/tiny/assets/` (~6 MB): the model directory loads with
`AutoModelForCausalLM.from_pretrained` / `AutoTokenizer.from_pretrained`, and the data are OpenAI-format jsonl.
`ensure_tiny_target()` rebuilds them (about 4 minutes on 2 CPU cores) only when they are missing or asked to.
Its answers are structured and predictable from the prompt (counting, lists, spelled words, templated item
descriptions), which is what a speculative drafter needs to show acceptance lengths well above 1 on a CPU.
Importing this package has no side effects and does not import torch or transformers.
"""
from __future__ import annotations

from pathlib import Path

ASSETS_DIR = Path(__file__).resolve().parent / "assets"
TINY_TARGET_DIR = ASSETS_DIR / "tiny-qwen3"
TINY_TRAIN_DATA = ASSETS_DIR / "data" / "train.jsonl"
TINY_HELDOUT_DATA = ASSETS_DIR / "data" / "heldout.jsonl"

__all__ = ["TINY_TARGET_DIR", "TINY_TRAIN_DATA", "TINY_HELDOUT_DATA", "ensure_tiny_target", "tiny_data_path",
           "tiny_heldout_path"]


def ensure_tiny_target(rebuild: bool = False) -> Path:
    """Return the tiny target's model directory, building the committed artefacts first if they are missing
    (or if `rebuild`), with progress printed. The directory also holds the tokenizer and chat template."""
    from dflash_lab.tiny import build  # lazy: torch/transformers are only needed for a (re)build

    if rebuild or not build.is_built(ASSETS_DIR):
        print(f"building the tiny target into {ASSETS_DIR} (about 4 minutes on 2 CPU cores)", flush=True)
        build.build(ASSETS_DIR, force=True, log=lambda s: print(s, flush=True))
    return TINY_TARGET_DIR


def tiny_data_path() -> Path:
    """Training conversations (OpenAI chat format jsonl, one {"messages": [...]} per line)."""
    return TINY_TRAIN_DATA


def tiny_heldout_path() -> Path:
    """100 held-out conversations (prompts never in train), for evaluation prompts and expected answers."""
    return TINY_HELDOUT_DATA
