#!/usr/bin/env bash
# One H200 device call: where the recipe-shape step's time goes, and the step through both entry points, for the
# tree of commit d029e5f (carried as .baseline/, made by: git archive d029e5f dflash_lab | tar -x -C .baseline,
# plus bench_configs/smollm2-135m.json) and this tree, one JSON line per configuration. Call with carry [".baseline"]:
#   bash bench/results/2026-12-02-h200-one-step/run.sh A      (profile + recipe shape)
#   bash bench/results/2026-12-02-h200-one-step/run.sh B      (paper shape + batch + compile)
set -u
PART=${1:?A or B}
OUT=${OUT:-/tmp/dflash-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false DFLASH_COMMIT=${DFLASH_COMMIT:-unknown}
T0=$(date +%s)
say() { echo "[one-step $(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/run.log"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$OUT/env.txt" 2>&1
python3 -c "import torch, transformers; print(torch.__version__, transformers.__version__)" >> "$OUT/env.txt"
E="python3 -m dflash_lab.benchmarks.entry_points"
BASE="python3 $PWD/dflash_lab/benchmarks/entry_points.py"
if [ "$PART" = A ]; then
  say "1 LM head + CE alone: recipe rows (32 x 64 x 15) and paper rows (512 x 15), full vs pruned"
  python3 -m dflash_lab.benchmarks.vocab_head --rows 30720 --vocab 49152 --hidden 576 --sizes 16384 32768 \
    --device cuda --dtype bfloat16 --repeats 10 > "$OUT/head.jsonl" 2>> "$OUT/head.log"
  python3 -m dflash_lab.benchmarks.vocab_head --rows 7680 --vocab 151936 --hidden 4096 --sizes 32768 65536 \
    --device cuda --dtype bfloat16 --repeats 10 >> "$OUT/head.jsonl" 2>> "$OUT/head.log"
  say "2 kernel profile, recipe shape (engine, synthetic batches)"
  timeout 110 python3 -m dflash_lab.benchmarks.step --shape recipe --batch-size 32 --gpus 0 --variants graph,eager \
    --profile eager --steps 30 --warmup 5 --out "$OUT/step.jsonl" > /dev/null 2> "$OUT/step.log"
  say "3 both entry points, tree d029e5f"
  (cd .baseline && PYTHONPATH=$PWD timeout 100 $BASE --shapes recipe --steps 150 --warmup 30 --label d029e5f \
    --out "$OUT/entry.jsonl" > /dev/null 2> "$OUT/entry.log")
  say "4 both entry points, this tree: full, 32k and 16k draft vocabularies"
  timeout 170 $E --shapes recipe --steps 150 --warmup 30 --draft-vocab 0,32768,16384 --label new \
    --out "$OUT/entry.jsonl" > /dev/null 2>> "$OUT/entry.log"
  say "5 feature store (4 GiB holds all 256 windows), full and 16k"
  timeout 120 $E --shapes recipe --steps 150 --warmup 30 --draft-vocab 0,16384 --feature-store-gib 4 --label new \
    --out "$OUT/entry.jsonl" > /dev/null 2>> "$OUT/entry.log"
else
  say "1 paper shape, both entry points, both trees"
  (cd .baseline && PYTHONPATH=$PWD timeout 170 $BASE --shapes paper --steps 40 --warmup 10 --label d029e5f \
    --out "$OUT/entry.jsonl" > /dev/null 2> "$OUT/entry.log")
  timeout 170 $E --shapes paper --steps 40 --warmup 10 --label new --out "$OUT/entry.jsonl" > /dev/null 2>> "$OUT/entry.log"
  say "2 recipe shape, larger batches with the store and 16k"
  timeout 150 $E --shapes recipe --entry-points notebook --steps 100 --warmup 30 --batch-sizes 64,128 \
    --draft-vocab 16384 --feature-store-gib 8 --conversations 512 --label new --out "$OUT/entry.jsonl" \
    > /dev/null 2>> "$OUT/entry.log"
  say "3 compile_drafter at the recipe shape: first step and steady step"
  timeout 100 $E --shapes recipe --entry-points notebook --steps 80 --warmup 30 --compile-drafter true \
    --label new --out "$OUT/entry.jsonl" > /dev/null 2>> "$OUT/entry.log"
fi
say "done"
python3 - "$OUT" <<'PY'
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
for name in ("head.jsonl", "entry.jsonl", "step.jsonl"):
    p = out / name
    for line in (p.read_text().splitlines() if p.exists() else []):
        r = json.loads(line)
        if "entry_point" in r:
            print(r.get("label"), r["shape"], r["entry_point"], "b", r["batch_size"], "vocab", r["draft_vocab_size"],
                  "store", r["feature_store_gib"], "->", r.get("step_ms"), "ms", r.get("tokens_per_s"), "tok/s",
                  "tgt", r.get("target_ms"), "dr", r.get("drafter_ms"), "opt", r.get("optimizer_ms"),
                  "hit", r.get("feature_store_hit_rate"), "first", r.get("first_step_s"), r.get("error", "")[:300])
        elif "vocab" in r:
            print("head", r)
        else:
            print("step", r.get("variant"), r.get("step_ms_median"), r.get("engine", {}).get("target_ms"),
                  r.get("engine", {}).get("drafter_ms"), r.get("error", "")[:300])
PY
