"""Text in, turns out: the target continues many rendered prefixes, in chunks, with progress and an ETA.

`TurnGenerator.turns(prefixes, settings)` tokenizes each prefix once (no special tokens added: the template wrote
them), generates until a stop token or `max_new_tokens`, and decodes the new tokens (without the stop token) into
the text of one turn: (text, finish_reason, new tokens counted with the stop token). Chunks of `16 x max_batch`
prompts keep progress lines coming and memory bounded; chunk c samples with seed + 1,000,003 * c, so the same
prefixes and settings give the same turns, and the first N turns do not change when more are asked for.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class GenerationSettings:
    max_new_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0


@dataclass(frozen=True)
class Generated:
    token_ids: list[int]
    finish_reason: str  # "stop" | "length"


class HFBatchGenerator:
    """Batched Hugging Face `generate` (left padding), one seed per batch; the interface of the fast engine."""

    def __init__(self, model, *, stop_ids, max_batch: int = 256, max_len: int = 2048, log=None):
        self.model, self.stop_ids, self.max_batch, self.max_len = model, list(stop_ids), max_batch, max_len
        self.device = next(model.parameters()).device

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], settings: GenerationSettings, progress=None) -> list[Generated]:
        out: list[Generated] = []
        for b0 in range(0, len(prompts), self.max_batch):
            batch = prompts[b0:b0 + self.max_batch]
            width = max(map(len, batch))
            pad = self.stop_ids[0]  # masked out: its value never reaches an output
            ids = torch.tensor([[pad] * (width - len(p)) + p for p in batch], device=self.device)
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch], device=self.device)
            kw = dict(max_new_tokens=settings.max_new_tokens, eos_token_id=self.stop_ids, pad_token_id=pad,
                      do_sample=settings.temperature > 0, repetition_penalty=1.0, no_repeat_ngram_size=0)
            if settings.temperature > 0:
                kw.update(temperature=settings.temperature, top_p=settings.top_p, top_k=settings.top_k, min_p=0.0)
            torch.manual_seed(settings.seed + b0)
            rows = self.model.generate(input_ids=ids, attention_mask=mask, **kw)[:, width:].tolist()  # .tolist() syncs
            stops = set(self.stop_ids)
            for row in rows:
                end = next((i for i, t in enumerate(row) if t in stops), None)
                out.append(Generated(row if end is None else row[:end + 1], "length" if end is None else "stop"))
            if progress is not None:
                progress(len(out), len(prompts))
        return out


class TurnGenerator:
    """Rendered prefixes -> decoded turns through a batched generator, with progress lines."""

    CHUNK_BATCHES = 16

    def __init__(self, model, tokenizer, *, stop_ids, max_batch: int = 256, max_len: int = 2048, log=print,
                 every_s: float = 10.0):
        self.tokenizer, self.stop_ids, self.log, self.every_s = tokenizer, set(stop_ids), log, every_s
        self.engine = "hf-generate"
        self.gen = HFBatchGenerator(model, stop_ids=sorted(stop_ids), max_batch=max_batch, max_len=max_len, log=log)
        self.chunk = self.CHUNK_BATCHES * max_batch

    def turns(self, prefixes: list[str], settings: GenerationSettings, what: str = "turns"
              ) -> list[tuple[str, str, int]]:
        if not prefixes:
            return []
        t0 = last = time.perf_counter()
        ids = self.tokenizer(prefixes, add_special_tokens=False)["input_ids"]
        out, new_tokens = [], 0
        for c, c0 in enumerate(range(0, len(ids), self.chunk)):
            chunk_settings = dataclasses.replace(settings, seed=settings.seed + 1_000_003 * c)
            for g in self.gen.generate(ids[c0:c0 + self.chunk], chunk_settings):
                toks = g.token_ids
                if toks and toks[-1] in self.stop_ids:
                    toks = toks[:-1]
                text = self.tokenizer.decode(toks, skip_special_tokens=False).strip()
                out.append((text, g.finish_reason, len(g.token_ids)))
                new_tokens += len(g.token_ids)
            now = time.perf_counter()
            if now - last >= self.every_s or len(out) == len(ids):
                last = now
                rate = len(out) / max(now - t0, 1e-9)
                eta = int((len(ids) - len(out)) / max(rate, 1e-9))
                self.log(f"self-prompts: {what} {len(out):,}/{len(ids):,} | {rate:,.1f}/s | "
                         f"{new_tokens / max(now - t0, 1e-9):,.0f} new tok/s | ETA {eta // 60}m{eta % 60:02d}s")
        return out
