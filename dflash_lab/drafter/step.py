"""The DFlash loss and one training step as plain functions.

    batch -> target features -> drafter forward -> chunked LM head + decayed CE -> backward -> clip -> AdamW -> stats

The frozen LM head is applied in chunks of `chunk_size` positions with a hand-written autograd function: each chunk's
logits exist only inside the loop, and the gradient w.r.t. the drafter's hidden states ((softmax - onehot) * w) @ W
is computed right there, so the head costs 2x its forward FLOPs and never a (positions x vocab) tensor or a weight
gradient. Only positions that carry loss go through the head.

Distillation (`SoftTargets`, TrainConfig.distill_weight) swaps each row's one-hot label for a mixture with the
target's own top-k distribution at that position; the same chunk loop, plus a (rows, k) scatter into the gradient.

D-PACE (loss_weights.py) needs every slot's CE of a block before it knows any slot's weight: the same chunk loop keeps
per-row CE (M,) and the gradient with the base weights, then scales both rows by the detached D-PACE factors once all
chunks are done (still 2x the head's forward, no second head pass).

A drafter variant with heads (variants.py; DSpark: dspark.py) replaces the chunked CE with its own loss over the same
supervised rows, asked of the variant table, never by name.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .blocks import BlockBatch, attention_masks
from .loss_weights import DECAY, LossWeighting, dpace_weights
from .variants import variant_of
from dflash_lab.target.segments import document_positions


def _ce_chunk(logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor):
    """One chunk's CE epilogue: (sum_i w_i * CE_i, argmax, w * (softmax - onehot) in the logits' dtype).

    logits (c, V) straight from the head matmul; math in fp32. Eager on CPU; on CUDA it is compiled once
    (`_ce_chunk_fn`) into two fused passes over the logits instead of ~10 (logsumexp, gather, argmax, exp, scatter,
    scale, cast each re-read or re-wrote the whole (c, V) fp32 block: ~18 ms per paper-shape step on an H200).
    """
    x = logits.float()
    lse = torch.logsumexp(x, dim=-1)
    target_logit = x.gather(1, labels[:, None]).squeeze(1)
    loss = ((lse - target_logit) * weights).sum()
    preds = x.argmax(-1)
    onehot = torch.arange(x.shape[1], device=x.device)[None, :] == labels[:, None]
    grad_logits = (torch.exp(x - lse[:, None]) - onehot.float()) * weights[:, None]
    return loss, preds, grad_logits.to(logits.dtype)


def _ce_rows_chunk(logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor):
    """D-PACE's epilogue: (per-row CE (c,) fp32, argmax, w * (softmax - onehot)) with the base weights w."""
    x = logits.float()
    lse = torch.logsumexp(x, dim=-1)
    ce = lse - x.gather(1, labels[:, None]).squeeze(1)
    preds = x.argmax(-1)
    onehot = torch.arange(x.shape[1], device=x.device)[None, :] == labels[:, None]
    grad_logits = (torch.exp(x - lse[:, None]) - onehot.float()) * weights[:, None]
    return ce, preds, grad_logits.to(logits.dtype)


def _soft_ce_chunk(logits, labels, weights, hard, soft_ids, soft_p):
    """Distillation's epilogue: per-row CE against the mixture target hard * onehot(y) + sum_k soft_p_k *
    onehot(id_k) (hard + sum_k soft_p_k = 1 per row). Returns (mixture CE (c,), hard CE (c,), argmax,
    w * (softmax - hard * onehot)); the soft part of the gradient, -w * soft_p at the k ids, is added by the caller
    (a (c, k) scatter instead of a second dense (c, V) pass)."""
    x = logits.float()
    lse = torch.logsumexp(x, dim=-1)
    label_logit = x.gather(1, labels[:, None]).squeeze(1)
    mix = lse - hard * label_logit - (soft_p * x.gather(1, soft_ids)).sum(-1)
    preds = x.argmax(-1)
    onehot = torch.arange(x.shape[1], device=x.device)[None, :] == labels[:, None]
    grad_logits = (torch.exp(x - lse[:, None]) - hard[:, None] * onehot.float()) * weights[:, None]
    return mix, lse - label_logit, preds, grad_logits.to(logits.dtype)


_compiled_epilogues: dict = {}


def _ce_chunk_fn(device: torch.device, per_row: bool = False, soft: bool = False):
    fn = _soft_ce_chunk if soft else _ce_rows_chunk if per_row else _ce_chunk
    if device.type != "cuda":
        return fn
    if fn not in _compiled_epilogues:
        _compiled_epilogues[fn] = torch.compile(fn, dynamic=False)
    return _compiled_epilogues[fn]


def _chunk_slices(rows: int, chunk_size: int) -> list[slice]:
    """Equal chunks (at most chunk_size rows): one compiled shape instead of a second one for a short tail."""
    n_chunks = max(1, -(-rows // chunk_size))
    size = -(-rows // n_chunks)
    return [slice(start, start + size) for start in range(0, rows, size)]


class ChunkedHeadCE(torch.autograd.Function):
    """sum_i w_i * CE(h_i @ W^T, y_i) over rows, in chunks; returns (loss, argmax per row, D-PACE factor per row).
    W gets no gradient.

    dpace_alpha None: w are the final weights; the factor output is empty. Otherwise rows are `slots` contiguous
    slots per block (slots 1..B-1, as drafter_loss lays them out) and each row's weight is w_i * f_i with f the
    detached D-PACE weights of its block computed from these very CEs (loss_weights.dpace_weights).
    """

    @staticmethod
    def forward(ctx, hidden, weight, labels, weights, chunk_size: int, dpace_alpha: float | None = None,
                slots: int = 0, soft: tuple | None = None):
        # hidden (M, H) compute dtype; weight (V, H) frozen; labels (M,) long; weights (M,) fp32 (already normalised)
        # soft: (hard (M,), ids (M, k), p (M, k)) of soft_row_targets: the mixture target of distillation
        M = hidden.shape[0]
        grad = torch.empty_like(hidden)
        preds = torch.empty(M, dtype=torch.long, device=hidden.device)
        if soft is not None:
            return ChunkedHeadCE._soft(ctx, hidden, weight, labels, weights, chunk_size, dpace_alpha, slots, soft,
                                       grad, preds)
        if dpace_alpha is not None:
            return ChunkedHeadCE._dpace(ctx, hidden, weight, labels, weights, chunk_size, dpace_alpha, slots,
                                        grad, preds)
        loss = torch.zeros((), dtype=torch.float32, device=hidden.device)
        epilogue = _ce_chunk_fn(hidden.device)
        for sl in _chunk_slices(M, chunk_size):
            logits = hidden[sl] @ weight.t()  # (c, V): the only logits alive at once
            chunk_loss, preds[sl], grad_logits = epilogue(logits, labels[sl], weights[sl])
            loss = loss + chunk_loss
            grad[sl] = (grad_logits.to(weight.dtype) @ weight).to(hidden.dtype)
        factors = weights.new_empty(0)
        ctx.save_for_backward(grad)
        ctx.mark_non_differentiable(preds, factors)
        return loss, preds, factors

    @staticmethod
    def _dpace(ctx, hidden, weight, labels, weights, chunk_size, alpha, slots, grad, preds):
        M = hidden.shape[0]
        ce = torch.empty(M, dtype=torch.float32, device=hidden.device)
        epilogue = _ce_chunk_fn(hidden.device, per_row=True)
        for sl in _chunk_slices(M, chunk_size):
            logits = hidden[sl] @ weight.t()  # (c, V)
            ce[sl], preds[sl], grad_logits = epilogue(logits, labels[sl], weights[sl])
            grad[sl] = (grad_logits.to(weight.dtype) @ weight).to(hidden.dtype)  # base weights only, so far
        # A block's factors need all its slots' CE: only now, after every chunk (rows are contiguous per block).
        has_loss = (weights > 0).view(-1, slots)  # (blocks, B-1)
        factors = dpace_weights(torch.exp(-ce).view(-1, slots), has_loss, alpha).flatten()  # (M,) detached
        loss = (ce * weights * factors).sum()
        grad.mul_(factors[:, None])  # fp32 factor, one rounding into the compute dtype
        ctx.save_for_backward(grad)
        ctx.mark_non_differentiable(preds, factors)
        return loss, preds, factors

    @staticmethod
    def _soft(ctx, hidden, weight, labels, weights, chunk_size, alpha, slots, soft, grad, preds):
        """Distillation, with decay weights (alpha None) or with D-PACE factors; those come from the per-row HARD
        CE, since whether a block survives to a slot is decided by the data's token there."""
        hard, soft_ids, soft_p = soft
        M = hidden.shape[0]
        mix = torch.empty(M, dtype=torch.float32, device=hidden.device)
        ce = torch.empty(M, dtype=torch.float32, device=hidden.device)
        epilogue = _ce_chunk_fn(hidden.device, soft=True)
        for sl in _chunk_slices(M, chunk_size):
            logits = hidden[sl] @ weight.t()  # (c, V)
            mix[sl], ce[sl], preds[sl], grad_logits = epilogue(logits, labels[sl], weights[sl], hard[sl],
                                                               soft_ids[sl], soft_p[sl])
            grad_logits.scatter_add_(1, soft_ids[sl], (-soft_p[sl] * weights[sl, None]).to(grad_logits.dtype))
            grad[sl] = (grad_logits.to(weight.dtype) @ weight).to(hidden.dtype)
        if alpha is None:
            loss, factors = (mix * weights).sum(), weights.new_empty(0)
        else:
            has_loss = (weights > 0).view(-1, slots)
            factors = dpace_weights(torch.exp(-ce).view(-1, slots), has_loss, alpha).flatten()
            loss = (mix * weights * factors).sum()
            grad.mul_(factors[:, None])
        ctx.save_for_backward(grad)
        ctx.mark_non_differentiable(preds, factors)
        return loss, preds, factors

    @staticmethod
    def backward(ctx, grad_loss, _grad_preds, _grad_factors):
        (grad,) = ctx.saved_tensors
        return grad * grad_loss.to(grad.dtype), None, None, None, None, None, None, None


def chunked_head_ce(hidden, weight, labels, weights, chunk_size: int = 4096, soft: tuple | None = None):
    """(loss, argmax per row) with `weights` final (the decay weighting); see ChunkedHeadCE."""
    loss, preds, _ = ChunkedHeadCE.apply(hidden, weight, labels, weights, chunk_size, None, 0, soft)
    return loss, preds


def dpace_head_ce(hidden, weight, labels, weights, chunk_size: int, alpha: float, slots: int,
                  soft: tuple | None = None):
    """(loss, argmax per row, detached D-PACE factor per row): `weights` are the base has_loss / count weights and
    rows are `slots` = B-1 contiguous slots per block; see ChunkedHeadCE."""
    return ChunkedHeadCE.apply(hidden, weight, labels, weights, chunk_size, alpha, slots, soft)


@dataclass
class SoftTargets:
    """Distillation's inputs for one micro-batch: the target's top-k next-token distribution at every window
    position (target/soft_labels.py), where each block starts, and the share of the loss it takes."""

    ids: torch.Tensor  # (b, S, k) int32: position t's most probable next ids (predicting token t + 1)
    logp: torch.Tensor  # (b, S, k) fp32: their log-probabilities at the distillation temperature
    anchors: torch.Tensor  # (b, N) long
    weight: float  # TrainConfig.distill_weight, in (0, 1]


def soft_row_targets(soft: SoftTargets, block_size: int, label_map: torch.Tensor | None = None):
    """Per supervised row (slots 1..B-1 of every block, drafter_loss's order): (hard share (M,), ids (M, k),
    soft shares (M, k)) with hard + sum(soft) = 1. Slot j of the block at anchor p is labelled token p + j, which the
    target's distribution at position p + j - 1 predicts. With a pruned draft vocabulary the target's ids are mapped
    to draft ids and those outside it dropped (the rest renormalised); a row left with none keeps the hard label."""
    b, S, k = soft.ids.shape
    offsets = torch.arange(block_size - 1, device=soft.anchors.device)
    pos = (soft.anchors[:, :, None] + offsets).clamp(max=S - 1).view(b, -1, 1).expand(-1, -1, k)  # padding: w 0
    ids = soft.ids.gather(1, pos).reshape(-1, k).long()
    p = soft.logp.gather(1, pos).reshape(-1, k).exp()
    if label_map is not None:
        ids = label_map[ids]
        p = p * (ids >= 0)
        ids = ids.clamp(min=0)
    mass = p.sum(-1)
    share = soft.weight * (mass > 0).float()
    return 1 - share, ids, p * (share / mass.clamp(min=1e-30))[:, None]


@dataclass
class DraftInputs:
    """Per-device tensors for one drafter forward: block batch + the masks for each layer type."""

    batch: BlockBatch
    masks: dict
    context_position_ids: torch.Tensor  # (b, S); per-conversation positions in packed windows


def build_masks(batch: BlockBatch, *, seq_len: int, backend: str, layer_types: tuple[str, ...],
                sliding_window: int | None, layer_windows: tuple = ()) -> dict:
    """{mask key: mask} for `batch`, one per distinct window (blocks.attention_masks)."""
    return attention_masks(batch.anchors, batch.anchor_valid, seq_len=seq_len, block_size=batch.block_size,
                           backend=backend, layer_types=layer_types, sliding_window=sliding_window,
                           layer_windows=layer_windows, doc_ids=batch.doc_ids)


def context_positions(batch: BlockBatch, seq_len: int, device) -> torch.Tensor:
    """(b, S) positions of the context features: 0..S-1, or restarting per conversation in packed windows."""
    if batch.doc_ids is not None:
        return document_positions(batch.doc_ids.to(device))
    return torch.arange(seq_len, device=device)[None].expand(batch.draft_ids.shape[0], -1)


def _unwrapped(drafter):
    """The DFlashDrafter inside a DDP wrapper (`.module`) or a compiled module (`._orig_mod`), or itself."""
    while hasattr(drafter, "module") or hasattr(drafter, "_orig_mod"):
        drafter = getattr(drafter, "module", None) or drafter._orig_mod
    return drafter


def heads_of(drafter):
    """The variant's heads of a drafter (variants.py), None for DFlash."""
    return getattr(_unwrapped(drafter), "heads", None)


def drafter_config(drafter):
    return _unwrapped(drafter).config


def drafter_loss(drafter, embed: torch.nn.Embedding, head_weight: torch.Tensor, features: torch.Tensor,
                 inputs: DraftInputs, chunk_size: int, weighting: LossWeighting = DECAY,
                 label_map: torch.Tensor | None = None, soft: SoftTargets | None = None) -> tuple[torch.Tensor, dict]:
    """Forward the drafter on all blocks of a micro-batch; returns (loss, raw stats tensors). No sync inside.

    weighting.dpace: the batch's loss_weights are has_loss / a global count and the D-PACE factor is applied inside
    the head's loss (raw stats then carry "dpace_weight" (b, N, B-1), 0 where no loss).
    `label_map` (V,) int64 (draft_vocab.label_map): with a pruned draft vocabulary `head_weight` is the
    (d, H) slice of the target head and labels are mapped to draft ids; a label outside (-1) gets weight 0 and
    counts as wrong. `soft`: distillation (SoftTargets); accuracy and the D-PACE factors stay on the hard labels.
    A drafter with heads (a DSpark drafter, variants.py) takes its variant's loss instead of the DFlash CE: its
    accuracy is that of its own corrected logits (DSpark: WITH the Markov bias of the true previous token), and
    raw["terms"] holds its extra loss terms (variant.metrics, detached; empty for DFlash)."""
    bb = inputs.batch
    b, Q = bb.draft_ids.shape
    with torch.no_grad():
        draft_embeds = embed(bb.draft_ids)  # (b, Q, H) frozen target embedding; MASK is a reserved existing row
    hidden = drafter(features, draft_embeds, bb.position_ids, inputs.context_position_ids, inputs.masks)  # (b, Q, H)
    flat_w = bb.loss_weights.flatten()
    # Only positions with loss go through the head. A fixed-size selection keeps shapes static for CUDA graphs:
    # slot 0 of every block never carries loss, so take slots 1..B-1 of every block.
    B = bb.block_size
    h = hidden.view(b, -1, B, hidden.shape[-1])[:, :, 1:].reshape(-1, hidden.shape[-1])  # (b*N*(B-1), H)
    y = bb.labels.view(b, -1, B)[:, :, 1:].reshape(-1)
    w = flat_w.view(b, -1, B)[:, :, 1:].reshape(-1)
    has_loss = (w > 0).view(b, -1, B - 1)  # before pruning: an unpredictable label still counts (as wrong)
    if label_map is not None:
        # Static shapes: a label outside the draft vocabulary becomes draft id 0 with weight 0, never a dropped row.
        y_draft = label_map[y]
        in_vocab = y_draft >= 0
        y, w = y_draft.clamp(min=0), w * in_vocab
    rows = None if soft is None else soft_row_targets(soft, B, label_map)
    heads = heads_of(drafter)
    terms = h.new_zeros(0, dtype=torch.float32)
    if heads is not None:  # the variant's loss in place of the DFlash CE (variants.py); its accuracy is its own
        if bb.prev_ids is None:
            raise ValueError(f"the {drafter_config(drafter).drafter_variant} heads need each slot's previous token: "
                             "build the batch with blocks.build_block_batch (it fills BlockBatch.prev_ids)")
        prev = bb.prev_ids.view(b, -1, B)[:, :, 1:].reshape(-1)  # the TRUE previous token (teacher forcing)
        loss, preds, terms = variant_of(drafter_config(drafter)).head_loss(
            heads, h, head_weight, y, w, prev, chunk_size, rows, weighting.head_terms)
    elif weighting.dpace:
        loss, preds, factors = dpace_head_ce(h, head_weight, y, w, chunk_size, weighting.alpha, B - 1, rows)
    else:
        loss, preds = chunked_head_ce(h, head_weight, y, w, chunk_size, rows)
    correct = preds == y
    if label_map is not None:
        correct = correct & in_vocab
    correct = correct.view(b, -1, B - 1)  # (b, N, B-1)
    raw = {"correct": correct, "has_loss": has_loss, "terms": terms}
    if weighting.dpace:
        raw["dpace_weight"] = factors.view(b, -1, B - 1)
    return loss, raw


def block_stats(correct: torch.Tensor, has_loss: torch.Tensor) -> dict:
    """Per-slot accuracy and simulated acceptance length from (b, N, B-1) correctness of supervised slots.

    Simulated tau = 1 + sum_k prod_{j<=k} acc_j with acc_j the accuracy of slot j over the blocks that supervise
    it (dflash-method.md). Training accuracy is NOT acceptance: only real speculative decoding is trusted.
    (docs/tau-gap.md) This used to be the mean over blocks of 1 + leading slots right, which overstates
    serving's tau once the drafter is good: serving starts a block where the previous one failed, a uniform anchor
    anywhere. Tiny target, 600 steps, B=8, held-out text: real tau 3.67, replayed decoding 3.66, per-block mean 5.75,
    this formula 4.35 (early in training, 200 steps: real 1.91, mean 1.97, this 2.00). The exact replay needs every
    anchor, so validation.py computes it on held-out data (`val_chain_tau`) beside real tau.
    """
    c = (correct & has_loss).flatten(0, 1).float()  # (blocks, B-1)
    h = has_loss.flatten(0, 1).float()
    per_slot_acc = c.sum(0) / h.sum(0).clamp(min=1)  # a slot no block supervises counts 0: the product stops there
    # No host sync (no boolean indexing, no `if tensor`): the engine reads these after the step, asynchronously.
    sim_tau = 1 + torch.cumprod(per_slot_acc, dim=0).sum()
    return {"slot_acc": per_slot_acc, "sim_tau": sim_tau, "acc": c.sum() / h.sum().clamp(min=1)}


def forward_backward(drafter, embed: torch.nn.Embedding, head_weight: torch.Tensor, features: torch.Tensor,
                     inputs: DraftInputs, chunk_size: int, weighting: LossWeighting = DECAY,
                     label_map: torch.Tensor | None = None,
                     soft: SoftTargets | None = None) -> tuple[torch.Tensor, ...]:
    """The differentiable half of a step: loss, backward (gradients accumulate into .grad), raw stats tensors
    (loss, correct (b, N, B-1), has_loss (b, N, B-1), the variant's terms (len(variant.metrics),)). This is what a
    CUDA graph captures (workers.py)."""
    loss, raw = drafter_loss(drafter, embed, head_weight, features, inputs, chunk_size, weighting, label_map, soft)
    loss.backward()
    return loss.detach(), raw["correct"], raw["has_loss"], raw["terms"]


def train_step(drafter, optimizer, embed: torch.nn.Embedding, head_weight: torch.Tensor, features: torch.Tensor,
               inputs: DraftInputs, *, lr: float, grad_clip: float, chunk_size: int,
               weighting: LossWeighting = DECAY, label_map: torch.Tensor | None = None,
               soft: SoftTargets | None = None) -> dict:
    """One optimizer step: zero grads -> forward + loss + backward -> clip + AdamW. The step a torchrun rank runs
    (DDP/FSDP2 sum the gradients inside backward). The threaded engine runs the same two halves with its own
    cross-replica gradient sum between them: `forward_backward` (captured in a CUDA graph) on every worker, then
    the sum, then `optimizer.step` on every worker.

    Returns tensors {loss, grad_norm, correct, has_loss, terms} and the terms' names; reading the tensors (.item())
    syncs the device.
    """
    optimizer.zero_grad()
    loss, correct, has_loss, terms = forward_backward(drafter, embed, head_weight, features, inputs, chunk_size,
                                                      weighting, label_map, soft)
    grad_norm = optimizer.step(lr, grad_clip)
    return {"loss": loss, "grad_norm": grad_norm, "correct": correct, "has_loss": has_loss, "terms": terms,
            "term_names": variant_of(drafter_config(drafter)).metrics}
