"""The chunked LM head + CE at the paper's shape, decay vs D-PACE (fwd + bwd ms, peak memory).

Qwen3-8B head (V 151936, H 4096), one sequence of 512 anchors x 15 supervised slots = 7680 rows, bf16, chunks of
4096 rows. D-PACE keeps per-row CE and scales the gradient rows after the loop: it should cost about the same.
Usage on a GPU machine, from the repo root:  python3 bench/dpace_head.py
"""

import json
import time

import torch

from dflash_lab.drafter.step import chunked_head_ce, dpace_head_ce

M, H, V, SLOTS, CHUNK, STEPS = 512 * 15, 4096, 151936, 15, 4096, 20


def main() -> None:
    g = torch.Generator(device="cuda").manual_seed(0)
    W = torch.randn(V, H, device="cuda", dtype=torch.bfloat16, generator=g) * 0.02
    h0 = torch.randn(M, H, device="cuda", dtype=torch.bfloat16, generator=g)
    y = torch.randint(0, V, (M,), device="cuda", generator=g)
    w = torch.ones(M, device="cuda") / 512
    runs = {"decay": lambda h: chunked_head_ce(h, W, y, w, CHUNK)[0],
            "dpace": lambda h: dpace_head_ce(h, W, y, w, CHUNK, 0.5, SLOTS)[0]}
    for name, fn in runs.items():
        h = h0.clone().requires_grad_(True)
        for _ in range(3):  # compile + warm-up
            fn(h).backward()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        for _ in range(STEPS):
            h.grad = None
            fn(h).backward()
        torch.cuda.synchronize()  # syncs
        ms = (time.perf_counter() - t0) / STEPS * 1e3
        print(json.dumps({"weighting": name, "rows": M, "vocab": V, "hidden": H, "chunk": CHUNK,
                          "fwd_bwd_ms": round(ms, 3), "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2),
                          "gpu": torch.cuda.get_device_name(0)}), flush=True)


if __name__ == "__main__":
    main()
