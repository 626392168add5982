"""The target's own next-token distribution at every position of a window, kept as its top-k: what distillation
trains the drafter towards (TrainConfig.distill_weight).

Hard labels train for T=0 serving, where a drafted token is accepted when it equals the target's argmax. When the
server samples, a draft token x is accepted with probability min(1, p(x) / q(x)), so the expected acceptance of a
position is sum_x min(p(x), q(x)): it rewards a drafter whose whole distribution q matches the target's p at the
serving temperature. The frozen target runs over every training window anyway (feature extraction), so its final
norm and LM head cost one matmul more per window; a window's top-k (ids and log-probabilities, 8 bytes per id) is
kept beside its features in the feature store, so a run pays it once per window.

Position t's distribution predicts token t + 1, i.e. the drafter's label of a block slot at position t + 1.
"""

from __future__ import annotations

import torch

# Rows of (rows, vocab) fp32 logits made at once: ~256 MiB whatever the vocabulary (151,936 ids: 441 rows).
LOGITS_BYTES = 2**28


@torch.no_grad()
def top_k_distribution(hidden: torch.Tensor, norm: torch.nn.Module, head_weight: torch.Tensor, *, k: int,
                       temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Last-layer hidden states (b, S, H) -> (ids (b, S, k) int32, log-probabilities (b, S, k) fp32) of the target's
    softmax(logits / temperature), the k most probable ids of each position, most probable first.

    Chunked over positions (static sizes, so a CUDA graph captures it): the full logits never exist at once."""
    b, S, H = hidden.shape
    V = head_weight.shape[0]
    if k > V:
        raise ValueError(f"distill_top_k={k} is larger than the target's vocabulary ({V} ids). Fix: use "
                         f"distill_top_k <= {V}, e.g. 16.")
    flat = norm(hidden).reshape(b * S, H)
    ids = torch.empty(b * S, k, dtype=torch.int32, device=hidden.device)
    logp = torch.empty(b * S, k, dtype=torch.float32, device=hidden.device)
    rows = max(1, LOGITS_BYTES // (4 * V))
    for start in range(0, b * S, rows):
        sl = slice(start, min(start + rows, b * S))
        logits = (flat[sl] @ head_weight.t()).float() / temperature  # (c, V)
        top, idx = logits.topk(k, dim=-1)
        logp[sl] = top - torch.logsumexp(logits, dim=-1, keepdim=True)
        ids[sl] = idx.to(torch.int32)
    return ids.view(b, S, k), logp.view(b, S, k)
