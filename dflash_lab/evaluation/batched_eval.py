"""Real tau of one drafter on many prompt sets and block sizes, many prompts at once (greedy, no timing).

A scaling study evaluates every point on three sets x two block sizes x 64 prompts x 128 tokens: at batch 1 that is
~400 decodes of the target alone plus ~400 speculative ones per point, minutes each on an H200. Tau does not need
batch 1: rows of batched_decode.py decode exactly as batch 1 does (only the rounding of batched matrix products
differs, which moves near-ties only), so this decodes up to `batch` prompts at once, loads the target and the
drafter once for every set and block size, and reports each pooled tau with its 95% bootstrap interval over
prompts and the set's name, size and checksum. Speedup and the lossless verdicts need timed batch-1 decoding beside
the target alone: evaluate.py.

    taus = batched_taus("runs/<run>", prompts={"general": "general", "chitchat-heldout": "held.jsonl"},
                        block_sizes=(16, 8), max_new_tokens=128, n_prompts=64)
    taus["b16"]["general"]  # {"tau": 2.9, "tau_low": 2.7, "tau_high": 3.1, "prompts": 64, "prompt_set_sha256": ...}
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from .prompts import EvalError, load_prompts
from .static_decode import speculative_generate


def batched_taus(run: str | Path, *, prompts, block_sizes=(16,), max_new_tokens: int = 128,
                 n_prompts: int | None = 64, dtype: str = "auto", device: str = "auto", batch: int = 64,
                 checkpoint: str | None = None, log=print) -> dict:
    """{f"b{B}": {set name: figures}} for every block size and prompt set (greedy, T=0); see the module docstring.

    prompts: as evaluate's (set names, JSONL files, or {name: name or file}). batch: prompts decoded at once."""
    from .evaluate import plan_eval
    from .export import load_drafter
    from dflash_lab.target.load import load_target, load_tokenizer

    if not isinstance(batch, int) or batch < 1:
        raise EvalError(f"batch={batch!r} must be an integer >= 1 (prompts decoded at once).")
    block_sizes = tuple(block_sizes)
    if not block_sizes:
        raise EvalError("block_sizes is empty. Fix: e.g. (16, 8).")
    plans = {B: plan_eval(run, prompts=prompts, block_size=B, max_new_tokens=max_new_tokens, n_prompts=n_prompts,
                          device=device, dtype=dtype, checkpoint=checkpoint) for B in block_sizes}  # checks every B
    plan = plans[block_sizes[0]]
    src, drafter = load_drafter(run, checkpoint=checkpoint, log=log)
    tok = load_tokenizer(plan.target)
    tgt = load_target(plan.target, device=plan.device, dtype=plan.dtype)
    drafter.to(device=plan.device, dtype=plan.dtype)
    sets = {s: load_prompts(f, tok, messages=plan.selections[s].messages) for s, f in plan.prompt_files.items()}
    out = {}
    for B in block_sizes:
        out[f"b{B}"] = {}
        for name, ids in sets.items():
            t0 = time.perf_counter()
            run_ = speculative_generate(tgt, drafter, ids, block_size=B, max_new_tokens=max_new_tokens,
                                        temperature=0.0, eos_token_id=tok.eos_token_id, batch=batch)
            ci = run_.interval()
            info = plan.prompt_sets[name]
            bound = lambda v: None if v is None else round(v, 4)  # noqa: E731 (None: too few prompts)
            out[f"b{B}"][name] = {"tau": round(run_.tau, 4), "tau_low": bound(ci.low),
                                  "tau_high": bound(ci.high), "prompts": info.prompts,
                                  "file_prompts": info.file_prompts, "prompt_set_sha256": info.sha256,
                                  "new_tokens": run_.new_tokens, "block_size": B, "temperature": 0.0,
                                  "dtype": str(plan.dtype).replace("torch.", ""), "batch": min(batch, len(ids)),
                                  "seconds": round(time.perf_counter() - t0, 2)}
            log(f"batched tau b{B} {name}: {ci.text()} ({info.prompts} prompts, "
                f"{time.perf_counter() - t0:.1f} s)")
    out["drafter"] = {"weights": str(src.weights), "step": src.step}
    return out
