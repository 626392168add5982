#!/usr/bin/env bash
# H200 run 2 (2 GPUs, kind nvidia-h200-x2): paper shape on 2 GPUs colocated (graph, compile), the scaled-down issue-9
# topology with the dense 32B-class shape (split: target GPU0 -> drafter GPU1, graph and compile; then colocated on
# both GPUs), the 2-GPU GPU tests, and (time permitting) paper shape on 1 GPU again with a warm compile cache.
# Processes compile concurrently; `--measure-lock` makes them time their steps one at a time.
# Usage on the device machine, from the repo root:  bash bench/results/2026-11-29-h200x2-run2/h200_run2.sh      (results in $OUT)
set -u
OUT=${OUT:-/tmp/dflash-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
T0=$(date +%s); DEADLINE=$((T0 + ${BUDGET_S:-560}))
LOCK=/tmp/dflash-measure.lock
left() { echo $((DEADLINE - $(date +%s))); }
step() { echo "[run2 $(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/run.log"; }
B="python3 -m dflash_lab.benchmarks.step --measure-lock $LOCK --out $OUT/bench.jsonl"

{ nvidia-smi; python3 -c "import torch; print('torch', torch.__version__, 'gpus', torch.cuda.device_count())"; } > "$OUT/env.txt" 2>&1

step "phase 1: 2-GPU tests | paper 2 GPUs colocated | big split GPU0 -> GPU1 (concurrent compiles)"
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py -k "two_gpus or split" > "$OUT/gpu_tests_2gpu.log" 2>&1 &
TESTS=$!
timeout 400 $B --shape paper --gpus 0,1 --variants graph,compile --steps 20 --warmup 5 > /dev/null 2> "$OUT/bench_paper_2gpu.log" &
P2=$!
timeout 400 $B --shape big --gpus 1 --target-gpus 0 --variants graph,compile --steps 12 --warmup 4 > /dev/null 2> "$OUT/bench_big_split.log" &
BS=$!
wait $TESTS; step "2-GPU tests rc=$?"
wait $BS; step "big split rc=$?"
wait $P2; step "paper 2 GPUs rc=$?"

if [ "$(left)" -gt 75 ]; then
  step "phase 2: big shape colocated on both GPUs"
  timeout $(( $(left) - 25 )) $B --shape big --gpus 0,1 --variants graph --steps 10 --warmup 4 > /dev/null 2> "$OUT/bench_big_colocated.log"
  step "big colocated rc=$?"
fi
if [ "$(left)" -gt 80 ]; then
  step "phase 3: paper shape, 1 GPU, warm compile cache (time to first step), graph + compile"
  CUDA_VISIBLE_DEVICES=0 timeout $(( $(left) - 10 )) $B --shape paper --gpus 0 --variants graph,compile --steps 20 --warmup 5 > /dev/null 2> "$OUT/bench_paper_1gpu_warm.log"
  step "paper 1 GPU warm rc=$?"
fi
python3 - "$OUT" <<'EOF'
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
for line in (out / "bench.jsonl").read_text().splitlines() if (out / "bench.jsonl").exists() else []:
    r = json.loads(line)
    if "error" in r:
        print("ERROR", r.get("shape"), r.get("variant"), r["error"][:300]); continue
    e = r["engine"]
    print(r["shape"], r["variant"], r["num_gpus"], "gpu", r["placement"], "| step", r["step_ms_median"], "ms |",
          r["tokens_per_s"], "tok/s |", r["tokens_per_s_per_gpu"], "/gpu | MFU", r["mfu"], "| ttfs", r["time_to_first_step_s"],
          "| t/d/o/r ms", e.get("target_ms"), e.get("drafter_ms"), e.get("optimizer_ms"), e.get("reduce_ms"),
          "| waits", e.get("target_wait_frac"), e.get("drafter_wait_frac"),
          "| peak", {k.split("/")[1]: v for k, v in e.items() if k.startswith("peak_mem_gb")},
          "|", {k.split("/")[1]: v[:40] for k, v in e.items() if k.startswith("graph/")})
EOF
tail -3 "$OUT/gpu_tests_2gpu.log" 2>/dev/null
step "done"
