#!/usr/bin/env bash
# H200 run 1 (2 GPUs, kind nvidia-h200-x2): paper shape on 1 GPU (CUDA graph, eager + profile, compile), the peer
# `speculators` step on the same machine, our step again on the peer's GPU, the 1-GPU GPU tests.
# Usage on the device machine, from the repo root (wheels carried in .whl/):  bash bench/results/2026-11-29-h200x2-run1/h200_run1.sh
# Everything lands in $OUT: bench.jsonl (one JSON line per configuration), peer.json, *.log, env.txt.
set -u
OUT=${OUT:-/tmp/dflash-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
T0=$(date +%s); DEADLINE=$((T0 + ${BUDGET_S:-570}))
left() { echo $((DEADLINE - $(date +%s))); }
step() { echo "[run1 $(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/run.log"; }

{ nvidia-smi; python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, 'transformers', transformers.__version__, 'gpus', torch.cuda.device_count())"; nvidia-smi topo -m; } > "$OUT/env.txt" 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > "$OUT/pip.log" 2>&1

# GPU1 in the background: GPU tests (1-GPU ones), then the peer's paper-shape step with the target forward inside.
(
  step "gpu tests on GPU1"
  CUDA_VISIBLE_DEVICES=1 timeout 170 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py > "$OUT/gpu_tests.log" 2>&1
  step "gpu tests rc=$?; peer on GPU1"
  CUDA_VISIBLE_DEVICES=1 PYTHONPATH=/tmp/site timeout 330 python3 .whl/peer_speculators.py --spec-loss eager \
    --only spec_paper_A_with_target,target_fwd_only_A --budget-s 320 --out "$OUT/peer.json" > "$OUT/peer.log" 2>&1
  step "peer rc=$?"
) &
BG=$!

step "paper shape, 1 GPU (GPU0): graph, eager (profiled), compile"
CUDA_VISIBLE_DEVICES=0 timeout 330 python3 -m dflash_lab.benchmarks.step --shape paper --gpus 0 --variants graph,eager,compile \
  --profile eager --steps 20 --warmup 5 --out "$OUT/bench.jsonl" > /dev/null 2> "$OUT/bench_paper_1gpu.log"
step "paper 1 GPU rc=$?"

if [ -d dflash_lab/tiny/assets ] && [ "$(left)" -gt 200 ]; then
  step "time to first step through Trainer (Qwen3-8B shape, GPU0)"
  CUDA_VISIBLE_DEVICES=0 timeout 120 python3 -m dflash_lab.benchmarks.step --shape paper --gpus 0 --ttfs --steps 5 \
    --out "$OUT/bench.jsonl" > /dev/null 2> "$OUT/ttfs.log"
  step "ttfs rc=$?"
fi

step "waiting for GPU1 (tests + peer)"
wait $BG

if [ "$(left)" -gt 50 ]; then
  step "paper shape, 1 GPU on the peer's GPU (GPU1)"
  CUDA_VISIBLE_DEVICES=1 timeout $(( $(left) - 5 )) python3 -m dflash_lab.benchmarks.step --shape paper --gpus 0 --variants graph \
    --steps 20 --warmup 4 --out "$OUT/bench.jsonl" > /dev/null 2>> "$OUT/bench_paper_1gpu.log"
  step "paper GPU1 rc=$?"
fi
python3 - "$OUT" <<'EOF'
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
for line in (out / "bench.jsonl").read_text().splitlines() if (out / "bench.jsonl").exists() else []:
    r = json.loads(line)
    if "error" in r:
        print("ERROR", r.get("shape"), r.get("variant"), r["error"][:300]); continue
    if r.get("scenario") == "time_to_first_step":
        print("TTFS", r["time_to_first_step_s"], "s (construct", r["construct_s"], ")"); continue
    e = r["engine"]
    print(r["shape"], r["variant"], r["num_gpus"], "gpu", r["placement"], "| step", r["step_ms_median"], "ms |",
          r["tokens_per_s"], "tok/s |", r["tokens_per_s_per_gpu"], "/gpu | MFU", r["mfu"], "| first", r["first_step_s"],
          "| t/d/o ms", e.get("target_ms"), e.get("drafter_ms"), e.get("optimizer_ms"), e.get("reduce_ms"),
          "| peak", {k.split("/")[1]: v for k, v in e.items() if k.startswith("peak_mem_gb")},
          "|", {k: v for k, v in e.items() if k.startswith("graph/")})
p = out / "peer.json"
if p.exists():
    for k, v in json.loads(p.read_text())["scenarios"].items():
        print("PEER", k, {x: v.get(x) for x in ("ms_per_step", "seq_tokens_per_s", "MFU_vs_989", "peak_alloc_GiB", "ms_per_fwd", "error")})
EOF
tail -3 "$OUT/gpu_tests.log" 2>/dev/null
step "done"
