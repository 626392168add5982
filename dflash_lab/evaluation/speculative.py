"""Speculative decoding with a DFlash drafter: draft a block in one pass, verify it in one target forward.

    prefill target on the prompt (KV cache + features of target_layer_ids) -> first token
    loop:  block = [last token, MASK x (B-1)] at positions p..p+B-1
           drafter: new context features -> cached context K/V per layer; block attends to all cached context
           target verifies the B tokens in ONE forward (its KV cache holds positions < p)
           accept the longest prefix where draft == target token (temperature 0) or speculative sampling (T > 0),
           plus the target's bonus token; crop the target cache to the accepted positions; the accepted positions'
           hidden states become the drafter's next context.

The drafter cache holds ONLY context K/V (the block's own K/V are recomputed each call), so nothing of a rejected
block ever needs cropping there; the target cache is cropped to p + accepted + 1 entries after each verification.
Block size 1 is the plain target-only loop (no drafter call, one token per target forward): the speedup baseline.

tau = mean over iterations of (accepted + 1), 1 <= tau <= B. At temperature 0 the output equals the target's own
greedy `generate()` (tests/test_speculative.py checks it token for token). For T > 0 the draft is by default
deterministic (the drafter's argmax), so draft token x is accepted with probability p_target(x) and a rejection
resamples from p_target with x removed: the output distribution is exactly the target's, and no argmax drafter
can be accepted more often than the target's own top-1 probability allows (evaluation/sampling_ceiling.py).

`draft_sampling="sample"` draws each slot's draft from the drafter's own distribution q_k at the same temperature
instead. The block's slots are drafted in one pass from MASK inputs, so x_k ~ q_k does not depend on the drafts
before it and its proposal given them is q_k itself, which is what speculative sampling must know: x_k is
accepted with probability min(1, p_k(x_k) / q_k(x_k)) (p_k: the target at slot k given the drafts before it) and a
rejection samples from max(0, p_k - q_k), normalised.
The output is again distributed exactly as the target's samples, and a slot is accepted with probability
sum_x min(p_k, q_k): up to 1 where the drafter's distribution matches the target's, above the argmax ceiling.
`draft_sampling="coupled"` draws every slot from one shared uniform instead (acceptance.coupled_drafts), so a
sampled block is more often one continuation, and verifies each slot against its proposal given the drafts before.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from dflash_lab.config import DrafterConfig
from dflash_lab.config.windows import window_masks
from dflash_lab.drafter.model import DFlashDrafter
from dflash_lab.target.features import decoder_of, embedding_of, lm_head_weight
from dflash_lab.data.draft_vocab import draft_head, to_target_ids
from dflash_lab.target.sampling import check_temperature, tempered_probs

from .acceptance import DRAFT_SAMPLING, accept_block, coupled_drafts, draw_rows, host_uniforms


class DrafterMismatchError(ValueError):
    """The drafter does not fit the target (hidden size, layer ids, vocabulary, MASK id)."""


class PromptTooLongError(ValueError):
    """A prompt (plus the generation budget) does not fit in the target's context."""


TOPK = 5  # target logits kept per output token: enough to see a 3- or 4-way tie at a divergence


def target_text_config(target):
    cfg = target.config
    return cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg


def check_compatible(target, config: DrafterConfig) -> None:
    """Raise DrafterMismatchError naming the drafter's and the target's values when they do not fit."""
    tc = target_text_config(target)
    embed_rows, embed_dim = embedding_of(target).weight.shape
    n_layers = len(decoder_of(target).layers)
    problems = []
    if config.hidden_size != tc.hidden_size or config.hidden_size != embed_dim:
        problems.append(f"hidden size: drafter {config.hidden_size} vs target {tc.hidden_size}")
    if config.num_target_layers != n_layers:
        problems.append(f"target layers: drafter was built for {config.num_target_layers} vs target has {n_layers}")
    bad = [i for i in config.target_layer_ids if not 0 <= i < n_layers]
    if bad:
        problems.append(f"target_layer_ids: drafter {list(config.target_layer_ids)} vs target layers 0..{n_layers - 1}"
                        f" (out of range: {bad})")
    if config.vocab_size != embed_rows:
        problems.append(f"vocabulary: drafter {config.vocab_size} vs target {embed_rows} embedding rows")
    if not 0 <= config.mask_token_id < embed_rows:
        problems.append(f"mask_token_id: drafter {config.mask_token_id} vs target vocabulary [0, {embed_rows})")
    if problems:
        raise DrafterMismatchError(
            f"the drafter does not fit the target {getattr(tc, '_name_or_path', '') or type(target).__name__}: "
            + "; ".join(problems) + ". Fix: evaluate the drafter with the target it was trained on (see the run's "
            "config.json 'target'), or train a new drafter for this target.")


@dataclass
class GenerationResult:
    """One prompt's speculative generation: output ids and acceptance statistics."""

    prompt_len: int
    output_ids: list[int]  # new tokens only (eos included when generated)
    accepted: list[int]  # per iteration: draft tokens accepted (0..B-1); the bonus token is not counted here
    block_size: int
    prefill_s: float
    decode_s: float
    stopped: str  # "eos" | "max_new_tokens"
    # Drafts the last block accepted past the budget or an eos (finish_result cuts them from output_ids and from
    # `accepted`, so tau counts the tokens delivered: 1 + sum(accepted) + iterations == len(output_ids)).
    accepted_past_budget: int = 0
    # Per output token, from the target logits it was chosen from: the TOPK best token ids and their logits, and the
    # logit of the reference's token at that position (generate(reference=...), None past its end). At the first
    # token where two computations differ they give each computation's logits of BOTH candidates (verdicts.py).
    topk_ids: list[list[int]] = field(default_factory=list)
    topk_logits: list[list[float]] = field(default_factory=list)
    ref_logits: list[float | None] = field(default_factory=list)

    @property
    def margins(self) -> list[float]:
        """Per output token: the target's top-1 minus top-2 logit where it chose that token."""
        return [round(v[0] - v[1], 5) if len(v) > 1 else 0.0 for v in self.topk_logits]

    @property
    def runner_up(self) -> list[int]:
        return [i[1] if len(i) > 1 else -1 for i in self.topk_ids]

    @property
    def iterations(self) -> int:
        return len(self.accepted)

    @property
    def tau(self) -> float:
        """Mean accepted + 1 (the bonus token) over iterations; 1 <= tau <= block_size."""
        return (sum(self.accepted) / len(self.accepted) + 1.0) if self.accepted else 1.0

    @property
    def accept_histogram(self) -> list[int]:
        """Iterations by accepted count: entry a = iterations that accepted exactly a draft tokens (a = 0..B-1)."""
        h = [0] * self.block_size
        for a in self.accepted:
            h[a] += 1
        return h

    @property
    def position_acceptance(self) -> list[float]:
        """Per block slot k = 1..B-1: fraction of iterations whose draft at slot k was accepted."""
        n = max(1, len(self.accepted))
        return [sum(a >= k for a in self.accepted) / n for k in range(1, self.block_size)]

    @property
    def total_s(self) -> float:
        return self.prefill_s + self.decode_s

    @property
    def tokens_per_s(self) -> float:
        """Output tokens per second of the whole generation (prefill included)."""
        return len(self.output_ids) / self.total_s if self.total_s > 0 else 0.0

    def to_dict(self) -> dict:
        return {"prompt_len": self.prompt_len, "new_tokens": len(self.output_ids), "iterations": self.iterations,
                "tau": self.tau, "accepted": self.accepted, "accept_histogram": self.accept_histogram,
                "position_acceptance": self.position_acceptance, "prefill_s": self.prefill_s,
                "decode_s": self.decode_s, "tokens_per_s": self.tokens_per_s, "stopped": self.stopped,
                "accepted_past_budget": self.accepted_past_budget}


@dataclass
class DraftCache:
    """Per draft layer: context K and V (b, kvh, T, d) at absolute positions 0..T-1."""

    keys: list = field(default_factory=list)
    values: list = field(default_factory=list)

    @property
    def length(self) -> int:
        return self.keys[0].shape[2] if self.keys else 0


class SpeculativeDecoder:
    """Target + DFlash drafter, batch size 1, with KV caches on both sides.

    `decoder.generate(prompt_ids, max_new_tokens=128, temperature=0.0)` -> GenerationResult.
    `block_size` may be smaller than the drafter's training block (the drafter sees a shorter block); 1 = target only.
    """

    def __init__(self, target, drafter: DFlashDrafter | None, *, block_size: int | None = None,
                 mask_token_id: int | None = None, eos_token_id: int | list[int] | None = None,
                 draft_sampling: str = "argmax"):
        """draft_sampling: at temperature > 0, "argmax" drafts the drafter's top-1; "sample" draws each draft from
        the drafter's distribution, "coupled" draws the block's drafts from one shared uniform (module docstring);
        no effect at temperature 0."""
        if draft_sampling not in DRAFT_SAMPLING:
            raise ValueError(f"draft_sampling={draft_sampling!r} is not one of {list(DRAFT_SAMPLING)}.")
        self.target = target
        self.drafter = drafter
        self.draft_sampling = draft_sampling
        cfg = drafter.config if drafter is not None else None
        if cfg is not None:
            check_compatible(target, cfg)
        self.block_size = block_size or (cfg.block_size if cfg else 1)
        if self.block_size < 1:
            raise ValueError(f"block_size={self.block_size} must be >= 1 (1 = target only).")
        if self.block_size > 1 and drafter is None:
            raise ValueError(f"block_size={self.block_size} needs a drafter; pass one, or use block_size=1 for the "
                             "target-only baseline.")
        self.mask_token_id = mask_token_id if mask_token_id is not None else (cfg.mask_token_id if cfg else None)
        self.layer_ids = cfg.target_layer_ids if cfg else ()
        tc = target_text_config(target)
        self.max_positions = int(getattr(tc, "max_position_embeddings", 1 << 30))
        if eos_token_id is None:
            eos_token_id = getattr(getattr(target, "generation_config", None), "eos_token_id", None)
            if eos_token_id is None:
                eos_token_id = getattr(tc, "eos_token_id", None)
        self.eos_ids = set([eos_token_id] if isinstance(eos_token_id, int) else (eos_token_id or []))
        self.embed = embedding_of(target)
        self.head = lm_head_weight(target)
        # a pruned drafter drafts over its (d, H) rows of the head; d2t maps the argmax back to target ids
        self.draft_head = draft_head(drafter, self.head)[0] if drafter is not None else self.head
        self.target_device = self.embed.weight.device
        self.drafter_device = next(drafter.parameters()).device if drafter is not None else self.target_device
        self.drafter_dtype = next(drafter.parameters()).dtype if drafter is not None else None

    # ---------------------------------------------------------------------------------------------------------
    def check_prompt(self, prompt_len: int, max_new_tokens: int, *, name: str = "prompt") -> None:
        need = prompt_len + max_new_tokens + self.block_size
        room = self.max_positions - max_new_tokens - self.block_size
        if prompt_len < 1:
            raise ValueError(f"{name} is empty (0 tokens). Fix: pass at least one token.")
        if need > self.max_positions:
            raise PromptTooLongError(
                f"{name} has {prompt_len} tokens; with max_new_tokens={max_new_tokens} and block_size="
                f"{self.block_size} it needs {need} positions, but the target's context is {self.max_positions} "
                f"(max_position_embeddings). Fix: shorten the prompt to <= {room} "
                "tokens or lower max_new_tokens.")

    def checked_prompt(self, prompt_ids, max_new_tokens: int, temperature: float) -> torch.Tensor:
        """The prompt as a 1-D long tensor after checking it and the generation settings."""
        check_temperature(temperature)
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={max_new_tokens} must be >= 1.")
        ids = torch.as_tensor(prompt_ids, dtype=torch.long).flatten()
        self.check_prompt(ids.numel(), max_new_tokens)
        return ids

    def _target_forward(self, ids: torch.Tensor, cache):
        out = self.target(input_ids=ids, past_key_values=cache, use_cache=True,
                          output_hidden_states=bool(self.layer_ids))
        feats = None
        if self.layer_ids:
            # DFlash id i = output of decoder layer i = HF hidden_states[i + 1]; no shift.
            feats = torch.cat([out.hidden_states[i + 1] for i in self.layer_ids], dim=-1)  # (1, T, n*H)
        return out.logits[0].float(), feats  # logits (T, V)

    @staticmethod
    def _topk(logits: torch.Tensor) -> tuple[list[list[int]], list[list[float]]]:
        """(top-k ids, their logits) per row of logits (T, V); row i's first id is its greedy token."""
        top = logits.topk(min(TOPK, logits.shape[-1]), dim=-1)
        return top.indices.tolist(), top.values.tolist()

    @staticmethod
    def _ref_logits(logits: torch.Tensor, reference, start: int, rows: int) -> list[float | None]:
        """Logit of reference[start + i] in row i (i < rows) of logits (T, V); None past the reference's end."""
        if reference is None:
            return [None] * rows
        return [float(logits[i, reference[start + i]]) if start + i < len(reference) else None for i in range(rows)]

    def _draft(self, cache: DraftCache, new_feats: torch.Tensor, ctx_start: int, last_token: int,
               p: int) -> list[int]:
        """The B-1 greedy draft tokens of the block [last_token, MASK...] at positions p..p+B-1."""
        hidden = self.draft_hidden(cache, new_feats, ctx_start, last_token, p)[0, 1:]  # (B-1, H)
        logits = hidden.to(self.head.device, self.head.dtype) @ self.draft_head.t()  # slot k predicts pos p + k
        return to_target_ids(self.drafter, logits.argmax(-1)).tolist()

    def _sampled_draft(self, cache: DraftCache, new_feats: torch.Tensor, ctx_start: int, last_token: int, p: int,
                       temperature: float, generator) -> tuple[torch.Tensor, torch.Tensor]:
        """The B-1 drafts (target ids) drawn from the drafter at `temperature` and each slot's proposal (B-1, V) fp32,
        zero outside a pruned draft vocabulary (q_k, or q_k given the drafts before it for coupled draws)."""
        hidden = self.draft_hidden(cache, new_feats, ctx_start, last_token, p)[0, 1:]
        return self.draw_drafts(hidden.to(self.head.device, self.head.dtype) @ self.draft_head.t(), temperature,
                                generator)

    def draw_drafts(self, logits: torch.Tensor, temperature: float, generator) -> tuple[torch.Tensor, torch.Tensor]:
        """_sampled_draft's drafts and proposals, on the device, from the drafter's logits (B-1, Vd) over its draft
        vocabulary (the static decoder computes those in its draft graph and draws here, the same generator stream);
        only coupled draws wait for the device (their drafts come back to the host once)."""
        q_draft = tempered_probs(logits, temperature)
        if self.draft_sampling == "coupled":
            picks, q_draft = coupled_drafts(q_draft, generator)  # q_draft: each slot's proposal given the drafts
            picks = torch.tensor(picks, device=q_draft.device)
        else:  # one draw per slot, independent
            picks = draw_rows(q_draft, host_uniforms(q_draft.shape[0], generator, q_draft.device))
        ids = to_target_ids(self.drafter, torch.arange(q_draft.shape[1], device=q_draft.device))  # draft -> target
        q = q_draft.new_zeros(q_draft.shape[0], self.head.shape[0]).index_copy_(1, ids, q_draft)
        return ids[picks], q

    def accept_sampled(self, logits: torch.Tensor, drafts: torch.Tensor, q: torch.Tensor | None, u: torch.Tensor,
                       temperature: float) -> torch.Tensor:
        """[accepted count, next token] of a block verified at temperature > 0, on the device (accept_block): q the
        drafts' proposals (None: argmax drafts, one-hot), u the block's B uniforms (drawn before the verify)."""
        probs = tempered_probs(logits, temperature)
        if q is None:
            q = probs.new_zeros(drafts.shape[0], probs.shape[1]).scatter_(1, drafts[:, None], 1.0)
        return accept_block(probs, q.to(probs.device), drafts.to(probs.device), u)

    def draft_hidden(self, cache: DraftCache, new_feats: torch.Tensor, ctx_start: int, last_token: int,
                     p: int) -> torch.Tensor:
        """Extend the drafter's context cache with `new_feats` (target features of positions ctx_start..p-1) and
        run the block [last_token, MASK x (B-1)] at positions p..p+B-1; returns normed hidden (1, B, H)."""
        d, B = self.drafter, self.block_size
        dev = self.drafter_device
        ctx = d.fuse_context(new_feats.to(dev, self.drafter_dtype))  # (1, T_new, H)
        ctx_pos = torch.arange(ctx_start, p, device=dev)[None]
        ctx_rope = d.rotary_emb(ctx, ctx_pos)
        block = torch.full((1, B), self.mask_token_id, dtype=torch.long, device=self.target_device)
        block[0, 0] = last_token
        hidden = self.embed(block).to(dev, self.drafter_dtype)  # (1, B, H) frozen target embedding
        blk_pos = torch.arange(p, p + B, device=dev)[None]
        draft_rope = d.rotary_emb(hidden, blk_pos)
        masks = self._block_masks(p, dev)
        first = not cache.keys
        for i, layer in enumerate(d.layers):
            k_new, v_new = layer.self_attn.project_kv(ctx, *ctx_rope)  # (1, kvh, T_new, d)
            if first:
                cache.keys.append(k_new)
                cache.values.append(v_new)
            else:
                cache.keys[i] = torch.cat([cache.keys[i], k_new], dim=2)
                cache.values[i] = torch.cat([cache.values[i], v_new], dim=2)
            hidden = layer(hidden, None, draft_rope, None, masks[layer.mask_key],
                           context_kv=(cache.keys[i], cache.values[i]))
        return d.norm(hidden)

    def _block_masks(self, p: int, dev) -> dict:
        """Block queries see all context < p and the whole block (full attention); sliding layers: context within
        the window, causal inside the block. Dense bool (1, 1, B, p + B)."""
        B = self.block_size
        masks = {"full_attention": torch.ones(1, 1, B, p + B, dtype=torch.bool, device=dev)}
        cfg = self.drafter.config
        for key, window in window_masks(cfg.layer_types, cfg.sliding_window, cfg.layer_windows).items():
            if window is None:
                continue
            q = torch.arange(p, p + B, device=dev)[:, None]
            ctx = (q - torch.arange(p, device=dev)[None]) < window
            own = torch.arange(B, device=dev)[None] <= torch.arange(B, device=dev)[:, None]
            masks[key] = torch.cat([ctx, own], dim=1)[None, None]
        return masks

    # ---------------------------------------------------------------------------------------------------------
    @torch.no_grad()
    def generate(self, prompt_ids, *, max_new_tokens: int = 128, temperature: float = 0.0,
                 generator: torch.Generator | None = None, reference: list[int] | None = None) -> GenerationResult:
        """Speculative generation for one prompt (a list or 1-D tensor of token ids).

        reference: another computation's output for this prompt; the result then records, per output token, this
        computation's logit of the reference's token there (`ref_logits`)."""
        from transformers import DynamicCache

        ids = self.checked_prompt(prompt_ids, max_new_tokens, temperature)
        n = ids.numel()
        B = self.block_size
        sync = torch.cuda.synchronize if self.target_device.type == "cuda" else (lambda: None)

        t0 = time.perf_counter()
        cache = DynamicCache(config=self.target.config)
        logits, feats = self._target_forward(ids[None].to(self.target_device), cache)
        top_ids, top_logits = self._topk(logits[-1:])
        out = [top_ids[0][0] if temperature == 0 else self._pick(logits[-1], temperature, generator)]
        refs = self._ref_logits(logits[-1:], reference, 0, 1)
        sync()
        t1 = time.perf_counter()

        draft_cache = DraftCache()
        pending = feats  # features not yet in the drafter's context cache, positions ctx_len..p-1
        accepted: list[int] = []
        p = n  # position of the last accepted token (out[-1]); the target cache holds positions < p
        done = out[-1] in self.eos_ids
        sampled = self.draft_sampling != "argmax" and temperature > 0
        while len(out) < max_new_tokens and not done:
            last = out[-1]
            q = None
            if B > 1 and sampled:
                drawn, q = self._sampled_draft(draft_cache, pending, draft_cache.length, last, p, temperature,
                                               generator)
                drafts = drawn.tolist()
            else:
                drafts = self._draft(draft_cache, pending, draft_cache.length, last, p) if B > 1 else []
            # the block's acceptance uniforms right after its drafts' draws: the static decoder's order
            u = host_uniforms(B, generator, self.target_device) if temperature > 0 else None
            block = torch.tensor([[last, *drafts]], dtype=torch.long, device=self.target_device)  # (1, B)
            logits, feats = self._target_forward(block, cache)  # logits[i] = next-token dist after block[i]
            ti, tv = self._topk(logits)
            if temperature > 0:
                a, nxt = self.accept_sampled(logits, block[0, 1:], q, u, temperature).tolist()
            else:  # the longest prefix the target's greedy tokens (the top-k's first ids) agree with
                a = 0
                while a < len(drafts) and drafts[a] == ti[a][0]:
                    a += 1
                nxt = ti[a][0]
            accepted.append(a)
            refs += self._ref_logits(logits, reference, len(out), a + 1)
            out.extend(drafts[:a])
            out.append(nxt)
            top_ids += ti[: a + 1]
            top_logits += tv[: a + 1]
            done = any(t in self.eos_ids for t in out[-(a + 1):])
            keep = p + a + 1  # positions 0..p+a are verified; the bonus token is not in the cache yet
            cache.crop(keep - cache.get_seq_length())  # negative = tokens to remove
            pending = feats[:, : a + 1] if feats is not None else None
            p = keep
        sync()
        t2 = time.perf_counter()
        return finish_result(n, out, accepted, B, t1 - t0, t2 - t1, self.eos_ids, max_new_tokens,
                             top_ids, top_logits, refs)

    @staticmethod
    def _pick(logits: torch.Tensor, temperature: float, generator) -> int:
        """The first token after the prompt: greedy at T=0, else drawn from the target at `temperature` (one
        uniform from the generator, as every later token)."""
        if temperature == 0:
            return int(logits.argmax())
        probs = tempered_probs(logits, temperature)[None]
        return int(draw_rows(probs, host_uniforms(1, generator, probs.device))[0])


def finish_result(prompt_len: int, out: list[int], accepted: list[int], block_size: int, prefill_s: float,
                  decode_s: float, eos_ids: set, max_new_tokens: int, topk_ids: list, topk_logits: list,
                  ref_logits: list) -> GenerationResult:
    """Cut the emitted tokens at the first eos and at max_new_tokens (the last block may overshoot both), and the
    accepted counts with them: a block that accepted 6 drafts when 2 tokens of the budget were left counts 1 draft
    + the bonus token, so tau and tokens/s count the same tokens on every decoder (128 new tokens had read as 133
    or 135 on prompts that reached the cap)."""
    stopped = "max_new_tokens"
    for i, t in enumerate(out):
        if t in eos_ids:
            out, stopped = out[: i + 1], "eos"
            break
    out = out[:max_new_tokens]
    n = len(out)
    counted, left = [], n - 1  # the first token comes from the prefill, each iteration gives accepted + 1
    for a in accepted:  # every iteration but the last starts inside the budget, so only the last one is cut
        counted.append(max(0, min(a, left - 1)))
        left -= counted[-1] + 1
    return GenerationResult(prompt_len=prompt_len, output_ids=out, accepted=counted, block_size=block_size,
                            prefill_s=prefill_s, decode_s=decode_s, stopped=stopped,
                            accepted_past_budget=sum(accepted) - sum(counted), topk_ids=topk_ids[:n],
                            topk_logits=[[round(v, 5) for v in row] for row in topk_logits[:n]],
                            ref_logits=[None if v is None else round(v, 5) for v in ref_logits[:n]])
