#!/usr/bin/env bash
# torchrun (NCCL, 2 processes, DDP, one per GPU) vs the in-process threaded engine (Trainer, devices cuda:0,cuda:1)
# on the SAME 2 GPUs and shape. Prints one JSON line per engine, then one with the ratio. Takes ~4-6 minutes.
#
#   bash bench/distributed_vs_threads.sh                       # Qwen3-8B shape (random weights), S=3072, N=512, B=16
#   SEQ=768 ANCHORS=256 bash bench/distributed_vs_threads.sh   # the micro shape
#   WITH_SPLIT=1 bash ...   # also torchrun with 1 target rank feeding 1 drafter rank (supply vs demand)
#
# tokens/s = sequence tokens of the timed steps / sum of their step times (each engine's own step timer, synced at the
# end of the step), and tokens_per_s_wall = the same tokens / wall clock from the end of step WARMUP to the last step
# (everything between steps counts: batch building, logging, the torchrun control broadcast). The first WARMUP steps
# (compile, CUDA-graph capture, allocator warm-up) are excluded.
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
from dflash_lab.config.train_config import TrainConfig
from dflash_lab.train.distributed import DistConfig
from dflash_lab.train.launch import prepare_run
import dflash_lab.target.load as T

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

summarise() {  # $1 engine name, $2 metrics.jsonl (one row per step: log_every=1)
"$PY" - "$1" "$2" <<'EOF'
import json, os, sys
engine, path = sys.argv[1], sys.argv[2]
warm = int(os.environ["WARMUP"])
rows = [json.loads(l) for l in open(path) if l.strip()]
rows = [r for r in rows if "loss" in r]
timed = [r for r in rows if r["step"] > warm]
tok, sec = sum(r["tokens"] for r in timed), sum(r["step_time_s"] for r in timed)
# wall clock from the end of the last warm-up step to the end of the last step: everything between steps counts
t_start = next(r["time"] for r in rows if r["step"] == warm)
wall = timed[-1]["time"] - t_start
shape = json.load(open(os.path.join(os.environ["OUT"], "shape.json")))
mem = {k: v for k, v in timed[-1].items() if k.startswith("mem_gb/")}
print(json.dumps({"engine": engine, "gpus": 2, **shape, "steps_timed": len(timed),
                  "tokens_per_s": round(tok / sec, 1), "tokens_per_s_per_gpu": round(tok / sec / 2, 1),
                  "tokens_per_s_wall": round(tok / wall, 1),
                  "step_time_s_median": sorted(r["step_time_s"] for r in timed)[len(timed) // 2],
                  "loss_last": timed[-1]["loss"], **mem}), flush=True)
with open(os.path.join(os.environ["OUT"], "results.jsonl"), "a") as f:
    f.write(json.dumps({"engine": engine, "tokens_per_s": tok / sec, "tokens_per_s_wall": tok / wall}) + "\n")
EOF
}

# 2) in-process threaded engine: one process, one worker thread per GPU
timeout 300 "$PY" - <<'EOF'
import os, json
from pathlib import Path
from dflash_lab.config.train_config import TrainConfig
from dflash_lab.train.trainer import Trainer
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
  -m dflash_lab.train --config "$OUT/ddp/config.json" --no-checkpoints > "$OUT/ddp/launch.log" 2>&1 \
  || { tail -n 40 "$OUT/ddp/launch.log"; exit 1; }
summarise torchrun-ddp-nccl "$OUT/ddp/metrics.jsonl"

if [ "$WITH_SPLIT" = "1" ]; then  # rank 1 = target only, sends features to rank 0 = drafter only
  timeout 300 "$PY" -m torch.distributed.run --standalone --nnodes 1 --nproc-per-node 2 --max-restarts 0 \
    -m dflash_lab.train --config "$OUT/split/config.json" --no-checkpoints > "$OUT/split/launch.log" 2>&1 \
    || { tail -n 40 "$OUT/split/launch.log"; exit 1; }
  summarise torchrun-split-1target-1drafter "$OUT/split/metrics.jsonl"
fi

"$PY" - <<'EOF'
import json, os
res = {r["engine"]: r for r in map(json.loads, open(os.path.join(os.environ["OUT"], "results.jsonl")))}
t, d = res["threads"], res["torchrun-ddp-nccl"]
print(json.dumps({"ratio_torchrun_over_threads": round(d["tokens_per_s"] / t["tokens_per_s"], 3),
                  "ratio_torchrun_over_threads_wall": round(d["tokens_per_s_wall"] / t["tokens_per_s_wall"], 3),
                  "run_dirs": os.environ["OUT"]}))
EOF
