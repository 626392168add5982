"""Fixed-shape global batches as a pure function of the step: the data's epoch permutation, anchors sampled per step
from a generator seeded with (seed, step), and the block batch built from them with globally normalised loss weights.
Resuming at step k therefore reproduces the batch of step k exactly. Each epoch uses len(data) // batch_size full
batches; the up to batch_size - 1 left-over samples differ from epoch to epoch."""

from __future__ import annotations

import torch

from dflash_lab.data.chat_formats import DataError
from dflash_lab.data.tokenize import TokenizedData

from .blocks import sample_anchors
from .loss_weights import DECAY, LossWeighting, global_block_batch


class BatchSampler:
    """Fixed-shape global batches as a pure function of the step: epoch permutation + per-step anchors."""

    def __init__(self, data: TokenizedData, *, batch_size: int, num_anchors: int, block_size: int,
                 mask_token_id: int, gamma: float, seed: int, weighting: LossWeighting = DECAY):
        if len(data) < batch_size:
            raise DataError(f"only {len(data)} samples survived filtering, fewer than batch_size={batch_size}. "
                            "Fix: lower batch_size, or add data (see the data report for what was dropped).")
        self.data = data
        self.batch_size, self.num_anchors, self.block_size = batch_size, num_anchors, block_size
        self.mask_token_id, self.gamma, self.seed = mask_token_id, gamma, seed
        self.weighting = weighting  # how the global batch's loss weights are normalised (loss_weights.py)
        self.steps_per_epoch = len(data) // batch_size
        self._perm_epoch, self._perm = -1, None

    def position(self, step: int) -> tuple[int, int]:
        """(epoch, batch index within the epoch) of a global step."""
        return divmod(step, self.steps_per_epoch)

    def epoch_order(self, epoch: int) -> torch.Tensor:
        """The seeded permutation of sample indices for one epoch."""
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        return torch.randperm(len(self.data), generator=g)

    def indices(self, step: int) -> torch.Tensor:
        epoch, i = self.position(step)
        if epoch != self._perm_epoch:
            self._perm, self._perm_epoch = self.epoch_order(epoch), epoch
        return self._perm[i * self.batch_size:(i + 1) * self.batch_size]

    def batch(self, step: int):
        """The BlockBatch of a global step (CPU tensors). Loss weights are normalised over this whole batch."""
        idx = self.indices(step)
        ids, mask = self.data.input_ids[idx].long(), self.data.loss_mask[idx]
        docs = None if self.data.doc_ids is None else self.data.doc_ids[idx].long()  # packed rows only
        g = torch.Generator().manual_seed(self.seed * 7_919 + step * 104_729 + 1)
        anchors, valid = sample_anchors(mask, self.num_anchors, g, doc_ids=docs)
        return global_block_batch(ids, mask, anchors, valid, block_size=self.block_size,
                                  mask_token_id=self.mask_token_id, gamma=self.gamma, weighting=self.weighting,
                                  doc_ids=docs)
