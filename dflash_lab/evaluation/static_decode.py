"""Speculative decoding whose per-iteration cost is GPU time: static KV caches and one CUDA graph per iteration.

The dynamic loop (speculative.py) grows caches with torch.cat, crops them after each verification and launches every
kernel from Python: for a 135M target on an H200 that is ~60 ms per iteration of which the GPU works a few. Here
every buffer has a fixed shape, so one iteration (ingest the last verified features into the drafter's context,
draft the block, verify it with the target) is ONE `torch.cuda.CUDAGraph` replay followed by one small copy back:

    state (device, long): [last token, p_prev, p]   p = position of the last accepted token
    drafter context K/V per draft layer (1, kvh, L, d)  written at p_prev..p_prev+B-1 (the previous verify's features)
    target K/V per target layer (1, kvh, L, d)          written at p..p+B-1 by the verify
    masks are built in the graph from positions: a query at position q sees keys at positions <= q (target) or
    < p plus the whole block (drafter), so entries past the accepted prefix are never read and need no cropping:
    the next iteration overwrites them.

The verify's features land in a static buffer that the next replay ingests; when fewer than B tokens were
accepted, the rejected positions' features are ingested too but sit at positions >= p, which no query sees before
they are overwritten. Nothing of the target is reimplemented: its own decoder layers run with our positioned cache
(the `update(k, v, layer_idx)` contract of a Hugging Face Cache; transformers' StaticCache writes at an internal
running counter, which cannot roll back a rejected block), so Llama and Qwen3 targets work alike.

Prefill stays eager (one variable-length forward per prompt). Graphs are captured per (block size, cache length);
the cache length grows (and graphs are re-captured) only when a prompt needs more. `graphs=False` runs the very
same step eagerly: tests/test_speculative.py checks graphs == eager token for token and lossless vs greedy.

    speculative_generate(target, drafter, prompts, block_size=16, max_new_tokens=128, temperature=0.0) -> SpeculativeRun
is the stable entry point for callers outside evaluation (the trainer's periodic real tau).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from dflash_lab.drafter.model import DFlashDrafter
from dflash_lab.data.draft_vocab import to_target_ids
from .speculative import GenerationResult, SpeculativeDecoder, target_text_config, finish_result, speculative_accept
from dflash_lab.target.features import decoder_of


class PositionedKVCache:
    """Per target layer a static K and V (1, kvh, L, d), written at the positions of the current forward.

    Implements the one method Hugging Face attention layers call on a cache: update(k, v, layer_idx) -> (K, V)."""

    def __init__(self, n_layers: int, kv_heads: int, length: int, head_dim: int, dtype, device):
        shape = (1, kv_heads, length, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.positions: torch.Tensor | None = None  # (T,) long: where this forward's K/V go

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        self.keys[layer_idx].index_copy_(2, self.positions, key_states)
        self.values[layer_idx].index_copy_(2, self.positions, value_states)
        return self.keys[layer_idx], self.values[layer_idx]


def static_path_problem(target, drafter: DFlashDrafter | None) -> str | None:
    """Why the static/graph path cannot run this target (None if it can)."""
    tc = target_text_config(target)
    if "sliding_attention" in (getattr(tc, "layer_types", None) or ()) and getattr(tc, "use_sliding_window", True):
        return "the target has sliding-window layers (the static path implements full attention only)"
    impl = getattr(target.config, "_attn_implementation", "sdpa")
    if impl not in ("sdpa", "eager"):
        return f"the target's attention implementation is {impl!r} (static path: sdpa or eager)"
    if not hasattr(decoder_of(target), "rotary_emb"):
        return "the target's decoder has no rotary_emb"
    if drafter is not None and next(drafter.parameters()).device != next(target.parameters()).device:
        return "the drafter and the target are on different devices (one graph spans one device)"
    return None


class StaticSpeculativeDecoder(SpeculativeDecoder):
    """SpeculativeDecoder with static caches and (on CUDA) one CUDA graph per iteration; same results.

    graphs: capture the iteration as a CUDA graph (CUDA only); False runs the same fixed-shape step eagerly.
    max_length: initial cache length in positions (grown to fit prompt + max_new_tokens + 2 blocks)."""

    def __init__(self, target, drafter: DFlashDrafter | None, *, block_size: int | None = None,
                 mask_token_id: int | None = None, eos_token_id=None, graphs: bool = True, max_length: int = 1024):
        super().__init__(target, drafter, block_size=block_size, mask_token_id=mask_token_id,
                         eos_token_id=eos_token_id)
        problem = static_path_problem(target, drafter)
        if problem:
            raise ValueError(f"static decoding cannot run this target: {problem}. Fix: use SpeculativeDecoder "
                             "(the dynamic loop) for it.")
        self.graphs = graphs and self.target_device.type == "cuda"
        self.decoder = decoder_of(target)
        tc = target_text_config(target)
        self.n_layers = len(self.decoder.layers)
        self.kv_heads = tc.num_key_value_heads
        self.head_dim = getattr(tc, "head_dim", None) or tc.hidden_size // tc.num_attention_heads
        self.dtype = self.embed.weight.dtype
        self.additive_mask = getattr(target.config, "_attn_implementation", "sdpa") == "eager"
        self.length = 0
        self._graph: torch.cuda.CUDAGraph | None = None
        self.capture_s = 0.0
        self.graph_status = "graphs: not captured yet" if self.graphs else "eager: graphs off"
        self._allocate(max_length)

    # ---------------------------------------------------------------------------------------------------------
    def _allocate(self, length: int) -> None:
        """(Re)allocate every static buffer for caches of `length` positions; drops a captured graph."""
        dev, B = self.target_device, self.block_size
        self.length = length
        self._graph = None
        self.cache = PositionedKVCache(self.n_layers, self.kv_heads, length, self.head_dim, self.dtype, dev)
        self.kv_pos = torch.arange(length, device=dev)  # (L,)
        self.offsets = torch.arange(B, device=dev)  # (B,)
        self.state = torch.zeros(3, dtype=torch.long, device=dev)  # [last token, p_prev, p]
        self.out_tokens = torch.zeros(3 * B, dtype=torch.long, device=dev)  # target top-1 | runner-up | drafts
        self.out_margin = torch.zeros(B, dtype=torch.float32, device=dev)
        self.out_logits = torch.zeros(B, self.head.shape[0], dtype=torch.float32, device=dev)
        if self.drafter is not None:
            d = self.drafter
            a0 = d.layers[0].self_attn
            shape = (1, a0.num_kv_heads, length, a0.head_dim)
            mk = lambda: torch.zeros(shape, dtype=self.drafter_dtype, device=self.drafter_device)  # noqa: E731
            self.ctx_keys = [mk() for _ in d.layers]
            self.ctx_values = [mk() for _ in d.layers]
            self.feats = torch.zeros(1, B, len(self.layer_ids) * d.config.hidden_size, dtype=self.dtype, device=dev)
            self.mask_ids = torch.full((B - 1,), self.mask_token_id, dtype=torch.long, device=dev)

    # ---------------------------------------------------------------------------------------------------------
    def _target_step(self, ids: torch.Tensor, pos: torch.Tensor):
        """The target on ids (1, T) at positions pos (T,), K/V written into the static cache.
        Returns logits (T, V) fp32 and the features of layer_ids (1, T, n*H) (None without a drafter)."""
        h = self.embed(ids)  # (1, T, H)
        rope = self.decoder.rotary_emb(h, pos[None])
        mask = (self.kv_pos[None, :] <= pos[:, None])[None, None]  # (1, 1, T, L): causal by absolute position
        if self.additive_mask:
            mask = torch.zeros(mask.shape, dtype=h.dtype, device=h.device).masked_fill(~mask, torch.finfo(h.dtype).min)
        self.cache.positions = pos
        picked = {}
        for i, layer in enumerate(self.decoder.layers):
            h = layer(h, attention_mask=mask, position_ids=pos[None], past_key_values=self.cache, use_cache=True,
                      position_embeddings=rope)
            h = h[0] if isinstance(h, tuple) else h
            if i in self.layer_ids:
                picked[i] = h
        logits = F.linear(self.decoder.norm(h)[0], self.head).float()  # (T, V)
        feats = torch.cat([picked[i] for i in self.layer_ids], dim=-1) if self.layer_ids else None
        return logits, feats

    def _ingest(self, feats: torch.Tensor, pos: torch.Tensor) -> None:
        """Write the drafter's context K/V of target features (1, T, n*H) at positions pos (T,)."""
        d = self.drafter
        ctx = d.fuse_context(feats.to(self.drafter_dtype))  # (1, T, H)
        rope = d.rotary_emb(ctx, pos[None])
        for i, layer in enumerate(d.layers):
            k, v = layer.self_attn.project_kv(ctx, *rope)  # (1, kvh, T, d)
            self.ctx_keys[i].index_copy_(2, pos, k)
            self.ctx_values[i].index_copy_(2, pos, v)

    def _draft(self, last: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        """The B-1 greedy draft tokens (B-1,) of the block [last, MASK...] at positions p..p+B-1."""
        d, B = self.drafter, self.block_size
        blk_pos = p + self.offsets  # (B,)
        hidden = self.embed(torch.cat([last, self.mask_ids])[None]).to(self.drafter_dtype)  # (1, B, H)
        rope = d.rotary_emb(hidden, blk_pos[None])
        seen = (self.kv_pos < p)[None].expand(B, -1)  # (B, L): context strictly before the anchor
        masks = {"full_attention": torch.cat([seen, torch.ones(B, B, dtype=torch.bool, device=p.device)], 1)}
        if "sliding_attention" in d.config.layer_types:
            near = (blk_pos[:, None] - self.kv_pos[None]) < d.config.sliding_window  # (B, L)
            causal = self.offsets[None] <= self.offsets[:, None]  # (B, B)
            masks["sliding_attention"] = torch.cat([seen & near, causal], 1)
        for i, layer in enumerate(d.layers):
            hidden = layer(hidden, None, rope, None, masks[layer.attention_type][None, None],
                           context_kv=(self.ctx_keys[i], self.ctx_values[i]))
        hidden = d.norm(hidden)[0, 1:]  # (B-1, H): slot k predicts position p + k
        return to_target_ids(d, F.linear(hidden.to(self.head.dtype), self.draft_head).argmax(-1))  # d2t

    def _step(self) -> None:
        """One iteration, fixed shapes, no host sync: reads `state` (and `feats`), writes the out_* buffers."""
        B = self.block_size
        last, p_prev, p = self.state[0:1], self.state[1], self.state[2]
        if B > 1:
            self._ingest(self.feats, p_prev + self.offsets)
            drafts = self._draft(last, p)
            ids = torch.cat([last, drafts])[None]  # (1, B)
        else:
            drafts = self.offsets[:0]
            ids = last[None]
        logits, feats = self._target_step(ids, p + self.offsets)
        if B > 1:
            self.feats.copy_(feats)
        top = logits.topk(2, dim=-1)  # (B, 2)
        self.out_tokens.copy_(torch.cat([top.indices[:, 0], top.indices[:, 1], drafts, self.offsets[:1]]))
        self.out_margin.copy_(top.values[:, 0] - top.values[:, 1])
        self.out_logits.copy_(logits)

    def _capture(self) -> None:
        """Warm the step up on a side stream, then capture it (with state 0: its writes land at positions 0..B-1,
        which the next prefill overwrites or no query sees before a verify rewrites them)."""
        t0 = time.perf_counter()
        stream = torch.cuda.Stream(device=self.target_device)
        stream.wait_stream(torch.cuda.current_stream(self.target_device))
        with torch.cuda.stream(stream):
            for _ in range(2):
                self._step()
        torch.cuda.current_stream(self.target_device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        try:
            # thread_local: another thread (a training worker) may keep launching on its GPU during the capture.
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                self._step()
        except RuntimeError as e:  # an op that cannot be captured: stay correct, say why it is slow
            self.graphs = False
            self.graph_status = f"eager: CUDA graph capture failed ({str(e).splitlines()[0]})"
            return
        torch.cuda.synchronize(self.target_device)
        self._graph = graph
        self.capture_s += time.perf_counter() - t0
        self.graph_status = f"graphs: captured at block {self.block_size}, cache length {self.length}"

    # ---------------------------------------------------------------------------------------------------------
    @torch.no_grad()
    def generate(self, prompt_ids, *, max_new_tokens: int = 128, temperature: float = 0.0,
                 generator: torch.Generator | None = None) -> GenerationResult:
        """Speculative generation for one prompt; identical results to SpeculativeDecoder.generate."""
        ids = self.checked_prompt(prompt_ids, max_new_tokens, temperature)
        n = ids.numel()
        B, dev = self.block_size, self.target_device
        need = n + max_new_tokens + 2 * B
        if need > self.length:
            self._allocate(max(need, 2 * self.length) if self.length else need)
        if self.graphs and self._graph is None:  # capture outside the timed region; state 0 writes only positions
            self.state.zero_()                    # that the prefill overwrites or that no query sees (masked)
            self._capture()
        sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)

        t0 = time.perf_counter()
        logits, feats = self._target_step(ids[None].to(dev), torch.arange(n, device=dev))
        if B > 1:
            self._ingest(feats, torch.arange(n, device=dev))
        out = [self._pick(logits[-1], temperature, generator)]
        margins, runner_up = self._top2(logits[-1:])
        self.state.copy_(torch.tensor([out[0], n, n]))  # p_prev = p: the first ingest writes only masked positions
        sync()
        t1 = time.perf_counter()

        accepted: list[int] = []
        p = n
        done = out[-1] in self.eos_ids
        while len(out) < max_new_tokens and not done:
            if self._graph is not None:
                self._graph.replay()
            else:
                self._step()
            tokens = self.out_tokens.tolist()  # syncs: the only device->host copy of an iteration at T=0
            top1, second, drafts = tokens[:B], tokens[B:2 * B], tokens[2 * B:3 * B - 1]
            if temperature == 0:
                a = 0
                while a < B - 1 and drafts[a] == top1[a]:
                    a += 1
                nxt = top1[a]
            else:
                probs = torch.softmax(self.out_logits / temperature, dim=-1).cpu()
                a, nxt = speculative_accept(probs, drafts, generator)
            accepted.append(a)
            out.extend(drafts[:a])
            out.append(nxt)
            margins += self.out_margin[: a + 1].tolist()
            runner_up += second[: a + 1]
            done = any(t in self.eos_ids for t in out[-(a + 1):])
            self.state.copy_(torch.tensor([nxt, p, p + a + 1]))
            p += a + 1
        sync()
        t2 = time.perf_counter()
        return finish_result(n, out, accepted, B, t1 - t0, t2 - t1, margins, runner_up, self.eos_ids,
                             max_new_tokens)


def make_decoder(target, drafter: DFlashDrafter | None, *, block_size: int | None = None, eos_token_id=None,
                 fast: str | bool = "auto", log=None) -> SpeculativeDecoder:
    """The decoder to measure with: static caches + CUDA graphs on CUDA (fast="auto" or True), the dynamic loop on
    the CPU or for a target the static path cannot run (said through `log`)."""
    on_cuda = next(target.parameters()).device.type == "cuda"
    if fast is True or (fast == "auto" and on_cuda):
        problem = static_path_problem(target, drafter)
        if problem is None:
            return StaticSpeculativeDecoder(target, drafter, block_size=block_size, eos_token_id=eos_token_id,
                                            graphs=on_cuda)
        if log:
            log(f"decoding with the dynamic loop: {problem}")
    return SpeculativeDecoder(target, drafter, block_size=block_size, eos_token_id=eos_token_id)


@dataclass
class SpeculativeRun:
    """Results of speculative_generate: one GenerationResult per prompt, pooled tau and throughput."""

    results: list[GenerationResult]

    @property
    def tau(self) -> float:
        """Mean accepted + 1 over all iterations of all prompts (pooled)."""
        acc = [a for r in self.results for a in r.accepted]
        return sum(acc) / len(acc) + 1.0 if acc else 1.0

    @property
    def new_tokens(self) -> int:
        return sum(len(r.output_ids) for r in self.results)

    @property
    def tokens_per_s(self) -> float:
        secs = sum(r.total_s for r in self.results)
        return self.new_tokens / secs if secs > 0 else 0.0

    @property
    def ms_per_iteration(self) -> float:
        its = sum(r.iterations for r in self.results)
        return 1e3 * sum(r.decode_s for r in self.results) / its if its else 0.0


@torch.no_grad()
def speculative_generate(target, drafter: DFlashDrafter | None, prompts, *, block_size: int | None = None,
                         max_new_tokens: int = 128, temperature: float = 0.0, eos_token_id=None, seed: int = 0,
                         fast: str | bool = "auto") -> SpeculativeRun:
    """Speculative decoding of every prompt (lists of token ids) at batch size 1; `.tau` is the pooled tau.

    drafter None (or block_size 1) = the target alone. The drafter is put in eval mode for the call and restored.
    Sampling (temperature > 0) uses a CPU generator seeded with seed + prompt index."""
    decoder = make_decoder(target, drafter, block_size=block_size, eos_token_id=eos_token_id, fast=fast)
    was_training = drafter.training if drafter is not None else False
    if drafter is not None:
        drafter.eval()
    try:
        results = [decoder.generate(list(p), max_new_tokens=max_new_tokens, temperature=temperature,
                                    generator=torch.Generator().manual_seed(seed + i))
                   for i, p in enumerate(prompts)]
    finally:
        if drafter is not None:
            drafter.train(was_training)
    return SpeculativeRun(results)
