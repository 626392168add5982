#!/usr/bin/env bash
# H200 run 5 (ONE device call, one H200, kind nvidia-h200, <= 9 minutes): issues 16 and 18 at the paper shape
# (Qwen3-8B-shape target, 5-layer drafter, S=3072, 512 anchors, B=16).
#   1. issue 18: drafter with MIXED layers (sliding 1024, sliding 2048, full, sliding 2048, full): CUDA graphs with
#      compile off vs on; recompile / graph-break counts in each JSON line.
#   2. issue 16: all-full drafter, bf16 vs FP8 (target + drafter; + the drafter's weight gradients; compiled;
#      target only; drafter only); the FP8 target's feature error vs bf16 per extracted layer and the target
#      forward time (--fp8-error); every row carries its per-step losses (FP8 vs bf16 loss curves on the same
#      synthetic data and seed).
#   3. the new GPU tests (mixed windows compiled under capture, FP8, fused optimizer, compiled target) with the
#      time left.
# Expected: ~1.5 + ~3.5 + ~2.5 minutes; each part is capped so the whole stays under BUDGET_S (530 s).
# No wheels needed (FP8 uses torch._scaled_mm). The peer comparison is bench/h200_peer.sh (separate call).
# Usage on the device machine, from the repo root:  bash bench/results/2026-12-01-h200-run5/h200_run5.sh     (results in $OUT)
set -u
OUT=${OUT:-/tmp/dflash-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD TOKENIZERS_PARALLELISM=false
T0=$(date +%s); DEADLINE=$((T0 + ${BUDGET_S:-530}))
left() { echo $((DEADLINE - $(date +%s))); }
cap() { local want=$1 l; l=$(( $(left) - 10 )); [ "$l" -lt "$want" ] && echo "$l" || echo "$want"; }
step() { echo "[run5 $(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/run.log"; }
STEPS=${STEPS:-20}; WARMUP=${WARMUP:-5}

{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, 'transformers', transformers.__version__)"
  git log -1 --format='commit %h %s' 2>/dev/null; } > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

step "1/3 issue 18: mixed sliding/full layers (windows 1024, 2048), paper shape, graph vs compile"
timeout $(cap 200) python3 -m dflash_lab.benchmarks.step --shape paper --gpus 0 --drafter-layers mixed --variants graph,compile \
  --steps "$STEPS" --warmup "$WARMUP" --out "$OUT/bench.jsonl" > /dev/null 2> "$OUT/bench_mixed.log"
step "mixed rc=$?"

step "2/3 issue 16: bf16 vs FP8, paper shape, all-full drafter, + feature error"
timeout $(cap 230) python3 -m dflash_lab.benchmarks.step --shape paper --gpus 0 --fp8-error \
  --variants ${FP8_VARIANTS:-graph,graph-fp8,graph-fp8w,compile-fp8,graph-fp8t,graph-fp8d} \
  --steps "$STEPS" --warmup "$WARMUP" --out "$OUT/bench.jsonl" > /dev/null 2> "$OUT/bench_fp8.log"
step "fp8 rc=$?"

if [ "$(left)" -gt 60 ]; then
  step "3/3 GPU tests (issues 16/18)"
  timeout $(cap 170) python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu.py -rs \
    -k "mixed or fp8 or fused_optimizer or compiled_target" > "$OUT/gpu_tests.log" 2>&1
  step "gpu tests rc=$?"; tail -6 "$OUT/gpu_tests.log" | cut -c1-300
fi

python3 - "$OUT" <<'PY'
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
rows = [json.loads(l) for l in (out / "bench.jsonl").read_text().splitlines()] if (out / "bench.jsonl").exists() else []
base = {}
for r in rows:
    if "error" in r:
        print("ERROR", r.get("variant"), r["error"][:300]); continue
    if r.get("scenario") == "fp8_features":
        print("FP8 FEATURES", r["per_layer"], "| target fwd ms", r["target_forward_ms"], "x", r["target_forward_speedup"]); continue
    e = r["engine"]
    key = (r["drafter_layers"], r["variant"])
    print(r["drafter_layers"], r["variant"], "| step", r["step_ms_median"], "ms |", r["tokens_per_s"], "tok/s | MFU",
          r["mfu"], "| t/d/o ms", e.get("target_ms"), e.get("drafter_ms"), e.get("optimizer_ms"),
          "| recompiles", r.get("recompiles_after_first_step"), "breaks", r.get("graph_breaks"),
          "graphs", r.get("compiled_graphs"), "| first", r["first_step_s"], "s | peak GiB",
          e.get("peak_mem_gb/cuda:0"), "| loss", r["losses"][0], "->", r["losses"][-1])
    base[key] = r
g = base.get(("full", "graph"))
for k, r in base.items():
    if g and k != ("full", "graph"):
        print("vs full/graph:", k, round(g["step_ms_median"] / r["step_ms_median"], 3), "x; max |loss diff|",
              round(max(abs(a - b) for a, b in zip(g["losses"], r["losses"])), 4) if k[0] == "full" else "-")
PY
step "done"
