"""Head-time bench of draft-vocabulary pruning: step.chunked_head_ce (forward + input gradient) with the
full target vocabulary vs pruned draft vocabularies, same rows. Results: docs/ablations.md (## draft vocabulary).

    python -m dflash_lab.benchmarks.vocab_head [--vocab 49152 --hidden 576 --rows 4096]
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from dflash_lab.drafter.step import chunked_head_ce


def head_inputs(*, vocab_size: int, hidden: int, rows: int, dtype, device: str, seed: int = 0,
                hidden_std: float = 1.0):
    """Random frozen head W (V, H) ~ N(0, 0.02^2), hidden rows h (M, H) ~ N(0, hidden_std^2), labels (M,).
    Logit std is 0.02 * sqrt(H) * hidden_std (0.48 at H=576 with the default: a near-uniform softmax)."""
    g = torch.Generator().manual_seed(seed)
    W = (torch.randn(vocab_size, hidden, generator=g) * 0.02).to(device, dtype)
    h = (torch.randn(rows, hidden, generator=g) * hidden_std).to(device, dtype)
    y = torch.randint(0, vocab_size, (rows,), generator=g).to(device)
    return W, h, y


def time_loss_backward(loss_of, hidden: torch.Tensor, *, repeats: int, warmup: int = 1) -> tuple[float, float | None]:
    """(min ms over `repeats` of loss_of(h).backward(), peak CUDA memory above the start in MiB; None off CUDA).

    `hidden` is a leaf that requires grad; its .grad is dropped before each call, so the gradient's allocation counts.
    """
    cuda = hidden.device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    for _ in range(warmup):  # compile, autotune, allocator warm-up
        hidden.grad = None
        loss_of(hidden).backward()
    sync()
    hidden.grad = None
    if cuda:
        torch.cuda.reset_peak_memory_stats(hidden.device)
        start = torch.cuda.memory_allocated(hidden.device)
    times = []
    for _ in range(repeats):
        hidden.grad = None
        t0 = time.perf_counter()
        loss_of(hidden).backward()
        sync()  # the device finished: the time is real
        times.append(time.perf_counter() - t0)
    peak = (torch.cuda.max_memory_allocated(hidden.device) - start) / 2**20 if cuda else None
    return 1000 * min(times), peak


def bench_head(*, vocab_size: int = 49152, hidden: int = 576, rows: int = 4096, sizes=(8192, 16384, 32768),
               chunk_size: int = 4096, repeats: int = 3, dtype=torch.float32, device: str = "cpu",
               seed: int = 0) -> list[dict]:
    """Wall time of step.chunked_head_ce (forward + input gradient) for V rows and each pruned d, same rows.
    Defaults: SmolLM2-135M's vocabulary and hidden size, 4096 supervised rows (e.g. 4 seqs x 64 anchors x 16)."""
    W, h, y = head_inputs(vocab_size=vocab_size, hidden=hidden, rows=rows, dtype=dtype, device=device, seed=seed)
    w = torch.full((rows,), 1.0 / rows, device=device)
    out = []
    for d in (vocab_size, *sizes):
        Wd = W[:d].contiguous()
        yd = y % d
        ms, _ = time_loss_backward(lambda hh: chunked_head_ce(hh, Wd, yd, w, chunk_size)[0],
                                   h.clone().requires_grad_(True), repeats=repeats)
        out.append({"vocab": d, "rows": rows, "hidden": hidden, "device": str(device), "dtype": str(dtype)[6:],
                    "ms": round(ms, 2)})
    full = out[0]["ms"]
    for r in out:
        r["speedup"] = round(full / r["ms"], 2)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dflash_lab.benchmarks.vocab_head", description=__doc__.splitlines()[0])
    p.add_argument("--vocab", type=int, default=49152)
    p.add_argument("--hidden", type=int, default=576)
    p.add_argument("--rows", type=int, default=4096)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--sizes", type=int, nargs="+", default=[8192, 16384, 32768])
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    a = p.parse_args(argv)
    for row in bench_head(vocab_size=a.vocab, hidden=a.hidden, rows=a.rows, sizes=tuple(a.sizes), repeats=a.repeats,
                          dtype=getattr(torch, a.dtype), device=a.device):
        print(json.dumps(row))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
