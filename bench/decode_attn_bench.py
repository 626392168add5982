"""Decode attention micro-benchmark on one GPU: the engine's masked sdpa grouped path (every row over the span of the
longest row) vs the per-row Triton kernel (each row over its own keys), one layer's attention at SmolLM2's shape.

    python bench/decode_attn_bench.py                    # bf16, B 256/512/1024, cache 2048, two length mixes
    python bench/decode_attn_bench.py --dtype float32 --batch-sizes 512

Per case (B, row lengths "uniform" 200-400 or "spread" 100-2000, every-turn-like) one JSON line on stdout: ms per
call of each path (median of --reps CUDA-graph replays after warm-up, CUDA events; each graph holds --calls calls so
launch gaps do not count), the K/V bytes each path reads (sdpa: B x span keys; triton: the keys rows hold) and the
effective GB/s, and the largest difference between the two outputs. Runs in well under a minute on an H200.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from dflash_lab.target.decode_attention import BLOCK_N, triton_decode_attention  # noqa: E402
from dflash_lab.target.gen_kernels import grouped_decode_attention  # noqa: E402
from dflash_lab.target.static_cache import bucket, length_ladder  # noqa: E402

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}
MIXES = {"uniform": (200, 400), "spread": (100, 2000)}


def sdpa_path(q, k, v, mask, scale):
    attn = torch.nn.Module()
    attn.num_key_value_groups, attn.is_causal = q.shape[1] // k.shape[1], True
    return grouped_decode_attention(attn, q, k, v, mask, scaling=scale)[0]


def time_graph(fn, calls: int, reps: int) -> float:
    """Median ms of one call: `calls` calls captured in one graph, replayed `reps` times after warm-up."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    for _ in range(5):
        graph.replay()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / calls)
    return statistics.median(times)


def one_case(B: int, mix: str, *, dtype, cache_len: int, kvh: int, g: int, d: int, calls: int, reps: int,
             seed: int) -> dict:
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(seed)
    lo, hi = MIXES[mix]
    lengths = torch.randint(lo, hi + 1, (B,), device=dev, generator=gen)
    span = bucket(length_ladder(cache_len), int(lengths.max()))
    cache_k = torch.randn(B, kvh, cache_len, d, device=dev, dtype=dtype, generator=gen)
    cache_v = torch.randn(B, kvh, cache_len, d, device=dev, dtype=dtype, generator=gen)
    k, v = cache_k[:, :, :span], cache_v[:, :, :span]  # the engine's views: the live length bucket
    q = torch.randn(B, 1, kvh * g, d, device=dev, dtype=dtype, generator=gen).transpose(1, 2)
    mask = (torch.arange(span, device=dev)[None] < lengths[:, None])[:, None, None]  # (B, 1, 1, span)
    scale = d ** -0.5
    diff = (sdpa_path(q, k, v, mask, scale).float() - triton_decode_attention(q, k, v, lengths, scale).float())
    per_key = kvh * d * 2 * cache_k.element_size()  # K and V of one position, all KV heads
    read = {"sdpa": B * span * per_key, "triton": int(lengths.sum()) * per_key}
    ms = {"sdpa": time_graph(lambda: sdpa_path(q, k, v, mask, scale), calls, reps),
          "triton": time_graph(lambda: triton_decode_attention(q, k, v, lengths, scale), calls, reps)}
    row = {"case": f"B{B}-{mix}", "batch": B, "lengths": mix, "min_len": int(lengths.min()),
           "max_len": int(lengths.max()), "mean_len": round(float(lengths.float().mean()), 1), "span": span,
           "cache_len": cache_len, "dtype": str(dtype).removeprefix("torch."), "kv_heads": kvh, "groups": g,
           "head_dim": d, "block_n": BLOCK_N, "max_abs_diff": round(diff.abs().max().item(), 6),
           "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__}
    for name in ("sdpa", "triton"):
        row[f"{name}_ms"] = round(ms[name], 4)
        row[f"{name}_kv_gb"] = round(read[name] / 1e9, 4)
        row[f"{name}_gb_per_s"] = round(read[name] / 1e9 / (ms[name] / 1e3), 1)
    row["speedup"] = round(ms["sdpa"] / ms["triton"], 2)
    del cache_k, cache_v, k, v
    torch.cuda.empty_cache()
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES))
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[256, 512, 1024])
    p.add_argument("--mixes", nargs="+", default=list(MIXES), choices=list(MIXES))
    p.add_argument("--cache-len", type=int, default=2048)
    p.add_argument("--kv-heads", type=int, default=3)
    p.add_argument("--groups", type=int, default=3, help="query heads per KV head")
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--calls", type=int, default=10, help="calls per captured graph")
    p.add_argument("--reps", type=int, default=200, help="timed graph replays (median)")
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("decode_attn_bench: needs a CUDA GPU (none visible). Fix: run it on the H200.", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    for B in a.batch_sizes:
        for mix in a.mixes:
            print(json.dumps(one_case(B, mix, dtype=DTYPES[a.dtype], cache_len=a.cache_len, kvh=a.kv_heads,
                                      g=a.groups, d=a.head_dim, calls=a.calls, reps=a.reps, seed=B)), flush=True)
    print(f"decode_attn_bench: {len(a.batch_sizes) * len(a.mixes)} cases in {time.perf_counter() - t0:.1f} s",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
