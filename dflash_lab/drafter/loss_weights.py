"""Which loss weighting a run uses (decay or D-PACE), its global normaliser, and the D-PACE closed form.

"decay" (the paper): slot k >= 1 of a block weighs exp(-(k-1)/gamma); the loss is normalised by the sum of those
raw weights over the GLOBAL batch (blocks.raw_weight_total).

"dpace" (D-PACE, arXiv 2605.18810): a slot's weight is the expected number of accepted tokens it takes part in,
estimated from the drafter's own probabilities. With q_i = exp(-CE_i) the probability of the label at supervised slot
i = 1..B-1 and q~_i = (1 - alpha) * q_i + alpha,

    w_j = sum_{m >= j} prod_{i <= m} q~_i      (suffix sums of the prefix products)

A slot without loss (past the sequence end, not an assistant token, invalid anchor) has q~ = 0: its weight is 0 AND
it ends the chain, so every later slot of that block weighs 0 too (a drafted token after a hole is never accepted).
The weights are detached: the loss is sum_j w_j * CE_j with w treated as a constant.

Normalisation is by a GLOBAL count fixed on the host before the batch is split over workers, never by the sum of the
D-PACE weights (it would cancel their credit mass: SpecForge#828) and never by a rank-local count (DDP-averaged
updates would then depend on how examples fall across ranks: NeMo Automodel PR 2572):
  "valid_anchors"  the number of valid anchors in the global batch (varies per step, like raw_weight_total);
  "anchor_budget"  batch_size * num_anchors (a constant).
The static per-row `loss_weights` buffer holds has_loss / count, so CUDA-graph capture is unchanged; the D-PACE factor
multiplies it on the device inside the loss (step.ChunkedHeadCE).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .blocks import BlockBatch, build_block_batch, raw_weight_total
from .variants import variant_of
from dflash_lab.config.feature_checks import LOSS_NORMALIZERS, LOSS_WEIGHTINGS  # noqa: F401 (re-exported)
from dflash_lab.config.field_types import field_default
from dflash_lab.config.train_config import DSPARK_LOSS_TERMS, TrainConfig



@dataclass(frozen=True)
class LossWeighting:
    """The loss weighting of a run, passed from the config to every place that builds batches or computes the loss."""

    mode: str = "decay"
    alpha: float = 0.5
    normalizer: str = "valid_anchors"
    head_terms: tuple[tuple[str, float], ...] = tuple((term, field_default(TrainConfig, name))
                                                      for term, name in DSPARK_LOSS_TERMS)
    """A variant's loss-term weights (drafter/dspark.py: TrainConfig.dspark_*_weight; their defaults, DeepSpec's)."""
    prefix_only: bool = False
    """Supervise only each block's contiguous supervised prefix (a variant's rule: DSpark's, variants.py)."""

    @property
    def dpace(self) -> bool:
        return self.mode == "dpace"


DECAY = LossWeighting()


def loss_weighting_of(cfg) -> LossWeighting:
    """The LossWeighting of a TrainConfig (its fields loss_weighting, dpace_alpha, loss_normalizer)."""
    return LossWeighting(cfg.loss_weighting, cfg.dpace_alpha, cfg.loss_normalizer,
                         tuple((term, getattr(cfg, name)) for term, name in DSPARK_LOSS_TERMS),
                         variant_of(cfg).prefix_only)


def dpace_weights(q: torch.Tensor, has_loss: torch.Tensor, alpha: float) -> torch.Tensor:
    """D-PACE weights (..., B-1) from per-slot label probabilities q (..., B-1); 0 where has_loss is False.

    w_j = sum_{m >= j} prod_{i <= m} q~_i with q~ = (1 - alpha) * q + alpha on supervised slots and 0 elsewhere.
    Computed without gradient (callers pass detached values; the result is a constant for the loss).
    """
    with torch.no_grad():
        q_s = torch.where(has_loss, (1 - alpha) * q.float() + alpha, torch.zeros_like(q, dtype=torch.float32))
        prefix = torch.cumprod(q_s, dim=-1)  # (..., B-1) prod_{i <= m} q~_i
        return prefix.flip(-1).cumsum(-1).flip(-1)  # suffix sums


def normalizer_total(weighting: LossWeighting, anchor_valid: torch.Tensor) -> float:
    """D-PACE's global loss normaliser for a (b, N) global batch: a count, never a sum of weights."""
    if weighting.normalizer == "anchor_budget":
        return float(anchor_valid.numel())  # batch_size * num_anchors
    return float(anchor_valid.sum())  # valid anchors in the GLOBAL batch


def global_block_batch(input_ids: torch.Tensor, loss_mask: torch.Tensor, anchors: torch.Tensor,
                       anchor_valid: torch.Tensor, *, block_size: int, mask_token_id: int, gamma: float,
                       weighting: LossWeighting = DECAY, doc_ids: torch.Tensor | None = None) -> BlockBatch:
    """build_block_batch for a GLOBAL batch, normalised as `weighting` says (before any split over workers).

    decay: raw decay weights / their global sum. dpace: has_loss / the global count (the D-PACE factor is applied
    on the device inside the loss).
    """
    kw = dict(block_size=block_size, mask_token_id=mask_token_id, gamma=gamma, doc_ids=doc_ids,
              prefix_only=weighting.prefix_only)
    if weighting.dpace:
        return build_block_batch(input_ids, loss_mask, anchors, anchor_valid, **kw,
                                 weight_total=normalizer_total(weighting, anchor_valid), decay=False)
    total = raw_weight_total(loss_mask, anchors, anchor_valid, block_size=block_size, gamma=gamma, doc_ids=doc_ids,
                             prefix_only=weighting.prefix_only)
    return build_block_batch(input_ids, loss_mask, anchors, anchor_valid, **kw, weight_total=total)
