"""`python -m dflash_lab.benchmarks.step --shape paper|micro|long|big|tiny ...`: the training-step benchmark, one JSON line per
configuration (stdout; progress on stderr).

    python -m dflash_lab.benchmarks.step --shape paper --gpus 0                         # 1 GPU, colocated, CUDA graphs
    python -m dflash_lab.benchmarks.step --shape paper --gpus 0,1                       # 2 GPUs, colocated
    python -m dflash_lab.benchmarks.step --shape big --gpus 1 --target-gpus 0           # split: target GPU0 -> drafter GPU1
    python -m dflash_lab.benchmarks.step --shape paper --gpus 0 --variants graph,eager,compile,compile-eager
    python -m dflash_lab.benchmarks.step --shape paper --gpus 0 --ttfs                  # Trainer construction -> first step
    python -m dflash_lab.benchmarks.step --shape tiny --device cpu --steps 3            # the same path on a CPU
    python -m dflash_lab.benchmarks.step --shape paper --drafter-layers mixed --variants graph,compile   # the compile trap shape
    python -m dflash_lab.benchmarks.step --shape paper --variants graph,graph-fp8,compile-fp8 --fp8-error  # FP8 target/drafter
    python -m dflash_lab.benchmarks.step --shape recipe --batch-size 32 --drafter-variants dflash,dspark,dspark@8

Targets are random-initialised real architectures (bench_configs/*.json) built on the GPU, so nothing is
downloaded. Batches are synthetic and fixed-shape: random tokens, the first 1/8 of each sequence is "prompt" (no
loss), `num_anchors` valid anchors per sequence, resampled every step (the flex mask changes every step, as in
training). Each step runs the engine exactly as the Trainer does (target forward + drafter forward/backward + sum of
gradients + AdamW, loss read back to the host). Timing excludes loading, warm-up and capture (reported separately):
median wall time of the measured steps. MFU uses the FLOP model of docs/performance.md (split printed) against
989 TFLOP/s (H200/H100 dense bf16).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gc
import json
import os
import platform
import statistics
import sys
import time

import torch

from dflash_lab.drafter.blocks import sample_anchors
from dflash_lab.drafter.loss_weights import DECAY, LossWeighting, global_block_batch, loss_weighting_of
from dflash_lab.benchmarks import step_variants
from dflash_lab.benchmarks.pinned import PINNED  # the fields a run would choose for the target, pinned (pinned.py)
from dflash_lab.config import TrainConfig
from dflash_lab.config.target_defaults import default_gamma
from dflash_lab.runs.metrics import JsonlSink
from dflash_lab.train.prepare import prepare_run
from dflash_lab.target.load import load_targets

SHAPES = {
    "tiny": dict(target="bench:tiny", seq_len=128, num_anchors=8, block_size=16),
    "micro": dict(target="bench:qwen3-8b", seq_len=768, num_anchors=256, block_size=16),
    "paper": dict(target="bench:qwen3-8b", seq_len=3072, num_anchors=512, block_size=16),
    "long": dict(target="bench:qwen3-8b", seq_len=16384, num_anchors=512, block_size=16),
    "big": dict(target="bench:qwen3-32b", seq_len=4096, num_anchors=512, block_size=16),
    # the SmolLM2 recipe's step: 3 draft layers, run with --batch-size 32
    "recipe": dict(target="bench:smollm2-135m", seq_len=320, num_anchors=64, block_size=16, num_draft_layers=3),
}
VARIANTS = {  # name -> (cuda_graphs, compile_drafter)
    "graph": (True, False), "eager": (False, False), "compile": (True, True), "compile-eager": (False, True),
    **step_variants.VARIANTS,  # FP8 variants
}
# Qwen3 shapes use the family's reserved id (151669); the random-weight SmolLM2 shape's text never holds id 2000
MASK_TOKEN_ID = {"bench:tiny": 1023, "bench:smollm2-135m": 2000}


def log(*a) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}]", *a, file=sys.stderr, flush=True)


def synthetic_batch(step: int, *, batch_size: int, seq_len: int, num_anchors: int, block_size: int, vocab_size: int,
                    mask_token_id: int, gamma: float, seed: int = 0, prompt_frac: float = 0.125,
                    weighting: LossWeighting = DECAY):
    """A fixed-shape BlockBatch of random tokens; a pure function of (seed, step)."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    ids = torch.randint(0, vocab_size, (batch_size, seq_len), generator=g)
    ids[ids == mask_token_id] = 0  # MASK never appears in real text
    loss_mask = torch.ones(batch_size, seq_len, dtype=torch.bool)
    loss_mask[:, : int(seq_len * prompt_frac)] = False
    anchors, valid = sample_anchors(loss_mask, num_anchors, g)
    return global_block_batch(ids, loss_mask, anchors, valid, block_size=block_size, mask_token_id=mask_token_id,
                              gamma=gamma, weighting=weighting)


def _lcm(a: int, b: int) -> int:
    import math

    return a * b // math.gcd(a, b)


def environment(args) -> dict:
    env = {"date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), "torch": torch.__version__,
           "python": platform.python_version(), "host": platform.node(),
           "commit": args.commit or os.environ.get("DFLASH_COMMIT") or _git_commit(),
           "command": "python -m dflash_lab.benchmarks.step " + " ".join(sys.argv[1:])}
    try:
        import transformers

        env["transformers"] = transformers.__version__
    except ImportError:
        pass
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(0)
        env["gpus_visible"] = torch.cuda.device_count()
        env["cuda"] = torch.version.cuda
        env["cuda_visible_devices"] = os.environ.get("CUDA_VISIBLE_DEVICES")
    return env


def _git_commit() -> str | None:
    import subprocess

    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              timeout=5).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None




def train_config(args, shape: dict, *, cuda_graphs: bool, compile_drafter: bool,
                 variant: str = "graph", arm: tuple = ("dflash", None)) -> TrainConfig:
    fields = {"num_draft_layers": shape.get("num_draft_layers", 5),
              **step_variants.train_fields(args, variant, arm)}
    return TrainConfig(**fields,
                       target=shape["target"], seq_len=shape["seq_len"], num_anchors=shape["num_anchors"],
                       block_size=shape["block_size"], batch_size=args.batch_size, devices=tuple(args.drafters),
                       target_devices=None if args.colocated else tuple(args.targets), cuda_graphs=cuda_graphs,
                       compile_drafter=compile_drafter, steps=10_000, seed=0, loss_chunk_size=args.chunk_size,
                       mask_token_id=MASK_TOKEN_ID.get(shape["target"]), **PINNED)


def run_variant(args, shape: dict, models: list, target_cfg, drafter_cfg, placement, variant: str, env: dict,
                load_report: dict, estimate: dict, arm: tuple = ("dflash", None)) -> dict:
    """One row: `variant` (graphs / compile / FP8) of the drafter arm `arm` (drafter variant, block size)."""
    from dflash_lab.train.engine_build import build_engine
    from dflash_lab.train.engine_metrics import engine_flops

    cuda_graphs, compile_drafter = VARIANTS[variant]
    shape = step_variants.arm_shape(shape, arm)
    drafter_cfg = step_variants.arm_drafter_config(args, drafter_cfg, arm)
    cfg = train_config(args, shape, cuda_graphs=cuda_graphs, compile_drafter=compile_drafter, variant=variant,
                       arm=arm)
    for d in placement.devices:
        if d.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats(torch.device(d))
    t0 = time.perf_counter()
    engine = build_engine(cfg, placement, models, drafter_cfg, target_config=target_cfg, log=log,
                          compile_mode=args.compile_mode)
    build_s = time.perf_counter() - t0
    gamma = default_gamma(shape["block_size"])
    make = lambda s: synthetic_batch(s, batch_size=args.batch_size, seq_len=shape["seq_len"],  # noqa: E731
                                     num_anchors=shape["num_anchors"], block_size=shape["block_size"],
                                     vocab_size=drafter_cfg.vocab_size, mask_token_id=drafter_cfg.mask_token_id,
                                     gamma=gamma, weighting=loss_weighting_of(cfg))
    times, losses = [], []
    batch = make(0)
    first_s = None
    total = args.warmup + args.steps
    prof, prof_rows = None, None
    lock = None
    for s in range(total):
        if s == 1 and args.measure_lock:  # several bench processes: compile together, measure one at a time
            import fcntl

            lock = open(args.measure_lock, "a")
            t_wait = time.perf_counter()
            fcntl.flock(lock, fcntl.LOCK_EX)
            log(f"{variant}: measuring (waited {time.perf_counter() - t_wait:.1f} s for the GPU lock)")
        nxt = make(s + 1) if engine.prefetches else None
        if args.profile and s == args.warmup and variant == args.profile:
            prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                      torch.profiler.ProfilerActivity.CUDA])
            prof.__enter__()
        t = time.perf_counter()
        out = engine.step(batch, step=s, lr=PINNED["lr"], next_batch=nxt)
        loss = out["loss"].item()  # syncs, like the Trainer
        dt = time.perf_counter() - t
        if prof is not None and s == args.warmup + 2:
            prof.__exit__(None, None, None)
            try:
                prof_rows = _profile_rows(prof, steps=3)
            except Exception as e:  # noqa: BLE001 - a profiler problem must not lose the timing row
                prof_rows = [{"error": f"{type(e).__name__}: {e}"}]
            prof = None
        if s == 0:
            first_s = dt
            log(f"{variant}: first step (warm-up, compile, capture) {dt:.1f} s, loss {loss:.4f}")
        if s >= args.warmup:
            times.append(dt)
        losses.append(loss)
        batch = nxt if nxt is not None else make(s + 1)
    if lock is not None:
        lock.close()  # releases the flock
    step_s = statistics.median(times)
    b, S = args.batch_size, shape["seq_len"]
    tps = b * S / step_s
    m = engine.metrics(tokens_per_s=tps)
    flops = engine_flops(engine)
    row = {
        "shape": args.shape, "variant": variant, "cuda_graphs": cuda_graphs, "compile_drafter": compile_drafter,
        "target": shape["target"], "seq_len": S, "num_anchors": shape["num_anchors"], "block_size": shape["block_size"],
        "batch_size": b, "placement": placement.mode, "target_devices": list(placement.target_devices),
        "drafter_devices": list(placement.drafter_devices), "num_gpus": placement.num_gpus,
        "steps_measured": len(times), "warmup_steps": args.warmup,
        "step_ms_median": round(step_s * 1e3, 2), "step_ms_p10": round(_pct(times, 10) * 1e3, 2),
        "step_ms_p90": round(_pct(times, 90) * 1e3, 2),
        "tokens_per_s": round(tps, 1), "tokens_per_s_per_gpu": round(tps / max(placement.num_gpus, 1), 1),
        "draft_positions_per_s": round(tps * shape["num_anchors"] * shape["block_size"] / S, 1),
        "tflop_per_sequence": {k: round(v / 1e12, 2) for k, v in (flops or {}).items()},
        "mfu": m.get("mfu"), "first_step_s": round(first_s, 2), "engine_build_s": round(build_s, 2),
        "time_to_first_step_s": round(load_report["seconds_all"] + build_s + first_s, 2),
        "graphs": {x.graphed.name: x.graphed.status() for x in [*engine.targets, *engine.workers]},
        "compile_times_s": _compile_times(),
        "loss_first": losses[0], "loss_last": losses[-1], "load": load_report, "memory_estimate": estimate,
        "engine": {k: v for k, v in m.items() if k not in ("mfu",)}, **step_variants.row_fields(args, variant, m, losses, arm),
        **env,
    }
    if prof_rows is not None:
        row["profile_top_kernels"] = prof_rows
    engine.shutdown()
    del engine
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return row


def _compile_times() -> dict:
    """Cumulative torch.compile time in this process (dynamo + inductor), by phase."""
    try:
        from torch._dynamo.utils import compile_times

        names, secs = compile_times(repr="csv", aggregate=True)
        keep = ("_compile.compile_inner", "OutputGraph.call_user_compiler", "compile_fx.<locals>.fw_compiler_base",
                "compile_fx_inner", "async_compile.wait", "bytecode_tracing")
        return {n: round(float(t), 2) for n, t in zip(names, secs) if n in keep or "compile" in n}
    except Exception:  # noqa: BLE001 - diagnostics only
        return {}


def _pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


def _profile_rows(prof, steps: int, top: int = 30) -> list[dict]:
    rows = []
    for e in prof.key_averages():
        t = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if t and e.device_type == torch.autograd.DeviceType.CUDA:
            rows.append({"name": e.key[:120], "ms_per_step": round(t / 1e3 / steps, 3), "calls_per_step": e.count / steps})
    rows.sort(key=lambda r: -r["ms_per_step"])
    return rows[:top]


def time_to_first_step(args, shape: dict, env: dict) -> dict:
    """Trainer construction (tokenizer, placement check, concurrent target load, data) -> first step returned."""
    from dflash_lab.train.trainer import Trainer

    cfg = TrainConfig(target=shape["target"], data="tiny", seq_len=shape["seq_len"], num_anchors=shape["num_anchors"],
                      block_size=shape["block_size"], batch_size=args.batch_size, devices=tuple(args.drafters),
                      target_devices=None if args.colocated else tuple(args.targets), steps=100, log_every=1000,
                      loss_chunk_size=args.chunk_size, compile_drafter=args.variants[0].startswith("compile"),
                      cuda_graphs=VARIANTS[args.variants[0]][0], **PINNED)
    t0 = time.perf_counter()
    trainer = Trainer(cfg, write_run_dir=False, log=log)
    constructed = time.perf_counter() - t0
    trainer.step(1)
    first = time.perf_counter() - t0
    rec = trainer.step(args.steps)
    total = time.perf_counter() - t0
    row = {"shape": args.shape, "scenario": "time_to_first_step", "variant": args.variants[0],
           "target": shape["target"], "seq_len": shape["seq_len"], "num_anchors": shape["num_anchors"],
           "batch_size": args.batch_size, "placement": trainer.placement.mode,
           "construct_s": round(constructed, 2), "target_load_s": round(trainer.target_load_seconds, 2),
           "time_to_first_step_s": round(first, 2), "first_step_s": round(first - constructed, 2),
           f"then_{args.steps}_steps_s": round(total - first, 2), "last_record": rec, **env}
    trainer.close()
    return row


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="DFlash training-step benchmark (one JSON line per configuration).")
    p.add_argument("--shape", choices=sorted(SHAPES), default="paper")
    p.add_argument("--gpus", default=None, help="drafter GPUs, e.g. 0 or 0,1 or 5-7 (default: 0; cpu with --device cpu)")
    p.add_argument("--target-gpus", default=None, help="target GPUs for a split placement, e.g. 0 or 0-4")
    p.add_argument("--placement", choices=["colocated", "split"], default=None,
                   help="colocated (default) or split; split without --target-gpus puts targets on the first half")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--workers", type=int, default=1, help="CPU only: number of drafter worker threads")
    p.add_argument("--compile", action="store_true", help="compile_drafter=True (same as --variants compile)")
    p.add_argument("--no-graphs", action="store_true", help="cuda_graphs=False (same as --variants eager)")
    p.add_argument("--variants", default=None, help=f"comma list of {sorted(VARIANTS)}, run in one process")
    p.add_argument("--compile-mode", default=None, help='torch.compile mode for --compile (default None; e.g. '
                   '"max-autotune-no-cudagraphs"); never CUDAGraph Trees')
    p.add_argument("--steps", type=int, default=20, help="measured steps")
    p.add_argument("--warmup", type=int, default=5, help="warm-up steps before timing (the first includes capture)")
    p.add_argument("--batch-size", type=int, default=None, help="global sequences per step (default: one per "
                   "drafter worker, rounded up to a multiple of the target replicas)")
    p.add_argument("--chunk-size", type=int, default=4096, help="LM head + CE chunk (positions)")
    p.add_argument("--ttfs", action="store_true", help="measure Trainer construction -> first step instead")
    p.add_argument("--profile", default=None, help="variant to profile (torch.profiler, 3 steps, top kernels)")
    p.add_argument("--out", default=None, help="also append the JSON lines to this file")
    p.add_argument("--measure-lock", default=None, help="file lock held from the 2nd step to the last: several "
                   "bench processes compile concurrently but time their steps one at a time")
    p.add_argument("--commit", default=None, help="commit id to record (default: git rev-parse, or $DFLASH_COMMIT)")
    step_variants.add_args(p)
    args = p.parse_args(argv)
    from dflash_lab.train.placement import gpus

    if args.device == "cpu":
        args.drafters = ["cpu"] * args.workers
        args.targets = ["cpu"] if args.placement == "split" else args.drafters
    else:
        args.drafters = list(gpus(args.gpus or "0"))
        if args.target_gpus:
            args.targets = list(gpus(args.target_gpus))
        elif args.placement == "split":
            n = len(args.drafters)
            if n < 2:
                p.error("--placement split needs --target-gpus or at least two --gpus")
            k = (n + 1) // 2
            args.drafters, args.targets = args.drafters[k:], args.drafters[:k]
        else:
            args.targets = args.drafters
    args.colocated = args.targets == args.drafters
    if args.variants:
        args.variants = [v.strip() for v in args.variants.split(",") if v.strip()]
        bad = [v for v in args.variants if v not in VARIANTS]
        if bad:
            p.error(f"unknown variants {bad}; use {sorted(VARIANTS)}")
    else:
        args.variants = [("compile" if args.compile else "graph") if not args.no_graphs
                         else ("compile-eager" if args.compile else "eager")]
    if args.batch_size is None:
        args.batch_size = _lcm(len(args.drafters), len(args.targets) if not args.colocated else 1)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    shape = SHAPES[args.shape]
    env = environment(args)
    sink = JsonlSink(args.out) if args.out else None  # one write per row: a run cut off keeps what it measured

    def emit(row):
        print(json.dumps(row, default=str), flush=True)
        if sink:
            sink.log(row)

    if args.ttfs:
        emit(time_to_first_step(args, shape, env))
        return 0
    # The same preparation as a training run (prepare.py): placement and memory check, drafter config, dtypes.
    first = VARIANTS[args.variants[0]]
    prep = prepare_run(train_config(args, shape, cuda_graphs=first[0], compile_drafter=first[1]), log=log)
    placement, target_cfg, drafter_cfg = prep.placement, prep.target_config, prep.drafter_config
    estimate = prep.memory_estimate
    log(f"{args.shape}: {placement.describe()}; estimate {estimate}")
    last: dict = {}

    def progress(p):
        last[p.replica] = p
        log(p.line())

    t0 = time.perf_counter()
    models = load_targets(shape["target"], placement.target_devices, dtype=prep.dtype, progress=progress)
    load_report = {"seconds_all": round(time.perf_counter() - t0, 2),
                   "replicas": {str(k): {"device": v.device, "seconds": round(v.seconds, 2), "gb": round(v.gb_total, 2),
                                         "tensors": v.tensors_total, "memory_gb": v.memory_gb}
                                for k, v in last.items()}}
    if args.fp8_error:
        emit({**step_variants.fp8_feature_report(models[0], drafter_cfg.target_layer_ids, batch_size=1,
                                              seq_len=shape["seq_len"], vocab_size=drafter_cfg.vocab_size),
              "shape": args.shape, **env})
    for arm in args.drafter_variants:  # each drafter variant beside the others, on the same replicas
        for variant in args.variants:
            try:
                emit(run_variant(args, shape, models, target_cfg, drafter_cfg, placement, variant, env, load_report,
                                 estimate, arm))
            except Exception as e:  # noqa: BLE001 - one failing variant must not hide the others' numbers
                import traceback

                log(f"variant {variant} ({arm[0]}) FAILED: {type(e).__name__}: {e}\n{traceback.format_exc()}")
                emit({"shape": args.shape, "variant": variant, "drafter_variant": arm[0],
                      "error": f"{type(e).__name__}: {e}"[:2000], **env})
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    if sink:
        sink.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
