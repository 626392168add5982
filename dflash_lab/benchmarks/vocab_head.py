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


def bench_head(*, vocab_size: int = 49152, hidden: int = 576, rows: int = 4096, sizes=(8192, 16384, 32768),
               chunk_size: int = 4096, repeats: int = 3, dtype=torch.float32, device: str = "cpu",
               seed: int = 0) -> list[dict]:
    """Wall time of step.chunked_head_ce (forward + input gradient) for V rows and each pruned d, same rows.
    Defaults: SmolLM2-135M's vocabulary and hidden size, 4096 supervised rows (e.g. 4 seqs x 64 anchors x 16)."""
    g = torch.Generator().manual_seed(seed)
    W = (torch.randn(vocab_size, hidden, generator=g) * 0.02).to(device, dtype)
    h = torch.randn(rows, hidden, generator=g).to(device, dtype)
    y = torch.randint(0, vocab_size, (rows,), generator=g).to(device)
    w = torch.full((rows,), 1.0 / rows, device=device)
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    out = []
    for d in (vocab_size, *sizes):
        Wd = W[:d].contiguous()
        yd = y % d
        hh = h.clone().requires_grad_(True)
        loss, _ = chunked_head_ce(hh, Wd, yd, w, chunk_size)  # warm-up
        loss.backward()
        sync()
        times = []
        for _ in range(repeats):
            hh.grad = None
            t0 = time.perf_counter()
            loss, _ = chunked_head_ce(hh, Wd, yd, w, chunk_size)
            loss.backward()
            sync()  # the device finished: the time is real
            times.append(time.perf_counter() - t0)
        out.append({"vocab": d, "rows": rows, "hidden": hidden, "device": str(device), "dtype": str(dtype)[6:],
                    "ms": round(1000 * min(times), 2)})
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
