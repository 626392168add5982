"""The static caches of fast decoding: a positioned KV cache read over a live prefix, its length buckets, masks.

Shared by static_decode.py (batch 1, one CUDA graph per iteration) and batched_decode.py (several prompts at once).
"""

from __future__ import annotations

import torch

from dflash_lab.drafter.model import DFlashDrafter
from dflash_lab.target.static_cache import static_cache_problem

MIN_BUCKET = 256  # shortest attention length: below it a kernel's cost no longer depends on the length


class PositionedKVCache:
    """Per target layer a static K and V (1, kvh, L, d), written at the positions of the current forward and read
    over the live prefix [0, live).

    Implements the one method Hugging Face attention layers call on a cache: update(k, v, layer_idx) -> (K, V)."""

    def __init__(self, n_layers: int, kv_heads: int, length: int, head_dim: int, dtype, device):
        shape = (1, kv_heads, length, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.positions: torch.Tensor | None = None  # (T,) long: where this forward's K/V go
        self.live = length  # keys returned: positions [0, live)

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        self.keys[layer_idx].index_copy_(2, self.positions, key_states)
        self.values[layer_idx].index_copy_(2, self.positions, value_states)
        return self.keys[layer_idx][:, :, :self.live], self.values[layer_idx][:, :, :self.live]


def buckets_for(length: int, shortest: int = MIN_BUCKET) -> list[int]:
    """Attention lengths for caches of `length` positions: `shortest` doubled while shorter, then the length."""
    out, b = [], shortest
    while b < length:
        out.append(b)
        b *= 2
    return out + [length]


def static_path_problem(target, drafter: DFlashDrafter | None) -> str | None:
    """Why the static/graph path cannot run this target (None if it can)."""
    problem = static_cache_problem(target)
    if problem:
        return problem
    if drafter is not None and next(drafter.parameters()).device != next(target.parameters()).device:
        return "the drafter and the target are on different devices (one graph spans one device)"
    return None
