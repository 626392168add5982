"""Time of distillation's targets: target/soft_labels.top_k_distribution (selection on the head's bf16 logits, the
normaliser in place) against the plain formulation it replaced (fp32 logits, divided by the temperature, topk and
logsumexp over them), same rows, same head, one JSON line per (formulation, k).

    python -m dflash_lab.benchmarks.soft_labels [--rows 10240 --hidden 576 --vocab 49152 --k 16 64]

Defaults: one batch of the SmolLM2 recipe (32 windows of 320 positions) through SmolLM2-135M's head. In a run this
cost is paid once per window (the feature store keeps the result), i.e. in the first epoch and after every resume.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from dflash_lab.target.soft_labels import LOGITS_BYTES, top_k_distribution


@torch.no_grad()
def plain_top_k(hidden: torch.Tensor, head_weight: torch.Tensor, *, k: int, temperature: float):
    """The formulation before: each chunk's logits copied to fp32, divided, then topk and logsumexp over them."""
    flat = hidden.reshape(-1, hidden.shape[-1])
    V = head_weight.shape[0]
    ids = torch.empty(flat.shape[0], k, dtype=torch.int32, device=flat.device)
    logp = torch.empty(flat.shape[0], k, dtype=torch.float32, device=flat.device)
    rows = max(1, LOGITS_BYTES // (4 * V))
    for start in range(0, flat.shape[0], rows):
        sl = slice(start, min(start + rows, flat.shape[0]))
        logits = (flat[sl] @ head_weight.t()).float() / temperature
        top, idx = logits.topk(k, dim=-1)
        logp[sl] = top - torch.logsumexp(logits, dim=-1, keepdim=True)
        ids[sl] = idx.to(torch.int32)
    return ids, logp


def time_ms(fn, *, repeats: int, device: torch.device) -> float:
    """Median milliseconds of fn() over `repeats` after one warm-up call (CUDA: timed with events)."""
    fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return sorted(times)[len(times) // 2]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=10_240)
    ap.add_argument("--hidden", type=int, default=576)
    ap.add_argument("--vocab", type=int, default=49_152)
    ap.add_argument("--k", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args(argv)
    if a.rows < 1 or a.hidden < 1 or a.vocab < 2 or a.repeats < 1 or a.temperature <= 0 or min(a.k) < 1:
        ap.error(f"rows={a.rows}, hidden={a.hidden}, vocab={a.vocab}, k={a.k}, temperature={a.temperature}, "
                 f"repeats={a.repeats}: every size >= 1 (vocab >= 2) and temperature > 0, e.g. the defaults")
    device = torch.device(a.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    g = torch.Generator().manual_seed(0)
    head = (torch.randn(a.vocab, a.hidden, generator=g) * 0.1).to(device, dtype)  # logit std ~2.4 at H=576
    hidden = torch.randn(1, a.rows, a.hidden, generator=g).to(device, dtype)
    norm = torch.nn.Identity()  # the hidden rows stand for the final norm's output
    for k in a.k:
        ours = lambda: top_k_distribution(hidden, norm, head, k=k, temperature=a.temperature)  # noqa: E731
        plain = lambda: plain_top_k(hidden, head, k=k, temperature=a.temperature)  # noqa: E731
        (ids, logp), (ref_ids, ref_logp) = ours(), plain()
        ids, logp = ids.reshape(ref_ids.shape), logp.reshape(ref_logp.shape)
        same_ids = bool(torch.equal(ids.sort(-1).values, ref_ids.sort(-1).values))  # as sets: ties may swap
        err = float((logp.sort(-1).values - ref_logp.sort(-1).values).abs().max())
        for name, fn in (("top_k_distribution", ours), ("plain_fp32", plain)):
            ms = time_ms(fn, repeats=a.repeats, device=device)
            print(json.dumps({"formulation": name, "k": k, "ms": round(ms, 3),
                              "rows": a.rows, "hidden": a.hidden, "vocab": a.vocab, "dtype": str(dtype),
                              "temperature": a.temperature, "same_ids": same_ids, "max_logp_diff": err,
                              "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                              "torch": torch.__version__}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
