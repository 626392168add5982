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

# Rows of (rows, vocab) logits made at once: 256 MiB of fp32-sized rows whatever the vocabulary (151,936 ids: 441
# rows); in bf16 the chunk's one buffer (the normaliser works in it in place) takes half that.
LOGITS_BYTES = 2**28


@torch.no_grad()
def top_k_distribution(hidden: torch.Tensor, norm: torch.nn.Module, head_weight: torch.Tensor, *, k: int,
                       temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Last-layer hidden states (b, S, H) -> (ids (b, S, k) int32, log-probabilities (b, S, k) fp32) of the target's
    softmax(logits / temperature), the k most probable ids of each position, most probable first.

    Chunked over positions (static sizes, so a CUDA graph captures it): the full logits never exist at once. The
    logits stay in the head's dtype, as its matmul writes them: a temperature keeps their order, so the top ids are
    those of the raw logits, and selecting among bf16 values takes half the radix passes of fp32 ones, over half the
    bytes (with fp32 selection distillation took a first-epoch batch of 32 x 320 on an H100 from 12 to 27 ms of
    target time with the top 16, to 48 ms with the top 64: growing with k, not the head's ~1 ms matmul). The normaliser
    sums exp((logit - max) / T) in fp32 over those exp terms rounded to bf16: within ~1e-3 of the exact one, and the
    training target renormalises over the top k anyway (drafter/step.soft_row_targets), where it cancels."""
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
        logits = flat[sl] @ head_weight.t()  # (c, V) in the head's dtype
        top, idx = logits.topk(k, dim=-1)  # sorted: top[:, :1] is the row's maximum
        centred = logits.sub_(top[:, :1])  # <= 0, in place: the chunk's one (c, V) buffer
        if temperature != 1.0:
            centred.div_(temperature)
        lse = centred.exp_().sum(-1, keepdim=True, dtype=torch.float32).log_()
        logp[sl] = (top.float() - top[:, :1].float()) / temperature - lse
        ids[sl] = idx.to(torch.int32)
    return ids.view(b, S, k), logp.view(b, S, k)
