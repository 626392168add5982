"""Speculative decoding whose per-iteration cost is GPU time: static KV caches and one CUDA graph per iteration.

The dynamic loop (speculative.py) grows caches with torch.cat, crops them after each verification and launches every
kernel from Python: for a 135M target on an H200 that is ~60 ms per iteration of which the GPU works a few. Here
every buffer has a fixed shape, so one iteration is ONE `torch.cuda.CUDAGraph` replay and one small copy back:

    ingest   fuse the previous verify's B target features into drafter context (fc + hidden_norm)
    draft    per draft layer ONE k/v projection of [those B context rows | the block's B rows], both written into
             the drafter's cache (context at p_prev.., block at p..: the block's entries are overwritten by the next
             ingest before anything reads them as context); block queries attend to cache[:live] (< p + B)
    verify   the target's own decoder layers on [last, drafts] at p..p+B-1, K/V written into a positioned cache
    accept   top-k of the verify logits, greedy acceptance ON the device (longest matching prefix, bonus token) and
             the next state [last, p_prev, p], so a greedy iteration copies nothing host -> device

Attention reads the LIVE prefix only: keys [0, live) where `live` is the smallest length bucket (256, 512, ...,
the cache length) >= p + B, with one graph per bucket, instead of the whole static cache behind a dense mask. The
mask is additive (built once per step, in the model dtype) so SDPA takes its memory-efficient kernel without a
per-layer bool conversion; the drafter's grouped-query attention folds its query groups into the query length
(q (1, kvh, groups * B, d) against k (1, kvh, live, d)) instead of copying K/V per head. Entries past the accepted
prefix are never read and need no cropping: the next iteration overwrites them. Nothing of the target is
reimplemented: its decoder layers run with our positioned cache (the `update(k, v, layer_idx)` contract of a
Hugging Face Cache), so Llama and Qwen3 targets work alike.

Drafts sampled from the drafter at T > 0 (draft_sampling "sample" / "coupled") split the iteration in two graphs:
ingest + draft (the drafter's logits into a static buffer), the draws with the dynamic loop's very code and
generator stream, then verify + the top-k rows. At T > 0 speculative sampling (acceptance.accept_block) runs on the
device too, with uniforms drawn on the host before the verify, so an iteration still reads the host once.

A Markov-head drafter (DSpark) drafts slot after slot INSIDE the graph (markov_draft.py, as vLLM captures it); a
verify policy verifies every draft and keeps the first k it chose (the target's logits at slots <= k do not depend
on later drafts): a k-draft verify's tokens and counts, a full verify's time (verify_budget.py prices k).

Prefill stays eager (one variable-length forward per prompt). `graphs=False` runs the very same step eagerly:
tests/test_speculative.py checks graphs == eager token for token and lossless vs greedy.

    speculative_generate(target, drafter, prompts, block_size=16, max_new_tokens=128, temperature=0.0) -> SpeculativeRun
is the stable entry point for callers outside evaluation (the trainer's periodic real tau).
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from dflash_lab.config.windows import window_masks
from dflash_lab.drafter.model import DFlashDrafter, apply_rope
from dflash_lab.target.features import decoder_of
from dflash_lab.target.static_cache import MIN_SPAN, RowKVCache, additive, bucket, doubling_ladder
from .acceptance import host_uniforms
from .batched_decode import BatchedSpeculativeDecoder, static_path_problem
from .speculative import (TOPK, GenerationResult, SpeculativeDecoder, finish_result, target_text_config,
                          verified_uniforms)
from .verify_budget import VerifyPolicy
from .speculative_run import SpeculativeRun

STAGES = ("ingest", "draft", "verify", "accept")  # the parts of one iteration, in order (decode_bench times each)


class StaticSpeculativeDecoder(SpeculativeDecoder):
    """SpeculativeDecoder with static caches and (on CUDA) one CUDA graph per iteration and length bucket; same
    results.

    graphs: capture the iteration as CUDA graphs (CUDA only); False runs the same fixed-shape step eagerly.
    draft_sampling: as SpeculativeDecoder's; "sample" / "coupled" draft in a graph of their own (module docstring).
    max_length: initial cache length in positions (grown to fit prompt + max_new_tokens + 2 blocks).
    min_bucket: the shortest attention length (tests use a small one to cross buckets with short prompts)."""

    def __init__(self, target, drafter: DFlashDrafter | None, *, block_size: int | None = None,
                 mask_token_id: int | None = None, eos_token_id=None, graphs: bool = True, max_length: int = 1024,
                 min_bucket: int = MIN_SPAN, draft_sampling: str = "argmax", draft_topk: int | None = None,
                 verify_policy: VerifyPolicy | None = None):
        super().__init__(target, drafter, block_size=block_size, mask_token_id=mask_token_id,
                         eos_token_id=eos_token_id, draft_sampling=draft_sampling, draft_topk=draft_topk,
                         verify_policy=verify_policy)
        self.sampled = draft_sampling != "argmax" and drafter is not None and self.block_size > 1
        problem = static_path_problem(target, drafter)
        if problem:
            raise ValueError(f"static decoding cannot run this target: {problem}. Fix: use SpeculativeDecoder "
                             "(the dynamic loop) for it.")
        if self.head.shape[0] >= 1 << 24:  # token ids travel in the float32 output row
            raise ValueError(f"vocabulary of {self.head.shape[0]} tokens is too large for the static path.")
        self.graphs = graphs and self.target_device.type == "cuda"
        self.decoder = decoder_of(target)
        tc = target_text_config(target)
        self.n_layers = len(self.decoder.layers)
        self.kv_heads = tc.num_key_value_heads
        self.head_dim = getattr(tc, "head_dim", None) or tc.hidden_size // tc.num_attention_heads
        self.dtype = self.embed.weight.dtype
        self.length, self.min_bucket = 0, min_bucket
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._draft_graphs: dict[int, torch.cuda.CUDAGraph] = {}  # sampled drafts: the draft stage alone
        self.capture_s = 0.0
        self.graph_status = "graphs: not captured yet" if self.graphs else "eager: graphs off"
        if drafter is not None:
            cfg = drafter.config
            self.windows = window_masks(cfg.layer_types, cfg.sliding_window, cfg.layer_windows)  # {mask key: window}
        self._allocate(max_length)

    # ---------------------------------------------------------------------------------------------------------
    def _allocate(self, length: int) -> None:
        """(Re)allocate every static buffer for caches of `length` positions; drops captured graphs."""
        dev, B, K = self.target_device, self.block_size, min(TOPK, self.head.shape[0])
        length = -(-length // 64) * 64  # a multiple of 64: attention kernels take masks of aligned length unpadded
        self.length, self.k = length, K
        self.buckets = doubling_ladder(length, self.min_bucket)
        self._graphs, self._draft_graphs = {}, {}
        self.cache = RowKVCache(self.n_layers, self.kv_heads, 1, length, self.head_dim, self.dtype, dev)
        self.kv_pos = torch.arange(length, device=dev)  # (L,)
        self.offsets = torch.arange(B, device=dev)  # (B,)
        self.state = torch.zeros(3, dtype=torch.long, device=dev)  # [last token, p_prev, p]
        self.ref_seq = torch.zeros(length, dtype=torch.long, device=dev)  # reference token at each position
        # One row per block slot: top-k ids | top-k logits | draft (slots 1..B-1) | reference logit | accepted (row 0)
        # | confidence of the draft (slots 1..B-1; a drafter with a confidence head)
        self.out = torch.zeros(B, 2 * K + 4, dtype=torch.float32, device=dev)
        self.out_logits = torch.zeros(B, self.head.shape[0], dtype=torch.float32, device=dev)  # sampling (T > 0)
        if self.drafter is not None:
            d = self.drafter
            a0 = d.layers[0].self_attn
            shape = (1, a0.num_kv_heads, length, a0.head_dim)
            mk = lambda: torch.zeros(shape, dtype=self.drafter_dtype, device=self.drafter_device)  # noqa: E731
            self.ctx_keys = [mk() for _ in d.layers]
            self.ctx_values = [mk() for _ in d.layers]
            self.feats = torch.zeros(1, B, len(self.layer_ids) * d.config.hidden_size, dtype=self.dtype, device=dev)
            self.mask_ids = torch.full((B - 1,), self.mask_token_id, dtype=torch.long, device=dev)
            # sampled drafts: the drafter's logits out of the draft stage, the drafts drawn on the host back in
            self.draft_logits = torch.zeros(B - 1, self.draft_head.shape[0], dtype=self.head.dtype, device=dev)
            self.draft_rows = torch.zeros(B - 1, d.config.hidden_size, dtype=self.drafter_dtype, device=dev)
            self.drafts_in = torch.zeros(B - 1, dtype=torch.long, device=dev)
            self.confidence_in = torch.zeros(B - 1, dtype=torch.float32, device=dev)

    def bucket(self, need: int) -> int:
        """The attention length of an iteration whose block ends before position `need`."""
        return bucket(self.buckets, need)

    # ---------------------------------------------------------------------------------------------------------
    def _target_step(self, ids: torch.Tensor, pos: torch.Tensor, live: int):
        """The target on ids (1, T) at positions pos (T,), K/V written into the static cache, attention over
        [0, live). Returns logits (T, V) fp32 and the features of layer_ids (1, T, n*H) (None without a drafter)."""
        h = self.embed(ids)  # (1, T, H)
        rope = self.decoder.rotary_emb(h, pos[None])
        mask = additive((self.kv_pos[None, :live] <= pos[:, None])[None, None], h.dtype)  # (1, 1, T, live) causal
        self.cache.at(pos, live)
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

    def _ingest_prompt(self, feats: torch.Tensor, pos: torch.Tensor) -> None:
        """The prompt's context K/V (features (1, T, n*H) at positions pos (T,)) into the drafter cache."""
        d = self.drafter
        ctx = d.fuse_context(feats.to(self.drafter_dtype))  # (1, T, H)
        rope = d.rotary_emb(ctx, pos[None])
        for i, layer in enumerate(d.layers):
            k, v = layer.self_attn.project_kv(ctx, *rope)  # (1, kvh, T, d)
            self.ctx_keys[i].index_copy_(2, pos, k)
            self.ctx_values[i].index_copy_(2, pos, v)

    def _draft_masks(self, p: torch.Tensor, live: int, groups: int) -> dict:
        """Additive masks (1, 1, groups * B, live) per mask key: context strictly before the anchor p and the whole
        block (full layers); context within the window and causal inside the block (sliding layers)."""
        B = self.block_size
        kv, q = self.kv_pos[None, :live], (p + self.offsets)[:, None]  # (1, live), (B, 1)
        masks = {}
        for key, window in self.windows.items():
            if window is None:
                seen = (kv < p + B).expand(B, -1)  # (B, live)
            else:
                seen = ((kv < p) & (q - kv < window)) | ((kv >= p) & (kv <= q))
            masks[key] = additive(seen, self.drafter_dtype).repeat(groups, 1)[None, None]
        return masks

    def _draft(self, ctx: torch.Tensor, last: torch.Tensor, p_prev: torch.Tensor, p: torch.Tensor,
               live: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The B-1 greedy draft tokens (B-1,), in target ids, of the block [last, MASK...] at p.. (_draft_hidden;
        slot after slot through a Markov head), and their confidences (None without a confidence head)."""
        hidden = self._draft_hidden(ctx, last, p_prev, p, live)  # (B-1, H): slot k predicts position p + k
        prop = self.propose(F.linear(hidden.to(self.head.dtype), self.draft_head), hidden, last, 0.0, None)
        return prop.drafts, prop.confidence

    def _draft_hidden(self, ctx: torch.Tensor, last: torch.Tensor, p_prev: torch.Tensor, p: torch.Tensor,
                      live: int) -> torch.Tensor:
        """Ingest the fused context rows ctx (1, B, H) at p_prev.. and run the block [last, MASK...] at p..;
        returns the normed hidden states of slots 1..B-1 (B-1, H). The layer forward of drafter/model.py, with the
        context and block K/V projected together and attention over the drafter cache's live prefix."""
        d, B = self.drafter, self.block_size
        a0 = d.layers[0].self_attn
        groups = a0.num_heads // a0.num_kv_heads
        ctx_pos, blk_pos = p_prev + self.offsets, p + self.offsets
        hidden = self.embed(torch.cat([last, self.mask_ids])[None]).to(self.drafter_dtype)  # (1, B, H)
        cos, sin = d.rotary_emb(hidden, torch.cat([ctx_pos, blk_pos])[None])  # (1, 2B, d)
        masks = self._draft_masks(p, live, groups)
        for i, layer in enumerate(d.layers):
            attn = layer.self_attn
            x = layer.input_layernorm(hidden)
            k, v = attn.project_kv(torch.cat([ctx, x], dim=1), cos, sin)  # (1, kvh, 2B, d): context | block
            for rows, pos in ((slice(0, B), ctx_pos), (slice(B, 2 * B), blk_pos)):  # the block last: it wins >= p
                self.ctx_keys[i].index_copy_(2, pos, k[:, :, rows])
                self.ctx_values[i].index_copy_(2, pos, v[:, :, rows])
            q = attn.q_norm(attn.q_proj(x).view(1, B, attn.num_heads, attn.head_dim)).transpose(1, 2)
            q = apply_rope(q, cos[:, B:], sin[:, B:])  # (1, h, B, d)
            q = q.reshape(1, attn.num_kv_heads, groups * B, attn.head_dim)  # head j reads kv head j // groups
            out = F.scaled_dot_product_attention(q, self.ctx_keys[i][:, :, :live], self.ctx_values[i][:, :, :live],
                                                 attn_mask=masks[layer.mask_key])  # (1, kvh, groups * B, d)
            # SDPA's fused kernels may return a non-contiguous output on the GPU: reshape, never view
            out = out.reshape(1, attn.num_heads, B, attn.head_dim).transpose(1, 2).reshape(1, B, -1)
            hidden = hidden + attn.o_proj(out)
            hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
        return d.norm(hidden)[0, 1:]

    def _draft_stage(self, live: int) -> None:
        """Sampled drafts, the first graph of an iteration: ingest the previous verify's features and write the
        drafter's logits of slots 1..B-1 (over its draft vocabulary) into `draft_logits`, as the dynamic loop
        computes them."""
        last, p_prev, p = self.state[0:1], self.state[1], self.state[2]
        ctx = self.drafter.fuse_context(self.feats.to(self.drafter_dtype))  # (1, B, H)
        hidden = self._draft_hidden(ctx, last, p_prev, p, live)
        self.draft_rows.copy_(hidden)
        self.draft_logits.copy_(hidden.to(self.head.dtype) @ self.draft_head.t())

    def _step(self, live: int, upto: str = "accept") -> None:
        """One iteration, fixed shapes, no host sync: reads `state` and `feats`, writes `out`, `out_logits` and the
        next `state` (greedy acceptance). `upto` stops after that stage (decode_bench times the stages). With
        sampled drafts the drafts are `drafts_in`, drawn on the host after _draft_stage."""
        B, stop = self.block_size, STAGES.index(upto)
        last, p_prev, p = self.state[0:1], self.state[1], self.state[2]
        drafts, confidence = self.offsets[:0], None
        if self.sampled:
            drafts, confidence = self.drafts_in, self.confidence_in
        elif B > 1:
            ctx = self.drafter.fuse_context(self.feats.to(self.drafter_dtype))  # (1, B, H)
            if stop < 1:
                return
            drafts, confidence = self._draft(ctx, last, p_prev, p, live)
        if stop < 2:
            return
        logits, feats = self._target_step(torch.cat([last, drafts])[None], p + self.offsets, live)
        if B > 1:
            self.feats.copy_(feats)
        if stop < 3:
            return
        top = logits.topk(self.k, dim=-1)  # (B, k)
        top1 = top.indices[:, 0]
        a = (drafts == top1[:-1]).long().cumprod(0).sum() if B > 1 else p * 0  # leading drafts the target agrees with
        ref = logits.gather(1, self.ref_seq[(p + 1 + self.offsets).clamp(max=self.length - 1)][:, None])  # (B, 1)
        col = lambda x: x.float()[:, None]  # noqa: E731
        acc = (self.offsets == 0).float()[:, None] * a.float()  # (B, 1): the accepted count in row 0
        conf = col(torch.cat([confidence, confidence[:1] * 0])) if confidence is not None else acc * 0
        self.out.copy_(torch.cat([top.indices.float(), top.values, col(torch.cat([drafts, drafts[:1] * 0]))
                                  if B > 1 else col(p[None] * 0), ref, acc, conf], dim=1))
        self.out_logits.copy_(logits)
        # top1[a] with a 0-dim tensor index reads `a` on the host (a sync a CUDA graph cannot capture): gather it
        nxt = top1.index_select(0, a.view(1)).squeeze(0)
        self.state.copy_(torch.stack([nxt, p, p + a + 1]))

    def _capture(self, live: int) -> None:
        """Warm the step up on a side stream, then capture it (with sampled drafts: the draft stage first, then the
        step). Its writes land at positions a prefill overwrites or no query reads before a verify rewrites them,
        and generate() sets the state after its prefill."""
        if self.sampled and live not in self._draft_graphs:
            graph = self._captured(lambda: self._draft_stage(live))
            if graph is None:
                return
            self._draft_graphs[live] = graph
        graph = self._captured(lambda: self._step(live))
        if graph is not None:
            self._graphs[live] = graph
            self.graph_status = (f"graphs: captured at block {self.block_size}, attention buckets "
                                 f"{sorted(self._graphs)}, cache length {self.length}"
                                 + (f", drafts sampled ({self.draft_sampling}) between two graphs" if self.sampled
                                    else ""))

    def _captured(self, fn) -> torch.cuda.CUDAGraph | None:
        """fn warmed up twice on a side stream, then captured; None (graphs off, status says why) if it cannot be."""
        t0 = time.perf_counter()
        stream = torch.cuda.Stream(device=self.target_device)
        stream.wait_stream(torch.cuda.current_stream(self.target_device))
        with torch.cuda.stream(stream):
            for _ in range(2):
                self.state.zero_()
                fn()
        torch.cuda.current_stream(self.target_device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        self.state.zero_()
        try:
            # thread_local: another thread (a training worker) may keep launching on its GPU during the capture.
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                fn()
        except RuntimeError as e:  # an op that cannot be captured: stay correct, say why it is slow
            self.graphs = False
            self.graph_status = f"eager: CUDA graph capture failed ({str(e).splitlines()[0]})"
            self._graphs, self._draft_graphs = {}, {}
            return None
        torch.cuda.synchronize(self.target_device)
        self.capture_s += time.perf_counter() - t0
        return graph

    # ---------------------------------------------------------------------------------------------------------
    @torch.no_grad()
    def generate(self, prompt_ids, *, max_new_tokens: int = 128, temperature: float = 0.0,
                 generator: torch.Generator | None = None, reference: list[int] | None = None) -> GenerationResult:
        """Speculative generation for one prompt; identical results to SpeculativeDecoder.generate."""
        ids = self.checked_prompt(prompt_ids, max_new_tokens, temperature)
        n = ids.numel()
        B, K, dev = self.block_size, self.k, self.target_device
        need = n + max_new_tokens + 2 * B
        if need > self.length:
            self._allocate(max(need, 2 * self.length) if self.length else need)
        if self.graphs:  # capture outside the timed region, every bucket this prompt can reach
            for live in self.buckets[: self.buckets.index(self.bucket(need)) + 1]:
                if live not in self._graphs and self.graphs:
                    self._capture(live)
        ref = list(reference or [])[:max_new_tokens]
        if ref:
            self.ref_seq[n:n + len(ref)] = torch.tensor(ref, dtype=torch.long, device=dev)
        sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)

        t0 = time.perf_counter()
        logits, feats = self._target_step(ids[None].to(dev), torch.arange(n, device=dev), self.bucket(n))
        if B > 1:
            self._ingest_prompt(feats, torch.arange(n, device=dev))
        top_ids, top_logits = self._topk(logits[-1:])
        out = [top_ids[0][0] if temperature == 0 else self._pick(logits[-1], temperature, generator)]
        refs = self._ref_logits(logits[-1:], ref or None, 0, 1)
        self.state.copy_(torch.tensor([out[0], n, n]))  # p_prev = p: the first ingest writes only masked positions
        sync()
        t1 = time.perf_counter()

        accepted: list[int] = []
        verified: list[int] = []
        p = n
        done = out[-1] in self.eos_ids
        confidence, scored = [1.0] * (B - 1), getattr(self.heads, "confidence_head", None) is not None
        while len(out) < max_new_tokens and not done:
            live = self.bucket(p + B)
            graph = self._graphs.get(live)
            q = None
            if self.sampled:  # draft stage, the drafts drawn on the device (argmax at T=0, as in every mode), verify
                self._draft_stage(live) if graph is None else self._draft_graphs[live].replay()
                prop = self.propose(self.draft_logits, self.draft_rows, self.state[0:1], temperature, generator)
                self.drafts_in.copy_(prop.drafts)
                q = prop.q
                self.confidence_in.copy_(prop.confidence) if prop.confidence is not None else None
            u = host_uniforms(B, generator, dev) if temperature > 0 else None  # the dynamic loop's order
            if graph is not None:
                graph.replay()
            else:
                self._step(live)
            drafts_dev = self.drafts_in if self.sampled else self.out[: B - 1, 2 * K].long()
            if temperature > 0 and self.verify_policy is None:  # the verdict's state, not greedy's; before the read
                verdict = self.accept_sampled(self.out_logits, drafts_dev, q, u, temperature)
                self.state.copy_(torch.stack([verdict[1], self.state[1], self.state[1] + verdict[0] + 1]))
            rows = self.out.tolist()  # syncs: the only device->host copy of an iteration without a verify policy
            ti = [[int(x) for x in r[:K]] for r in rows]
            drafts = [int(r[2 * K]) for r in rows[: B - 1]]
            k, confidence = self.drafts_to_verify(scored and [r[-1] for r in rows[: B - 1]] or None, confidence, B - 1)
            verified.append(k)
            if temperature > 0 and self.verify_policy is not None:  # the first k drafts verified: a second read
                verdict = self.accept_sampled(self.out_logits[: k + 1], drafts_dev[:k], q, verified_uniforms(u, k),
                                              temperature)
                self.state.copy_(torch.stack([verdict[1], self.state[1], self.state[1] + verdict[0] + 1]))
            if temperature == 0:
                a = min(int(rows[0][2 * K + 2]), k)
                nxt = ti[a][0]
                if a < int(rows[0][2 * K + 2]):  # drafts past the verified ones were accepted: not this block's
                    self.state.copy_(torch.tensor([nxt, p, p + a + 1], device=dev))
            else:
                a, nxt = verdict.tolist()  # already computed: the read above waited for it
            accepted.append(a)
            refs += [rows[i][2 * K + 1] if len(out) + i < len(ref) else None for i in range(a + 1)]
            out.extend(drafts[:a])
            out.append(nxt)
            top_ids += ti[: a + 1]
            top_logits += [r[K:2 * K] for r in rows[: a + 1]]
            done = any(t in self.eos_ids for t in out[-(a + 1):])
            p += a + 1
        sync()
        t2 = time.perf_counter()
        return finish_result(n, out, accepted, B, t1 - t0, t2 - t1, self.eos_ids, max_new_tokens,
                             top_ids, top_logits, refs, verified)


def make_decoder(target, drafter: DFlashDrafter | None, *, block_size: int | None = None, eos_token_id=None,
                 fast: str | bool = "auto", log=None, draft_sampling: str = "argmax", draft_topk: int | None = None,
                 verify_policy: VerifyPolicy | None = None) -> SpeculativeDecoder:
    """The decoder to measure with: static caches + CUDA graphs on CUDA (fast="auto" or True), the dynamic loop on
    the CPU or for a target the static path cannot run (said through `log`). Drafts drawn from the drafter at T > 0
    (draft_sampling "sample" or "coupled", speculative.py), a Markov head's top-k candidates (draft_topk) and a
    confidence head's verify policy run on both, with the same draws."""
    on_cuda = next(target.parameters()).device.type == "cuda"
    options = dict(block_size=block_size, eos_token_id=eos_token_id, draft_sampling=draft_sampling,
                   draft_topk=draft_topk, verify_policy=verify_policy)
    if fast is True or (fast == "auto" and on_cuda):
        problem = static_path_problem(target, drafter)
        if problem is None:
            return StaticSpeculativeDecoder(target, drafter, graphs=on_cuda, **options)
        if log:
            log(f"decoding with the dynamic loop: {problem}")
    return SpeculativeDecoder(target, drafter, **options)


@torch.no_grad()
def speculative_generate(target, drafter: DFlashDrafter | None, prompts, *, block_size: int | None = None,
                         max_new_tokens: int = 128, temperature: float = 0.0, eos_token_id=None, seed: int = 0,
                         fast: str | bool = "auto", batch: int = 1) -> SpeculativeRun:
    """Speculative decoding of every prompt (lists of token ids); `.tau` is the pooled tau.

    drafter None (or block_size 1) = the target alone. The drafter is put in eval mode for the call and restored.
    Sampling (temperature > 0) uses a CPU generator seeded with seed + prompt index. batch > 1: greedy decoding of
    up to `batch` prompts at once (batched_decode.py: the same tokens and tau, no per-prompt timing)."""
    prompts = [list(p) for p in prompts]
    B = block_size or (drafter.config.block_size if drafter is not None else 1)
    # the batched decoder drafts DFlash blocks; a drafter with heads (DSpark) decodes one prompt at a time
    batched = (batch > 1 and len(prompts) > 1 and temperature == 0 and drafter is not None and B > 1
               and drafter.heads is None and static_path_problem(target, drafter) is None)
    decoder = (BatchedSpeculativeDecoder(target, drafter, rows=min(batch, len(prompts)), block_size=B,
                                         length=max(map(len, prompts)) + max_new_tokens + 2 * B,
                                         eos_token_id=eos_token_id) if batched else
               make_decoder(target, drafter, block_size=block_size, eos_token_id=eos_token_id, fast=fast))
    was_training = drafter.training if drafter is not None else False
    if drafter is not None:
        drafter.eval()
    try:
        if batched:
            results = decoder.generate_many(prompts, max_new_tokens=max_new_tokens)
        else:
            results = [decoder.generate(p, max_new_tokens=max_new_tokens, temperature=temperature,
                                        generator=torch.Generator().manual_seed(seed + i))
                       for i, p in enumerate(prompts)]
    finally:
        if drafter is not None:
            drafter.train(was_training)
    return SpeculativeRun(results)
