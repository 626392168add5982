"""One-token decode attention with a per-row number of keys: a Triton kernel that reads each row's K/V once and only
up to that row's length, and a plain torch reference with the same contract.

Why. The engine decodes all live rows in one step over a length bucket (`span`) that covers the LONGEST row, so
with multi-turn histories (100 to 2,000 positions live together) every row pays for the longest one: the masked
sdpa reads span x d x 2 bytes of K and V per row and head whatever the row holds. Here row b reads keys
0..lengths[b]-1 only; the bound is read from device memory inside the kernel, so one launch (and one CUDA graph)
serves any mix of lengths, and its cost follows the keys rows hold.

Contract (Hugging Face's attention-function layout):
    q        (B, kvh * g, 1, d)   query head h = kv * g + j, as repeat_kv serves them
    k, v     (B, kvh, S, d)       strided views (slices of a bigger (rows, kvh, length, d) cache), last dim contiguous
    lengths  (B,) int             row b attends keys 0..lengths[b]-1 (1 <= lengths[b] <= S)
    -> out   (B, 1, kvh * g, d)   contiguous, in q's dtype

Kernel. One program per (row, KV head): the g query heads of a KV head are g query rows of one tile (padded to 16,
tl.dot's smallest M), so K/V are read once for all of them. It walks key blocks of BLOCK_N up to the row's length
with an online softmax in fp32 (running max, running sum, fp32 accumulator). fp32 inputs use true fp32 dots
(`input_precision="ieee"`, not TF32): the engine's fp32 greedy output has to stay the evaluator's token for token.

No split over key blocks (flash-decoding). A split pays off when rows x KV heads leave SMs idle; the engine decodes
B >= 64 rows x 3 KV heads (SmolLM2) = 192+ programs on an H200's 132 SMs, and at 512 rows 1,536 programs, so the
scheduler balances long and short rows over the SMs already. Small batch buckets (the tail of a run, 8-32 rows) do
leave SMs idle, but there a step is bound by launches and weight reads, not by attention bytes.
"""

from __future__ import annotations

import math
import os

import torch

try:  # Triton ships with CUDA builds of torch; CPU-only installs fall back to the reference (or the engine's sdpa)
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the install
    triton = tl = None

BLOCK_N = 64  # keys per step of a program: 64 x d=64 x 2 bytes = 8 KB of K (and of V) per block in bf16
ROWS_PAD = 16  # tl.dot's smallest M: the g query rows of a KV head, padded


def triton_available() -> bool:
    return triton is not None


def _interpreted() -> bool:
    """Under Triton's CPU interpreter (TRITON_INTERPRET=1) a bf16 x bf16 tl.dot is wrong (numpy has no bf16), so
    there the kernel does every dot in fp32; on a GPU bf16 dots run on tensor cores with fp32 accumulation."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: torch.Tensor) -> tuple[int, int]:
    """(kvh, g) of a valid call; raises naming the shape that does not fit the contract."""
    if q.dim() != 4 or q.shape[2] != 1:
        raise ValueError(f"decode attention takes one query token per row: q has shape {tuple(q.shape)}, expected "
                         "(B, heads, 1, d). Fix: use the sdpa path for prefill / several tokens.")
    B, heads, _, d = q.shape
    if k.shape != v.shape or k.dim() != 4 or k.shape[0] != B or k.shape[3] != d or heads % k.shape[1]:
        raise ValueError(f"decode attention: K {tuple(k.shape)} / V {tuple(v.shape)} do not fit q {tuple(q.shape)} "
                         "(expected (B, kvh, S, d) with heads a multiple of kvh). Fix: pass the cache's K/V views.")
    if lengths.shape != (B,):
        raise ValueError(f"decode attention: lengths has shape {tuple(lengths.shape)}, expected ({B},). Fix: one "
                         "key count per row (position + 1).")
    g = heads // k.shape[1]
    if not 1 <= g <= ROWS_PAD:
        raise ValueError(f"decode attention: {g} query heads per KV head; the kernel takes 1..{ROWS_PAD}. Fix: "
                         "use decode_attention='sdpa' for this target.")
    return k.shape[1], g


def reference_decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: torch.Tensor,
                               scale: float | None = None) -> torch.Tensor:
    """The contract in plain torch (fp32 math, keys >= lengths[b] masked out); graph-safe (no host sync)."""
    kvh, g = check_inputs(q, k, v, lengths)
    B, heads, _, d = q.shape
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    qf = q.reshape(B, kvh, g, d).float()
    scores = torch.matmul(qf, k.float().transpose(-1, -2)) * scale  # (B, kvh, g, S)
    keep = torch.arange(k.shape[2], device=k.device)[None, :] < lengths.to(k.device)[:, None]  # (B, S)
    scores = scores.masked_fill(~keep[:, None, None, :], float("-inf"))
    out = torch.matmul(torch.softmax(scores, dim=-1), v.float())  # (B, kvh, g, d)
    return out.reshape(B, heads, d)[:, None].to(q.dtype).contiguous()


if triton is not None:
    @triton.jit
    def _decode_kernel(q_ptr, k_ptr, v_ptr, len_ptr, o_ptr, qk_scale,
                       s_qb, s_qh, s_qd, s_kb, s_kh, s_kn, s_kd, s_vb, s_vh, s_vn, s_vd, s_ob, s_oh, s_od,
                       G: tl.constexpr, D: tl.constexpr, D_PAD: tl.constexpr, ROWS: tl.constexpr,
                       BLOCK: tl.constexpr, FP32_DOTS: tl.constexpr):
        b = tl.program_id(0).to(tl.int64)  # 64-bit offsets: a large cache is > 2**31 elements
        kv = tl.program_id(1).to(tl.int64)
        n_keys = tl.load(len_ptr + b).to(tl.int32)  # this row's keys, read at run time: graph-safe
        rows = tl.arange(0, ROWS)
        cols = tl.arange(0, D_PAD)
        row_ok = rows < G
        col_ok = cols < D
        q_off = b * s_qb + (kv * G + rows)[:, None] * s_qh + cols[None, :] * s_qd
        q = tl.load(q_ptr + q_off, mask=row_ok[:, None] & col_ok[None, :], other=0.0)  # (ROWS, D_PAD)
        m_i = tl.full((ROWS,), float("-inf"), tl.float32)
        l_i = tl.zeros((ROWS,), tl.float32)
        acc = tl.zeros((ROWS, D_PAD), tl.float32)
        keys = tl.arange(0, BLOCK)
        k_base = k_ptr + b * s_kb + kv * s_kh
        v_base = v_ptr + b * s_vb + kv * s_vh
        for start in range(0, n_keys, BLOCK):
            key_ok = (start + keys) < n_keys
            ld_mask = key_ok[:, None] & col_ok[None, :]
            kt = tl.load(k_base + (start + keys)[:, None] * s_kn + cols[None, :] * s_kd, mask=ld_mask, other=0.0)
            vt = tl.load(v_base + (start + keys)[:, None] * s_vn + cols[None, :] * s_vd, mask=ld_mask, other=0.0)
            if FP32_DOTS:
                s = tl.dot(q.to(tl.float32), tl.trans(kt.to(tl.float32)), input_precision="ieee")
            else:
                s = tl.dot(q, tl.trans(kt))
            s = tl.where(key_ok[None, :], s * qk_scale, float("-inf"))  # (ROWS, BLOCK), log2 units
            m_new = tl.maximum(m_i, tl.max(s, 1))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            if FP32_DOTS:
                acc = acc * alpha[:, None] + tl.dot(p, vt.to(tl.float32), input_precision="ieee")
            else:
                acc = acc * alpha[:, None] + tl.dot(p.to(vt.dtype), vt)
            m_i = m_new
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]  # a row with no keys gives zeros, not NaN
        o_off = b * s_ob + (kv * G + rows)[:, None] * s_oh + cols[None, :] * s_od
        tl.store(o_ptr + o_off, out.to(o_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


def triton_decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: torch.Tensor,
                            scale: float | None = None, *, block: int = BLOCK_N) -> torch.Tensor:
    """The contract as one Triton launch, grid (B, kvh); see the module docstring."""
    if triton is None:
        raise RuntimeError("triton is not importable. Fix: install a CUDA build of torch (it brings triton), or "
                           "use reference_decode_attention / decode_attention='sdpa'.")
    kvh, g = check_inputs(q, k, v, lengths)
    B, heads, _, d = q.shape
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    out = torch.empty(B, 1, heads, d, dtype=q.dtype, device=q.device)
    if B == 0:
        return out
    _decode_kernel[(B, kvh)](
        q, k, v, lengths, out, scale * 1.4426950408889634,  # log2(e): the kernel's softmax is in base 2
        q.stride(0), q.stride(1), q.stride(3), k.stride(0), k.stride(1), k.stride(2), k.stride(3),
        v.stride(0), v.stride(1), v.stride(2), v.stride(3), out.stride(0), out.stride(2), out.stride(3),
        G=g, D=d, D_PAD=max(16, triton.next_power_of_2(d)), ROWS=ROWS_PAD, BLOCK=block,
        FP32_DOTS=q.dtype == torch.float32 or _interpreted(), num_warps=4)
    return out
