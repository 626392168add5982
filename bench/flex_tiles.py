"""The drafter's attention alone (forward + backward, one layer), at the recipe shape and the paper shape, in the
ways the block mask and the flex kernel can be tiled: where did the ~6 ms of flex attention of the compiled batch-32
step go (bench/results/2026-12-06-h100-flex-split/)?

    python bench/flex_tiles.py [--shape recipe|paper] [--variants base split split-compiled ...] > flex.jsonl

Variants (every one over the same q/k/v and anchors; `max_abs_diff`, `dq_diff`... against `base`'s output and
gradients):
  base      one flex call over [context | every block's slots]: the BlockMask from the dense mask in 128 x 128
            tiles, flex compiled with defaults (the engine's path before the split; long windows' path still)
  b64       64 x 64 tiles (fewer keys per query row: a query tile holds 4 blocks, not 8)
  q64       64-row query tiles, 128-column key tiles
  autotune  base's tiles, flex compiled with mode="max-autotune-no-cudagraphs" (inductor picks among its configs)
  sdpa      the dense bool mask through scaled_dot_product_attention (the "sdpa" backend)
  split     the split formulation eager around the compiled flex kernel (model._attend_blocks_eager): flex over
            the context keys only (tiles wholly below a query tile's first anchor are full) and each block's
            16 x 16 scores as one batched matmul, merged through both parts' log-sum-exp; no key tile is spent
            on other blocks' slots
  split-compiled  the library's path (model.attend_blocks: the same compiled as one function on CUDA, as the
            engine runs it with or without compile_drafter)
One JSON line per variant: fwd_ms, fwd_bwd_ms (median of --repeats, CUDA events), tiles visited, error if it failed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from dflash_lab.drafter.blocks import (block_mask_from_dense, dense_mask, flex_block_mask, flex_mask_mod,  # noqa: E402
                                       sample_anchors)
from dflash_lab.benchmarks.soft_labels import time_ms  # noqa: E402
from dflash_lab.drafter.model import _attend_blocks_eager, attend_blocks  # noqa: E402

SHAPES = {  # batch, heads, kv heads, head dim, seq len, anchors, block
    "recipe": dict(b=32, h=9, kvh=3, d=64, S=320, N=64, B=16),  # SmolLM2-135M drafter, 3 layers' one layer
    "paper": dict(b=1, h=32, kvh=8, d=128, S=3072, N=512, B=16),  # Qwen3-8B drafter
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="recipe", choices=sorted(SHAPES))
    ap.add_argument("--variants", nargs="+",
                    default=["base", "split", "split-compiled", "b64", "q64", "autotune", "sdpa"])
    ap.add_argument("--repeats", type=int, default=20)
    a = ap.parse_args(argv)
    from torch.nn.attention.flex_attention import flex_attention

    dev = torch.device("cuda")
    s = SHAPES[a.shape]
    b, h, kvh, d, S, N, B = (s[k] for k in ("b", "h", "kvh", "d", "S", "N", "B"))
    g = torch.Generator().manual_seed(0)
    loss_mask = torch.zeros(b, S, dtype=torch.bool)
    starts = torch.randint(S // 8, S // 3, (b,), generator=g)  # a prompt, then the supervised answer
    for i in range(b):
        loss_mask[i, starts[i]:] = True
    anchors, valid = sample_anchors(loss_mask, N, g)
    anchors, valid = anchors.to(dev), valid.to(dev)
    Q, KV = N * B, S + N * B
    q = torch.randn(b, h, Q, d, generator=g).to(dev, torch.bfloat16).requires_grad_()
    k = torch.randn(b, kvh, KV, d, generator=g).to(dev, torch.bfloat16).requires_grad_()
    v = torch.randn(b, kvh, KV, d, generator=g).to(dev, torch.bfloat16).requires_grad_()
    go = torch.randn(b, h, Q, d, generator=g).to(dev, torch.bfloat16)
    dense = dense_mask(anchors, valid, seq_len=S, block_size=B)
    mod = flex_mask_mod(anchors, valid, seq_len=S, block_size=B, context_only=False)  # [context | blocks]
    compiled = torch.compile(flex_attention, dynamic=False)
    ref = None
    for name in a.variants:
        row = {"variant": name, "shape": a.shape, **s, "device": torch.cuda.get_device_name(dev),
               "torch": torch.__version__}
        try:
            t0 = time.perf_counter()
            if name == "sdpa":
                seen = dense.any(-1, keepdim=True)
                safe = dense | ~seen & (torch.arange(KV, device=dev) == 0)
                fn = lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=safe, enable_gqa=True)  # noqa: E731
            elif name in ("split", "split-compiled"):
                bm = flex_block_mask(anchors, valid, seq_len=S, block_size=B, context_only=True)
                row.update(tiles=[128, 128], partial_tiles=int(bm.kv_num_blocks.sum()),
                           full_tiles=int(bm.full_kv_num_blocks.sum()))
                split = attend_blocks if name == "split-compiled" else _attend_blocks_eager
                fn = lambda: split(q, (k[:, :, :S], v[:, :, :S]), (k[:, :, S:], v[:, :, S:]), bm,  # noqa: E731
                                   block_size=B, causal=False)
            else:
                tiles = {"b64": (64, 64), "q64": (64, 128)}.get(name, (128, 128))
                bm = block_mask_from_dense(dense, mod, tiles)
                row.update(tiles=list(tiles), partial_tiles=int(bm.kv_num_blocks.sum()),
                           full_tiles=int(bm.full_kv_num_blocks.sum()))
                opts = {"BLOCK_M": tiles[0], "BLOCK_N": tiles[1]} if name in ("b64", "q64") else None
                flex = (torch.compile(flex_attention, dynamic=False, mode="max-autotune-no-cudagraphs")
                        if name == "autotune" else compiled)
                fn = lambda: flex(q, k, v, block_mask=bm, enable_gqa=True, kernel_options=opts)  # noqa: E731,B023
            out = fn()
            out.backward(go)
            torch.cuda.synchronize()
            row["first_call_s"] = round(time.perf_counter() - t0, 1)
            with torch.no_grad():
                row["fwd_ms"] = round(time_ms(fn, repeats=a.repeats, device=dev), 3)

            def fwd_bwd():
                q.grad = k.grad = v.grad = None
                fn().backward(go)

            row["fwd_bwd_ms"] = round(time_ms(fwd_bwd, repeats=a.repeats, device=dev), 3)
            fwd_bwd()
            got = [fn().detach().float()] + [t.grad.float() for t in (q, k, v)]
            if ref is None:
                ref = got
            for key, x, y in zip(("max_abs_diff", "dq_diff", "dk_diff", "dv_diff"), got, ref):
                row[key] = float((x - y).abs().max())
        except Exception as exc:  # one variant's failure (a kernel option inductor refuses) leaves the others
            row["error"] = f"{type(exc).__name__}: {str(exc)[:400]}"
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
