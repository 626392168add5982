"""The one memory model: bytes each device must hold for a placement, item by item, before anything loads.

preflight.py shows these items (and ETA, data counts); placement.check_placement compares their sum with each GPU's
free memory and refuses a plan that does not fit. Both call `device_memory`, so "does it fit?" has one answer.
Parameter counts come from model_size.py. Per device:
- target: weights in the compute dtype + one forward's live activations of its micro-batch + the kept features;
- drafter: weights + grads in the compute dtype, fp32 masters + AdamW m, v (12 bytes/param; 8 when the weights are
  fp32 and ARE the masters), what autograd keeps for one step, features copied in and frozen embedding/head copies
  (split placements);
- CUDA: + 12% allocator slack (on all but the feature store, one allocation) + 1 GiB context / cuBLAS workspaces.
"""

from __future__ import annotations

from typing import Callable

import torch

from dflash_lab.config.model_size import text_config
from dflash_lab.drafter.blocks import splits_context
from dflash_lab.drafter.variants import variant_of

GIB = 2**30
CUDA_OVERHEAD_BYTES = 1 * GIB
ALLOCATOR_SLACK = 0.12
STORE_ITEM = "target feature store (at most)"


def target_activation_bytes(tc, *, batch: int, seq_len: int, num_features: int, dtype_bytes: int) -> int:
    """Forward-only target up to max(ids): one layer's transients + the kept feature outputs."""
    H = tc.hidden_size
    nh = tc.num_attention_heads
    nkv = getattr(tc, "num_key_value_heads", None) or nh
    hd = getattr(tc, "head_dim", None) or H // nh
    inter = getattr(tc, "intermediate_size", 0) or 0
    if getattr(tc, "num_experts", 0):
        inter = max(inter, tc.moe_intermediate_size * getattr(tc, "num_experts_per_tok", 1))
    per_token = 3 * H + (nh + 2 * nkv) * hd + nh * hd + 3 * inter
    return batch * seq_len * (per_token + num_features * H) * dtype_bytes


def drafter_activation_bytes(dc, *, batch: int, seq_len: int, num_anchors: int, dtype_bytes: int,
                             chunk_size: int, backend: str, fused_norms: bool = False) -> int:
    """What autograd keeps for one micro-batch of the drafter step, plus the head's chunk buffers.

    `fused_norms`: on CUDA the drafter's RMSNorm is one fused kernel (drafter.RMSNorm) that keeps only its bf16 input
    and the fp32 rstd, not the fp32 intermediates of the eager CPU path. Counting them anyway overstated the paper
    shape's peak by ~5 GiB and refused the 32B-class shape colocated on one H200 (142 GiB estimated, 109 GiB measured
    at commit 49c1fff).
    """
    H, Iw, D = dc.hidden_size, dc.intermediate_size, dc.num_hidden_layers
    nh, nkv, hd = dc.num_attention_heads, dc.num_key_value_heads, dc.head_dim
    n = len(dc.target_layer_ids)
    Q = num_anchors * dc.block_size
    KV = seq_len + Q
    c = dtype_bytes
    per_layer = c * (Q * (4 * H + 3 * nh * hd + 4 * Iw) + KV * 5 * nkv * hd)
    if not fused_norms:  # eager fp32 RMSNorm (CPU) keeps its fp32 intermediates
        per_layer += 4 * (4 * Q * H + 2 * Q * nh * hd + 2 * KV * nkv * hd)
    if backend == "sdpa_math":  # CPU SDPA with a boolean mask keeps the attention probabilities
        per_layer += c * nh * Q * KV
    if backend == "flex" and splits_context(seq_len):  # model.attend_blocks: the blocks' own fp32 probabilities,
        per_layer += nh * Q * (4 * dc.block_size + 8 + 8 * hd)  # two lse rows, two fp32 outputs for the merge
    once = c * (seq_len * n * H + 3 * seq_len * H + 3 * Q * H) + 4 * 2 * seq_len * H
    # the LM head reads every predicted slot of the micro-batch (batch x anchors x (B-1) rows, their hidden and its
    # gradient) and holds one chunk of logits, fp32 softmax and its gradient at a time
    rows = batch * num_anchors * (dc.block_size - 1)
    chunk = min(chunk_size, rows)
    head = c * 2 * rows * H + chunk * (dc.draft_vocab_size or dc.vocab_size) * (4 + 4 + c)
    heads = variant_of(dc).heads
    if heads is not None:  # a variant's heads beside the LM head (DSpark: drafter/dspark.py)
        head += heads.activation_bytes(dc, rows=rows, chunk_rows=chunk, dtype_bytes=c)
    mask = Q * KV if backend.startswith("sdpa") else 0
    return batch * (D * per_layer + per_layer + once + mask) + head  # + one layer of gradient transients


def device_memory(*, drafter_devices: tuple[str, ...], target_devices: tuple[str, ...], target_config,
                  drafter_config, target_params: int, drafter_params: int, seq_len: int, num_anchors: int,
                  batch_size: int, chunk_size: int, plan: Callable,
                  feature_store_bytes: int = 0) -> dict[str, dict[str, int]]:
    """{device: {item: bytes}}. `plan(device)` -> placement.DevicePlan (compute dtype and attention backend).
    `feature_store_bytes`: TrainConfig.feature_store_gib per target device, counted whole (the data, which may need
    fewer rows, is not read yet when placements are checked)."""
    tc, dc = text_config(target_config), drafter_config
    workers = list(drafter_devices)
    tdevs = list(target_devices)
    if len(tdevs) == 1:
        tdevs = tdevs * len(workers)
    micro = batch_size // len(workers)
    n = len(dc.target_layer_ids)
    per: dict[str, dict[str, int]] = {}

    def add(name: str, key: str, nbytes: float) -> None:
        items = per.setdefault(name, {})
        items[key] = items.get(key, 0) + int(nbytes)

    def cbytes(name: str) -> int:
        return torch.empty((), dtype=plan(name).dtype).element_size()

    for t in dict.fromkeys(tdevs):
        add(t, "target weights", target_params * cbytes(t))
        if feature_store_bytes:
            add(t, STORE_ITEM, feature_store_bytes)
    for w, t in zip(workers, tdevs):
        add(t, "target activations", target_activation_bytes(tc, batch=micro, seq_len=seq_len, num_features=n,
                                                             dtype_bytes=cbytes(t)))
        c = cbytes(w)
        add(w, "drafter weights+grads", drafter_params * 2 * c)
        add(w, "fp32 master + AdamW m, v", drafter_params * (12 if c != 4 else 8))
        backend = plan(w).attention
        if backend == "sdpa" and torch.device(w).type == "cpu":
            backend = "sdpa_math"
        add(w, "drafter activations", drafter_activation_bytes(dc, batch=micro, seq_len=seq_len,
                                                               num_anchors=num_anchors, dtype_bytes=c,
                                                               chunk_size=chunk_size, backend=backend,
                                                               fused_norms=torch.device(w).type == "cuda"))
        if t != w:  # features are copied from the target's device to the drafter's
            add(w, "features (copied in)", micro * seq_len * n * dc.hidden_size * c)
        if torch.device(w).type == "cuda" and "embedding + head copy" not in per[w] and t != w:
            add(w, "embedding + head copy", dc.vocab_size * dc.hidden_size * c * (1 if dc.tie_word_embeddings else 2))
    for name, items in per.items():
        if torch.device(name).type == "cuda":  # the store is one allocation made once: no fragmentation to allow for
            churned = sum(v for k, v in items.items() if k != STORE_ITEM)
            items["allocator slack 12%"] = int(ALLOCATOR_SLACK * churned)
            items["CUDA context"] = CUDA_OVERHEAD_BYTES
    return per
