"""The acceptance rules of speculative sampling at T > 0: which drafted tokens the target keeps, and what it emits
at the first rejection, so that the emitted tokens are distributed exactly as the target's own samples.

Three drafts are verified (DRAFT_SAMPLING): the drafter's argmax (deterministic, q one-hot: a draft is kept with
the target's probability of it), a draft drawn from the drafter's own distribution q at the serving temperature,
each slot independently (kept with probability min(1, p/q), up to 1 where q matches the target), and the block's
drafts drawn from q with one shared uniform (coupled_drafts: verified against each slot's proposal given the drafts
before it). Every decoder (dynamic, static, the sampling ceiling) calls these functions, so the lossless tests of
them cover every decoder.
"""

from __future__ import annotations

import torch

DRAFT_SAMPLING = ("argmax", "sample", "coupled")


def speculative_accept_sampled(probs: torch.Tensor, q: torch.Tensor, drafts: list[int],
                               generator: torch.Generator | None = None) -> tuple[int, int]:
    """Speculative sampling for drafts DRAWN from proposals q (len(drafts), V): row k is the distribution x_k was
    drawn from given the drafts before it (q_k itself for independent draws, coupled_drafts' rows for coupled ones).

    probs: (len(drafts) + 1, V) target probabilities at each block slot. Draft x_k is accepted with probability
    min(1, p_k(x_k) / q_k(x_k)); on the first rejection the next token is sampled from max(0, p_k - q_k)
    normalised. If every draft is accepted, the bonus token is sampled from the last row. The emitted tokens are
    distributed exactly as the target's own samples. Returns (accepted count, next token).
    """
    for k, x in enumerate(drafts):
        rejected = accept_drawn(probs[k], q[k], x, generator)
        if rejected is not None:
            return k, rejected
    return len(drafts), int(torch.multinomial(probs[len(drafts)], 1, generator=generator))


def accept_drawn(p: torch.Tensor, q_k: torch.Tensor, x: int, generator: torch.Generator | None = None) -> int | None:
    """One slot of speculative_accept_sampled: None when draft x (drawn from q_k) is kept, else the token emitted
    instead, drawn from max(0, p - q_k) normalised. For decoders that verify a block slot by slot."""
    u = torch.rand((), generator=generator)
    if u * q_k[x] < p[x]:  # u < p / q without dividing (q[x] > 0: x was drawn from q_k)
        return None
    residual = (p - q_k).clamp_(min=0.0)
    total = residual.sum()
    if total <= 0:  # p <= q everywhere means p == q, where every draft is accepted; rounding guard
        return int(torch.multinomial(p, 1, generator=generator))
    return int(torch.multinomial(residual / total, 1, generator=generator))


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


def coupled_drafts(q: torch.Tensor, generator: torch.Generator | None = None) -> tuple[list[int], torch.Tensor]:
    """Drafts for all slots from ONE uniform u, and each slot's proposal given the drafts before it.

    q: (K, V) the drafter's per-slot distributions, each drafted from MASK inputs, so independent draws from them
    are rarely one continuation. Here every slot lays its tokens on [0, 1) in descending order of q_k and takes the
    token whose interval holds the same u: where slot 1 takes its top token, the later slots lean to theirs, as an
    argmax block would, and each slot's marginal is still q_k. Speculative sampling needs the proposal of slot k
    GIVEN the drafts before it: knowing them says only that u lies in the intersection I of their intervals, so
    that proposal is q~_k(x) = |I ∩ J_k(x)| / |I| (J_k(x): x's interval at slot k), which is exact and positive at
    the drawn token. Pass the returned (K, V) proposals to speculative_accept_sampled. Computed on q's device, with
    no per-slot host syncs: only the drafts come back to the host, once.
    """
    order = q.argsort(dim=-1, descending=True, stable=True)  # ties in id order, as coupled_slot orders them
    hi_edge = q.gather(-1, order).double().cumsum(-1)
    hi_edge = hi_edge / hi_edge[:, -1:]  # the last edge exactly 1, so every u in [0, 1) falls in some interval
    lo_edge = torch.cat([torch.zeros_like(hi_edge[:, :1]), hi_edge[:, :-1]], dim=1)
    u = torch.rand((), generator=generator, dtype=torch.float64)  # on the generator's (host) device
    # every slot takes the token whose interval holds the same u: one search over all slots at once
    at_u = torch.full_like(hi_edge[:, :1], float(u))
    r = torch.searchsorted(hi_edge, at_u, right=True).clamp_(max=q.shape[1] - 1)  # (K, 1)
    # I_{k-1} = [lo, hi): where the drafts before slot k leave u, all of [0, 1) before slot 0
    lo = torch.cat([torch.zeros_like(at_u[:1]), lo_edge.gather(1, r)]).cummax(0).values[:-1]
    hi = torch.cat([torch.ones_like(at_u[:1]), hi_edge.gather(1, r)]).cummin(0).values[:-1]
    width = hi_edge.clamp_(max=hi).sub_(lo_edge.clamp_(min=lo)).clamp_(min=0.0).div_(hi - lo)  # |I ∩ J_k(x)| / |I|
    proposals = torch.zeros(q.shape, dtype=torch.float32, device=q.device).scatter_(1, order, width.float())
    return order.gather(1, r)[:, 0].tolist(), proposals


def coupled_slot(q_k: torch.Tensor, u: float, lo: float = 0.0, hi: float = 1.0
                 ) -> tuple[int, torch.Tensor, float, float]:
    """One slot of coupled_drafts, for a drafter whose slots come one at a time (the sampling ceiling's oracle drafts
    slot k only once slot k-1 was kept): (the token whose interval of q_k holds u, its proposal given the drafts
    before it, which left u in [lo, hi), and the interval left after this draft). Iterated over the rows of q from
    (lo, hi) = (0, 1) with coupled_drafts' u, it gives coupled_drafts' drafts and proposals bit for bit."""
    order = q_k.argsort(descending=True, stable=True)
    hi_edge = q_k[order].double().cumsum(0)
    hi_edge = hi_edge / hi_edge[-1:]
    lo_edge = torch.cat([torch.zeros_like(hi_edge[:1]), hi_edge[:-1]])
    width = (hi_edge.clamp(max=hi) - lo_edge.clamp(min=lo)).clamp_(min=0.0) / (hi - lo)
    proposal = torch.zeros(q_k.shape, dtype=torch.float32, device=q_k.device).scatter_(0, order, width.float())
    r = min(int(torch.searchsorted(hi_edge, torch.full_like(hi_edge[:1], u), right=True)), q_k.numel() - 1)
    return int(order[r]), proposal, max(lo, float(lo_edge[r])), min(hi, float(hi_edge[r]))
