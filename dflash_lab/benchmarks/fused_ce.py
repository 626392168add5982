"""LM head + cross-entropy backends side by side: step.chunked_head_ce ("ours") against cut-cross-entropy and
liger-kernel's fused linear cross-entropy, forward + hidden gradient, same rows, same per-row weights, frozen head.

    PYTHONPATH=$PWD:/tmp/ce-site python -m dflash_lab.benchmarks.fused_ce --rows 30720 --hidden 576 \\
        --vocab 49152 16384 --device cuda --dtype bfloat16 --repeats 10 [--out rows.jsonl]
    ... fused_ce --cases 30720x576x49152 7680x4096x151936 30720x576x49152x8     # several shapes, one process

One JSON line per (vocab, backend) on stdout (and --out), a table on stderr. A backend that is not installed or
fails gives a row with "error" instead of numbers; the run goes on. Each row has ms (min of --repeats, synced),
peak_mem_mib (CUDA peak above the start), first_call_s (compile/JIT of the shape + one call), and differences
against "ours" with the same weights (*_diff) and against a plain-torch fp32 reference (*_err_fp32): loss |a - b|
and |a - b| / |b|, hidden gradient max |a - b| and that over max |b|.

What each backend does for the same (loss, grad):
  ours                 chunked matmul + compiled epilogue; the gradient is made in the forward (2 head matmuls),
                       argmax per row included.
  cce / cce-exact      cut_cross_entropy.linear_cross_entropy(reduction="none") * w, summed: logits never leave
                       SRAM; the backward recomputes them. "cce" keeps the library's default filter_eps ("high" in
                       25.1.1: the dtype's eps / 32, 2.4e-4 in bf16), which skips gradient blocks whose every
                       |softmax - onehot| is below it; "cce-exact" passes filter_eps=None. bf16/fp16 only.
  liger                liger_fused_linear_cross_entropy(reduction="none") * w, summed: the per-row upstream
                       gradient is honoured, but then the forward only computes the loss and the backward recomputes
                       the chunked logits (3 head matmuls); argmax via return_predicted_tokens.
  liger-sum            reduction="sum" times the mean weight: liger's fast path (gradient made in the forward), but
                       it cannot weigh rows, so it runs with uniform weights ("per_row_weights": false) and its
                       differences are against ours with the same uniform weights.
The head never gets a gradient (requires_grad False): both libraries then skip their weight-gradient matmul, as
ours does; each row checks that W.grad stayed None.

The softmax's shape decides how much cce's filter skips: with the default inputs (logit std ~0.5) every probability
is ~1/V, below the filter; --hidden-std 8 gives a peaked softmax (logit std ~3.8 at H=576). Each row says the logit
std and the fraction of probabilities below the bf16 filter, measured on 256 rows.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from dflash_lab.benchmarks.vocab_head import head_inputs, time_loss_backward
from dflash_lab.drafter.step import chunked_head_ce

WHEEL_HINT = ("HINT: carry the wheels (.whl-ce/), then: python3 -m pip install --no-index --no-deps --target "
              "/tmp/ce-site .whl-ce/*.whl and run with PYTHONPATH=$PWD:/tmp/ce-site")
CCE_FILTER_BF16 = torch.finfo(torch.bfloat16).eps / 32  # cut-cross-entropy's "high"/"auto" filter_eps in bf16


# The libraries are optional: each is imported inside its backend, so a missing one costs its rows, not the run.

def _ours(h, W, y, w, chunk_size):
    return chunked_head_ce(h, W, y, w, chunk_size)[0]


def _cce(h, W, y, w, chunk_size, **filter_eps):
    from cut_cross_entropy import linear_cross_entropy

    return (linear_cross_entropy(h, W, y, reduction="none", **filter_eps) * w).sum()  # (M,) fp32 per-row CE


def _cce_exact(h, W, y, w, chunk_size):
    return _cce(h, W, y, w, chunk_size, filter_eps=None)


def _liger(h, W, y, w, chunk_size):
    from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

    out = liger_fused_linear_cross_entropy(h, W, y, reduction="none", return_predicted_tokens=True)
    return (out.loss * w).sum()


def _liger_sum(h, W, y, w, chunk_size):
    from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

    out = liger_fused_linear_cross_entropy(h, W, y, reduction="sum", return_predicted_tokens=True)
    return out.loss * w.mean()  # w is uniform here (per_row_weights False): sum * (1/M) == sum_i w_i * CE_i


@dataclass(frozen=True)
class Backend:
    """One way to compute sum_i w_i * CE(h_i @ W^T, y_i) and its hidden gradient."""

    name: str
    loss: Callable  # (hidden (M, H) leaf, weight (V, H) frozen, labels (M,), weights (M,) fp32, chunk_size) -> ()
    per_row_weights: bool  # False: timed with uniform weights, compared with ours at uniform weights
    argmax: bool  # also yields the argmax per row, as ours does (the drafter's accuracy needs it)


BACKENDS = {b.name: b for b in (
    Backend("ours", _ours, per_row_weights=True, argmax=True),
    Backend("cce", _cce, per_row_weights=True, argmax=False),
    Backend("cce-exact", _cce_exact, per_row_weights=True, argmax=False),
    Backend("liger", _liger, per_row_weights=True, argmax=True),
    Backend("liger-sum", _liger_sum, per_row_weights=False, argmax=True),
)}


def decay_weights(rows: int, slots: int = 15, gamma: float = 7.0) -> torch.Tensor:
    """(rows,) fp32 DFlash decay weights, rows laid out as `slots` slots per block (block 16), summing to 1."""
    w = torch.exp(-torch.arange(slots, dtype=torch.float32) / gamma).repeat(-(-rows // slots))[:rows]  # (M,)
    return w / w.sum()


def _loss_and_grad(loss_of, h: torch.Tensor):
    """One untimed call: (loss fp32 (), hidden gradient fp32 (M, H))."""
    hh = h.detach().clone().requires_grad_(True)
    loss = loss_of(hh)
    loss.backward()
    return loss.detach().float(), hh.grad.float()


def _reference_fp32(W, h, y, w, chunk_size: int):
    """(loss, hidden gradient) in fp32 with plain torch ops, chunk by chunk: the yardstick for every backend's error,
    ours included (the bf16 backends round the logits and the gradient; which rounds least is the question)."""
    Wf = W.float()  # (V, H)
    loss = torch.zeros((), dtype=torch.float32, device=h.device)
    grad = torch.empty(h.shape, dtype=torch.float32, device=h.device)  # (M, H)
    for start in range(0, h.shape[0], chunk_size):
        sl = slice(start, start + chunk_size)
        hc = h[sl].float().requires_grad_(True)
        chunk_loss = (F.cross_entropy(hc @ Wf.t(), y[sl], reduction="none") * w[sl]).sum()
        (grad[sl],) = torch.autograd.grad(chunk_loss, hc)
        loss += chunk_loss.detach()
    return loss, grad


def _diffs(loss, grad, ref_loss, ref_grad, suffix: str) -> dict:
    """|loss - ref|, that over |ref|, max |grad - ref| and that over max |ref| (the gradient's scale)."""
    loss_diff = abs(loss - ref_loss).item()
    grad_diff = (grad - ref_grad).abs().max().item()
    return {f"loss_abs_{suffix}": loss_diff, f"loss_rel_{suffix}": loss_diff / max(abs(ref_loss.item()), 1e-30),
            f"grad_max_abs_{suffix}": grad_diff,
            f"grad_rel_{suffix}": grad_diff / max(ref_grad.abs().max().item(), 1e-30)}


def _logit_facts(W: torch.Tensor, h: torch.Tensor) -> dict:
    logits = (h[:256] @ W.t()).float()  # (256, V)
    p = torch.softmax(logits, dim=-1)
    return {"logit_std": round(logits.std().item(), 3),
            "p_below_bf16_filter": round((p < CCE_FILTER_BF16).float().mean().item(), 4)}


def _error(e: BaseException) -> str:
    msg = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"[:400]
    return f"{msg} ({WHEEL_HINT})" if isinstance(e, ImportError) else msg


def compare_backends(*, rows: int, hidden: int, vocab: int, dtype=torch.bfloat16, device: str = "cuda",
                     repeats: int = 10, backends=tuple(BACKENDS), chunk_size: int = 4096, hidden_std: float = 1.0,
                     seed: int = 0):
    """Yield one row per backend (see the module docstring); never raises for a backend's failure."""
    W, h, y = head_inputs(vocab_size=vocab, hidden=hidden, rows=rows, dtype=dtype, device=device, seed=seed,
                          hidden_std=hidden_std)
    assert not W.requires_grad  # the frozen head: no backend may spend a matmul on its gradient
    weightings = {True: decay_weights(rows).to(device), False: torch.full((rows,), 1.0 / rows, device=device)}
    # per_row_weights -> ((ours' loss, grad), (fp32 loss, grad), seconds of ours' first call); made on first need
    refs: dict[bool, tuple] = {}
    facts = _logit_facts(W, h)
    for name in backends:
        b = BACKENDS[name]
        w = weightings[b.per_row_weights]
        row = {"backend": name, "rows": rows, "hidden": hidden, "vocab": vocab, "dtype": str(dtype)[6:],
               "device": str(device), "hidden_std": hidden_std, "per_row_weights": b.per_row_weights,
               "argmax": b.argmax, **facts}
        try:
            if b.per_row_weights not in refs:
                t0 = time.perf_counter()
                ours_ref = _loss_and_grad(lambda hh: _ours(hh, W, y, w, chunk_size), h)
                ours_s = time.perf_counter() - t0
                refs[b.per_row_weights] = (ours_ref, _reference_fp32(W, h, y, w, chunk_size), ours_s)
            ours_ref, fp32_ref, ours_first_s = refs[b.per_row_weights]
            t0 = time.perf_counter()
            loss, grad = _loss_and_grad(lambda hh: b.loss(hh, W, y, w, chunk_size), h)
            # compile / JIT / autotune of this shape plus one call (ours compiled in its reference call, just above)
            first_s = ours_first_s if name == "ours" else time.perf_counter() - t0
            ms, peak = time_loss_backward(lambda hh: b.loss(hh, W, y, w, chunk_size),
                                          h.detach().clone().requires_grad_(True), repeats=repeats)
            if W.grad is not None:
                raise RuntimeError(f"{name} gave the frozen head a gradient: its time is not comparable")
            row.update(ms=round(ms, 3), peak_mem_mib=None if peak is None else round(peak, 1),
                       first_call_s=round(first_s, 2), loss=loss.item(),
                       **_diffs(loss, grad, *ours_ref, "diff"), **_diffs(loss, grad, *fp32_ref, "err_fp32"))
        except Exception as e:  # a missing package, a kernel that refuses the dtype or device, an OOM
            row["error"] = _error(e)
            if torch.device(device).type == "cuda":
                torch.cuda.empty_cache()
        yield row


def _summary_line(r: dict) -> str:
    head = f"{r['backend']:<10} V={r['vocab']:<7} rows={r['rows']:<6} H={r['hidden']:<5} {r['dtype']:<9}"
    if "error" in r:
        return f"{head} ERROR {r['error'][:160]}"
    mem = "-" if r["peak_mem_mib"] is None else f"{r['peak_mem_mib']:.0f} MiB"
    return (f"{head} {r['ms']:9.2f} ms {mem:>10}  vs ours: loss {r['loss_rel_diff']:.1e} grad "
            f"{r['grad_rel_diff']:.1e}  vs fp32: loss {r['loss_rel_err_fp32']:.1e} grad {r['grad_rel_err_fp32']:.1e}"
            f"  per-row w {str(r['per_row_weights']).lower():<5} first {r['first_call_s']} s")


def parse_case(text: str) -> dict:
    """'ROWSxHIDDENxVOCAB' or 'ROWSxHIDDENxVOCABxHIDDEN_STD' -> compare_backends' shape arguments."""
    parts = text.split("x")
    try:
        if len(parts) not in (3, 4):
            raise ValueError
        case = dict(rows=int(parts[0]), hidden=int(parts[1]), vocab=int(parts[2]))
        return {**case, "hidden_std": float(parts[3]) if len(parts) == 4 else 1.0}
    except ValueError:
        raise argparse.ArgumentTypeError(f"--cases {text!r}: write ROWSxHIDDENxVOCAB[xHIDDEN_STD], "
                                         "e.g. 30720x576x49152 or 30720x576x49152x8") from None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dflash_lab.benchmarks.fused_ce", description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=30720, help="supervised rows M (recipe: 32 x 64 anchors x 15 slots)")
    p.add_argument("--hidden", type=int, default=576)
    p.add_argument("--vocab", type=int, nargs="+", default=[49152])
    p.add_argument("--hidden-std", type=float, default=1.0, help="8 gives a peaked softmax at H=576")
    p.add_argument("--cases", type=parse_case, nargs="+",
                   help="several shapes in one process (one compile warm-up), instead of --rows/--hidden/--vocab")
    p.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=list(BACKENDS))
    p.add_argument("--chunk-size", type=int, default=4096, help="ours' rows per chunk (TrainConfig.loss_chunk_size)")
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    p.add_argument("--out", help="also append the JSON lines to this file")
    a = p.parse_args(argv)
    cases = a.cases or [dict(rows=a.rows, hidden=a.hidden, vocab=v, hidden_std=a.hidden_std) for v in a.vocab]
    sink = open(a.out, "a") if a.out else None
    for case in cases:
        for row in compare_backends(**case, dtype=getattr(torch, a.dtype), device=a.device, repeats=a.repeats,
                                    backends=tuple(a.backends), chunk_size=a.chunk_size):
            line = json.dumps(row)
            print(line, flush=True)  # flushed per row: a run cut by a timeout keeps what it measured
            if sink:
                sink.write(line + "\n")
                sink.flush()
            print(_summary_line(row), file=sys.stderr, flush=True)
    if sink:
        sink.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
