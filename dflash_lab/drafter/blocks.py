"""Anchors, block inputs, position ids, labels, loss weights and the DFlash attention mask (flex and dense).

One forward pass trains all N blocks of a sequence. The key/value sequence is
    KV = [context (S target features) | block_0 | ... | block_{N-1}]   (S + N*B keys)
and the queries are the N*B block slots. A query of block b sees context positions kv < p_b (STRICTLY less: the
anchor's own features do not exist yet at inference) and the slots of its own block; nothing of other blocks.
Visibility is by absolute position, so overlapping blocks cannot leak future features into each other
(SpecForge#470). Padding blocks see nothing and carry no loss.

Sliding-window draft layers are causal inside the block and see context only within the window.

Packed windows (TrainConfig.pack_sequences, packing.py) add `doc_ids` (b, S): an anchor p needs p + 1 in its own
document, slot k has loss only if p + k is in it, a block sees only context of its own document, and positions
restart at 0 per document. doc_ids=None (unpacked) is today's code path, bit for bit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from dflash_lab.target.segments import document_positions, same_document
from dflash_lab.config.windows import window_masks


@dataclass(frozen=True)
class BlockBatch:
    """Everything a drafter step needs besides the target features; all tensors on one device."""

    input_ids: torch.Tensor  # (b, S) long, right-padded
    loss_mask: torch.Tensor  # (b, S) bool, True on supervised (assistant) tokens
    anchors: torch.Tensor  # (b, N) long, sorted; padding anchors are 0
    anchor_valid: torch.Tensor  # (b, N) bool
    draft_ids: torch.Tensor  # (b, N*B) long: [token[p], MASK, ..., MASK] per block
    position_ids: torch.Tensor  # (b, N*B) long: p + 0..B-1
    labels: torch.Tensor  # (b, N*B) long: token[p + k] (same position, no shift); 0 where no loss
    loss_weights: torch.Tensor  # (b, N*B) float32: w_k * valid / global sum (sums to 1 over the GLOBAL batch)
    block_size: int
    doc_ids: torch.Tensor | None = None  # (b, S) long document id per token of a packed window; None = unpacked
    prev_ids: torch.Tensor | None = None  # (b, N*B) long: token[p + k - 1], the TRUE previous token of slot k (the
    # Markov head's teacher forcing, drafter/dspark.py; slot 0 reads token[p - 1], never used); None where not built

    @property
    def num_anchors(self) -> int:
        return self.anchors.shape[1]

    def to(self, device: torch.device | str, non_blocking: bool = False) -> "BlockBatch":
        moved = {k: _maybe(getattr(self, k), lambda t: t.to(device, non_blocking=non_blocking))
                 for k in _TENSOR_FIELDS}
        return BlockBatch(**moved, block_size=self.block_size)

    def split(self, parts: int) -> list["BlockBatch"]:
        """Split along the sequence dimension into `parts` micro-batches (weights stay globally normalised)."""
        chunks = {k: _maybe(getattr(self, k), lambda t: t.chunk(parts, dim=0)) or [None] * parts
                  for k in _TENSOR_FIELDS}
        return [BlockBatch(**{k: chunks[k][i] for k in _TENSOR_FIELDS}, block_size=self.block_size)
                for i in range(parts)]


_TENSOR_FIELDS = ("input_ids", "loss_mask", "anchors", "anchor_valid", "draft_ids", "position_ids", "labels",
                  "loss_weights", "doc_ids", "prev_ids")


def _maybe(t, fn):
    return None if t is None else fn(t)


def sample_anchors(loss_mask: torch.Tensor, num_anchors: int, generator: torch.Generator,
                   doc_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample up to `num_anchors` positions p with loss_mask[p] and loss_mask[p+1], without replacement, sorted.
    Packed (`doc_ids`): p and p + 1 also in the same document (the same random draws as unpacked).

    Returns (anchors (b, N) long, valid (b, N) bool); sequences with fewer candidates get padding anchors (0, False).
    """
    b, S = loss_mask.shape
    m = loss_mask.bool()
    candidate = torch.zeros_like(m)
    candidate[:, :-1] = m[:, :-1] & m[:, 1:]  # (b, S)
    if doc_ids is not None:
        candidate[:, :-1] &= doc_ids[:, :-1] == doc_ids[:, 1:]
    # Random keys for candidates, 2.0 for the rest: the N smallest keys are a uniform sample without replacement.
    keys = torch.rand(b, S, generator=generator, device="cpu").to(loss_mask.device)
    keys = torch.where(candidate, keys, torch.full_like(keys, 2.0))
    n = min(num_anchors, S)
    picked_keys, picked = keys.topk(n, dim=1, largest=False)  # (b, n)
    valid = picked_keys < 2.0
    positions = torch.where(valid, picked, torch.full_like(picked, S))  # padding sorts last
    positions, _ = positions.sort(dim=1)
    valid = positions < S
    positions = torch.where(valid, positions, torch.zeros_like(positions))
    if n < num_anchors:  # sequence shorter than the anchor budget: pad to the fixed shape
        pad = num_anchors - n
        positions = torch.cat([positions, positions.new_zeros(b, pad)], dim=1)
        valid = torch.cat([valid, valid.new_zeros(b, pad)], dim=1)
    return positions, valid


def loss_decay_weights(block_size: int, gamma: float) -> torch.Tensor:
    """w_k for slots k = 0..B-1: 0 for the anchor slot, exp(-(k-1)/gamma) for k >= 1."""
    k = torch.arange(block_size, dtype=torch.float32)
    w = torch.exp(-(k - 1) / gamma)
    w[0] = 0.0
    return w


def build_block_batch(input_ids: torch.Tensor, loss_mask: torch.Tensor, anchors: torch.Tensor,
                      anchor_valid: torch.Tensor, *, block_size: int, mask_token_id: int, gamma: float,
                      weight_total: float | None = None, decay: bool = True,
                      doc_ids: torch.Tensor | None = None, prefix_only: bool = False) -> BlockBatch:
    """Block inputs, positions, same-position labels and normalised loss weights for sampled anchors.

    `weight_total` is the sum of raw weights over the GLOBAL batch (so micro-batches on several workers add up to
    exactly the single-device loss); None = this batch's own sum. decay=False: every supervised slot weighs 1 before
    normalisation (D-PACE: loss_weights.global_block_batch; its factor is applied inside the loss). `doc_ids`
    (packed): labels stay in the anchor's document and position ids are per-document positions. `prefix_only`: a
    slot has loss only while every slot before it in the block has (DeepSpec's DSpark supervises a block's
    contiguous supervised prefix: a draft after a hole is never accepted).
    """
    b, S = input_ids.shape
    N, B = anchors.shape[1], block_size
    k = torch.arange(B, device=input_ids.device)
    pos = anchors[:, :, None] + k  # (b, N, B) absolute positions of every slot
    in_range = pos < S
    gather_pos = pos.clamp(max=S - 1)
    tokens = input_ids.gather(1, gather_pos.flatten(1)).view(b, N, B)
    supervised = loss_mask.bool().gather(1, gather_pos.flatten(1)).view(b, N, B)

    draft_ids = torch.full_like(tokens, mask_token_id)
    draft_ids[:, :, 0] = tokens[:, :, 0]  # slot 0 = the anchor token itself

    # Slot k predicts token[p + k] (same position; predicting p + k + 1 was SpecForge#473).
    has_loss = in_range & supervised & anchor_valid[:, :, None]
    if doc_ids is not None:  # a label in the NEXT conversation is not what this block drafts
        has_loss &= same_document(doc_ids, gather_pos, anchors[:, :, None].expand(b, N, B))
        pos = document_positions(doc_ids).gather(1, anchors)[:, :, None] + k  # (b, N, B) per-document positions
    has_loss[:, :, 0] = False
    if prefix_only:
        has_loss[:, :, 1:] = has_loss[:, :, 1:].long().cumprod(-1).bool()
    slot_w = loss_decay_weights(B, gamma) if decay else torch.ones(B)
    raw = slot_w.to(input_ids.device)[None, None, :] * has_loss  # (b, N, B)
    total = float(raw.sum()) if weight_total is None else weight_total
    weights = raw / max(total, 1e-12)
    labels = torch.where(has_loss, tokens, torch.zeros_like(tokens))
    prev_ids = input_ids.gather(1, (gather_pos - 1).clamp(min=0).flatten(1))  # whatever its loss mask says
    return BlockBatch(
        input_ids=input_ids, loss_mask=loss_mask.bool(), anchors=anchors, anchor_valid=anchor_valid,
        draft_ids=draft_ids.flatten(1), position_ids=pos.flatten(1), labels=labels.flatten(1),
        loss_weights=weights.flatten(1).float(), block_size=B, doc_ids=doc_ids, prev_ids=prev_ids,
    )


def raw_weight_total(loss_mask: torch.Tensor, anchors: torch.Tensor, anchor_valid: torch.Tensor, *,
                     block_size: int, gamma: float, doc_ids: torch.Tensor | None = None,
                     prefix_only: bool = False) -> float:
    """Sum of w_k over all supervised slots of a batch (the loss normaliser); the same rule as build_block_batch."""
    b, S = loss_mask.shape
    k = torch.arange(block_size, device=loss_mask.device)
    pos = anchors[:, :, None] + k
    sup = loss_mask.bool().gather(1, pos.clamp(max=S - 1).flatten(1)).view(pos.shape) & (pos < S)
    sup = sup & anchor_valid[:, :, None]
    if doc_ids is not None:
        sup &= same_document(doc_ids, pos.clamp(max=S - 1), anchors[:, :, None].expand(pos.shape))
    sup[:, :, 0] = False
    if prefix_only:
        sup[:, :, 1:] = sup[:, :, 1:].long().cumprod(-1).bool()
    return float((loss_decay_weights(block_size, gamma).to(loss_mask.device) * sup).sum())


# ---------------------------------------------------------------------------------------------------------------
# Attention masks. The same rule, twice: a dense boolean (b, 1, Q, KV) mask for SDPA (CPU, tests, decoding) and a
# FlexAttention BlockMask (GPU). Both say True = may attend. Flex has two formulations, told apart by the mask's key
# length (model.DFlashAttention): one call over [context | every block's slots], or the context alone with each
# block's own slots attended to beside it by one batched matmul (model.attend_blocks). The split pays where a query
# tile's context is a few key tiles against the 1-2 tiles of block slots the single call spends, most of them on
# blocks the tile may not see. Measured on one H100 (bench/results/2026-12-06-h100-flex-split/): at seq 320 (the
# recipe) the attention took 1.65 against 2.18 ms a layer (forward + backward) and the compiled step 17.8 against
# 20.6 ms; at seq 3072 (the paper shape) 4.07 against 3.50 ms, so long windows keep the single call. Where between
# the two the break-even lies is not measured.
# ---------------------------------------------------------------------------------------------------------------
SPLIT_MAX_SEQ_LEN = 1024


def splits_context(seq_len: int) -> bool:
    """Whether flex attends to the context alone (and the blocks' own slots beside it) at this window length."""
    return seq_len <= SPLIT_MAX_SEQ_LEN


def context_mask(anchors: torch.Tensor, anchor_valid: torch.Tensor, *, seq_len: int, block_size: int,
                 sliding_window: int | None = None, doc_ids: torch.Tensor | None = None) -> torch.Tensor:
    """(b, 1, N*B, S) bool: which context positions each block slot sees (strictly before its anchor; within the
    window on sliding layers; its anchor's document when packed; nothing for padding blocks)."""
    N, B, S = anchors.shape[1], block_size, seq_len
    dev = anchors.device
    q_block = torch.arange(N * B, device=dev) // B  # (Q,)
    p = anchors[:, q_block]  # (b, Q) anchor of each query's block
    kv_ctx = torch.arange(S, device=dev)
    ctx = kv_ctx[None, None, :] < p[:, :, None]  # (b, Q, S): strictly before the anchor
    if doc_ids is not None:
        ctx = ctx & (doc_ids[:, None, :] == doc_ids.gather(1, p)[:, :, None])  # same conversation only
    if sliding_window is not None:
        q_pos = p + (torch.arange(N * B, device=dev) % B)[None, :]  # (b, Q)
        ctx = ctx & (q_pos[:, :, None] - kv_ctx[None, None, :] < sliding_window)
    return (ctx & anchor_valid[:, q_block][:, :, None])[:, None]


def dense_mask(anchors: torch.Tensor, anchor_valid: torch.Tensor, *, seq_len: int, block_size: int,
               sliding_window: int | None = None, doc_ids: torch.Tensor | None = None) -> torch.Tensor:
    """(b, 1, N*B, S + N*B) bool mask: [context_mask | own block]. Memory is O(N*B*(S+N*B)): for small shapes,
    tests and decoding. `doc_ids` (b, S), packed: a block sees only context of its anchor's document."""
    b, N = anchors.shape
    B = block_size
    dev = anchors.device
    ctx = context_mask(anchors, anchor_valid, seq_len=seq_len, block_size=B, sliding_window=sliding_window,
                       doc_ids=doc_ids)[:, 0]
    q_block = torch.arange(N * B, device=dev) // B
    slot = torch.arange(N * B, device=dev) % B
    own = q_block[:, None] == q_block[None, :]  # (Q, N*B)
    if sliding_window is not None:
        own = own & (slot[None, :] <= slot[:, None])  # causal inside the block
    own = own[None] & anchor_valid[:, q_block][:, :, None]
    return torch.cat([ctx, own], dim=2)[:, None]  # (b, 1, Q, KV)


def flex_mask_mod(anchors: torch.Tensor, anchor_valid: torch.Tensor, *, seq_len: int, block_size: int,
                  sliding_window: int | None = None, doc_ids: torch.Tensor | None = None,
                  context_only: bool | None = None):
    """mask_mod(b, h, q_idx, kv_idx) for FlexAttention: the rule of `dense_mask` over [context | blocks], or with
    `context_only` that of `context_mask` (kv_idx < seq_len). None: as `splits_context(seq_len)` decides.

    The window is a 0-d tensor the closure reads (data), not a Python int baked into the kernel: every sliding
    layer's mask_mod is then the same code over same-shaped tensors, so the compiled flex kernel is built once for
    all windows instead of once per distinct window (the recompiles of a per-layer window value)."""
    S, B = seq_len, block_size
    context_only = splits_context(seq_len) if context_only is None else context_only
    if sliding_window is not None:
        sliding_window = torch.tensor(sliding_window, device=anchors.device, dtype=torch.long)

    def mask_mod(b, h, q_idx, kv_idx):
        q_block = q_idx // B
        p = anchors[b, q_block]
        is_ctx = kv_idx < S
        ctx = is_ctx & (kv_idx < p)
        if doc_ids is not None:  # block keys and the kernel's padding past S: clamped, `kv_idx < p` drops them
            ctx = ctx & (doc_ids[b, torch.clamp(kv_idx, max=S - 1)] == doc_ids[b, p])
        if sliding_window is not None:
            ctx = ctx & (p + q_idx % B - kv_idx < sliding_window)
        if context_only:
            return ctx & anchor_valid[b, q_block]
        own = (~is_ctx) & ((kv_idx - S) // B == q_block)
        if sliding_window is not None:
            own = own & ((kv_idx - S) % B <= q_idx % B)  # causal inside the block
        return (ctx | own) & anchor_valid[b, q_block]

    return mask_mod


def flex_block_mask(anchors: torch.Tensor, anchor_valid: torch.Tensor, *, seq_len: int, block_size: int,
                    sliding_window: int | None = None, doc_ids: torch.Tensor | None = None,
                    context_only: bool | None = None):
    """FlexAttention BlockMask with H=None (per-head masks OOM, SpecForge#452), built from the dense mask: over the
    context keys where `context_only` (None: `splits_context(seq_len)`), else over [context | blocks].

    Never `create_block_mask` uncompiled (it materialises the dense mask per head: 7 GB/step, speculators#731) nor
    compiled (its inductor compile took ~200 s of the first step per GPU on an H200): see block_mask_from_dense.
    """
    context_only = splits_context(seq_len) if context_only is None else context_only
    kw = dict(seq_len=seq_len, block_size=block_size, sliding_window=sliding_window, doc_ids=doc_ids)
    dense = (context_mask if context_only else dense_mask)(anchors, anchor_valid, **kw)
    return block_mask_from_dense(dense, flex_mask_mod(anchors, anchor_valid, context_only=context_only, **kw))


def flex_mask_mods(anchors: torch.Tensor, anchor_valid: torch.Tensor, *, seq_len: int, block_size: int,
                   layer_types: tuple[str, ...], sliding_window: int | None, layer_windows: tuple = (),
                   doc_ids: torch.Tensor | None = None) -> dict:
    """{mask key: mask_mod}, one per distinct window (config.window_masks): closures over `anchors` (and `doc_ids`
    when packed; a CUDA-graph worker builds them once over its static buffers)."""
    return {key: flex_mask_mod(anchors, anchor_valid, seq_len=seq_len, block_size=block_size, sliding_window=window,
                               doc_ids=doc_ids)
            for key, window in window_masks(layer_types, sliding_window, layer_windows).items()}


def attention_masks(anchors: torch.Tensor, anchor_valid: torch.Tensor, *, seq_len: int, block_size: int,
                    backend: str, layer_types: tuple[str, ...], sliding_window: int | None,
                    layer_windows: tuple = (), mask_mods: dict | None = None,
                    doc_ids: torch.Tensor | None = None) -> dict:
    """The drafter's attention masks, one per distinct window (config.window_masks: "full_attention",
    "sliding_attention" or "sliding_attention_<w>"): dense bool (b, 1, Q, KV) for "sdpa", a BlockMask for "flex"
    (over the context alone where `splits_context(seq_len)`). The one place masks are built (engine workers and
    torchrun ranks both call it). `mask_mods`: flex closures to reuse (see flex_mask_mods; the same rule); by
    default made over `anchors`. `doc_ids`: packed windows (None = unpacked)."""
    masks = {}
    for key, window in window_masks(layer_types, sliding_window, layer_windows).items():
        kw = dict(seq_len=seq_len, block_size=block_size, sliding_window=window, doc_ids=doc_ids)
        if backend == "sdpa":
            masks[key] = dense_mask(anchors, anchor_valid, **kw)
            continue
        dense = (context_mask if splits_context(seq_len) else dense_mask)(anchors, anchor_valid, **kw)
        mod = mask_mods[key] if mask_mods is not None else flex_mask_mod(anchors, anchor_valid, **kw)
        masks[key] = block_mask_from_dense(dense, mod)
    return masks


def block_mask_from_dense(dense: torch.Tensor, mask_mod, block: int | tuple[int, int] = 128):
    """FlexAttention BlockMask from the dense boolean mask (b, 1, Q, KV): per (q block, kv block) "full" (all True)
    or "partial" (some True), exactly what create_block_mask computes, with a few tensor ops and no compile.
    `block`: the tile, or (query rows, key columns).

    Why not torch.compile(create_block_mask): on an H200 its inductor compile for the paper shape took ~200 s of a
    220 s first step (and again per GPU); the dense mask of one micro-batch is ~100 MB and reduces in well under 1 ms.
    """
    from torch.nn.attention.flex_attention import BlockMask

    bq, bk = (block, block) if isinstance(block, int) else block
    b, h, Q, KV = dense.shape
    pq, pk = (-Q) % bq, (-KV) % bk
    if pq or pk:
        dense = torch.nn.functional.pad(dense, (0, pk, 0, pq), value=False)
    tiles = dense.view(b, h, (Q + pq) // bq, bq, (KV + pk) // bk, bk)
    full = tiles.all(dim=5).all(dim=3)  # (b, h, Qb, KVb)
    partial = tiles.any(dim=5).any(dim=3) & ~full

    def ordered(m):  # count, and the True block indices first (ascending), like create_block_mask
        return (m.sum(-1, dtype=torch.int32),
                torch.argsort((~m).to(torch.int8), dim=-1, stable=True).to(torch.int32))

    kv_num, kv_idx = ordered(partial)
    full_num, full_idx = ordered(full)
    return BlockMask.from_kv_blocks(kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=(bq, bk), mask_mod=mask_mod,
                                    seq_lengths=(Q, KV))


def kv_length(seq_len: int, num_anchors: int, block_size: int) -> int:
    return seq_len + num_anchors * block_size


def padded_to(n: int, multiple: int) -> int:
    return int(math.ceil(n / multiple) * multiple)
