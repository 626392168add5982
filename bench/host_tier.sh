#!/usr/bin/env bash
# One device call (one GPU, any kind, ~6-8 minutes): what a feature store's host tier costs at the recipe shape, and
# the GPU tests of the store and of coupled drafts first. A store holding ~68% of the windows on the GPU serves
# almost no batch (a batch is served only whole); the host tier holds the rest. Rows, all at the recipe shape
# (SmolLM2-135M architecture, random weights, seq 320, batch 64, 64 anchors, block 16, 3 layers, 16,384-id head,
# compiled drafter), 256 synthetic windows (epoch = 4 steps), median step after 40 warm-up steps:
#   no store | every window on the GPU (1 GiB) | 174 of 256 on the GPU (0.3 GiB) | the same + the other 82 in host
# Needs .whl/ carried with pytest's wheels (pip download -d .whl pytest): the image has no pytest.
#   Usage: bash bench/host_tier.sh        (results in $OUT: run.log, gpu-tests.log, host-tier.jsonl, bench.log)
set -u
OUT=${OUT:-/tmp/dflash-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
T0=$(date +%s)
step() { echo "[host-tier $(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/run.log"; }
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch; print('torch', torch.__version__)"; free -g | head -2; nproc; } >> "$OUT/run.log" 2>&1
if ls .whl/pytest-*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > "$OUT/pip.log" 2>&1
  step "GPU tests: the store (float8, host tier), coupled drafts on the static path"
  PYTHONPATH=/tmp/site:$PWD timeout ${T_TESTS:-200} python3 -m pytest -q -p no:cacheprovider -m gpu \
    tests/test_speculative.py tests/test_gpu.py::test_float8_feature_store_round_trip_on_the_gpu \
    tests/test_gpu.py::test_a_feature_store_with_a_host_tier_on_the_gpu_gathers_exactly_batch_after_batch \
    > "$OUT/gpu-tests.log" 2>&1
  step "GPU tests rc=$?: $(tail -1 "$OUT/gpu-tests.log")"
else
  step "no .whl/pytest-*.whl carried: GPU tests skipped"
fi
BENCH="python3 -m dflash_lab.benchmarks.entry_points --shapes recipe --entry-points notebook --batch-sizes 64
  --draft-vocab 16384 --compile-drafter true --steps 240 --warmup 40 --conversations 256 --out $OUT/host-tier.jsonl
  --label ${DFLASH_COMMIT:-unknown}"
step "no store, all on the GPU, ~68% on the GPU"
PYTHONPATH=$PWD timeout ${T_GPU:-300} $BENCH --feature-store-gib 0,1,0.3 >> "$OUT/bench.log" 2>&1
step "rc=$?; ~68% on the GPU + the rest in host memory"
PYTHONPATH=$PWD timeout ${T_HOST:-120} $BENCH --feature-store-gib 0.3 --set feature_store_host_gib=1 \
  >> "$OUT/bench.log" 2>&1
step "rc=$?"
python3 - "$OUT/host-tier.jsonl" <<'EOF' | tee -a "$OUT/run.log"
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    print(f"store {r['feature_store_gib']} GiB host {r.get('set', {}).get('feature_store_host_gib', 0)}: {r['step_ms']} ms, "
          f"{r['tokens_per_s']:,.0f} tok/s, hit {r.get('feature_store_hit_rate')}, rows {r.get('feature_store_rows')}"
          f" + host {r.get('feature_store_host_rows', 0)}, host share {r.get('feature_store_host_share')}, "
          f"target {r.get('target_ms')} ms")
EOF
