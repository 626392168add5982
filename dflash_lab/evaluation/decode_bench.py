"""Micro-benchmark of speculative decoding per iteration: dynamic loop vs static caches eager vs CUDA graphs.

    python -m dflash_lab.evaluation.decode_bench [--block-size 16] [--prompt-len 128] [--max-new-tokens 128] [--repeats 3]
                                      [--dtype bfloat16] [--device cuda] [--layers 30]

A random-initialised target of the SmolLM2-135M shape (Llama, 30 layers, hidden 576, 9 heads / 3 KV heads,
intermediate 1536, vocabulary 49,152, tied embeddings) and a random 3-layer drafter at batch size 1; no weights
needed. A random drafter accepts ~nothing, so every iteration emits ~1 token: the figure is the cost of one
iteration (ingest + draft + verify) and of one target-only token (block size 1), in milliseconds, median over
`repeats` generations after a warm-up (graph capture happens there and is printed separately). With those two
numbers a drafter of acceptance length tau speeds decoding up by tau * target_ms_per_token / spec_ms_per_iteration
(printed as break_even_tau: the tau at which speculative decoding starts to pay). One JSON line per configuration.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch

from dflash_lab.config import DrafterConfig
from dflash_lab.drafter.model import DFlashDrafter
from .speculative import SpeculativeDecoder
from .static_decode import StaticSpeculativeDecoder

SMOLLM2_135M_SHAPE = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                          num_attention_heads=9, num_key_value_heads=3, head_dim=64, max_position_embeddings=8192,
                          rope_theta=100000.0, tie_word_embeddings=True, rms_norm_eps=1e-5)


def random_llama_target(*, layers: int, dtype: torch.dtype, device: torch.device, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(**{**SMOLLM2_135M_SHAPE, "num_hidden_layers": layers})
    cfg._attn_implementation = "sdpa"
    return LlamaForCausalLM(cfg).to(device=device, dtype=dtype).eval().requires_grad_(False)


def random_drafter(target, *, block_size: int, draft_layers: int, dtype, device, seed: int = 0) -> DFlashDrafter:
    n_feats = min(5, max(1, target.config.num_hidden_layers - 3))
    cfg = DrafterConfig.from_target(target.config, num_draft_layers=draft_layers, block_size=block_size,
                                    num_target_features=n_feats,
                                    mask_token_id=target.config.vocab_size - 1)
    d = DFlashDrafter(cfg)
    d.init_weights(torch.Generator().manual_seed(seed))
    return d.to(device=device, dtype=dtype).eval().requires_grad_(False)


def time_decoder(decoder, prompt: list[int], *, max_new_tokens: int, repeats: int) -> dict:
    """Warm-up generation (captures graphs), then `repeats` timed ones: median ms per iteration and per token."""
    decoder.generate(prompt, max_new_tokens=max_new_tokens)
    per_it, per_tok, taus = [], [], []
    for _ in range(repeats):
        r = decoder.generate(prompt, max_new_tokens=max_new_tokens)
        per_it.append(1e3 * r.decode_s / max(1, r.iterations))
        per_tok.append(1e3 * r.decode_s / max(1, len(r.output_ids) - 1))  # the first token comes from the prefill
        taus.append(r.tau)
    return {"ms_per_iteration": round(statistics.median(per_it), 3),
            "ms_per_token": round(statistics.median(per_tok), 3), "tau": round(statistics.median(taus), 3),
            "iterations": r.iterations, "prefill_ms": round(1e3 * r.prefill_s, 2),
            "status": getattr(decoder, "graph_status", "dynamic loop (torch.cat caches, eager)"),
            "capture_s": round(getattr(decoder, "capture_s", 0.0), 3)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dflash_lab.evaluation.decode_bench", description=__doc__.split("\n")[0])
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--layers", type=int, default=30, help="target layers (30 = SmolLM2-135M)")
    ap.add_argument("--draft-layers", type=int, default=3)
    ap.add_argument("--skip-dynamic", action="store_true", help="skip the (slow) dynamic loop")
    args = ap.parse_args(argv)
    dev, dtype = torch.device(args.device), getattr(torch, args.dtype)
    target = random_llama_target(layers=args.layers, dtype=dtype, device=dev)
    drafter = random_drafter(target, block_size=args.block_size, draft_layers=args.draft_layers, dtype=dtype,
                             device=dev)
    prompt = torch.randint(0, SMOLLM2_135M_SHAPE["vocab_size"] - 1, (args.prompt_len,),
                           generator=torch.Generator().manual_seed(1)).tolist()
    meta = {"device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu", "torch": torch.__version__,
            "dtype": args.dtype, "target_layers": args.layers, "draft_layers": args.draft_layers,
            "prompt_len": args.prompt_len, "max_new_tokens": args.max_new_tokens}
    kinds = [("static_graphs", True), ("static_eager", False)] + ([] if args.skip_dynamic else [("dynamic", None)])
    figures = {}
    for B in (args.block_size, 1):
        for kind, graphs in kinds:
            d = drafter if B > 1 else None
            if graphs is None:
                dec = SpeculativeDecoder(target, d, block_size=B, eos_token_id=[])
            else:
                dec = StaticSpeculativeDecoder(target, d, block_size=B, eos_token_id=[], graphs=graphs)
            row = time_decoder(dec, prompt, max_new_tokens=args.max_new_tokens, repeats=args.repeats)
            figures[(kind, B)] = row
            print(json.dumps({"decoder": kind, "block_size": B, **row, **meta}), flush=True)
            del dec
    for kind, _ in kinds:
        spec, base = figures[(kind, args.block_size)], figures[(kind, 1)]
        print(json.dumps({"decoder": kind, "summary": True, "block_size": args.block_size,
                          "spec_ms_per_iteration": spec["ms_per_iteration"],
                          "target_only_ms_per_token": base["ms_per_token"],
                          "break_even_tau": round(spec["ms_per_iteration"] / base["ms_per_token"], 2)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
