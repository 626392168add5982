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

A drafter with a Markov head (DSpark, drafter/dspark.py) drafts its block slot after slot from the same one pass
(markov_draft.py: each slot's logits plus the bias of the token drafted before it, the engines' top-k candidate
option as `draft_topk`); its sampled drafts are drawn from those biased rows, which are their proposals given the
drafts before ("coupled" draws do not apply: its slots are not independent). With a confidence head, a
`verify_policy` (verify_budget.py) chooses how many of the drafts the target verifies, as the engines' adaptive
verification does; `GenerationResult.verified` records the count per block.
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
from .generation_result import GenerationResult, Proposal, finish_result, verified_uniforms  # noqa: F401 (public)
from .markov_draft import markov_block, slot_confidence
from .verify_budget import VerifyPolicy


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


def check_variant_options(drafter, heads, draft_sampling: str, draft_topk: int | None,
                          verify_policy: VerifyPolicy | None) -> None:
    """Raise ValueError when a decoding option asks for a head the drafter does not have, naming the fix."""
    markov = heads is not None and hasattr(heads, "markov_head")
    if draft_topk is not None:
        v_draft = drafter.config.draft_vocab_size or drafter.config.vocab_size if drafter is not None else 0
        if not markov:
            raise ValueError(f"draft_topk={draft_topk} biases the top-k candidates of a Markov head, and this drafter "
                             "has none. Fix: leave draft_topk unset, or decode a DSpark drafter.")
        if not 1 <= draft_topk <= v_draft:
            raise ValueError(f"draft_topk={draft_topk} must lie in [1, {v_draft}] (the draft vocabulary).")
    if markov and draft_sampling == "coupled":
        raise ValueError("draft_sampling='coupled' draws independent slots from one uniform; a Markov-head drafter's "
                         "slots depend on the drafts before them. Fix: use draft_sampling='sample' (SGLang's default "
                         "DSpark drafts, vLLM's draft_sample_method 'probabilistic') or 'argmax' (vLLM's default).")
    if verify_policy is not None and getattr(heads, "confidence_head", None) is None:
        raise ValueError("verify_policy chooses the verified drafts from a confidence head, and this drafter has "
                         "none. Fix: leave verify_policy unset, or decode a drafter trained with "
                         "enable_confidence_head=True.")


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
                 draft_sampling: str = "argmax", draft_topk: int | None = None,
                 verify_policy: VerifyPolicy | None = None):
        """draft_sampling: at temperature > 0, "argmax" drafts the drafter's top-1; "sample" draws each draft from
        the drafter's distribution, "coupled" draws the block's drafts from one shared uniform (module docstring);
        no effect at temperature 0. draft_topk (Markov-head drafters): bias and draw only each slot's top-k base
        candidates (vLLM's dspark_draft_topk). verify_policy (drafters with a confidence head): how many drafts the
        target verifies per block."""
        if draft_sampling not in DRAFT_SAMPLING:
            raise ValueError(f"draft_sampling={draft_sampling!r} is not one of {list(DRAFT_SAMPLING)}.")
        self.target = target
        self.drafter = drafter
        self.draft_sampling = draft_sampling
        self.heads = drafter.heads if drafter is not None else None  # the variant's heads (None: DFlash)
        self.draft_topk = draft_topk
        self.verify_policy = verify_policy
        check_variant_options(drafter, self.heads, draft_sampling, draft_topk, verify_policy)
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
        return self._propose(cache, new_feats, ctx_start, last_token, p, 0.0, None).drafts.tolist()

    def _propose(self, cache: DraftCache, new_feats: torch.Tensor, ctx_start: int, last_token: int, p: int,
                 temperature: float, generator) -> Proposal:
        """The block [last_token, MASK...] at positions p..p+B-1 drafted: its B-1 drafts, their proposals (drawn
        drafts) and confidences (propose)."""
        hidden = self.draft_hidden(cache, new_feats, ctx_start, last_token, p)[0, 1:]  # (B-1, H)
        logits = hidden.to(self.head.device, self.head.dtype) @ self.draft_head.t()  # slot k predicts pos p + k
        anchor = torch.tensor([last_token], device=logits.device)
        return self.propose(logits, hidden, anchor, temperature, generator)

    def propose(self, logits: torch.Tensor, hidden: torch.Tensor, anchor: torch.Tensor, temperature: float,
                generator) -> Proposal:
        """A block's drafts from the drafter's logits (K, V_draft) over its draft vocabulary and the hidden rows
        (K, H) they came from (both decoders call this; the static one inside its CUDA graph for argmax drafts):
        argmax drafts, or at T > 0 with draft_sampling "sample" / "coupled" drafts drawn from the caller's stream
        (draw_drafts); a Markov head drafts slot after slot from `anchor` (1,), the block's first token
        (markov_draft.py), and a confidence head scores each slot. No host read but coupled draws."""
        sampled = temperature > 0 and self.draft_sampling != "argmax"
        if self.heads is None:
            if sampled:
                return Proposal(*self.draw_drafts(logits, temperature, generator))
            return Proposal(to_target_ids(self.drafter, logits.argmax(-1)))
        u = host_uniforms(logits.shape[0], generator, logits.device) if sampled else None  # one per slot, as above
        block = markov_block(self.heads, logits, anchor, lambda ids: to_target_ids(self.drafter, ids),
                             temperature=temperature if sampled else 0.0, uniforms=u, topk=self.draft_topk)
        q = self.target_proposals(tempered_probs(block.logits, temperature)) if sampled else None
        return Proposal(block.drafts, q, slot_confidence(self.heads, hidden.to(self.drafter_dtype), block.embeds))

    def target_proposals(self, q_draft: torch.Tensor) -> torch.Tensor:
        """Proposals over the draft vocabulary (K, V_draft) -> over the target's (K, V), zero outside a pruned
        draft vocabulary."""
        ids = to_target_ids(self.drafter, torch.arange(q_draft.shape[1], device=q_draft.device))  # draft -> target
        return q_draft.new_zeros(q_draft.shape[0], self.head.shape[0]).index_copy_(1, ids, q_draft)

    def draw_drafts(self, logits: torch.Tensor, temperature: float, generator) -> tuple[torch.Tensor, torch.Tensor]:
        """Drafts drawn from slots drafted independently (no Markov head) and their proposals, on the device, from the
        drafter's logits (B-1, Vd) over its draft vocabulary (the static decoder computes those in its draft graph
        and draws here, the same generator stream); only coupled draws wait for the device (their drafts come back
        to the host once)."""
        q_draft = tempered_probs(logits, temperature)
        if self.draft_sampling == "coupled":
            picks, q_draft = coupled_drafts(q_draft, generator)  # q_draft: each slot's proposal given the drafts
            picks = torch.tensor(picks, device=q_draft.device)
        else:  # one draw per slot, independent
            picks = draw_rows(q_draft, host_uniforms(q_draft.shape[0], generator, q_draft.device))
        return to_target_ids(self.drafter, picks), self.target_proposals(q_draft)

    def accept_sampled(self, logits: torch.Tensor, drafts: torch.Tensor, q: torch.Tensor | None, u: torch.Tensor,
                       temperature: float) -> torch.Tensor:
        """[accepted count, next token] of a block verified at temperature > 0, on the device (accept_block): q the
        drafts' proposals (None: argmax drafts, one-hot; rows past the verified drafts are dropped), u the uniforms
        of the verified slots and the emitted token (verified_uniforms)."""
        probs = tempered_probs(logits, temperature)
        if q is None:
            q = probs.new_zeros(drafts.shape[0], probs.shape[1]).scatter_(1, drafts[:, None], 1.0)
        return accept_block(probs, q[:drafts.shape[0]].to(probs.device), drafts.to(probs.device), u)

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
        verified: list[int] = []
        p = n  # position of the last accepted token (out[-1]); the target cache holds positions < p
        done = out[-1] in self.eos_ids
        confidence = [1.0] * (B - 1)  # a new request's, as vLLM starts one: every draft is expected to survive
        while len(out) < max_new_tokens and not done:
            last = out[-1]
            prop = (self._propose(draft_cache, pending, draft_cache.length, last, p, temperature, generator) if B > 1
                    else Proposal(torch.zeros(0, dtype=torch.long)))
            drafts = prop.drafts.tolist()
            k, confidence = self.drafts_to_verify(prop.confidence, confidence, len(drafts))
            verified.append(k)
            # the block's acceptance uniforms right after its drafts' draws: the static decoder's order
            u = host_uniforms(B, generator, self.target_device) if temperature > 0 else None
            block = torch.tensor([[last, *drafts[:k]]], dtype=torch.long, device=self.target_device)  # (1, 1 + k)
            logits, feats = self._target_forward(block, cache)  # logits[i] = next-token dist after block[i]
            ti, tv = self._topk(logits)
            drafts = drafts[:k]
            if temperature > 0:
                a, nxt = self.accept_sampled(logits, block[0, 1:], prop.q, verified_uniforms(u, k),
                                             temperature).tolist()
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
                             top_ids, top_logits, refs, verified)

    def drafts_to_verify(self, confidence: torch.Tensor | list[float] | None, previous: list[float],
                         drafts: int) -> tuple[int, list[float]]:
        """(drafts the target verifies in this block, the confidences the next block's choice may read): every
        draft without a verify policy, else the policy's count from this block's confidences or, with lag 1, the
        previous block's (`previous`)."""
        if self.verify_policy is None or confidence is None:
            return drafts, previous
        # one host read of K floats (the dynamic loop reads the drafts anyway; the static one passes a list)
        current = confidence.tolist() if isinstance(confidence, torch.Tensor) else list(confidence)
        seen = current if self.verify_policy.lag == 0 else previous
        return self.verify_policy.drafts_to_verify(seen, drafts), current

    @staticmethod
    def _pick(logits: torch.Tensor, temperature: float, generator) -> int:
        """The first token after the prompt: greedy at T=0, else drawn from the target at `temperature` (one
        uniform from the generator, as every later token)."""
        if temperature == 0:
            return int(logits.argmax())
        probs = tempered_probs(logits, temperature)[None]
        return int(draw_rows(probs, host_uniforms(1, generator, probs.device))[0])
