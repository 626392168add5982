"""FP8 (e4m3) linear layers with row-wise scaling through `torch._scaled_mm`: forward-only for the frozen target's
feature extraction (`target_fp8`), trainable for the drafter (`drafter_fp8`). No extra dependency.

Row-wise scaling: every row of an operand (one token of the activation, one output channel of the weight) gets its
own fp32 scale amax / 448, so one outlier token or channel does not flatten everyone else's precision the way a
single tensor-wide scale does. The scaled matmul accumulates in fp32 and writes bf16.

- Target (`fp8_frozen_linears` + `fp8_scope`): weights are quantised once at conversion (the bf16 weights stay, so
  evaluation and anything outside the scope keep the exact bf16 target); activations are quantised per call. Only
  calls inside `with fp8_scope():` (the FeatureExtractor's) use FP8; the scope is thread-local, so one worker thread
  extracting in FP8 never changes what another thread's forward computes.
- Drafter (`fp8_train_linears`): the Linear modules change class in place (same parameters, same names, same
  state_dict): forward y = x W^T and the input gradient dX = dY W run in FP8; the weight gradient dW = dY^T X stays
  in bf16 by default (torchao's "rowwise_with_gw_hp"), or runs in FP8 too with `drafter_fp8_weight_grad`.

`feature_error` measures what the target conversion costs: per extracted layer, relative L2 error and cosine.
"""

from __future__ import annotations

import contextlib
import threading

import torch
import torch.nn.functional as F
from torch import nn

E4M3 = torch.float8_e4m3fn
E4M3_MAX = float(torch.finfo(E4M3).max)  # 448
_ALIGN = 16  # _scaled_mm needs the inner and output dimensions to be multiples of 16


def fp8_supported(device: torch.device | str) -> tuple[bool, str]:
    """Whether row-wise FP8 matmuls run on `device`, and why not (CUDA needs compute capability >= 8.9)."""
    device = torch.device(device)
    if device.type == "cpu":
        return True, "CPU (reference speed only)"
    if device.type != "cuda":
        return False, f"{device.type} has no FP8 matmul"
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) < (8, 9):
        return False, f"{torch.cuda.get_device_name(device)} is sm{major}{minor}; FP8 matmuls need sm89+ (Ada/Hopper)"
    return True, f"sm{major}{minor}"


def _require(device) -> None:
    ok, why = fp8_supported(device)
    if not ok:
        raise RuntimeError(f"FP8 is not available: {why}. Fix: set target_fp8=False and drafter_fp8=False.")


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x (M, K) -> (e4m3 (M, K), fp32 scale (M, 1)) with x ~= q * scale, one scale per row."""
    xf = x.float()
    scale = xf.abs().amax(dim=-1, keepdim=True).clamp(min=1e-12) / E4M3_MAX
    return (xf / scale).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3), scale


_compiled_quantize = None


def quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`quantize_rows`, compiled once on CUDA (dynamic shapes: one kernel pair for every layer's shape) so the cast
    is one read of x instead of ~5 elementwise passes; inside a compiled region it is traced as is."""
    global _compiled_quantize
    if not x.is_cuda or torch.compiler.is_compiling():
        return quantize_rows(x)
    if _compiled_quantize is None:
        _compiled_quantize = torch.compile(quantize_rows, dynamic=True)
    return _compiled_quantize(x)


def scaled_matmul(a_q, a_scale, b_q, b_scale, out_dtype: torch.dtype) -> torch.Tensor:
    """(a_q * a_scale) @ (b_q * b_scale)^T for row-quantised a (M, K) and b (N, K): (M, N) in out_dtype."""
    mm_dtype = torch.bfloat16 if a_q.is_cuda else out_dtype  # CUDA row-wise scaling writes bf16 only
    out = torch._scaled_mm(a_q, b_q.t(), scale_a=a_scale, scale_b=b_scale.t(), out_dtype=mm_dtype)
    return out if out.dtype == out_dtype else out.to(out_dtype)


def _fits(linear: nn.Linear) -> bool:
    return linear.in_features % _ALIGN == 0 and linear.out_features % _ALIGN == 0


# ---------------------------------------------------------------------------------------------------------------
# Frozen target: forward only, inside a thread-local scope
# ---------------------------------------------------------------------------------------------------------------

_SCOPE = threading.local()


@contextlib.contextmanager
def fp8_scope(enabled: bool = True):
    """Converted frozen linears compute in FP8 inside this block (this thread only)."""
    before = getattr(_SCOPE, "on", False)
    _SCOPE.on = enabled
    try:
        yield
    finally:
        _SCOPE.on = before


def _frozen_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    if not getattr(_SCOPE, "on", False) or torch.is_grad_enabled() and x.requires_grad:
        return F.linear(x, self.weight, self.bias)
    x2 = x.reshape(-1, x.shape[-1])
    xq, xs = quantize(x2)
    out = scaled_matmul(xq, xs, self.fp8_weight, self.fp8_scale, x.dtype)
    if self.bias is not None:
        out = out + self.bias
    return out.view(*x.shape[:-1], out.shape[-1])


@torch.no_grad()
def fp8_frozen_linears(module: nn.Module) -> int:
    """Give every fitting nn.Linear under `module` an FP8 copy of its weight and an FP8 forward used inside
    `fp8_scope()`. Returns how many were converted (idempotent)."""
    n = 0
    for m in module.modules():
        if isinstance(m, nn.Linear) and _fits(m):
            if not hasattr(m, "fp8_weight"):
                _require(m.weight.device)
                m.fp8_weight, m.fp8_scale = quantize_rows(m.weight.detach())
                m.forward = _frozen_forward.__get__(m)
            n += 1
    return n


# ---------------------------------------------------------------------------------------------------------------
# Drafter: trainable FP8 linear (same parameters)
# ---------------------------------------------------------------------------------------------------------------

class _Fp8LinearFn(torch.autograd.Function):
    """y = x W^T in FP8 (row-wise), dX = dY W in FP8 (dY per row, W per input channel), dW = dY^T X in bf16 or,
    with `fp8_weight_grad`, in FP8 too (dY^T per output channel, X^T per input channel: torchao's "rowwise")."""

    @staticmethod
    def forward(ctx, x2: torch.Tensor, weight: torch.Tensor, fp8_weight_grad: bool) -> torch.Tensor:
        xq, xs = quantize(x2)
        wq, ws = quantize(weight)
        ctx.save_for_backward(x2, weight)
        ctx.fp8_weight_grad = fp8_weight_grad
        return scaled_matmul(xq, xs, wq, ws, x2.dtype)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        x2, weight = ctx.saved_tensors
        g = grad_out.contiguous()
        gq, gs = quantize(g)  # (M, N), one scale per token
        wtq, wts = quantize(weight.t().contiguous())  # (K, N), one scale per input channel
        grad_x = scaled_matmul(gq, gs, wtq, wts, x2.dtype)  # (M, K) = dY W
        if ctx.fp8_weight_grad:
            gtq, gts = quantize(g.t().contiguous())  # (N, M)
            xtq, xts = quantize(x2.t().contiguous())  # (K, M)
            grad_w = scaled_matmul(gtq, gts, xtq, xts, weight.dtype)  # (N, K)
        else:
            grad_w = (g.t() @ x2).to(weight.dtype)  # (N, K) in high precision
        return grad_x, grad_w, None


class Fp8TrainLinear(nn.Linear):
    """An nn.Linear whose matmuls run in FP8 (see _Fp8LinearFn); made by `fp8_train_linears` (class swap)."""

    fp8_weight_grad = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = _Fp8LinearFn.apply(x.reshape(-1, x.shape[-1]), self.weight, self.fp8_weight_grad)
        out = out.view(*x.shape[:-1], out.shape[-1])
        return out if self.bias is None else out + self.bias


def fp8_train_linears(module: nn.Module, *, weight_grad: bool = False) -> int:
    """Switch every fitting nn.Linear under `module` to FP8 training in place (parameters, names and optimizer
    state untouched); `weight_grad` also runs dW in FP8. Returns how many were switched."""
    n = 0
    for m in module.modules():
        if type(m) is nn.Linear and _fits(m):
            _require(m.weight.device)
            m.__class__ = Fp8TrainLinear
        if type(m) is Fp8TrainLinear:
            m.fp8_weight_grad = weight_grad
            n += 1
    return n


# ---------------------------------------------------------------------------------------------------------------
# What the conversion costs
# ---------------------------------------------------------------------------------------------------------------

def feature_error(reference: torch.Tensor, test: torch.Tensor, layer_ids: tuple[int, ...]) -> dict:
    """Per extracted layer of (b, S, n*H) features: relative L2 error |test - ref| / |ref| and mean cosine per
    position, as {layer id: {"rel_err": ..., "cosine": ...}} (fp32 math)."""
    n = len(layer_ids)
    refs, tests = reference.float().chunk(n, dim=-1), test.float().chunk(n, dim=-1)
    out = {}
    for i, r, t in zip(layer_ids, refs, tests):
        rel = (t - r).norm() / r.norm().clamp(min=1e-12)
        cos = F.cosine_similarity(t.flatten(0, -2), r.flatten(0, -2), dim=-1).mean()
        out[int(i)] = {"rel_err": round(float(rel), 5), "cosine": round(float(cos), 6)}
    return out
