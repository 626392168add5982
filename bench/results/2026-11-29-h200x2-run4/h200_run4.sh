#!/usr/bin/env bash
# H200 run 4 (kind nvidia-h200-x2, lead): issue 8's torchrun-NCCL vs threaded engine on the same 2 GPUs, issue 5's
# monitor/dashboard overhead on one H200, and the GPU-marked tests on the final code.   Results in $OUT.
set -u
OUT=${OUT:-/tmp/dflash-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpus.txt"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" | tee -a "$OUT/gpus.txt"

echo "[run4] 1/3 torchrun (NCCL, DDP) vs threaded engine, Qwen3-8B shape, S=3072, N=512, B=16, global batch 2"
OUT_DIST=$OUT/dist STEPS=${STEPS:-16} WARMUP=${WARMUP:-5} PY=python3 \
  timeout ${T_DIST:-260} env OUT=$OUT/dist bash bench/distributed_vs_threads.sh > "$OUT/dist.jsonl" 2> "$OUT/dist.log"
echo "[run4] rc=$?"; cat "$OUT/dist.jsonl"; tail -5 "$OUT/dist.log" | cut -c1-300

echo "[run4] 2/3 overhead: monitor + dashboard model on vs off, one H200, paper shape"
timeout ${T_OVER:-100} python3 -m widgets.overhead --devices cuda:0 --widgets off ${OVERHEAD_ARGS:---target bench:qwen3-8b --seq-len 3072 --num-anchors 512 --batch-size 1 --warmup 5 --steps-per-block 8 --repeats 3} \
  > "$OUT/overhead.json" 2> "$OUT/overhead.log"
echo "[run4] rc=$?"; cat "$OUT/overhead.json"; tail -3 "$OUT/overhead.log" | cut -c1-300

echo "[run4] 3/3 GPU-marked tests"
timeout ${T_TEST:-120} python3 -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider > "$OUT/gpu_tests.log" 2>&1
echo "[run4] rc=$?"; tail -15 "$OUT/gpu_tests.log" | cut -c1-300
