"""The measurements of an evaluation: every decoder on every prompt, the untrained floor, and held-out real tau.

`run_decoders` interleaves the decoders per prompt (fair timing on a shared machine) and runs the target alone
first, so that at temperature 0 each drafter decodes with the target-only output as its reference and a differing
output gets both computations' logits at the first differing token (verdicts.py); with a deadline it stops
before a prompt that would run past it, and `cut_to_measured` then says exactly which prompts were measured.
`heldout_run` / `heldout_tau` are the cheap version the Trainer calls while training.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import torch

from dflash_lab.drafter.model import DFlashDrafter
from .prompt_sets import default_sets, info_of, is_heldout_file, read_training_prompts, resolve_sets
from .prompts import EvalError, load_prompts, select_prompts
from .report import BASELINE, pooled_tau
from .speculative import GenerationResult, SpeculativeDecoder
from .static_decode import SpeculativeRun, speculative_generate
from .verdicts import divergence_record, first_difference


def untrained_drafter(config, seed: int) -> DFlashDrafter:
    """The floor: a drafter of the same shape, initialised exactly as training starts (same seed), never trained."""
    d = DFlashDrafter(config)
    d.init_weights(torch.Generator().manual_seed(seed))
    return d.eval().requires_grad_(False)


def run_decoders(target, decoders: dict[str, SpeculativeDecoder], prompt_sets: dict[str, list[list[int]]], *,
                 max_new_tokens: int, temperature: float, seed: int = 0, log=print, progress_every_s: float = 10.0,
                 deadline: float | None = None) -> dict:
    """Every decoder on every prompt, interleaved per prompt (fair timing on a shared machine).

    The target alone decodes each prompt first; at temperature 0 every drafter then decodes with its output as the
    reference (recording its own logit of the target-only token at every position), and a drafter whose output
    differs gets a `divergence` record: both computations' logits of both tokens at the first differing one (the
    target-only decoding is repeated up to that token with the drafter's output as reference, untimed).
    deadline: a time.monotonic() value; no prompt is started that would end after it, judged by the longest prompt
    so far (every decoder of it), so a job under a hard time limit keeps whole prompts instead of losing them all.
    Returns {decoder: {set: [result dict with output_ids (and divergence for drafters)]}}: every decoder has the
    same prompts, the first ones of each set, fewer than given when the deadline stopped it."""
    first = next(iter(prompt_sets.values()))[0]
    for dec in decoders.values():  # warm-up: first calls allocate / pick kernels
        dec.generate(first, max_new_tokens=min(8, max_new_tokens), temperature=0.0)
    names = list(decoders)
    order = ([BASELINE] if BASELINE in decoders else []) + [n for n in names if n != BASELINE]
    results = {name: {s: [] for s in prompt_sets} for name in decoders}
    total = sum(len(v) for v in prompt_sets.values())
    done, last, longest = 0, time.monotonic(), 0.0
    for sname, prompts in prompt_sets.items():
        for i, ids in enumerate(prompts):
            started = time.monotonic()
            if deadline is not None and started + longest > deadline:
                log(f"eval stopped by its time budget after {done} of {total} prompts: the next one would end "
                    f"{started + longest - deadline:.0f} s past it (the longest so far took {longest:.1f} s)")
                return results
            base = None
            for name in order:
                g = torch.Generator().manual_seed(seed * 1_000_003 + i * 101 + names.index(name))
                ref = base.output_ids if base is not None and temperature == 0 else None
                r: GenerationResult = decoders[name].generate(ids, max_new_tokens=max_new_tokens,
                                                              temperature=temperature, generator=g, reference=ref)
                row = {**r.to_dict(), "output_ids": r.output_ids}
                if name == BASELINE:
                    base = r
                elif ref is not None:
                    row["divergence"] = _divergence(decoders[BASELINE], ids, r, base)
                results[name][sname].append(row)
            done += 1
            longest = max(longest, time.monotonic() - started)
            if time.monotonic() - last >= progress_every_s or done == total:
                last = time.monotonic()
                taus = " | ".join(f"{n} tau {pooled_tau([x for v in results[n].values() for x in v]):.2f}"
                                  for n in decoders if n != BASELINE)
                log(f"eval {done}/{total} prompts | {taus}")
    return results


def cut_to_measured(results: dict, selections: dict, infos: dict) -> tuple[dict, dict, dict]:
    """What a run_decoders stopped by its deadline measured: the results without the sets it never reached, and
    each set's PromptSetInfo for exactly its prompts decoded (count and sha256 of that prefix), so that a figure of
    a cut set is compared only with figures on the same prompts. selections / infos: {set: PromptSelection /
    PromptSetInfo} of the planned evaluation. Returns (results, infos, {set: (measured, planned)} of the cut sets)."""
    measured = {s: min(len(per_set.get(s, [])) for per_set in results.values()) for s in infos}
    cut = {s: (n, infos[s].prompts) for s, n in measured.items() if n < infos[s].prompts}
    kept = {name: {s: rows[: measured[s]] for s, rows in per_set.items() if measured.get(s)}
            for name, per_set in results.items()}
    new_infos = {s: info if s not in cut else
                 info_of(s, info.path, replace(selections[s], messages=selections[s].messages[: measured[s]]))
                 for s, info in infos.items() if measured[s]}
    return kept, new_infos, cut


def _divergence(baseline: SpeculativeDecoder, ids: list[int], spec: GenerationResult, base: GenerationResult
                ) -> dict | None:
    """The divergence record of a drafter's output that differs from the target-only output (None if identical)."""
    j = first_difference(spec.output_ids, base.output_ids)
    if j is None:
        return None
    again = baseline.generate(ids, max_new_tokens=j + 1, temperature=0.0, reference=spec.output_ids)
    return divergence_record(spec, base, again)


def heldout_run(source, prompts=None, block_size: int | None = None, max_new_tokens: int = 128,
                n_prompts: int = 32, temperature: float = 0.0, batch: int = 16) -> SpeculativeRun:
    """Real speculative decoding of a drafter on a few held-out prompts, cheap enough to run while training:
    `.tau` is the pooled tau, `.interval()` its bootstrap interval over the prompts.

    `source` is a Trainer or a (target, drafter, tokenizer) tuple. prompts: a JSONL file or set name, a list of
    token-id lists, or None = the tiny held-out set (tiny target) / the run's held-out prompts; from a held-out
    file those the run trains on are left out (prompt_sets.py). batch > 1 decodes that many prompts at once
    (greedy; the same tau as one at a time; batched_decode.py).
    """
    if isinstance(source, tuple):
        target, drafter, tok = source
        target_name, data, heldout = "tiny", "tiny", None
    else:
        target, drafter, tok = source.target, source.drafter, source.tokenizer
        target_name, data, heldout = source.config.target, source.config.data, source.config.heldout_data
    if prompts is None:
        prompts = next(iter(default_sets(target_name, data, heldout).values()))
    if isinstance(prompts, (str, Path)):
        path = next(iter(resolve_sets(prompts, target_name, data).values()))
        chosen = select_prompts(path, n_prompts, train=read_training_prompts(data),
                                remove=is_heldout_file(path, data, heldout))
        ids = load_prompts(path, tok, messages=chosen.messages)
    else:
        ids = [list(p) for p in prompts][:n_prompts]
        if not ids:
            raise EvalError("heldout_tau got no prompts. Fix: pass a JSONL file or a non-empty list of token ids.")
    return speculative_generate(target, drafter, ids, block_size=block_size, max_new_tokens=max_new_tokens,
                                temperature=temperature, eos_token_id=tok.eos_token_id, batch=batch)


def heldout_tau(source, prompts=None, block_size: int | None = None, max_new_tokens: int = 128,
                n_prompts: int = 32, temperature: float = 0.0, batch: int = 16) -> float:
    """The pooled real tau of heldout_run (the same arguments)."""
    return heldout_run(source, prompts, block_size, max_new_tokens, n_prompts, temperature, batch).tau
