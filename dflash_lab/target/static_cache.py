"""Static KV caches over the target's own decoder layers: one row per sequence, each row written at its own positions.

    keys / values per layer   (rows, kv_heads, length, head_dim)   allocated once, never resized while running

The one cache of the project: the generation engine (generate.py) and the evaluator's fast decoders
(evaluation/static_decode.py at batch 1, evaluation/batched_decode.py with many rows) all drive the target's layers
over it. The caller says where the next forward writes before running the layers, which call
`update(k, v, layer_idx)` as on any Hugging Face Cache. Three ways:
- prefill(rows): new prompts for a set of rows, right-padded to T tokens at positions 0..T-1. Their K/V go to those
  rows at 0..T-1 and the attention sees only the prompt itself (causal), so a refilled row never reads its previous
  occupant. Pad positions hold garbage until decoding overwrites them in order: a row at position p writes p and
  reads <= p. (Generation engine.)
- decode(rows, pos, span): one token per row for rows 0..B-1, row r at position pos[r]. The attention reads only the
  first `span` positions (the live length bucket, views of the same storage), not the whole cache: a 2,048-position
  cache holding 200-token rows would otherwise read 10x the bytes per step. (Generation engine.)
- at(positions, live, rows): T tokens per row at `positions` (T,) for every row, or (R', T) with one line per row of
  `rows`; the attention reads the live prefix [0, live) of those rows, and the caller's mask says which of it each
  token sees. (The evaluator's decoders: a verify block, a prompt.)

Buckets keep the number of distinct shapes (and CUDA graphs) small: `length_ladder` (four steps per doubling) for
the engine's attention spans, `doubling_ladder` for its batch sizes and the evaluator's attention lengths;
`move_rows` packs live rows to the front so the tail of a run decodes at a smaller batch bucket.

`static_cache_problem` says whether a target's own decoder layers can be driven over a static cache at all, and
`additive` turns a visibility mask into the additive one eager attention takes.
"""

from __future__ import annotations

import torch

from .features import decoder_of

BATCH_FLOOR = 8  # the engine's smallest batch bucket
MIN_SPAN = 256  # the evaluator's shortest attention length: below it a kernel's cost no longer depends on the length


def static_cache_problem(model) -> str | None:
    """Why the target's own decoder layers cannot be driven over a static KV cache (None if they can): the
    generation engine and the evaluator's fast decoders both do it, with full attention by position."""
    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    if "sliding_attention" in (getattr(cfg, "layer_types", None) or ()) and getattr(cfg, "use_sliding_window", True):
        return "the target has sliding-window layers (static caches here implement full attention only)"
    impl = getattr(model.config, "_attn_implementation", "sdpa")
    if impl not in ("sdpa", "eager"):
        return f"the target's attention implementation is {impl!r} (static caches here run sdpa or eager)"
    if not hasattr(decoder_of(model), "rotary_emb"):
        return "the target's decoder has no rotary_emb"
    return None


def additive(visible: torch.Tensor, dtype) -> torch.Tensor:
    """Bool visibility -> an additive mask (0 where visible, the dtype's minimum elsewhere), for eager attention."""
    return torch.zeros(visible.shape, dtype=dtype, device=visible.device).masked_fill(~visible, torch.finfo(dtype).min)


def length_ladder(cap: int, floor: int = 64) -> list[int]:
    """Length buckets up to `cap`: 64, 80, 96, 112, 128, 160, ... (four steps per doubling: <= 25% of the bytes an
    attention reads are past the longest row), ending with `cap` itself."""
    out, base = [], floor
    while base < cap:
        out += [base * k // 4 for k in (4, 5, 6, 7) if base * k // 4 < cap]
        base *= 2
    return out + [cap]


def doubling_ladder(cap: int, floor: int) -> list[int]:
    """Buckets up to `cap`: floor, 2 floor, 4 floor, ... while below it, ending with `cap` itself (the engine's batch
    sizes from BATCH_FLOOR, the evaluator's attention lengths from MIN_SPAN)."""
    out, b = [], floor
    while b < cap:
        out.append(b)
        b *= 2
    return out + [cap]


def bucket(ladder: list[int], need: int) -> int:
    """The smallest bucket >= need (the last one if none is)."""
    return next((b for b in ladder if b >= need), ladder[-1])


def write_rows(keys, values, k, v, rows, positions, live):
    """Write k/v (R', kvh, T, d) into keys/values (R, kvh, L, d) at rows x positions (R', T), rows None meaning
    every row; return the live K/V [0, live) of those rows."""
    r = torch.arange(keys.shape[0], device=keys.device) if rows is None else rows
    keys[r[:, None], :, positions] = k.transpose(1, 2)  # (R', T, kvh, d) at [row, :, position]
    values[r[:, None], :, positions] = v.transpose(1, 2)
    if rows is None:
        return keys[:, :, :live], values[:, :, :live]
    return keys[rows, :, :live], values[rows, :, :live]


class RowKVCache:
    """Per target layer a static K and V (rows, kvh, length, d); see the module docstring for the three ways a
    forward writes into it.

    Implements the one method Hugging Face attention layers call on a cache: update(k, v, layer_idx) -> (K, V)."""

    def __init__(self, n_layers: int, kv_heads: int, rows: int, length: int, head_dim: int, dtype, device):
        shape = (rows, kv_heads, length, head_dim)
        self.rows, self.length = rows, length
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self._mode = ""
        self._rows: torch.Tensor | None = None  # prefill: (n,); decode: (B,) 0..B-1; at: (R',) or None (every row)
        self._pos: torch.Tensor | None = None  # decode: (B,); at: (T,) or (R', T)
        self._span = 0  # decode: span; at: live

    @property
    def nbytes(self) -> int:
        return 2 * sum(k.numel() * k.element_size() for k in self.keys)

    def prefill(self, rows: torch.Tensor) -> None:
        """The next forward writes prompts (n, T) into `rows` at positions 0..T-1 and attends to them only."""
        self._mode, self._rows = "prefill", rows

    def decode(self, rows: torch.Tensor, pos: torch.Tensor, span: int) -> None:
        """The next forward writes one token per row of `rows` (0..B-1) at `pos` and attends to positions < span."""
        self._mode, self._rows, self._pos, self._span = "decode", rows, pos, span

    def at(self, positions: torch.Tensor, live: int, rows: torch.Tensor | None = None) -> None:
        """The next forward writes its T tokens at `positions` ((T,) for every row alike, (R', T) one line per row of
        `rows`, None = every row) and attends to the live prefix [0, live) of those rows."""
        self._mode, self._rows, self._pos, self._span = "at", rows, positions, live

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        k_all, v_all = self.keys[layer_idx], self.values[layer_idx]
        if self._mode == "prefill":
            T = key_states.shape[2]
            k_all[self._rows, :, :T] = key_states  # (n, kvh, T, d)
            v_all[self._rows, :, :T] = value_states
            return key_states, value_states
        if self._mode == "decode":
            B, span = self._rows.numel(), self._span
            # advanced indices on dims 0 and 2 around a slice: the selection is (B, kvh, d), one entry per row
            k_all[self._rows, :, self._pos] = key_states[:, :, 0]
            v_all[self._rows, :, self._pos] = value_states[:, :, 0]
            return k_all[:B, :, :span], v_all[:B, :, :span]
        if self._mode == "at":
            if self._pos.dim() == 1 and self._rows is None:  # every row at the same positions: a plain index copy
                k_all.index_copy_(2, self._pos, key_states)
                v_all.index_copy_(2, self._pos, value_states)
                return k_all[:, :, :self._span], v_all[:, :, :self._span]
            return write_rows(k_all, v_all, key_states, value_states, self._rows, self._pos, self._span)
        raise RuntimeError("RowKVCache.update called before prefill(), decode() or at() said where this forward "
                           "writes.")

    def move_rows(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy rows src -> dst (disjoint sets) in every layer: live rows packed to the front."""
        for t in (*self.keys, *self.values):
            t[dst] = t[src]
