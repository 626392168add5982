#!/usr/bin/env bash
# torchrun (NCCL, 2 processes, DDP, one per GPU) vs the in-process threaded engine (Trainer, devices cuda:0,cuda:1)
# on the SAME 2 GPUs and shape. Prints one JSON line per engine, then one with the ratio. Takes ~4-6 minutes.
#
#   bash bench/distributed_vs_threads.sh                       # Qwen3-8B shape (random weights), S=3072, N=512, B=16
#   SEQ=768 ANCHORS=256 bash bench/distributed_vs_threads.sh   # the micro shape
#   WITH_SPLIT=1 bash ...   # also torchrun with 1 target rank feeding 1 drafter rank (supply vs demand)
#
# tokens/s = sequence tokens of the timed steps / sum of their step times (both engines time a step the same way:
# wall clock from batch to synced metrics), after WARMUP steps (compile, graph capture, allocator warm-up excluded).
set -euo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
cd "$(dirname "$0")/.."
PY=${PY:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
export TARGET=${TARGET:-bench:qwen3-8b} SEQ=${SEQ:-3072} ANCHORS=${ANCHORS:-512} BLOCK=${BLOCK:-16}
export BATCH=${BATCH:-2} STEPS=${STEPS:-30} WARMUP=${WARMUP:-8} WITH_SPLIT=${WITH_SPLIT:-0}
export OUT=${OUT:-$(mktemp -d /tmp/dflash-dist-bench.XXXXXX)}
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0,1}

"$PY" - <<'EOF'
import torch, sys
n = torch.cuda.device_count()
if n < 2:
    sys.exit(f"this benchmark needs 2 visible CUDA GPUs; found {n} (CUDA_VISIBLE_DEVICES={__import__('os').environ.get('CUDA_VISIBLE_DEVICES')}). "
             "Fix: run it on the 2x H200 machine with a CUDA build of torch (PY=/path/to/python).")
EOF

# 1) one config for both engines (a random-weight Qwen3 target; a smaller transformers-built one if bench:* is absent)
"$PY" - <<'EOF'
import os, json
from pathlib import Path
from dflash_lab.config import TrainConfig
from dflash_lab.distributed import DistConfig
from dflash_lab.launch import prepare_run
import dflash_lab.targets as T

out, target = Path(os.environ["OUT"]), os.environ["TARGET"]
if target.startswith("bench:") and not hasattr(T, "is_bench_target"):
    # fallback: a Qwen3-1.7B-shaped target with random weights, saved once, tiny tokenizer
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM
    tdir = out / "target"
    if not (tdir / "config.json").is_file():
        torch = __import__("torch")
        torch.manual_seed(0)
        cfg = Qwen3Config(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
                          num_key_value_heads=8, head_dim=128, vocab_size=151936, max_position_embeddings=40960,
                          rope_theta=1e6, tie_word_embeddings=True)
        Qwen3ForCausalLM(cfg).to(torch.bfloat16).save_pretrained(tdir)
        AutoTokenizer.from_pretrained(T.resolve_target_path("tiny")).save_pretrained(tdir)
    target = str(tdir)
cfg = TrainConfig(target=target, data="tiny", seq_len=int(os.environ["SEQ"]), num_anchors=int(os.environ["ANCHORS"]),
                  block_size=int(os.environ["BLOCK"]), batch_size=int(os.environ["BATCH"]),
                  steps=int(os.environ["STEPS"]), log_every=1, checkpoint_every=0, devices=("cuda:0", "cuda:1"),
                  run_name="bench-dist", runs_dir=str(out / "runs"))
for name, dist in {"ddp": DistConfig(parallel="ddp"), "split": DistConfig(targets_per_node=1)}.items():
    prepare_run(cfg, dist, run_dir=out / name)
(out / "shape.json").write_text(json.dumps({"target": target, "seq_len": cfg.seq_len, "num_anchors": cfg.num_anchors,
                                            "block_size": cfg.block_size, "global_batch": cfg.batch_size}))
EOF

summarise() {  # $1 engine name, $2 metrics.jsonl
"$PY" - "$1" "$2" <<'EOF'
import json, os, sys
engine, path = sys.argv[1], sys.argv[2]
rows = [json.loads(l) for l in open(path) if l.strip()]
rows = [r for r in rows if "loss" in r and r["step"] > int(os.environ["WARMUP"])]
tok, sec = sum(r["tokens"] for r in rows), sum(r["step_time_s"] for r in rows)
shape = json.load(open(os.path.join(os.environ["OUT"], "shape.json")))
mem = {k: v for k, v in rows[-1].items() if k.startswith("mem_gb/")} if rows else {}
print(json.dumps({"engine": engine, "gpus": 2, **shape, "steps_timed": len(rows),
                  "tokens_per_s": round(tok / sec, 1) if sec else None,
                  "tokens_per_s_per_gpu": round(tok / sec / 2, 1) if sec else None,
                  "step_time_s": round(sec / len(rows), 4) if rows else None,
                  "loss_last": rows[-1]["loss"] if rows else None, **mem}), flush=True)
EOF
}

# 2) in-process threaded engine: one process, one worker thread per GPU
timeout 300 "$PY" - <<'EOF'
import os, json
from pathlib import Path
from dflash_lab.config import TrainConfig
from dflash_lab.trainer import Trainer
out = Path(os.environ["OUT"])
cfg = TrainConfig.from_json(out / "ddp" / "config.json")
tr = Trainer(cfg, run_dir=out / "threads", log=lambda *a, **k: None)
try:
    for _ in range(cfg.steps):
        tr.step(1)
finally:
    tr.close()
with open(out / "threads" / "all_steps.jsonl", "w") as f:
    for r in tr.history:
        f.write(json.dumps(r, default=str) + "\n")
EOF
summarise threads "$OUT/threads/all_steps.jsonl"

# 3) torchrun, NCCL, 2 processes, DDP (target + drafter on each GPU)
timeout 300 "$PY" -m torch.distributed.run --standalone --nnodes 1 --nproc-per-node 2 --max-restarts 0 \
  -m dflash_lab.train --config "$OUT/ddp/config.json" > "$OUT/ddp/launch.log" 2>&1 \
  || { tail -n 40 "$OUT/ddp/launch.log"; exit 1; }
summarise torchrun-ddp-nccl "$OUT/ddp/metrics.jsonl"

if [ "$WITH_SPLIT" = "1" ]; then  # rank 1 = target only, sends features to rank 0 = drafter only
  timeout 300 "$PY" -m torch.distributed.run --standalone --nnodes 1 --nproc-per-node 2 --max-restarts 0 \
    -m dflash_lab.train --config "$OUT/split/config.json" > "$OUT/split/launch.log" 2>&1 \
    || { tail -n 40 "$OUT/split/launch.log"; exit 1; }
  summarise torchrun-split-1target-1drafter "$OUT/split/metrics.jsonl"
fi

"$PY" - <<'EOF'
import json, os
def tps(p):
    rows = [json.loads(l) for l in open(p) if l.strip()]
    rows = [r for r in rows if "loss" in r and r["step"] > int(os.environ["WARMUP"])]
    return sum(r["tokens"] for r in rows) / sum(r["step_time_s"] for r in rows)
o = os.environ["OUT"]
t, d = tps(f"{o}/threads/all_steps.jsonl"), tps(f"{o}/ddp/metrics.jsonl")
print(json.dumps({"ratio_torchrun_over_threads": round(d / t, 3), "run_dirs": o}))
EOF
