"""Greedy speculative decoding of several prompts at once: each row decodes its own prompt exactly as batch 1 does.

The training-time real tau decodes 32 held-out prompts x 128 tokens every few hundred steps; one prompt at a time
that is ~2,000 iterations of a few ms. Here R rows share every kernel of an iteration: the static step of
static_decode.py with a row dimension (per-row positions, caches written with index_put at each row's positions,
per-row masks, greedy acceptance and the next state on the device). A row that finishes is refilled with the next
prompt (its own eager prefill), so the batch stays full until the prompts run out. Rows never see each other, so
tokens, accepted counts and tau are those of batch-1 decoding (tests/test_speculative.py checks it); only the
rounding of batched matrix products can differ, which matters at near-ties only. Timing is not per prompt here:
speedup is measured at batch 1 (evaluate.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dflash_lab.config.windows import window_masks
from dflash_lab.data.draft_vocab import to_target_ids
from dflash_lab.drafter.model import apply_rope
from dflash_lab.target.features import decoder_of
from dflash_lab.target.static_cache import MIN_SPAN, RowKVCache, additive, bucket, doubling_ladder, \
    static_cache_problem, write_rows
from .speculative import TOPK, GenerationResult, SpeculativeDecoder, finish_result, target_text_config

CACHE_BYTES = 2 << 30  # the rows' caches stay under ~2 GiB: they sit beside a training run on its GPU


def greedy(logits: torch.Tensor) -> torch.Tensor:
    """The greedy token per row of logits (..., V): the first of its top-k, as the batch-1 decoders choose it (so an
    exact tie is broken the same way)."""
    return logits.topk(min(TOPK, logits.shape[-1]), dim=-1).indices[..., 0]


def static_path_problem(target, drafter) -> str | None:
    """Why the static decoders (batch 1 and batched) cannot run this target (None if they can)."""
    problem = static_cache_problem(target)
    if problem:
        return problem
    if drafter is not None and next(drafter.parameters()).device != next(target.parameters()).device:
        return "the drafter and the target are on different devices (one graph spans one device)"
    return None


class BatchedSpeculativeDecoder(SpeculativeDecoder):
    """Greedy speculative decoding of many prompts, `rows` at a time, with static caches (eager; the work per
    iteration is R rows' worth, so Python overhead matters far less than at batch 1)."""

    def __init__(self, target, drafter, *, rows: int, length: int, block_size: int | None = None,
                 eos_token_id=None):
        super().__init__(target, drafter, block_size=block_size, eos_token_id=eos_token_id)
        problem = static_path_problem(target, drafter)
        if problem or drafter is None:
            raise ValueError(f"batched decoding cannot run this target: {problem or 'no drafter'}. Fix: decode one "
                             "prompt at a time (speculative_generate without batch).")
        if self.heads is not None:  # its rows draft DFlash blocks: a Markov head's slot-by-slot drafts are not here
            raise ValueError(f"batched decoding drafts DFlash blocks; this drafter is a "
                             f"{drafter.config.drafter_variant} drafter. Fix: decode one prompt at a time "
                             "(speculative_generate without batch).")
        tc, self.decoder = target_text_config(target), decoder_of(target)
        head_dim = getattr(tc, "head_dim", None) or tc.hidden_size // tc.num_attention_heads
        dev, B, R, L = self.target_device, self.block_size, rows, -(-length // 64) * 64
        self.rows, self.length, self.buckets = R, L, doubling_ladder(L, MIN_SPAN)
        self.cache = RowKVCache(len(self.decoder.layers), tc.num_key_value_heads, R, L, head_dim,
                                self.embed.weight.dtype, dev)
        a0 = drafter.layers[0].self_attn
        mk = lambda: torch.zeros(R, a0.num_kv_heads, L, a0.head_dim, dtype=self.drafter_dtype, device=dev)  # noqa
        self.ctx_keys, self.ctx_values = [mk() for _ in drafter.layers], [mk() for _ in drafter.layers]
        self.kv_pos, self.offsets = torch.arange(L, device=dev), torch.arange(B, device=dev)
        self.state = torch.zeros(R, 3, dtype=torch.long, device=dev)  # per row [last token, p_prev, p]
        self.active = torch.zeros(R, dtype=torch.bool, device=dev)
        self.feats = torch.zeros(R, B, len(self.layer_ids) * drafter.config.hidden_size, dtype=self.embed.weight.dtype,
                                 device=dev)
        self.mask_ids = torch.full((R, B - 1), self.mask_token_id, dtype=torch.long, device=dev)
        cfg = drafter.config
        self.windows = window_masks(cfg.layer_types, cfg.sliding_window, cfg.layer_windows)

    @staticmethod
    def rows_for(target, drafter, length: int, limit: int = 16) -> int:
        """How many rows fit in CACHE_BYTES for caches of `length` positions (at least 1, at most `limit`)."""
        tc = target_text_config(target)
        hd = getattr(tc, "head_dim", None) or tc.hidden_size // tc.num_attention_heads
        a0 = drafter.layers[0].self_attn
        per_pos = 2 * (tc.num_hidden_layers * tc.num_key_value_heads * hd
                       + len(drafter.layers) * a0.num_kv_heads * a0.head_dim) * next(target.parameters()).element_size()
        return max(1, min(limit, CACHE_BYTES // max(1, per_pos * length)))

    # ---------------------------------------------------------------------------------------------------------
    def _target(self, ids, pos, live, rows=None):
        """The target on ids (R', T) at positions pos (R', T) of `rows` (None = all); logits fp32 and features."""
        h = self.embed(ids)
        rope = self.decoder.rotary_emb(h, pos)
        mask = additive((self.kv_pos[None, None, :live] <= pos[:, :, None])[:, None], h.dtype)  # (R', 1, T, live)
        self.cache.at(pos, live, rows)
        picked = {}
        for i, layer in enumerate(self.decoder.layers):
            h = layer(h, attention_mask=mask, position_ids=pos, past_key_values=self.cache, use_cache=True,
                      position_embeddings=rope)
            h = h[0] if isinstance(h, tuple) else h
            if i in self.layer_ids:
                picked[i] = h
        logits = F.linear(self.decoder.norm(h), self.head).float()  # (R', T, V)
        return logits, torch.cat([picked[i] for i in self.layer_ids], dim=-1)

    def _draft(self, live: int) -> torch.Tensor:
        """Every row: ingest its previous verify's features at p_prev.., draft its block at p..; (R, B-1) ids."""
        d, B, R = self.drafter, self.block_size, self.rows
        a0 = d.layers[0].self_attn
        groups = a0.num_heads // a0.num_kv_heads
        last, p_prev, p = self.state[:, 0:1], self.state[:, 1:2], self.state[:, 2:3]
        ctx_pos, blk_pos = p_prev + self.offsets, p + self.offsets  # (R, B)
        ctx = d.fuse_context(self.feats.to(self.drafter_dtype))  # (R, B, H)
        hidden = self.embed(torch.cat([last, self.mask_ids], 1)).to(self.drafter_dtype)  # (R, B, H)
        cos, sin = d.rotary_emb(hidden, torch.cat([ctx_pos, blk_pos], 1))  # (R, 2B, d)
        kv, q_pos = self.kv_pos[None, None, :live], blk_pos[:, :, None]  # (1, 1, live), (R, B, 1)
        masks = {}
        for key, window in self.windows.items():
            if window is None:
                seen = (kv < p[:, :, None] + B).expand(R, B, live)
            else:
                seen = ((kv < p[:, :, None]) & (q_pos - kv < window)) | ((kv >= p[:, :, None]) & (kv <= q_pos))
            masks[key] = additive(seen, self.drafter_dtype).repeat(1, groups, 1)[:, None]  # (R, 1, g*B, live)
        for i, layer in enumerate(d.layers):
            attn = layer.self_attn
            x = layer.input_layernorm(hidden)
            k, v = attn.project_kv(torch.cat([ctx, x], dim=1), cos, sin)  # (R, kvh, 2B, d): context | block
            write_rows(self.ctx_keys[i], self.ctx_values[i], k[:, :, :B], v[:, :, :B], None, ctx_pos, live)
            keys, values = write_rows(self.ctx_keys[i], self.ctx_values[i], k[:, :, B:], v[:, :, B:], None, blk_pos,
                                      live)  # the block last: it wins at positions >= p
            q = attn.q_norm(attn.q_proj(x).view(R, B, attn.num_heads, attn.head_dim)).transpose(1, 2)
            q = apply_rope(q, cos[:, B:], sin[:, B:]).reshape(R, attn.num_kv_heads, groups * B, attn.head_dim)
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=masks[layer.mask_key])
            out = out.view(R, attn.num_heads, B, attn.head_dim).transpose(1, 2).reshape(R, B, -1)
            hidden = hidden + attn.o_proj(out)
            hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
        hidden = d.norm(hidden)[:, 1:]  # (R, B-1, H)
        return to_target_ids(d, F.linear(hidden.to(self.head.dtype), self.draft_head).argmax(-1))

    def _step(self, live: int) -> torch.Tensor:
        """One iteration of every row; inactive rows compute but keep their state. Returns (R, B, 3): the target's
        greedy token per slot, the drafts (slots 1..B-1) and the accepted count (slot 0)."""
        p = self.state[:, 2:3]
        drafts = self._draft(live)  # (R, B-1)
        logits, feats = self._target(torch.cat([self.state[:, 0:1], drafts], 1), p + self.offsets, live)
        self.feats.copy_(feats)
        top1 = greedy(logits)  # (R, B)
        a = (drafts == top1[:, :-1]).long().cumprod(1).sum(1, keepdim=True)  # (R, 1)
        nxt = top1.gather(1, a)
        new = torch.cat([nxt, p, p + a + 1], 1)
        self.state.copy_(torch.where(self.active[:, None], new, self.state))
        acc = torch.zeros_like(top1).scatter_(1, torch.zeros_like(a), a)
        return torch.stack([top1, torch.cat([drafts, drafts[:, :1] * 0], 1), acc], dim=-1)

    def _prefill(self, row: int, ids: list[int]) -> int:
        """Prompt `ids` into row `row` (target and drafter caches, state); returns its first token."""
        dev, n = self.target_device, len(ids)
        rows, pos = torch.tensor([row], device=dev), torch.arange(n, device=dev)[None]
        logits, feats = self._target(torch.tensor([ids], device=dev), pos, self._bucket(n), rows)
        d = self.drafter
        ctx = d.fuse_context(feats.to(self.drafter_dtype))
        rope = d.rotary_emb(ctx, pos)
        for i, layer in enumerate(d.layers):
            k, v = layer.self_attn.project_kv(ctx, *rope)
            write_rows(self.ctx_keys[i], self.ctx_values[i], k, v, rows, pos, self.length)
        first = int(greedy(logits[0, -1:])[0])
        self.state[row] = torch.tensor([first, n, n], device=dev)
        self.active[row] = True
        return first

    def _bucket(self, need: int) -> int:
        return bucket(self.buckets, need)

    @torch.no_grad()
    def generate_many(self, prompts: list[list[int]], *, max_new_tokens: int = 128) -> list[GenerationResult]:
        """Greedy speculative decoding of every prompt; results in prompt order (no per-prompt timing)."""
        B = self.block_size
        for i, ids in enumerate(prompts):
            self.check_prompt(len(ids), max_new_tokens, name=f"prompt {i + 1}")
            if len(ids) + max_new_tokens + 2 * B > self.length:
                raise ValueError(f"prompt {i + 1} needs {len(ids) + max_new_tokens + 2 * B} positions, the caches "
                                 f"hold {self.length}. Fix: build the decoder with a larger length.")
        todo = list(range(len(prompts)))
        slot: dict[int, dict] = {}  # row -> {"prompt", "out", "accepted", "p", "n"}
        done: dict[int, GenerationResult] = {}
        self.active.zero_()

        def fill(row: int) -> None:
            while todo:
                i = todo.pop(0)
                first = self._prefill(row, prompts[i])
                slot[row] = {"prompt": i, "out": [first], "accepted": [], "p": len(prompts[i])}
                if first not in self.eos_ids and max_new_tokens > 1:
                    return
                self._finish(slot.pop(row), prompts, done, max_new_tokens)
            self.active[row] = False

        for row in range(self.rows):
            fill(row)
        while slot:
            rows = self._step(self._bucket(max(s["p"] for s in slot.values()) + B)).tolist()  # syncs
            for row in list(slot):
                s, r = slot[row], rows[row]
                a = r[0][2]
                s["accepted"].append(a)
                s["out"] += [x[1] for x in r[:a]] + [r[a][0]]
                s["p"] += a + 1
                if len(s["out"]) >= max_new_tokens or any(t in self.eos_ids for t in s["out"][-(a + 1):]):
                    self._finish(slot.pop(row), prompts, done, max_new_tokens)
                    fill(row)
        return [done[i] for i in range(len(prompts))]

    def _finish(self, s: dict, prompts, done: dict, max_new_tokens: int) -> None:
        n = len(s["out"])
        done[s["prompt"]] = finish_result(len(prompts[s["prompt"]]), s["out"], s["accepted"], self.block_size, 0.0,
                                          0.0, self.eos_ids, max_new_tokens, [[t] for t in s["out"]],
                                          [[0.0]] * n, [None] * n)
