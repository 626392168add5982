"""`python -m dflash_lab.benchmarks.entry_points`: the training step through BOTH entry points a user runs, one JSON
line per configuration (stdout and --out; progress on stderr).

    python -m dflash_lab.benchmarks.entry_points --shapes recipe,paper --draft-vocab 0,32768,16384 --out b.jsonl
    python -m dflash_lab.benchmarks.entry_points --shapes tiny --device cpu --steps 6 --warmup 2   # the CPU check

"notebook" is the Trainer as notebooks/train.ipynb drives it (in this process); "cli" is `python -m
dflash_lab.train --data ...` in a subprocess, as torchrun ranks run it. Both train the same synthetic chat file
(long answers in the tiny tokenizer, so every anchor is valid) on a random-weight real architecture
(bench_configs/), with identical TrainConfig fields; a row's step time is the median `step_time_s` of the steps
after --warmup, read back from the run's metrics.jsonl, and tokens/s counts the sequence tokens of the windows
trained, as the dashboard does. Each row has at least entry_point, shape, batch_size, num_anchors,
draft_vocab_size, feature_store_gib, step_ms and tokens_per_s, plus the engine's phase times of the last step.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dflash_lab.benchmarks.pinned import PINNED

# name -> TrainConfig fields of the shape. mask 2000: a row of the 49,152-id head that the tiny tokenizer's text
# (ids < 1,024) never holds; Qwen3 shapes keep the family's reserved id.
SHAPES = {
    "recipe": dict(target="bench:smollm2-135m", seq_len=320, batch_size=32, num_anchors=64, block_size=16,
                   num_draft_layers=3, mask_token_id=2000),
    "paper": dict(target="bench:qwen3-8b", seq_len=3072, batch_size=1, num_anchors=512, block_size=16,
                  num_draft_layers=5),
    "tiny": dict(target="bench:tiny", seq_len=128, batch_size=4, num_anchors=8, block_size=16, num_draft_layers=1,
                 mask_token_id=1023),
}


def log(*a) -> None:
    print(f"[entry_points {time.strftime('%H:%M:%S')}]", *a, file=sys.stderr, flush=True)


def write_chats(path: Path, *, n: int, words: int, seed: int = 0) -> Path:
    """`n` conversations whose answers are `words` words of the tiny chat set's own text (long enough that every
    anchor of a window is valid; their content does not change a fixed-shape step's time)."""
    from dflash_lab.tiny import tiny_data_path

    rows = [json.loads(ln) for ln in tiny_data_path().read_text().split("\n") if ln.strip()]
    vocab = " ".join(m["content"] for r in rows for m in r["messages"]).split()
    with path.open("w") as f:
        for i in range(n):
            start = (i * 7919 + seed) % max(1, len(vocab) - words)
            answer = " ".join(vocab[start:start + words])
            f.write(json.dumps({"messages": [{"role": "user", "content": f"question {i}: tell me more"},
                                             {"role": "assistant", "content": answer}]}) + "\n")
    return path


def config_fields(shape: str, args, draft_vocab: int, store_gib: float, runs_dir: Path) -> dict:
    # The fields a run would choose for the target are pinned as benchmarks/step.py pins them (pinned.py); the feature
    # store is this benchmark's own axis and overrides the pinned 0.
    fields = {**SHAPES[shape], **PINNED, "steps": args.steps, "log_every": 1, "checkpoint_every": 0, "eval_every": 0,
              "val_every": 0, "real_tau_every": 0, "warmup_ratio": 0.0, "seed": 0,
              "draft_vocab_size": draft_vocab or None, "feature_store_gib": float(store_gib),  # 0 = off, said
              "compile_drafter": args.compile_drafter, "runs_dir": str(runs_dir)}
    # Fields left at their defaults are not passed, so an older tree without them runs the same configuration.
    return {k: v for k, v in fields.items() if v is not None}


def read_row(run_dir: Path, warmup: int, last: int | None = None) -> dict:
    """Median step time of steps warmup+1..last (default: all after `warmup`) and the last row's engine fields, from
    a run's metrics.jsonl."""
    rows = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().split("\n") if ln.strip()]
    rows = [r for r in rows if "step_time_s" in r]
    timed = [r["step_time_s"] for r in rows if r["step"] > warmup and (last is None or r["step"] <= last)]
    if not timed:
        raise RuntimeError(f"{run_dir}: no step after the {warmup} warm-up steps in metrics.jsonl")
    last, ms = rows[-1], statistics.median(timed) * 1e3
    keep = ("target_ms", "drafter_ms", "optimizer_ms", "mfu", "feature_store_hit_rate", "feature_store_rows",
            "feature_store_stored", "feature_store_host_rows", "feature_store_host_share", "first_step_s", "loss")
    return {"step_ms": round(ms, 3), "tokens_per_s": round(last["tokens"] / (ms / 1e3), 1),
            "steps_timed": len(timed), "loss_last": last.get("loss"),
            **{k: last[k] for k in keep if k in last and k != "loss"},
            **{k: v for k, v in last.items() if k.startswith(("graph/", "peak_mem_gb/"))}}


def run_notebook(fields: dict, data: Path, device: str, warmup: int, profile_steps: int = 0) -> dict:
    from dflash_lab.config import TrainConfig
    from dflash_lab.train.trainer import Trainer

    cfg = TrainConfig(**fields, data=str(data), devices=(device,), run_name="bench-notebook")
    t0 = time.perf_counter()
    trainer = Trainer(cfg, log=lambda *a: None)
    profile = None
    try:
        if profile_steps:  # the last steps under the profiler; their times stay out of the median (see read_row)
            trainer.step(cfg.steps - profile_steps)
            profile = profiled(lambda: trainer.step(profile_steps), profile_steps)
        else:
            trainer.train(progress_every_s=1e9)
        run_dir = trainer.run_dir
    finally:
        trainer.close()
    row = read_row(run_dir, warmup, last=cfg.steps - profile_steps)
    return {**row, "wall_s": round(time.perf_counter() - t0, 1), **({"profile": profile} if profile else {})}


# Kernel families by name, for the profile's summary: what a drafter step spends its device time on.
KERNEL_FAMILIES = (
    ("flex attention backward", ("flex_attention_backward", "flex_backward")),
    ("flex attention forward", ("flex_attention", "flex_decoding")),
    ("matmul", ("gemm", "nvjet", "cutlass", "sm90_", "sm100_", "cublas", "xmma", "splitk", "fused_mm", "addmm",
                "bmm")),
    ("LM head CE epilogue", ("_ce_", "cross_entropy", "log_softmax", "logsumexp")),
    ("norms", ("rms_norm", "rmsnorm", "layer_norm")),
    ("optimizer", ("adam", "multi_tensor", "foreach", "clip")),
    ("fused elementwise (triton)", ("triton_",)),  # inductor's fusions (their names list the ops they fuse)
    ("copies and gathers", ("copy", "memcpy", "memset", "gather", "index", "scatter", "cat")),
    ("elementwise (eager)", ("elementwise", "vectorized", "reduce")),
)


def kernel_family(name: str) -> str:
    low = name.lower()
    for family, keys in KERNEL_FAMILIES:
        if any(k in low for k in keys):
            return family
    return "other"


def profiled(fn, steps: int, top: int = 40) -> dict:
    """Run `fn` (which trains `steps` steps) under torch.profiler: device ms per step by kernel family, the top
    kernels, and the step's device-busy time (the sum of kernel times: the rest of the wall time is idle GPU)."""
    import torch

    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        fn()
    kernels = []
    for e in prof.key_averages():
        t = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if t and e.device_type == torch.autograd.DeviceType.CUDA:
            kernels.append((e.key, t / 1e3 / steps, e.count / steps))
    families: dict[str, float] = {}
    for name, ms, _ in kernels:
        families[kernel_family(name)] = families.get(kernel_family(name), 0.0) + ms
    kernels.sort(key=lambda k: -k[1])
    return {"steps": steps, "device_busy_ms_per_step": round(sum(k[1] for k in kernels), 3),
            "families_ms_per_step": {f: round(ms, 3) for f, ms in sorted(families.items(), key=lambda x: -x[1])},
            "top_kernels": [{"name": n[:160], "ms_per_step": round(ms, 4), "calls_per_step": round(c, 2)}
                            for n, ms, c in kernels[:top]]}


def run_cli(fields: dict, data: Path, device: str, warmup: int) -> dict:
    sets = [f"{k}={json.dumps(v)}" for k, v in fields.items() if k not in ("target", "runs_dir")]
    cmd = [sys.executable, "-m", "dflash_lab.train", "--data", str(data), "--target", fields["target"],
           "--devices", device, "--run-name", "bench-cli", "--runs-dir", fields["runs_dir"], "--no-checkpoints",
           *[a for s in sets for a in ("--set", s)]]
    t0 = time.perf_counter()
    # Run from the root of the package this process imported, so `-m dflash_lab.train` is the same tree.
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=_package_root(),
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
    if proc.returncode != 0:
        raise RuntimeError(f"exit {proc.returncode}: {proc.stderr[-2000:]}")
    [run_dir] = [p for p in Path(fields["runs_dir"]).iterdir() if "bench-cli" in p.name]
    return {**read_row(run_dir, warmup), "wall_s": round(time.perf_counter() - t0, 1)}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m dflash_lab.benchmarks.entry_points", description=__doc__.split("\n")[0])
    p.add_argument("--shapes", default="recipe", help=f"comma list of {sorted(SHAPES)}")
    p.add_argument("--entry-points", default="notebook,cli", help="comma list of notebook, cli")
    p.add_argument("--draft-vocab", default="0", help="comma list of draft vocabulary sizes (0 = full vocabulary)")
    p.add_argument("--feature-store-gib", default="0", help="comma list of feature_store_gib values")
    p.add_argument("--batch-sizes", default=None, help="comma list overriding the shape's batch size")
    p.add_argument("--steps", type=int, default=120)
    p.add_argument("--warmup", type=int, default=20, help="steps left out of the median (capture, first epoch)")
    p.add_argument("--conversations", type=int, default=256, help="conversations in the synthetic data file")
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--compile-drafter", default="false", choices=["false", "true", "auto"])
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="any other TrainConfig field for every row, the value as JSON (e.g. --set distill_weight=0.5 "
                        "--set drafter_fp8=true); repeat for several")
    p.add_argument("--label", default=None, help="a name for these rows (e.g. the commit of the tree that ran)")
    p.add_argument("--profile-steps", type=int, default=0, help="notebook rows: profile the last K steps "
                   "(torch.profiler: device ms per kernel family and the top kernels, in the row's 'profile')")
    p.add_argument("--out", default=None, help="also append the JSON lines to this file")
    args = p.parse_args(argv)
    if args.profile_steps and args.steps - args.profile_steps <= args.warmup:
        p.error(f"--profile-steps {args.profile_steps} leaves no timed step after --warmup {args.warmup} of "
                f"--steps {args.steps}: raise --steps")
    args.compile_drafter = {"false": False, "true": True, "auto": "auto"}[args.compile_drafter]
    args.extra = {}
    for item in args.set:
        name, eq, value = item.partition("=")
        if not eq or not name:
            p.error(f"--set {item!r}: use FIELD=VALUE, e.g. --set distill_weight=0.5")
        try:
            args.extra[name] = json.loads(value)
        except json.JSONDecodeError:
            args.extra[name] = value  # a bare string, e.g. --set lr_schedule=wsd
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    failures = 0
    with tempfile.TemporaryDirectory(prefix="dflash-entry-") as tmp:
        tmp = Path(tmp)
        for shape in args.shapes.split(","):
            data = write_chats(tmp / f"{shape}.jsonl", n=args.conversations, words=SHAPES[shape]["seq_len"])
            batches = [int(b) for b in args.batch_sizes.split(",")] if args.batch_sizes else [None]
            for batch in batches:
                for vocab in [int(v) for v in args.draft_vocab.split(",")]:
                    for store in [float(g) for g in args.feature_store_gib.split(",")]:
                        for entry in args.entry_points.split(","):
                            runs = tmp / f"runs-{shape}-{batch}-{vocab}-{store}-{entry}"
                            fields = config_fields(shape, args, vocab, store, runs)
                            if batch:
                                fields["batch_size"] = batch
                            fields.update(args.extra)
                            head = {"entry_point": entry, "shape": shape, "batch_size": fields["batch_size"],
                                    "num_anchors": fields["num_anchors"], "seq_len": fields["seq_len"],
                                    "num_draft_layers": fields["num_draft_layers"], "draft_vocab_size": vocab or None,
                                    "feature_store_gib": store, "compile_drafter": args.compile_drafter,
                                    "label": args.label, **({"set": args.extra} if args.extra else {}),
                                    "steps": args.steps, "warmup": args.warmup}
                            log("running", json.dumps(head))
                            try:
                                if entry == "notebook":
                                    out = run_notebook(fields, data, args.device, args.warmup, args.profile_steps)
                                else:
                                    out = run_cli(fields, data, args.device, args.warmup)
                                row = {**head, **out}
                            except Exception as e:  # noqa: BLE001 - one failing configuration must not stop the rest
                                failures += 1
                                row = {**head, "error": f"{type(e).__name__}: {e}"[-3000:]}
                            row.update(_env())
                            line = json.dumps(row)
                            print(line, flush=True)
                            if args.out:
                                with open(args.out, "a") as f:
                                    f.write(line + "\n")
    return 1 if failures else 0


def _package_root() -> Path:
    """The folder holding the dflash_lab package this process imported: this tree, or an older one put first on
    PYTHONPATH to compare against (bench/results/2026-12-02-h200-one-step/run.sh)."""
    import dflash_lab.config  # noqa: F401 - makes sure the package is the one imported

    return Path(sys.modules["dflash_lab"].__file__).resolve().parents[1]


def _env() -> dict:
    import torch

    out = {"torch": torch.__version__, "commit": os.environ.get("DFLASH_COMMIT"), "tree": str(_package_root())}
    if torch.cuda.is_available():
        out["gpu"] = torch.cuda.get_device_name(0)
    return out


if __name__ == "__main__":
    sys.exit(main())
