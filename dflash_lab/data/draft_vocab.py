"""Draft-vocabulary pruning: the drafter predicts only the d most frequent supervised target tokens.

    python -m dflash_lab.benchmarks.vocab_head        # CPU time of the head + CE: full vocabulary vs pruned

The drafter has no LM head of its own: its logits are the frozen target head applied to its hidden states, which
costs 2 x (rows x V x H) FLOPs per step (forward + input gradient, step.ChunkedHeadCE). With a draft vocabulary of
d ids the head is a frozen (d, H) copy of the target head's rows for those ids: d / V of the head's FLOPs and
memory traffic (SmolLM2: V = 49152; d = 8192 is 1/6). The price: a label outside the draft vocabulary cannot be
predicted. It carries no loss (its weight is zeroed, the other weights keep their global normalisation, so the loss
is scaled by the weighted coverage) but it counts as WRONG in accuracy and simulated tau: the metrics show what the
pruning costs. Shapes never change (labels outside map to draft id 0 with weight 0), so CUDA graphs still apply.

The vocabulary is built from the TRAINING data's supervised (loss-mask) tokens after tokenisation: counts -> top d
ids (ties broken by the lower id, deterministic) -> sorted. MASK is not added: it is an input (block slots 1..B-1
are embedded as MASK), never a label, so the head never needs it.

Storage follows EAGLE-3 / speculators (checked in their sources, 2026-12): a buffer `d2t` of d int64 OFFSETS,
target_id = draft_id + d2t[draft_id] (SpecForge/EAGLE build it as `used_tokens[i] - i`; vLLM maps drafted ids the
same way), and `draft_vocab_size` in config.json. They also keep a boolean `t2d` (V,) buffer; we derive it from d2t
instead of storing it (`DraftVocab.in_vocab`). The export also writes the reduced (d, H) `lm_head.weight` =
target_head[arange(d) + d2t], as speculators' DFlash saves it: the head vLLM reads (evaluation/serving_engines.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from dflash_lab.config.errors import ConfigError
from dflash_lab.config.feature_checks import check_draft_vocab_size


@dataclass(frozen=True)
class DraftVocab:
    """The draft vocabulary: target ids (d,) ascending, and how much of the supervised training data it covers."""

    target_ids: torch.Tensor  # (d,) int64, sorted ascending: draft id i <-> target id target_ids[i]
    vocab_size: int  # the target's vocabulary V
    coverage: float  # fraction of supervised training tokens inside the draft vocabulary
    supervised_tokens: int

    @property
    def size(self) -> int:
        return int(self.target_ids.numel())

    @property
    def d2t(self) -> torch.Tensor:
        """(d,) int64 offsets, the EAGLE-3 / speculators convention: target id = draft id + d2t[draft id]."""
        return self.target_ids - torch.arange(self.size, dtype=torch.long)

    @property
    def in_vocab(self) -> torch.Tensor:
        """(V,) bool: EAGLE-3's `t2d`."""
        return label_map(self.target_ids, self.vocab_size) >= 0

    def report(self) -> dict:
        return {"draft_vocab_size": self.size, "target_vocab_size": self.vocab_size,
                "coverage": round(self.coverage, 6), "supervised_tokens": self.supervised_tokens}


def target_ids_of(d2t: torch.Tensor) -> torch.Tensor:
    """d2t offsets (d,) -> absolute target ids (d,)."""
    return d2t.long() + torch.arange(d2t.numel(), dtype=torch.long, device=d2t.device)


def label_map(target_ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """(V,) int64: target id -> draft id, -1 for a target id outside the draft vocabulary."""
    m = torch.full((vocab_size,), -1, dtype=torch.long, device=target_ids.device)
    m[target_ids.long()] = torch.arange(target_ids.numel(), dtype=torch.long, device=target_ids.device)
    return m


def count_supervised(input_ids: torch.Tensor, loss_mask: torch.Tensor, vocab_size: int, *, rows_per_chunk: int = 4096,
                     log=None, progress_every_s: float = 10.0) -> torch.Tensor:
    """(V,) int64 counts of the supervised (loss-mask) tokens; progress through `log` when it takes a while."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    n, t0, last = input_ids.shape[0], time.monotonic(), time.monotonic()
    for start in range(0, n, rows_per_chunk):
        ids = input_ids[start:start + rows_per_chunk].long()
        counts += torch.bincount(ids[loss_mask[start:start + rows_per_chunk].bool()], minlength=vocab_size)
        now = time.monotonic()
        if log is not None and now - last >= progress_every_s:
            log(f"draft vocab: counted {min(n, start + rows_per_chunk)}/{n} sequences ({now - t0:.0f} s)")
            last = now
    return counts


def top_ids(counts: torch.Tensor, d: int) -> torch.Tensor:
    """The d ids with the highest counts, ties broken by the lower id; returned sorted ascending."""
    # A stable descending sort keeps equal counts in id order, so the cut at d is deterministic.
    order = torch.sort(counts, descending=True, stable=True).indices
    return torch.sort(order[:d]).values


def build_draft_vocab(input_ids: torch.Tensor, loss_mask: torch.Tensor, *, size: int, vocab_size: int,
                      log=None) -> DraftVocab:
    """Top-`size` supervised target ids of the training data (TokenizedData.input_ids / loss_mask)."""
    check_draft_vocab_size(size, vocab_size)
    counts = count_supervised(input_ids, loss_mask, vocab_size, log=log)
    ids = top_ids(counts, size)
    total = int(counts.sum())
    covered = int(counts[ids].sum())
    return DraftVocab(target_ids=ids, vocab_size=vocab_size, coverage=covered / max(total, 1),
                      supervised_tokens=total)


def set_draft_vocab(drafter: torch.nn.Module, vocab: DraftVocab | None) -> None:
    """Write `vocab` into the drafter's `d2t` buffer (the drafter's config says whether it has one)."""
    if (drafter.config.draft_vocab_size is None) != (vocab is None) or (
            vocab is not None and vocab.size != drafter.config.draft_vocab_size):
        raise ValueError(f"draft vocabulary of {None if vocab is None else vocab.size} ids for a drafter configured "
                         f"with draft_vocab_size={drafter.config.draft_vocab_size}. Fix: build both from the same "
                         "TrainConfig (prepare_run does).")
    if vocab is not None:
        with torch.no_grad():
            drafter.d2t.copy_(vocab.d2t.to(drafter.d2t.device))


def draft_head(drafter: torch.nn.Module, head_weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(head, label_map) the drafter's logits use: the target head and None for a full-vocabulary drafter; the
    frozen (d, H) rows of its draft vocabulary and the (V,) target -> draft id map for a pruned one."""
    if drafter.config.draft_vocab_size is None:
        return head_weight, None
    ids = target_ids_of(drafter.d2t).to(head_weight.device)
    return head_weight.detach()[ids].contiguous(), label_map(ids, head_weight.shape[0])


def to_target_ids(drafter: torch.nn.Module, draft_ids: torch.Tensor) -> torch.Tensor:
    """Drafted ids (argmax over the draft head) -> target ids; unchanged for a full-vocabulary drafter."""
    if drafter.config.draft_vocab_size is None:
        return draft_ids
    d2t = drafter.d2t.to(draft_ids.device)
    return draft_ids + d2t[draft_ids]


def check_same_vocab(checkpoint_d2t: torch.Tensor | None, vocab: DraftVocab | None, where) -> None:
    """A resume must keep the draft vocabulary: the checkpoint's d2t equals the one rebuilt from the data."""
    if checkpoint_d2t is None and vocab is None:
        return
    if checkpoint_d2t is None or vocab is None or not torch.equal(checkpoint_d2t.long().cpu(), vocab.d2t):
        raise ConfigError(
            f"cannot resume from {where}: its draft vocabulary (d2t of "
            f"{None if checkpoint_d2t is None else checkpoint_d2t.numel()} ids) differs from the one built from the "
            f"data now ({None if vocab is None else vocab.size} ids). Fix: resume with the data and draft_vocab_size "
            "the run was trained with, or start a fresh run.")
