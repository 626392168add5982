"""The acceptance rules of speculative sampling at T > 0: which drafted tokens the target keeps, and what it emits
at the first rejection, so that the emitted tokens are distributed exactly as the target's own samples.

Two drafts are verified: the drafter's argmax (deterministic, q one-hot: a draft is kept with the target's
probability of it) and a draft drawn from the drafter's own distribution q at the serving temperature (kept with
probability min(1, p/q), up to 1 where q matches the target). Every decoder (dynamic, static, the sampling
ceiling) calls these two functions, so one lossless test covers them all.
"""

from __future__ import annotations

import torch


def speculative_accept_sampled(probs: torch.Tensor, q: torch.Tensor, drafts: list[int],
                               generator: torch.Generator | None = None) -> tuple[int, int]:
    """Speculative sampling for drafts DRAWN from the drafter's distributions q (len(drafts), V), one per slot.

    probs: (len(drafts) + 1, V) target probabilities at each block slot. Draft x_k is accepted with probability
    min(1, p_k(x_k) / q_k(x_k)); on the first rejection the next token is sampled from max(0, p_k - q_k)
    normalised. If every draft is accepted, the bonus token is sampled from the last row. The emitted tokens are
    distributed exactly as the target's own samples. Returns (accepted count, next token).
    """
    for k, x in enumerate(drafts):
        p, qk = probs[k], q[k]
        u = torch.rand((), generator=generator)
        if u * qk[x] < p[x]:  # u < p / q without dividing (q[x] > 0: x was drawn from q_k)
            continue
        residual = (p - qk).clamp_(min=0.0)
        total = residual.sum()
        if total <= 0:  # p <= q everywhere means p == q, where every draft is accepted; rounding guard
            return k, int(torch.multinomial(p, 1, generator=generator))
        return k, int(torch.multinomial(residual / total, 1, generator=generator))
    return len(drafts), int(torch.multinomial(probs[len(drafts)], 1, generator=generator))


def speculative_accept(probs: torch.Tensor, drafts: list[int], generator: torch.Generator | None = None
                       ) -> tuple[int, int]:
    """Speculative sampling for a DETERMINISTIC draft (the drafter's q is one-hot at each draft token).

    probs: (len(drafts) + 1, V) target probabilities at each block slot. Draft x_k is accepted with probability
    min(1, p(x_k) / q(x_k)) = p(x_k); on the first rejection the next token is sampled from the residual
    max(0, p - q) normalised = p with x_k removed. If every draft is accepted, the bonus token is sampled from the
    last row. The emitted tokens are then distributed exactly as the target's own samples.
    Returns (accepted count, next token).
    """
    for k, x in enumerate(drafts):
        p = probs[k]
        u = torch.rand((), generator=generator)
        if u < p[x]:
            continue
        residual = p.clone()
        residual[x] = 0.0
        total = residual.sum()
        if total <= 0:  # p is one-hot at x but u >= 1 cannot happen; keep the guard for rounding
            return k, x
        return k, int(torch.multinomial(residual / total, 1, generator=generator))
    return len(drafts), int(torch.multinomial(probs[len(drafts)], 1, generator=generator))
