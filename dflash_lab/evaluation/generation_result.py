"""What one speculative generation returns: the tokens, the drafts accepted and verified per block, and how the
budget and eos cut them, so tau, tokens/s and verify counts count the same tokens on every decoder."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


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
    # Per iteration: drafts the target verified (B-1, or fewer where a verify policy chose so); same length as accepted
    verified: list[int] = field(default_factory=list)

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
    def verify_tokens_per_token(self) -> float:
        """Tokens the target verified (the block's first token + its verified drafts) per token the iterations
        emitted: B / tau when every draft is verified."""
        emitted = sum(self.accepted) + len(self.accepted)
        return sum(1 + v for v in self.verified) / emitted if emitted else 0.0

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
                "position_acceptance": self.position_acceptance, "verified": self.verified,
                "verify_tokens_per_token": self.verify_tokens_per_token, "prefill_s": self.prefill_s,
                "decode_s": self.decode_s, "tokens_per_s": self.tokens_per_s, "stopped": self.stopped,
                "accepted_past_budget": self.accepted_past_budget}


@dataclass
class Proposal:
    """One block's drafts: drafts (K,) target ids on the device; q (K, V) fp32 each draft's proposal given the drafts
    before it (None: argmax drafts, one-hot); confidence (K,) the confidence head's acceptance probabilities (None
    without one)."""

    drafts: torch.Tensor
    q: torch.Tensor | None = None
    confidence: torch.Tensor | None = None



def verified_uniforms(u: torch.Tensor | None, k: int) -> torch.Tensor | None:
    """The uniforms of a block whose first k drafts are verified: those of slots 1..k and the emitted token's, out of
    the B drawn for it (the stream advances by B whatever k is, so later blocks draw the same numbers)."""
    return None if u is None else torch.cat([u[:k], u[-1:]])


def finish_result(prompt_len: int, out: list[int], accepted: list[int], block_size: int, prefill_s: float,
                  decode_s: float, eos_ids: set, max_new_tokens: int, topk_ids: list, topk_logits: list,
                  ref_logits: list, verified: list[int] | None = None) -> GenerationResult:
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
                            ref_logits=[None if v is None else round(v, 5) for v in ref_logits[:n]],
                            verified=list(verified if verified is not None else [block_size - 1] * len(accepted))
                            [:len(counted)])
