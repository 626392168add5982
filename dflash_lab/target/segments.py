"""Document (segment) ids of packed windows -> per-document positions and same-document tests, as static-shape
tensor ops (no host sync, no data-dependent shapes: safe inside a CUDA graph).

A packed window holds several whole conversations; `doc_ids` (b, S) numbers them 0, 1, 2, ... from the left and the
trailing padding gets the next id (its own "document"), so every rule below is uniform. None everywhere means an
unpacked batch (one conversation per row): callers keep today's code path and numbers bit for bit.
"""

from __future__ import annotations

import torch


def document_positions(doc_ids: torch.Tensor) -> torch.Tensor:
    """(b, S) position of each token inside its document: 0 at every document start (RoPE / position ids)."""
    b, S = doc_ids.shape
    t = torch.arange(S, device=doc_ids.device).expand(b, S)
    starts = torch.ones_like(doc_ids, dtype=torch.bool)
    starts[:, 1:] = doc_ids[:, 1:] != doc_ids[:, :-1]
    start_of = torch.where(starts, t, torch.zeros_like(t)).cummax(dim=1).values  # (b, S) first index of the doc
    return t - start_of


def same_document(doc_ids: torch.Tensor, positions: torch.Tensor, others: torch.Tensor) -> torch.Tensor:
    """(b, ...) bool: doc_ids[positions] == doc_ids[others] per row; positions/others (b, ...) long, < S."""
    b = doc_ids.shape[0]
    a = doc_ids.gather(1, positions.reshape(b, -1)).view(positions.shape)
    o = doc_ids.gather(1, others.reshape(b, -1)).view(others.shape)
    return a == o
