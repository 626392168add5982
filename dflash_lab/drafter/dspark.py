"""The DSpark heads beside the DFlash backbone, and the loss their authors train them with.

DSpark (DeepSpec) keeps DFlash's parallel block forward and adds two small heads:
- a Markov head, a low-rank transition: the PREVIOUS token of a slot (target ids) is embedded by `markov_w1`
  (V x r) and projected by `markov_w2` (r -> V_draft) into a bias added to that slot's logits. Training feeds the
  TRUE previous token (teacher forcing: slot k of the block at anchor p reads token[p + k - 1], the anchor itself for
  slot 1); decoding feeds the token just drafted, slot after slot (evaluation/). One batched gather + matmul for all
  slots in training, fused into the chunked LM head so N*B x V_draft logits never exist at once.
- a confidence head, one linear map of the slot's hidden state (the backbone's output AFTER its final norm: the
  hidden the LM head reads, as vLLM's speculator feeds it) and, when `confidence_head_with_markov`, the slot's Markov
  embedding, to one logit: the probability that the slot's draft is accepted, which the engine uses to choose how many
  drafts to verify.

Submodule and parameter names are the ones vLLM's `qwen3_dspark.py` loads (`markov_head.markov_w1.weight`,
`markov_head.markov_w2.weight`, `confidence_head.proj.{weight,bias}`).

The loss (DeepSpec's deepspec/modeling/dspark/loss.py, with its published weights in TrainConfig):
    ce_weight * CE(corrected logits, data token) + l1_weight * ||softmax(corrected) - q||_1
    + confidence_weight * BCE(confidence logit, sum_v min(softmax(corrected)_v, q_v))
every term a mean over the supervised slots under the same decayed slot weights (only each block's contiguous
supervised prefix, as DeepSpec's cumulative eval mask: Variant.prefix_only), q the target's next-token distribution
at that position (with soft labels: its top-k, renormalised; without them the data token stands in for it, exact at
T=0 when the data is the target's own writing). The confidence target is the slot's acceptance probability under
speculative sampling, detached; it is not gated by the earlier slots (the chain's product is taken at decoding).
There is no schedule: the three weights hold from the first step.

Published settings (DeepSpec's config/dspark/*.py, every target): rank 256, confidence head with the Markov
embedding, weights 0.1 / 0.9 / 1.0, slot decay gamma 4, block of 7 drafts, lr 6e-4 with 4% warm-up; its DFlash
baseline drafts the same 7 a block with the CE alone. Their block puts the anchor in the first query slot, which
predicts the next token (7 slots, 7 drafts); ours keeps DFlash's [anchor, MASK x (B - 1)] with slot k predicting
token[p + k], so their 7 drafts are block_size=8 here and a served drafter says so with vLLM's fill-in layout
(`sample_from_anchor: false`). The previous token of slot k is the same token[p + k - 1] in both.
"""

from __future__ import annotations

import torch
from torch import nn

from dflash_lab.config import DrafterConfig
from dflash_lab.config.model_size import confidence_head_inputs


class MarkovHead(nn.Module):
    """markov_w1: Embedding(target vocab, r) of the previous token; markov_w2: Linear(r -> draft vocab, no bias)."""

    def __init__(self, vocab_size: int, draft_vocab_size: int, rank: int):
        super().__init__()
        self.markov_w1 = nn.Embedding(vocab_size, rank)
        self.markov_w2 = nn.Linear(rank, draft_vocab_size, bias=False)


class ConfidenceHead(nn.Module):
    """proj: Linear(hidden [+ r] -> 1, bias); evaluated in fp32 (vLLM keeps this head's parameters in fp32)."""

    def __init__(self, input_dim: int):
        super().__init__()
        self.proj = nn.Linear(input_dim, 1, bias=True)


class DSparkHeads(nn.Module):
    """The Markov head and the (optional) confidence head of a DSpark drafter."""

    def __init__(self, config: DrafterConfig):
        super().__init__()
        self.config = config
        r = config.markov_rank
        v_draft = config.draft_vocab_size or config.vocab_size
        self.markov_head = MarkovHead(config.vocab_size, v_draft, r)
        self.with_markov = bool(config.enable_confidence_head and config.confidence_head_with_markov)
        self.confidence_head = (ConfidenceHead(config.hidden_size + (r if self.with_markov else 0))
                                if config.enable_confidence_head else None)

    @staticmethod
    def activation_bytes(config: DrafterConfig, *, rows: int, chunk_rows: int, dtype_bytes: int) -> int:
        """What the step keeps for the heads beyond the DFlash head's (train/memory_model.py): per supervised row
        the Markov embedding and its gradient (r each) and the confidence head's fp32 input (H, + r when it reads
        the Markov embedding) and logit; markov_w2's fp32 gradient accumulator and its cast; per chunk row the
        epilogue's extra fp32 (c, V_draft) passes (probabilities, the L1 gradient) over the DFlash CE's."""
        r, v_draft = config.markov_rank, config.draft_vocab_size or config.vocab_size
        conf_in = confidence_head_inputs(config)  # 0 without the head
        per_row = 2 * r * dtype_bytes + (4 * (conf_in + 2) if config.enable_confidence_head else 0)
        return rows * per_row + v_draft * r * (4 + dtype_bytes) + chunk_rows * v_draft * 8

    def markov_embed(self, prev_ids: torch.Tensor) -> torch.Tensor:
        """(...) previous tokens, TARGET ids -> (..., r) Markov embeddings."""
        return self.markov_head.markov_w1(prev_ids)

    def markov_bias(self, embed: torch.Tensor) -> torch.Tensor:
        """(..., r) -> (..., V_draft) transition bias added to the slot's draft logits (draft ids)."""
        return self.markov_head.markov_w2(embed.to(self.markov_head.markov_w2.weight.dtype))

    def confidence_logit(self, hidden: torch.Tensor, embed: torch.Tensor | None) -> torch.Tensor:
        """(..., H) backbone output after its final norm (+ (..., r) Markov embedding of the slot's previous token)
        -> (...) pre-sigmoid acceptance logit, fp32."""
        if self.confidence_head is None:
            raise RuntimeError("this DSpark drafter has no confidence head (enable_confidence_head=False). Fix: "
                               "build it with enable_confidence_head=True, or do not ask for a confidence.")
        x = torch.cat([hidden, embed.to(hidden.dtype)], dim=-1) if self.with_markov else hidden
        p = self.confidence_head.proj
        return torch.nn.functional.linear(x.float(), p.weight.float(), p.bias.float()).squeeze(-1)


METRICS = ("markov_ce", "markov_l1", "confidence_bce", "confidence_err", "confidence_acc")
"""The loss terms and statistics dspark_head_loss returns beside the loss, each a decay-weighted sum over the
supervised slots (weights normalised over the global batch, so micro-batches and workers add up to the mean):
markov_ce / markov_l1 the two terms on the Markov-corrected logits, confidence_bce the confidence head's loss,
confidence_err its mean |sigmoid - acceptance|, confidence_acc how often (sigmoid > 0.5) says rightly whether the
slot's greedy draft (teacher-forced) is the data's token."""


def _markov_chunk(z, labels, weights, q_ids, q_p, ce_weight: float, l1_weight: float):
    """One chunk of corrected logits z (c, V) -> (sum w*CE, sum w*L1, argmax, acceptance (c,), grad of z).

    q is a distribution on the ids q_ids (c, k) with probabilities q_p (summing to 1 per row). With p = softmax(z):
    L1 = sum_v |p_v - q_v| = 2 (1 - a), a = sum_v min(p_v, q_v) the acceptance probability of a sampled draft. The
    gradient of a w.r.t. z_j is p_j [p_j < q_j] - p_j * sum_v [p_v < q_v] p_v, a dense term and a (c, k) scatter.
    """
    x = z.float()
    lse = torch.logsumexp(x, dim=-1)
    p = torch.exp(x - lse[:, None])
    ce = lse - x.gather(1, labels[:, None]).squeeze(1)
    pq = p.gather(1, q_ids)
    below = (pq < q_p).float()
    accept = torch.minimum(pq, q_p).sum(-1)
    below_mass = (below * pq).sum(-1)
    onehot = (torch.arange(x.shape[1], device=x.device)[None, :] == labels[:, None]).float()
    grad = (ce_weight * (p - onehot) + (2 * l1_weight) * p * below_mass[:, None]) * weights[:, None]
    grad = grad.scatter_add(1, q_ids, (-2 * l1_weight) * weights[:, None] * below * pq)
    return (ce * weights).sum(), (2 * (1 - accept) * weights).sum(), x.argmax(-1), accept, grad.to(z.dtype)


_compiled_chunk = None


def _chunk_fn(device: torch.device):
    global _compiled_chunk
    if device.type != "cuda":
        return _markov_chunk
    if _compiled_chunk is None:  # a few fused passes over the chunk's logits instead of one per op
        _compiled_chunk = torch.compile(_markov_chunk, dynamic=False)
    return _compiled_chunk


def _chunk_slices(rows: int, chunk_size: int) -> list[slice]:
    n_chunks = max(1, -(-rows // chunk_size))
    size = -(-rows // n_chunks)
    return [slice(start, start + size) for start in range(0, rows, size)]


class MarkovHeadCE(torch.autograd.Function):
    """The LM head and the Markov bias in one chunked pass: logits_i = h_i @ W^T + e_i @ W2^T for rows i in chunks,
    the CE and L1 terms and their gradients computed right there. W (frozen head) gets no gradient; h, e and W2 do.
    Returns (ce_weight * sum w CE + l1_weight * sum w L1, sum w CE, sum w L1, argmax, acceptance)."""

    @staticmethod
    def forward(ctx, hidden, embed, w2, weight, labels, weights, q_ids, q_p, chunk_size: int, ce_weight: float,
                l1_weight: float):
        M = hidden.shape[0]
        grad_h, grad_e = torch.empty_like(hidden), torch.empty_like(embed)
        grad_w2 = torch.zeros(w2.shape, dtype=torch.float32, device=w2.device)
        preds = torch.empty(M, dtype=torch.long, device=hidden.device)
        accept = torch.empty(M, dtype=torch.float32, device=hidden.device)
        ce = l1 = torch.zeros((), dtype=torch.float32, device=hidden.device)
        epilogue = _chunk_fn(hidden.device)
        for sl in _chunk_slices(M, chunk_size):
            # (c, V_draft), the only logits alive at once; the bias added in the second GEMM's epilogue (beta = 1)
            z = torch.addmm(hidden[sl] @ weight.t(), embed[sl].to(hidden.dtype), w2.t().to(hidden.dtype))
            ce_c, l1_c, preds[sl], accept[sl], g = epilogue(z, labels[sl], weights[sl], q_ids[sl], q_p[sl],
                                                            ce_weight, l1_weight)
            ce, l1 = ce + ce_c, l1 + l1_c
            grad_h[sl] = (g.to(weight.dtype) @ weight).to(hidden.dtype)
            g2 = g.to(w2.dtype)
            grad_e[sl] = (g2 @ w2).to(embed.dtype)
            grad_w2 += (g2.t() @ embed[sl].to(w2.dtype)).float()
        ctx.save_for_backward(grad_h, grad_e, grad_w2.to(w2.dtype))
        ctx.mark_non_differentiable(ce, l1, preds, accept)
        return ce_weight * ce + l1_weight * l1, ce, l1, preds, accept

    @staticmethod
    def backward(ctx, grad_loss, *_unused):
        grad_h, grad_e, grad_w2 = ctx.saved_tensors
        return (grad_h * grad_loss.to(grad_h.dtype), grad_e * grad_loss.to(grad_e.dtype),
                grad_w2 * grad_loss.to(grad_w2.dtype), None, None, None, None, None, None, None, None)


def target_distribution(labels: torch.Tensor, rows: tuple | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids (M, k), probabilities (M, k)) of q, the target's next-token distribution per row: the soft labels'
    top-k (step.soft_row_targets, draft ids, renormalised; a row none of whose ids is in the draft vocabulary keeps
    its data token), or without them the data token alone."""
    one = torch.ones(labels.shape[0], 1, dtype=torch.float32, device=labels.device)
    if rows is None:
        return labels[:, None], one
    hard, ids, p = rows  # hard is 0 or 1 per row: dspark reads distill_weight as 1 (TrainConfig refuses others)
    return torch.cat([labels[:, None], ids], 1), torch.cat([hard[:, None].float(), p.float()], 1)


def dspark_head_loss(heads: DSparkHeads, hidden: torch.Tensor, head_weight: torch.Tensor, labels: torch.Tensor,
                     weights: torch.Tensor, prev_ids: torch.Tensor, chunk_size: int, rows: tuple | None,
                     loss_weights) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """DSpark's loss over the supervised rows (module docstring). hidden (M, H) backbone output after its norm;
    labels (M,) draft ids; weights (M,) normalised slot weights (0: no loss); prev_ids (M,) the TRUE previous token
    of each row (target ids: teacher forcing); rows: soft_row_targets or None; loss_weights: the pairs
    (("ce", w), ("l1", w), ("confidence", w)) of LossWeighting.head_terms. Returns (loss, argmax of the corrected logits (M,), METRICS values (len(METRICS),) detached)."""
    loss_weights = dict(loss_weights)
    embed = heads.markov_embed(prev_ids)  # (M, r): one gather for every slot of every block
    q_ids, q_p = target_distribution(labels, rows)
    loss, ce, l1, preds, accept = MarkovHeadCE.apply(hidden, embed, heads.markov_head.markov_w2.weight, head_weight,
                                                     labels, weights, q_ids, q_p, chunk_size,
                                                     float(loss_weights["ce"]), float(loss_weights["l1"]))
    zero = ce.new_zeros(())
    bce = err = acc = zero
    if heads.confidence_head is not None:
        logit = heads.confidence_logit(hidden, embed)  # (M,) fp32; its gradient reaches the backbone, as published
        bce_rows = torch.nn.functional.binary_cross_entropy_with_logits(logit, accept, reduction="none")
        bce = (bce_rows * weights).sum()
        loss = loss + float(loss_weights["confidence"]) * bce
        with torch.no_grad():
            prob = torch.sigmoid(logit)
            err = ((prob - accept).abs() * weights).sum()
            acc = (((prob > 0.5) == (preds == labels)).float() * weights).sum()
    return loss, preds, torch.stack([ce, l1, bce, err, acc]).detach()
