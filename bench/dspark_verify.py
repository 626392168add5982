"""The confidence head's adaptive verification on a trained DSpark arm of bench/recipe_ab.py, as the engines use it.

One process, one GPU, nothing else on it: the cost table first (CUDA-graph replays of one target forward over
q = 1..B tokens at batch 1, and of the drafter's draft stage), then every policy of VERIFY on the same prompts at
T=0 with the static decoder: tau with its interval, target tokens verified per token emitted, and the decode time
per token the cost table prices (what an engine that verifies only the chosen drafts would spend; our decoder
verifies every draft and keeps the chosen ones, so its measured time is the full verify's, reported beside).

    python bench/dspark_verify.py --work /tmp/ab --arm dspark --prompts 64 --out /tmp/ab/verify.json
    python bench/dspark_verify.py --work /tmp/ab --arm dspark --device cpu --prompts 2 --max-new-tokens 16  # CPU
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

VERIFY = {  # name -> VerifyPolicy arguments (the cost table is added to "cost" rules)
    "all": None,
    "cost-lag1": dict(rule="cost", lag=1),  # vLLM: the previous block's confidences price this block's verify
    "cost-lag0": dict(rule="cost", lag=0),  # the same rule with fresh confidences (SGLang with no relay lag)
    "threshold-0.5": dict(rule="threshold", threshold=0.5, lag=0),  # DeepSpec's evaluator
}


def _time_graph(fn, device, replays: int) -> float:
    """ms per replay of fn captured as a CUDA graph (eager calls timed on the CPU)."""
    if device.type != "cuda":
        t0 = time.perf_counter()
        for _ in range(replays):
            fn()
        return 1e3 * (time.perf_counter() - t0) / replays
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        fn(), fn()
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    graph.replay()
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize(device)
    return start.elapsed_time(end) / replays


@torch.no_grad()
def cost_table(target, drafter, block_size: int, prompt: list[int], replays: int) -> dict:
    """{verify_ms: [ms of one target forward over 1..B tokens], draft_ms: ms of the draft stage} at the prompt's
    length, on the decoder's own static caches."""
    from dflash_lab.evaluation.static_decode import StaticSpeculativeDecoder

    dec = StaticSpeculativeDecoder(target, drafter, block_size=block_size, graphs=False)
    dec.generate(prompt, max_new_tokens=8)  # caches filled, state set
    dev = dec.target_device
    p = len(prompt) + 8
    live = dec.bucket(p + block_size)
    ids = torch.full((1, block_size), int(prompt[-1]), dtype=torch.long, device=dev)
    pos = p + torch.arange(block_size, device=dev)
    verify = [_time_graph(lambda q=q: dec._target_step(ids[:, :q], pos[:q], live), dev, replays)
              for q in range(1, block_size + 1)]
    draft = _time_graph(lambda: dec._step(live, upto="draft"), dev, replays)
    return {"verify_ms": [round(v, 4) for v in verify], "draft_ms": round(draft, 4), "at_position": p}


def main(argv=None) -> int:
    from dflash_lab.evaluation.evaluate import plan_eval
    from dflash_lab.evaluation.export import load_drafter
    from dflash_lab.evaluation.intervals import tau_interval
    from dflash_lab.evaluation.prompts import load_prompts
    from dflash_lab.evaluation.static_decode import StaticSpeculativeDecoder
    from dflash_lab.evaluation.verify_budget import VerifyPolicy
    from dflash_lab.target.load import load_target, load_tokenizer

    ap = argparse.ArgumentParser(prog="python bench/dspark_verify.py", description=__doc__.split("\n")[0])
    ap.add_argument("--work", type=Path, required=True, help="bench/recipe_ab.py's work dir (ab.json)")
    ap.add_argument("--arm", default="dspark")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--sets", nargs="*", default=["chitchat-heldout", "general"])
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--replays", type=int, default=50)
    ap.add_argument("--time-budget-s", type=float, default=None, help="stop before a prompt past it")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    t_start = time.monotonic()
    state = json.loads((args.work / "ab.json").read_text())
    run_dir = state["arms"][args.arm]["run_dir"]
    sets = {k: v for k, v in state["sets"].items() if k in args.sets}
    plan = plan_eval(run_dir, prompts=sets, n_prompts=args.prompts, device=args.device,
                     max_new_tokens=args.max_new_tokens)
    src, drafter = load_drafter(run_dir)
    tok = load_tokenizer(plan.target)
    target = load_target(plan.target, device=plan.device, dtype=plan.dtype)
    drafter.to(device=plan.device, dtype=plan.dtype).eval()
    B = src.config.block_size
    prompts = {s: load_prompts(f, tok, messages=plan.selections[s].messages) for s, f in plan.prompt_files.items()}
    first = next(iter(prompts.values()))[0]
    costs = cost_table(target, drafter, B, first, args.replays)
    print(f"cost table at position {costs['at_position']}: verify {costs['verify_ms']} ms for 1..{B} tokens, "
          f"draft {costs['draft_ms']} ms", flush=True)
    out = {"arm": args.arm, "run_dir": run_dir, "step": src.step, "block_size": B, "device": str(plan.device),
           "dtype": str(plan.dtype), "gpu": torch.cuda.get_device_name(plan.device) if plan.device.type == "cuda"
           else "cpu", "costs": costs, "rows": []}
    pricing = VerifyPolicy(rule="cost", verify_ms=tuple(costs["verify_ms"]), draft_ms=costs["draft_ms"])
    for name, spec in VERIFY.items():
        policy = None if spec is None else VerifyPolicy(**spec, **({"verify_ms": tuple(costs["verify_ms"]),
                                                                    "draft_ms": costs["draft_ms"]}
                                                                   if spec["rule"] == "cost" else {}))
        dec = StaticSpeculativeDecoder(target, drafter, block_size=B, eos_token_id=tok.eos_token_id,
                                       graphs=plan.device.type == "cuda", verify_policy=policy)
        for s, ids_list in prompts.items():
            results = []
            for ids in ids_list:
                if args.time_budget_s and time.monotonic() - t_start > args.time_budget_s:
                    break
                results.append(dec.generate(ids, max_new_tokens=args.max_new_tokens))
            if not results:
                continue
            accepted = [a for r in results for a in r.accepted]
            verified = [v for r in results for v in r.verified]
            emitted = sum(accepted) + len(accepted)
            iv = tau_interval(results)
            priced = pricing.modeled_ms(verified)  # what the blocks' k-draft verifies cost on this GPU
            row = {"policy": name, "prompt_set": s, "prompts": len(results), "tau": round(emitted / len(accepted), 4),
                   "tau_low": iv.low if iv else None, "tau_high": iv.high if iv else None,
                   "verify_tokens_per_token": round(sum(1 + v for v in verified) / emitted, 4),
                   "mean_verified": round(sum(verified) / len(verified), 3),
                   "priced_ms_per_token": round(priced / emitted, 4),
                   "priced_speedup": round(costs["verify_ms"][0] / (priced / emitted), 3),
                   "measured_tokens_per_s": round(sum(len(r.output_ids) for r in results)
                                                  / sum(r.total_s for r in results), 1)}
            out["rows"].append(row)
            print(json.dumps(row), flush=True)
            if args.out:
                args.out.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
