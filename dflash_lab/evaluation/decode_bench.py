"""Micro-benchmark of speculative decoding: one iteration and its parts against one target-only step, and tokens/s.

    python -m dflash_lab.evaluation.decode_bench [--target smollm2-135m-instruct --drafter RUN [--checkpoint best]
        --prompts general --n-prompts 8] [--block-size 16] [--max-new-tokens 128] [--repeats 3] [--dtype bfloat16]
        [--device cuda] [--layers 30] [--draft-layers 3] [--skip-dynamic] [--temperature 1 --draft-sampling sample]

Without --target: a random-initialised target of the SmolLM2-135M shape (Llama, 30 layers, hidden 576, 9 heads /
3 KV heads, intermediate 1536, vocabulary 49,152, tied embeddings) and a random drafter, on a random prompt of
--prompt-len tokens: no weights needed, and a random drafter accepts ~nothing, so the figures are the COST of an
iteration. With --target (a model name or folder) the real model decodes real prompts of a prompt set, with the
drafter of --drafter (a run, checkpoint or export; a random one of --draft-layers without it): tau and tokens/s
are then what that drafter achieves. --temperature > 0 times speculative sampling (drafts of --draft-sampling,
seeded per prompt) and the target sampling alone; the parts line is timed greedy. One JSON line each (median over
`repeats` after a warm-up that captures the graphs):

  {"decoder", "block_size", "ms_per_iteration", "ms_per_token", "tokens_per_s", "tau", ...}  per decoder kind
        (static_graphs, static_eager, dynamic) at block B and at block 1 (the target alone)
  {"parts": true, "ingest_ms", "draft_ms", "verify_ms", "accept_ms", "iteration_ms", "target_step_ms", "ops": {...}}
        one static iteration split into its stages (static_decode.STAGES): on CUDA each prefix of the step is its
        own CUDA graph, replayed `--part-iters` times between CUDA events, and a part is the difference of two
        prefixes; on the CPU the same prefixes run eagerly. `ops` counts the aten kernels each part launches (at
        batch 1 a small model's step costs about its kernel count, so the counts explain the times)
  {"summary": true, "iteration_vs_target_step", "aim": 1.3, "tokens_per_s_speculative", "tokens_per_s_target_only",
   "speedup", "break_even_tau"}
        iteration_vs_target_step = static graphed iteration / graphed target-only step (the aim is <= 1.3 at block
        16 for SmolLM2 on an H200); break_even_tau = the tau above which speculative decoding pays.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

from dflash_lab.config import DrafterConfig
from dflash_lab.drafter.model import DFlashDrafter
from .speculative import SpeculativeDecoder
from .static_decode import STAGES, StaticSpeculativeDecoder
from dflash_lab.target.sampling import temperature_arg

SMOLLM2_135M_SHAPE = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                          num_attention_heads=9, num_key_value_heads=3, head_dim=64, max_position_embeddings=8192,
                          rope_theta=100000.0, tie_word_embeddings=True, rms_norm_eps=1e-5)
AIM = 1.3  # speculative iteration / target-only step at block 16 for SmolLM2 on an H200


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


def time_decoder(decoder, prompts: list[list[int]], *, max_new_tokens: int, repeats: int,
                 temperature: float = 0.0) -> dict:
    """Warm-up generation (captures graphs), then `repeats` passes over the prompts: medians of ms per iteration,
    ms per token and tokens/s (prefill included), and the pooled tau. At temperature > 0 prompt i samples with a
    generator seeded i in every pass."""
    def gen(i: int, p: list[int]):
        g = torch.Generator().manual_seed(i) if temperature > 0 else None
        return decoder.generate(p, max_new_tokens=max_new_tokens, temperature=temperature, generator=g)

    gen(0, prompts[0])
    per_it, per_tok, tps, taus = [], [], [], []
    for _ in range(repeats):
        rs = [gen(i, p) for i, p in enumerate(prompts)]
        its, secs = sum(r.iterations for r in rs), sum(r.decode_s for r in rs)
        per_it.append(1e3 * secs / max(1, its))
        per_tok.append(1e3 * secs / max(1, sum(len(r.output_ids) - 1 for r in rs)))  # token 1 comes from prefill
        tps.append(sum(len(r.output_ids) for r in rs) / sum(r.total_s for r in rs))
        taus.append(sum(sum(r.accepted) for r in rs) / max(1, its) + 1)
    return {"ms_per_iteration": round(statistics.median(per_it), 3),
            "ms_per_token": round(statistics.median(per_tok), 3), "tokens_per_s": round(statistics.median(tps), 1),
            "tau": round(statistics.median(taus), 3), "iterations": its, "prefill_ms": round(1e3 * rs[0].prefill_s, 2),
            "status": getattr(decoder, "graph_status", "dynamic loop (torch.cat caches, eager)"),
            "capture_s": round(getattr(decoder, "capture_s", 0.0), 3)}


def count_ops(fn) -> int:
    """aten operators `fn` runs that compute something (views left out): ~ the kernels it launches."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if not func.is_view:
                Count.n += 1
            return func(*args, **(kwargs or {}))

    with Count():
        fn()
    return Count.n


@torch.no_grad()
def time_stages(dec: StaticSpeculativeDecoder, prompt: list[int], *, iters: int) -> dict:
    """ms of each prefix of one static iteration (static_decode.STAGES), from the state after a short generation.
    Every prefix starts by restoring that state, so the differences are the parts alone."""
    dec.generate(prompt, max_new_tokens=4)
    saved = dec.state.clone()
    live = dec.bucket(int(saved[2]) + dec.block_size)
    stages = STAGES if dec.block_size > 1 else STAGES[2:]
    out, ops = {}, {}
    for stage in stages:
        def body(stage=stage):
            dec.state.copy_(saved)
            dec._step(live, stage)

        ops[stage] = count_ops(body)
        if dec.target_device.type == "cuda":
            out[stage] = _graph_ms(body, dec.target_device, iters)
        else:
            body()
            t0 = time.perf_counter()
            for _ in range(iters):
                body()
            out[stage] = 1e3 * (time.perf_counter() - t0) / iters
    return {"ms": out, "ops": ops}


def _graph_ms(body, device, iters: int) -> float:
    stream = torch.cuda.Stream(device=device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        body()
        body()
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        body()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        graph.replay()
    end.record()
    torch.cuda.synchronize(device)
    return start.elapsed_time(end) / iters


def parts_line(spec: dict, base: dict) -> dict:
    """Part times and op counts as differences of consecutive prefixes; the target-only step is block 1's whole
    step."""
    ms, ops = spec["ms"], spec["ops"]
    prev_ms = prev_ops = 0
    row = {"parts": True}
    counts = {}
    for stage in STAGES:
        row[f"{stage}_ms"] = round(ms[stage] - prev_ms, 4)
        counts[stage] = ops[stage] - prev_ops
        prev_ms, prev_ops = ms[stage], ops[stage]
    row.update(iteration_ms=round(ms["accept"], 4), target_step_ms=round(base["ms"]["accept"], 4),
               ops={**counts, "iteration": ops["accept"], "target_step": base["ops"]["accept"]})
    return row


def load_models(args, dev, dtype):
    """(target, drafter, prompts, eos) for the arguments: a random SmolLM2-shaped pair, or a real target."""
    if not args.target:
        target = random_llama_target(layers=args.layers, dtype=dtype, device=dev)
        drafter = random_drafter(target, block_size=args.block_size, draft_layers=args.draft_layers, dtype=dtype,
                                 device=dev)
        prompt = torch.randint(0, SMOLLM2_135M_SHAPE["vocab_size"] - 1, (args.prompt_len,),
                               generator=torch.Generator().manual_seed(1)).tolist()
        return target, drafter, [prompt], []
    from .export import load_drafter
    from .prompt_sets import resolve_sets
    from .prompts import load_prompts
    from dflash_lab.target.load import load_target, load_tokenizer

    tok = load_tokenizer(args.target)
    target = load_target(args.target, device=dev, dtype=dtype)
    if args.drafter:
        _, drafter = load_drafter(args.drafter, checkpoint=args.checkpoint)
        drafter = drafter.to(device=dev, dtype=dtype)
    else:
        drafter = random_drafter(target, block_size=args.block_size, draft_layers=args.draft_layers, dtype=dtype,
                                 device=dev)
    path = next(iter(resolve_sets(args.prompts, args.target).values()))
    return target, drafter, load_prompts(path, tok, n_prompts=args.n_prompts), tok.eos_token_id


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dflash_lab.evaluation.decode_bench", description=__doc__.split("\n")[0])
    ap.add_argument("--target", default=None, help="a real target (model name or folder); default: a random "
                    "SmolLM2-135M-shaped one")
    ap.add_argument("--drafter", default=None, help="run dir, checkpoint or export of a trained drafter (with "
                    "--target); default: a random drafter of --draft-layers")
    ap.add_argument("--checkpoint", default=None, help="with --drafter RUN: best | latest | step-N")
    ap.add_argument("--prompts", default="general", help="prompt set name or JSONL file (with --target)")
    ap.add_argument("--n-prompts", type=int, default=8, help="prompts per pass (with --target)")
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=128, help="random prompt length (without --target)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--part-iters", type=int, default=None, help="repeats per part timing (default 200 on CUDA, 5 "
                    "on the CPU)")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--layers", type=int, default=30, help="random target layers (30 = SmolLM2-135M)")
    ap.add_argument("--draft-layers", type=int, default=3)
    ap.add_argument("--skip-dynamic", action="store_true", help="skip the (slow) dynamic loop")
    ap.add_argument("--temperature", type=temperature_arg, default=0.0, help="> 0: time speculative sampling")
    ap.add_argument("--draft-sampling", default="argmax", choices=["argmax", "sample", "coupled"],
                    help="drafts at --temperature > 0 (speculative.py)")
    args = ap.parse_args(argv)
    dev, dtype = torch.device(args.device), getattr(torch, args.dtype)
    target, drafter, prompts, eos = load_models(args, dev, dtype)
    B = args.block_size
    meta = {"device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu", "torch": torch.__version__,
            "dtype": args.dtype, "target": args.target or f"random SmolLM2-135M shape, {args.layers} layers",
            "drafter": args.drafter or f"random, {args.draft_layers} layers", "prompts": len(prompts),
            "max_new_tokens": args.max_new_tokens, "temperature": args.temperature,
            "draft_sampling": args.draft_sampling if args.temperature > 0 else "argmax"}
    kinds = ([("static_graphs", True)] if dev.type == "cuda" else []) + [("static_eager", False)] + \
        ([] if args.skip_dynamic else [("dynamic", None)])
    figures = {}
    for b in (B, 1):
        for kind, graphs in kinds:
            d = drafter if b > 1 else None
            mode = args.draft_sampling if b > 1 else "argmax"
            if graphs is None:
                dec = SpeculativeDecoder(target, d, block_size=b, eos_token_id=eos, draft_sampling=mode)
            else:
                dec = StaticSpeculativeDecoder(target, d, block_size=b, eos_token_id=eos, graphs=graphs,
                                               draft_sampling=mode)
            figures[(kind, b)] = time_decoder(dec, prompts, max_new_tokens=args.max_new_tokens,
                                              repeats=args.repeats, temperature=args.temperature)
            print(json.dumps({"decoder": kind, "block_size": b, **figures[(kind, b)], **meta}), flush=True)
            if graphs is not False:
                continue
            figures[("stages", b)] = time_stages(StaticSpeculativeDecoder(target, d, block_size=b, eos_token_id=eos,
                                                                          graphs=False), prompts[0],
                                                 iters=args.part_iters or (200 if dev.type == "cuda" else 5))
    print(json.dumps({**parts_line(figures[("stages", B)], figures[("stages", 1)]), "block_size": B,
                      "timed": "CUDA graphs per prefix" if dev.type == "cuda" else "eager (CPU)", **meta}), flush=True)
    kind = kinds[0][0]
    spec, base = figures[(kind, B)], figures[(kind, 1)]
    ratio = spec["ms_per_iteration"] / base["ms_per_token"]
    print(json.dumps({"summary": True, "decoder": kind, "block_size": B,
                      "spec_ms_per_iteration": spec["ms_per_iteration"],
                      "target_only_ms_per_token": base["ms_per_token"], "iteration_vs_target_step": round(ratio, 3),
                      "aim": AIM, "meets_aim": ratio <= AIM, "tau": spec["tau"],
                      "tokens_per_s_speculative": spec["tokens_per_s"],
                      "tokens_per_s_target_only": base["tokens_per_s"],
                      "speedup": round(spec["tokens_per_s"] / base["tokens_per_s"], 3),
                      "break_even_tau": round(ratio, 2),
                      **meta}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
