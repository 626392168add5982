#!/usr/bin/env bash
# DFlash against DSpark on the SmolLM2 recipe's data, the same pool and the same GPU-minutes, in three device calls
# on one warm machine (each call's tree + carry under 64 MiB: the GGUF travels in parts, the library as a tarball).
# Prepared here, once:   bash bench/dspark_ab.sh prepare     (parts into $CARRY/x1 x2 x3; code into each)
#   call 1 (carry [$CARRY rel]/x1): bash $C/x1/run.sh call1     GGUF part 1 staged; GPU tests of DSpark decoding
#   call 2 (carry .../x2):          bash $C/x2/run.sh call2     part 2 staged; the training step of each variant
#   (alone, carry a folder with code.txz + run.sh: bash $C/step/run.sh step, ~1 min on a warm machine)
#   call 3 (carry .../x3):          bash $C/x3/run.sh call3     part 3 + wheels: model, data, both arms trained side
#                                   by side for ARM_S seconds each, then T=0 (alone: speeds), the confidence head's
#                                   verify policies (alone), T=1 argmax and sample drafts
# Arms: `dflash` is the recipe's TrainConfig (D-PACE, distilled, block 16, 3 layers, 16,384 ids); `dspark` the same
# with drafter_variant="dspark" and the decayed slot weights its loss is published with (D-PACE is refused for it).
# Results under $OUT: run.log, env.txt, ab.json, results.json (recipe_ab eval rows), verify.json, step-*.jsonl,
# gpu-tests.log, logs.tgz.
set -u
MODE=${1:?prepare, call1, call2, call3 or step}
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/dflash-out}; mkdir -p "$OUT"
STAGE=/tmp/recipe-smollm2
WORK=${WORK:-/tmp/dspark-ab}
CALL_S=${CALL_S:-585}
T0=${CALL_T0:-$(date +%s)}
ARM_S=${ARM_S:-200}           # each arm's training seconds (both at once on the one GPU)
PROMPTS=${PROMPTS:-64}
DEVICE=${DEVICE:-cuda:0}
PY=${PY:-python3}
LAB=${LAB:-/tmp/lab}          # where this call unpacks the library it carries
DATA_SET=${DATA_SET:-"--set n_self=13000"}   # half the recipe's target-written prompts: the data phase fits a call
COMMON=${COMMON:-"--set val_every=250 --set real_tau_every=0 --set feature_store_gib=24 --set feature_store_host_gib=24"}
SPARK=${SPARK:-'--set drafter_variant="dspark" --set loss_weighting="decay"'}
say() { echo "[$MODE $(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/run.log"; }
left() { echo $(( CALL_S - ($(date +%s) - T0) )); }
code() {  # this call's copy of the library (the tree the device receives is main's)
  rm -rf $LAB && mkdir -p $LAB && tar xJf "$HERE/code.txz" -C $LAB || exit 3
  cp -r dflash_lab/tiny/assets $LAB/dflash_lab/tiny/ || exit 3  # the tiny target's files: the tree's own copy
  export PYTHONPATH=$LAB:/tmp/site PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
  export DFLASH_LAB_CACHE=${DFLASH_LAB_CACHE:-/tmp/dflash-cache}
  AB="$PY $LAB/bench/recipe_ab.py"
  { nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null
    $PY -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
    echo "library: branch i56 at $(cat $LAB/COMMIT)"; } > "$OUT/env.txt" 2>&1
}
stage() { mkdir -p $STAGE && cp "$HERE"/part.* "$HERE"/*.whl "$HERE"/xz.sha256 $STAGE/ 2>/dev/null; say "staged: $(ls $STAGE | tr '\n' ' ')"; }

case "$MODE" in
prepare)  # here: CARRY (a folder of the device's tree ignored by git), SRC (the GGUF .xz), WHEELS (gguf, chitchat)
  CARRY=${CARRY:?the folder the calls carry, e.g. /work/main/.wt56}; SRC=${SRC:?m.gguf.xz}; WHEELS=${WHEELS:?folder}
  mkdir -p "$CARRY"/x1 "$CARRY"/x2 "$CARRY"/x3
  rm -f "$CARRY"/x*/part.* "$CARRY"/x*/code.txz "$CARRY"/x*/run.sh
  split -b 35000000 -d "$SRC" "$CARRY/x1/part." && mv "$CARRY/x1/part.01" "$CARRY/x2/" && mv "$CARRY/x1/part.02" "$CARRY/x3/"
  sha256sum "$SRC" | cut -d' ' -f1 > "$CARRY/x3/xz.sha256"
  cp "$WHEELS"/gguf-*.whl "$WHEELS"/chitchat_dataset-*.whl "$CARRY/x3/"
  ROOT=$(cd "$HERE/.." && pwd)
  # the committed tree (HEAD), not the working files: what ran is a commit
  rm -rf /tmp/dspark-code && mkdir -p /tmp/dspark-code && git -C "$ROOT" rev-parse --short HEAD > /tmp/dspark-code/COMMIT
  git -C "$ROOT" archive HEAD dflash_lab bench/recipe_ab.py bench/dspark_verify.py tests | tar -x -C /tmp/dspark-code
  (cd /tmp/dspark-code && rm -rf dflash_lab/tiny/assets && tar cJf /tmp/code.txz .) || exit 1
  for x in x1 x2 x3; do cp /tmp/code.txz "$HERE/dspark_ab.sh" "$CARRY/$x/"; mv "$CARRY/$x/dspark_ab.sh" "$CARRY/$x/run.sh"; done
  du -sh "$CARRY"/x1 "$CARRY"/x2 "$CARRY"/x3
  ;;
call1)
  stage; code
  say "GPU tests: DSpark decoding (graphs == eager, fp32 lossless) and DFlash's graph tests"
  (cd $LAB && timeout ${T_TESTS:-240} $PY -m pytest -q -p no:cacheprovider -m gpu tests/test_dspark_decode.py \
     tests/test_speculative.py -k "cuda" > "$OUT/gpu-tests.log" 2>&1); tail -4 "$OUT/gpu-tests.log" | tee -a "$OUT/run.log"
  ;;
call2|step)  # step: the step benchmark alone (carry a folder with code.txz and run.sh only)
  [ "$MODE" = call2 ] && stage
  code
  say "the training step at the recipe's shape (batch 32, graphs): dflash, dspark, dspark at its published block 8"
  # from $LAB: `python -m` puts the working directory first on sys.path, and the tree's own dflash_lab is older
  (cd $LAB && timeout ${T_STEP:-300} $PY -m dflash_lab.benchmarks.step --shape recipe --batch-size 32 \
    --drafter-variants dflash,dspark,dspark@8 --variants graph > "$OUT/step.jsonl" 2> "$OUT/step.log")
  say "rc=$?"; cut -c1-400 "$OUT/step.jsonl" | tee -a "$OUT/run.log"
  ;;
call3)
  stage; code
  if [ -z "${SKIP_MODEL:-}" ]; then  # SKIP_MODEL=1: a CPU rehearsal on the tiny target
    say "model"; (cd $LAB && OUT=$OUT bash "$OLDPWD/bench/smollm2_model.sh" model 2>&1 | tail -3 | tee -a "$OUT/run.log")
    $PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $STAGE/chitchat*.whl || exit 3
  fi
  say "recipe data phases ($DATA_SET)"
  timeout $(left) $AB data --work $WORK --device $DEVICE $DATA_SET > "$OUT/data.log" 2>&1 || { say "data rc=$?"; exit 5; }
  tail -1 "$OUT/data.log" | cut -c1-400 | tee -a "$OUT/run.log"
  left_now=$(left); budget=$ARM_S; [ $budget -gt $(( left_now - ${EVAL_S:-290} )) ] && budget=$(( left_now - ${EVAL_S:-290} ))
  say "training both arms side by side, ${budget}s each"
  timeout $(( budget + 60 )) $AB train --work $WORK --arm dflash $COMMON --set time_budget_s=$budget > "$OUT/arm-dflash.log" 2>&1 &
  p1=$!; sleep 3
  timeout $(( budget + 60 )) $AB train --work $WORK --arm dspark $COMMON $SPARK --set time_budget_s=$budget > "$OUT/arm-dspark.log" 2>&1 &
  p2=$!; wait $p1; r1=$?; wait $p2; r2=$?
  say "arms rc=$r1/$r2: $($PY -c "import json; a=json.load(open('$WORK/ab.json'))['arms']; print({k: (v['status'], v['steps'], v['wall_s']) for k, v in a.items()})")"
  say "T=0 on every set, both arms and the target alone (nothing else on the GPU: speeds)"
  timeout $(left) $AB eval --work $WORK --device $DEVICE --prompts $PROMPTS --temperature 0 \
    --time-budget-s $(( $(left) - 150 )) --out $WORK/ab-results.json > "$OUT/eval-t0.log" 2>&1
  say "eval T=0 rc=$?"
  say "verify policies of the DSpark confidence head (alone)"
  timeout $(( $(left) - 70 )) $PY $LAB/bench/dspark_verify.py --work $WORK --arm dspark --device $DEVICE \
    --sets chitchat-heldout --prompts $PROMPTS --time-budget-s $(( $(left) - 90 )) --out $OUT/verify.json > "$OUT/verify.log" 2>&1
  say "verify rc=$?"
  say "T=1 on held-out chitchat: argmax and sampled drafts"
  timeout $(( $(left) - 10 )) $AB eval --work $WORK --device $DEVICE --prompts $PROMPTS --temperature 1 \
    --draft-sampling argmax --draft-sampling sample --sampled-sets chitchat-heldout \
    --time-budget-s $(( $(left) - 25 )) --out $WORK/ab-results.json > "$OUT/eval-t1.log" 2>&1
  say "eval T=1 rc=$?"
  cp $WORK/ab.json $WORK/ab-results.json "$OUT/" 2>/dev/null
  (cd $WORK && tar czf "$OUT/arm-metrics.tgz" runs/*/metrics.jsonl runs/*/summary.json runs/*/config.json 2>/dev/null)
  (cd $OUT && ls *.log | grep -v '^run.log$' > /tmp/logs.txt && tar czf logs.tgz -T /tmp/logs.txt && rm -f $(cat /tmp/logs.txt))
  ;;
*) echo "prepare, call1, call2, call3 or step"; exit 2 ;;
esac
say "$MODE done"
