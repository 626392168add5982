"""A DSpark block drafted slot after slot, as vLLM's and SGLang's DSpark speculators draft it: the backbone's logits
of every slot come from ONE parallel pass, then each slot adds its Markov head's bias for the token drafted just
before it and draws its own draft, which seeds the next slot's bias.

    slot 1:  logits_1 + markov_bias(markov_embed(anchor))     -> draft 1    (anchor: the block's first token, the
    slot 2:  logits_2 + markov_bias(markov_embed(draft 1))    -> draft 2     last token the target emitted)
    ...

The previous token is embedded in TARGET ids (markov_w1 has a row per target id), the bias is over the DRAFT
vocabulary, so a pruned drafter's draws pass through d2t before they seed the next slot (vLLM's
`map_draft_to_target` runs before `prev = draft`). At temperature 0 a slot takes the argmax of its biased logits; at
T > 0 it draws from their softmax at T, one uniform per slot from the caller's stream (acceptance.draw_rows), and
that biased distribution, given the drafts before it, is exactly the proposal speculative sampling must verify the
draft against. `topk` is vLLM's `dspark_draft_topk`: candidates are the top-k of each slot's BASE logits, chosen
once for the block; only they get the bias, every other id is -inf, so the draw (and its proposal) is over those k.

Everything stays on the logits' device with no host read (argmax, gather, searchsorted), so the static decoder runs
the chain inside its CUDA graph as the engines do; K is the block's draft count, a Python constant per graph.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from dflash_lab.target.sampling import tempered_probs

from .acceptance import draw_rows


@dataclass
class MarkovBlock:
    """One drafted block: drafts (K,) target ids; logits (K, V_draft) each slot's biased logits, the ones it was
    drawn from (-inf outside the top-k candidates when topk is set); embeds (K, r) the Markov embedding each slot
    read, of the token before it (the confidence head reads it too)."""

    drafts: torch.Tensor
    logits: torch.Tensor
    embeds: torch.Tensor


def markov_block(heads, base_logits: torch.Tensor, anchor: torch.Tensor, to_target: Callable, *,
                 temperature: float = 0.0, uniforms: torch.Tensor | None = None,
                 topk: int | None = None) -> MarkovBlock:
    """Draft K slots in order from the backbone's logits base_logits (K, V_draft).

    heads: a DSparkHeads (markov_embed, markov_bias, markov_head.markov_w2); anchor (1,) long, the target id before
    slot 1; to_target maps draft ids to target ids (identity for a full vocabulary); temperature 0 drafts argmax,
    > 0 draws with uniforms (K,) in [0, 1); topk: bias and draw only each slot's top-k base candidates."""
    K = base_logits.shape[0]
    if temperature > 0 and (uniforms is None or uniforms.shape[0] < K):
        got = None if uniforms is None else uniforms.shape[0]
        raise ValueError(f"drawing {K} slots at temperature {temperature} needs {K} uniforms; got {got}. Fix: pass "
                         "acceptance.host_uniforms(K, ...).")
    if topk is not None:
        values, candidates = base_logits.topk(topk, dim=-1)  # (K, k), once for the block, as vLLM selects them
        w2 = heads.markov_head.markov_w2.weight  # (V_draft, r)
    prev = anchor.reshape(1).long()
    drafts, rows, embeds = [], [], []
    for k in range(K):
        embed = heads.markov_embed(prev)  # (1, r): the token drafted just before this slot
        if topk is None:
            row = base_logits[k:k + 1] + heads.markov_bias(embed).to(base_logits.dtype)  # (1, V_draft)
        else:  # bias only the candidates: (k, r) rows of w2 against the embedding, scattered into -inf
            bias = (w2[candidates[k]] @ embed[0].to(w2.dtype)).to(base_logits.dtype)  # (k,)
            row = torch.full_like(base_logits[k:k + 1], float("-inf")).scatter_(1, candidates[k:k + 1],
                                                                                (values[k] + bias)[None])
        if temperature > 0:
            pick = draw_rows(tempered_probs(row, temperature), uniforms[k:k + 1])
        else:
            pick = row.argmax(-1)
        prev = to_target(pick)  # (1,) target id: the next slot's previous token
        drafts.append(prev)
        rows.append(row)
        embeds.append(embed)
    return MarkovBlock(torch.cat(drafts), torch.cat(rows), torch.cat(embeds))


def slot_confidence(heads, hidden: torch.Tensor, embeds: torch.Tensor) -> torch.Tensor | None:
    """(K,) fp32 acceptance probability of each drafted slot from the confidence head (sigmoid of its logit), or None
    for a drafter without one. hidden (K, H): the backbone's output after its final norm at the slots (the rows the
    LM head reads, as vLLM's speculator feeds the head); embeds (K, r): MarkovBlock.embeds."""
    if heads.confidence_head is None:
        return None
    return torch.sigmoid(heads.confidence_logit(hidden, embeds))
