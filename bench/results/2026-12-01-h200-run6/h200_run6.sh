#!/usr/bin/env bash
# H200 run 6 (ONE device call, one H200, <= 5 minutes): the shapes the peer call did not cover, for issue 16 items 4
# and 6: the 32B-class shape colocated on one H200 (bf16 CUDA graphs, compiled drafter, compiled drafter + FP8) and
# the micro shape (S=768, 256 anchors) compile off vs on, so "compile where it wins" is decided on every shape.
# Usage on the device machine, from the repo root:  bash bench/results/2026-12-01-h200-run6/h200_run6.sh     (results in $OUT)
set -u
OUT=${OUT:-/tmp/dflash-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD TOKENIZERS_PARALLELISM=false
T0=$(date +%s)
step() { echo "[run6 $(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/run.log"; }
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; git log -1 --format='commit %h %s'; } \
  > "$OUT/env.txt" 2>&1
step "1/2 32B-class shape (S=4096, 512 anchors), colocated on one H200: graph, compile, compile-fp8"
timeout ${T_BIG:-175} python3 -m dflash_lab.benchmarks.step --shape big --gpus 0 --variants ${BIG_VARIANTS:-graph,compile,compile-fp8} \
  --steps 10 --warmup 4 --out "$OUT/bench.jsonl" > /dev/null 2> "$OUT/bench_big.log"
step "big rc=$?"
step "2/2 micro shape (S=768, 256 anchors): graph vs compile"
timeout ${T_MICRO:-80} python3 -m dflash_lab.benchmarks.step --shape micro --gpus 0 --variants graph,compile \
  --steps 20 --warmup 5 --out "$OUT/bench.jsonl" > /dev/null 2> "$OUT/bench_micro.log"
step "micro rc=$?"
python3 - "$OUT" <<'PY'
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
for line in (out / "bench.jsonl").read_text().splitlines() if (out / "bench.jsonl").exists() else []:
    r = json.loads(line)
    if "error" in r:
        print("ERROR", r.get("variant"), r["error"][:300]); continue
    print(r["shape"], r["variant"], r["step_ms_median"], "ms |", r["tokens_per_s"], "tok/s | MFU", r["mfu"],
          "| recompiles", r.get("recompiles_after_first_step"), "| time to 1st step", r["time_to_first_step_s"],
          "s | peak GiB", r["engine"].get("peak_mem_gb/cuda:0"))
PY
tail -3 "$OUT/bench_big.log"
step "done"
