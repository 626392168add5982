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

# name -> TrainConfig fields of the shape. mask 2000: a row of the 49,152-id head that the tiny tokenizer's text
# (ids < 1,024) never holds; Qwen3 shapes keep the family's reserved id.
SHAPES = {
    "recipe": dict(target="bench:smollm2-135m", seq_len=320, batch_size=32, num_anchors=64, block_size=16,
                   num_draft_layers=3, lr=6e-4, mask_token_id=2000),
    "paper": dict(target="bench:qwen3-8b", seq_len=3072, batch_size=1, num_anchors=512, block_size=16,
                  num_draft_layers=5, lr=6e-4),
    "tiny": dict(target="bench:tiny", seq_len=128, batch_size=4, num_anchors=8, block_size=16, num_draft_layers=1,
                 lr=6e-4, mask_token_id=1023),
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
    fields = {**SHAPES[shape], "steps": args.steps, "log_every": 1, "checkpoint_every": 0, "eval_every": 0,
              "val_every": 0, "real_tau_every": 0, "warmup_ratio": 0.0, "seed": 0,
              "draft_vocab_size": draft_vocab or None, "feature_store_gib": store_gib or None,
              "compile_drafter": args.compile_drafter, "runs_dir": str(runs_dir)}
    # Fields left at their defaults are not passed, so an older tree without them runs the same configuration.
    return {k: v for k, v in fields.items() if v is not None}


def read_row(run_dir: Path, warmup: int) -> dict:
    """Median step time after `warmup` steps and the last row's engine fields, from a run's metrics.jsonl."""
    rows = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().split("\n") if ln.strip()]
    rows = [r for r in rows if "step_time_s" in r]
    timed = [r["step_time_s"] for r in rows if r["step"] > warmup]
    if not timed:
        raise RuntimeError(f"{run_dir}: no step after the {warmup} warm-up steps in metrics.jsonl")
    last, ms = rows[-1], statistics.median(timed) * 1e3
    keep = ("target_ms", "drafter_ms", "optimizer_ms", "mfu", "feature_store_hit_rate", "feature_store_rows",
            "feature_store_stored", "first_step_s", "loss")
    return {"step_ms": round(ms, 3), "tokens_per_s": round(last["tokens"] / (ms / 1e3), 1),
            "steps_timed": len(timed), "loss_last": last.get("loss"),
            **{k: last[k] for k in keep if k in last and k != "loss"},
            **{k: v for k, v in last.items() if k.startswith(("graph/", "peak_mem_gb/"))}}


def run_notebook(fields: dict, data: Path, device: str, warmup: int) -> dict:
    from dflash_lab.config import TrainConfig
    from dflash_lab.train.trainer import Trainer

    cfg = TrainConfig(**fields, data=str(data), devices=(device,), run_name="bench-notebook")
    t0 = time.perf_counter()
    trainer = Trainer(cfg, log=lambda *a: None)
    try:
        trainer.train(progress_every_s=1e9)
        run_dir = trainer.run_dir
    finally:
        trainer.close()
    return {**read_row(run_dir, warmup), "wall_s": round(time.perf_counter() - t0, 1)}


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
    p.add_argument("--out", default=None, help="also append the JSON lines to this file")
    args = p.parse_args(argv)
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
                                run = run_notebook if entry == "notebook" else run_cli
                                row = {**head, **run(fields, data, args.device, args.warmup)}
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
