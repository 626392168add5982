"""Does the generation engine write what the evaluator's target says? Engine greedy vs the evaluator's own target-only
greedy (the decoder that measures tau), per dtype, as a match rate with first-difference positions.

A drafter is trained on regenerated answers and measured against the target-only decoding of evaluation (block size
1 of speculative_generate: static caches + CUDA graphs on a GPU, the dynamic loop on the CPU). If the engine's
greedy answers differ from that decoding, the drafter learns text the evaluator's target does not write. Batching
changes reduction orders, so in bf16 near-tied argmaxes flip; each difference is reported with the evaluator's
top-1 minus top-2 logit margin at that token (a margin near 0 is a numerical near-tie, a large one a real bug).

The engine side is batched (one generate call); the evaluator side is batch 1 by nature, so keep `prompts` to a few
dozen: 32 prompts x 128 tokens is seconds on an H200.
"""

from __future__ import annotations

import time

from dflash_lab.target.generate import Generator
from dflash_lab.target.sampling import GenerationSettings
from .static_decode import speculative_generate


def first_difference(a: list[int], b: list[int]) -> int | None:
    """Index of the first differing token of two sequences (the shorter one's length if one is a prefix), or None."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def serving_match(model, prompts: list[list[int]], *, stop_ids, max_new_tokens: int = 128,
                  generator: Generator | None = None, max_batch: int = 64, fast: str | bool = "auto",
                  log=None) -> dict:
    """Compare engine greedy answers with the evaluator's target-only greedy answers to the same prompts.

    generator: the engine to check (default: a new Generator on `model`). fast: the evaluator's decoding choice
    ("auto" = what evaluation uses: static + graphs on CUDA, dynamic on the CPU). Returns a JSON-able dict."""
    stop = sorted({int(s) for s in ([stop_ids] if isinstance(stop_ids, int) else stop_ids)})
    engine = generator or Generator(model, stop_ids=stop, max_batch=max_batch,
                                    max_len=max(len(p) for p in prompts) + max_new_tokens)
    t0 = time.perf_counter()
    ours = engine.generate(prompts, GenerationSettings(max_new_tokens=max_new_tokens))
    t1 = time.perf_counter()
    ref = speculative_generate(model, None, prompts, block_size=1, max_new_tokens=max_new_tokens, eos_token_id=stop,
                               fast=fast).results
    t2 = time.perf_counter()
    diffs = []
    common = total = 0
    for i, (g, r) in enumerate(zip(ours, ref)):
        at = first_difference(g.token_ids, r.output_ids)
        total += len(r.output_ids)
        common += len(r.output_ids) if at is None else at
        if at is not None:
            diffs.append({"index": i, "first_difference": at, "engine_tokens": len(g.token_ids),
                          "evaluator_tokens": len(r.output_ids),
                          "evaluator_margin": r.margins[at] if at < len(r.margins) else None})
    n = len(prompts)
    dtype = str(next(model.parameters()).dtype).replace("torch.", "")
    on_cuda = engine.device.type == "cuda"
    static = fast is True or (fast == "auto" and on_cuda)
    evaluator = ("static caches" + (" + CUDA graphs" if on_cuda else ", eager")) if static else "dynamic loop"
    out = {"dtype": dtype, "device": str(engine.device), "checked": n, "identical": n - len(diffs),
           "match_rate": round((n - len(diffs)) / max(n, 1), 4),
           "token_agreement": round(common / max(total, 1), 4),  # evaluator tokens before the first difference
           "max_new_tokens": max_new_tokens, "engine": engine.graph_status,
           "evaluator": evaluator, "differences": diffs,
           "engine_s": round(t1 - t0, 2), "evaluator_s": round(t2 - t1, 2),
           "summary": f"{n - len(diffs)}/{n} identical to the evaluator's greedy ({dtype})"}
    if log:
        log(f"serving match: {out['summary']}; first differences at {[d['first_difference'] for d in diffs][:8]}")
    return out


def serving_match_dtypes(load, prompts: list[list[int]], *, dtypes=("bfloat16", "float32"), **kw) -> list[dict]:
    """serving_match once per dtype; `load(dtype_name)` returns the target in that dtype."""
    return [serving_match(load(d), prompts, **kw) for d in dtypes]
