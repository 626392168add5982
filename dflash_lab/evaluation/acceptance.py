"""The acceptance rules of speculative sampling at T > 0: which drafted tokens the target keeps, and what it emits
at the first rejection, so that the emitted tokens are distributed exactly as the target's own samples.

Three drafts are verified (DRAFT_SAMPLING): the drafter's argmax (deterministic, q one-hot: a draft is kept with
the target's probability of it), a draft drawn from the drafter's own distribution q at the serving temperature,
each slot independently (kept with probability min(1, p/q), up to 1 where q matches the target), and the block's
drafts drawn from q with one shared uniform (coupled_drafts: verified against each slot's proposal given the drafts
before it). The decoders (dynamic and static) verify a block with accept_block and draw tokens with draw_rows, on
the device with uniforms drawn on the host from the caller's generator (one host read per block, the same tokens on
every device); the sampling ceiling's oracle verifies slot by slot (speculative_accept, accept_drawn) with the same
rule. The lossless tests of these functions cover every decoder.
"""

from __future__ import annotations

import torch

from dflash_lab.target.device_time import to_device_async

DRAFT_SAMPLING = ("argmax", "sample", "coupled")


def host_uniforms(n: int, generator: torch.Generator | None, device) -> torch.Tensor:
    """n uniforms in [0, 1) (float64) from the caller's generator, on `device`: drawn where the generator lives, so
    a seeded decode takes the same tokens on every device, and sent over without waiting for the device."""
    where = generator.device if generator is not None else "cpu"
    return to_device_async(torch.rand(n, generator=generator, dtype=torch.float64, device=where), device)


def draw_rows(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """One token per row of probs (R, V) by inverse CDF: the token whose interval of the row's cumulative sum holds
    u (R,) in [0, 1) scaled to the row's total, on probs' device with no host sync (u drawn on the host from the
    decoder's generator, so every decoder and device takes the same tokens). Ids of zero probability have empty
    intervals and are never drawn."""
    cdf = probs.double().cumsum(-1)
    at = (u.to(cdf.device, torch.float64) * cdf[:, -1]).unsqueeze(-1)
    return torch.searchsorted(cdf, at, right=True).squeeze(-1).clamp_(max=probs.shape[-1] - 1)


def accept_block(probs: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Speculative sampling of a whole verified block at once, on probs' device with no host sync: the tensor
    [accepted count, next token].

    probs: (K + 1, V) the target's probabilities at each block slot; q: (K, V) each draft's proposal (the row it
    was drawn from given the drafts before it; one-hot at the draft for argmax drafts); drafts: (K,) target ids;
    u: (K + 1,) uniforms in [0, 1): u[k] tests slot k, u[K] draws the emitted token. Draft x_k is kept while
    u[k] q_k(x_k) < p_k(x_k) (u < p / q without dividing); at the first rejection k the token is drawn from
    max(0, p_k - q_k) normalised, after every draft from p_K (the bonus token). The emitted tokens are distributed
    exactly as the target's own samples; a slot is kept with probability sum_x min(p_k, q_k). One uniform per slot
    is drawn whether or not the slot is reached, so the host's generator advances by K + 1 per block."""
    K = drafts.shape[0]
    slots = torch.arange(K, device=probs.device)
    kept = u[:K].to(probs.device, torch.float64) * q[slots, drafts].double() < probs[slots, drafts].double()
    a = kept.long().cumprod(0).sum()  # the leading kept drafts
    at = a.view(1)  # a 0-dim index would read `a` on the host: index_select keeps it on the device
    q_next = torch.cat([q.float(), q.new_zeros(1, q.shape[1], dtype=torch.float32)]).index_select(0, at)
    p_next = probs.float().index_select(0, at)
    residual = (p_next - q_next).clamp_(min=0.0)
    # p <= q everywhere means p == q, where every draft is kept; rounding guard: draw from p
    residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, p_next)
    return torch.stack([a, draw_rows(residual, u[K:K + 1])[0]])


def accept_drawn(p: torch.Tensor, q_k: torch.Tensor, x: int, generator: torch.Generator | None = None) -> int | None:
    """One slot of accept_block's rule for a drafter verified slot by slot (the sampling ceiling's oracle): None
    when draft x (drawn from q_k) is kept, else the token emitted instead, drawn from max(0, p - q_k) normalised."""
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
    the drawn token. Pass the returned (K, V) proposals to accept_block. Computed on q's device, with
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
