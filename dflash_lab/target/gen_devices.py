"""Generation on several devices: one Generator (one target replica) per device, one thread each, one shared queue.

Engines take prompts from the same PromptQueue as their rows free up, so a slow or busy device simply takes fewer;
results do not depend on which device answered a prompt beyond the device's own numerics (sampling is keyed by
prompt, sampling.py). Each thread selects its GPU before it runs, and captures its CUDA graphs itself (captures
are thread-local). An error on one device stops the others and is raised naming the device.
"""

from __future__ import annotations

import concurrent.futures as cf
from typing import Callable

import torch

from .gen_queue import Generated, PromptItem, PromptQueue, by_length
from .generate import Generator
from .sampling import GenerationSettings
from .static_cache import BATCH_FLOOR, bucket, doubling_ladder


def make_generators(models, *, stop_ids, **kw) -> list[Generator]:
    """One Generator per loaded replica (target/load.py `load_targets` gives one per device)."""
    return [Generator(m, stop_ids=stop_ids, **kw) for m in models]


def run_queue(generators: list[Generator], queue: PromptQueue, settings: GenerationSettings, *,
              rows: int | None = None, length: int | None = None) -> None:
    """Every engine decodes from `queue` until it is empty everywhere (follow-ups included).

    rows / length: cache size per engine (default: max_batch x max_len; pass less when the prompts are known)."""
    for g in generators:
        g.allocate(rows or g.max_batch, length or g.max_len)

    def one(g: Generator) -> None:
        if g.device.type == "cuda":
            torch.cuda.set_device(g.device)
        g.run(queue, settings)

    if len(generators) == 1:
        one(generators[0])
        return
    with cf.ThreadPoolExecutor(max_workers=len(generators), thread_name_prefix="dflash-gen") as pool:
        futures = {pool.submit(one, g): g for g in generators}
        errors = []
        for fut in cf.as_completed(futures):
            try:
                fut.result()
            except BaseException as e:  # noqa: BLE001 - re-raised below with the device
                queue.abort(e)
                errors.append((futures[fut], e))
    if errors:
        g, e = errors[0]
        raise RuntimeError(f"generation on {g.name} failed: {type(e).__name__}: {e}") from e


def generate_on_devices(generators: list[Generator], prompts: list[list[int]], settings: GenerationSettings, *,
                        keys: list[int] | None = None, progress: Callable | None = None,
                        log: Callable[[str], None] | None = None, log_every_s: float = 10.0) -> list[Generated]:
    """Answers to `prompts` (token id lists), in order, spread over the engines (one thread per engine)."""
    prompts = [list(map(int, p)) for p in prompts]
    if not prompts:
        return []
    for g in generators:
        g.check_prompts(prompts, settings.max_new_tokens)
    keys = list(range(len(prompts))) if keys is None else list(keys)
    if len(set(keys)) != len(keys) or len(keys) != len(prompts):
        raise ValueError(f"keys must be {len(prompts)} distinct integers, one per prompt. Fix: pass unique keys.")
    queue = PromptQueue(by_length([PromptItem(k, p) for k, p in zip(keys, prompts)]), progress=progress, log=log,
                        log_every_s=log_every_s)
    share = -(-len(prompts) // len(generators))
    batches = doubling_ladder(generators[0].max_batch, BATCH_FLOOR)
    run_queue(generators, queue, settings, rows=min(bucket(batches, share), generators[0].max_batch),
              length=max(len(p) for p in prompts) + settings.max_new_tokens)
    queue.flush()
    return [queue.results[k] for k in keys]
