#!/usr/bin/env bash
# DFlash, DSpark (block 16) and DSpark at its published block 8 on the SmolLM2 recipe's data: one pool, each arm
# trained ALONE on the GPU for the same ARM_S seconds (so GPU-minutes are equal by construction and each arm's step
# time is its own), then real tau at T=0 on the three held-out sets (decoded alone: speedups are speeds) and at T=1
# with sampled drafts (the arms side by side: tau does not depend on the GPU's load, so no speed is reported there).
#
# The library is the device tree's own (main at the commit sent). Three calls on one warm machine, after the SmolLM2
# parts and wheels are staged and the model converted (bench/recipe_smollm2.sh stage1 x3, then any call that ran
# `SMOLLM2=1 bash bench/defaults_ab.sh` or `bash bench/smollm2_model.sh model` with .recipe/x4 carried):
#   bash bench/variants_ab.sh call1   data (n_self 13,000, ~80 s), arm dflash, arm dspark
#   bash bench/variants_ab.sh call2   arm dspark8, then T=0 on every set with every arm and the target alone
#   bash bench/variants_ab.sh call3   T=1, sampled drafts, every set, one evaluation process per arm
# Results under $OUT: run.log, env.txt, ab.json, ab-results*.json (recipe_ab rows), arm-metrics.tgz, logs-<mode>.tgz.
# A call brings back at most 8 files from $OUT: keep what a call adds to that. One evaluation compares drafters of
# one block size: call2's T=0 pass refuses dspark8 (block 8) beside the block-16 arms; evaluate it apart:
#   python3 bench/recipe_ab.py eval --work $WORK --arms dflash dspark --temperature 0 --out $WORK/ab-results.json
#   python3 bench/recipe_ab.py eval --work $WORK --arms dspark8 --temperature 0 --out $WORK/ab-results-b8.json
set -u
MODE=${1:?call1, call2 or call3}
OUT=${OUT:-/tmp/dflash-out}; mkdir -p "$OUT"
WORK=${WORK:-/tmp/variants-ab}
CALL_S=${CALL_S:-585}
T0=$(date +%s)
ARM_S=${ARM_S:-150}
PROMPTS=${PROMPTS:-64}
DEVICE=${DEVICE:-cuda:0}
PY=${PY:-python3}
DATA_SET=${DATA_SET:-"--set n_self=13000"}   # half the recipe's target-written prompts: the data phase fits a call
# one cosine schedule for every arm, about what the fastest arm reaches in ARM_S alone; validation every 250 steps
COMMON=${COMMON:-"--set steps=3000 --set val_every=250 --set real_tau_every=0 --set feature_store_gib=24 --set feature_store_host_gib=24"}
SPARK='--set drafter_variant="dspark" --set loss_weighting="decay"'
export PYTHONPATH=$PWD:/tmp/site${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export DFLASH_LAB_CACHE=${DFLASH_LAB_CACHE:-/tmp/dflash-cache}
AB="$PY bench/recipe_ab.py"
say() { echo "[$MODE $(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/run.log"; }
left() { echo $(( CALL_S - ($(date +%s) - T0) )); }
arm() {  # name, then its --set overrides
  local name=$1; shift
  say "arm $name alone for ${ARM_S}s"
  timeout $(( ARM_S + 90 )) $AB train --work $WORK --arm $name $COMMON "$@" --set time_budget_s=$ARM_S \
    > "$OUT/arm-$name.log" 2>&1
  say "arm $name rc=$?: $(tail -1 "$OUT/arm-$name.log" | cut -c1-300)"
}
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null
  $PY -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
  echo "library: the device tree (git HEAD of the sender: ${COMMIT:-unknown})"; } > "$OUT/env.txt" 2>&1

case "$MODE" in
call1)
  say "recipe data phases ($DATA_SET)"
  timeout $(left) $AB data --work $WORK --device $DEVICE $DATA_SET > "$OUT/data.log" 2>&1 || { say "data rc=$?"; exit 5; }
  tail -1 "$OUT/data.log" | cut -c1-400 | tee -a "$OUT/run.log"
  arm dflash
  arm dspark $SPARK
  ;;
call2)
  arm dspark8 $SPARK --set block_size=8
  say "T=0 on every set, the block-16 arms and the target alone, then dspark8 (nothing else on the GPU: speeds)"
  timeout $(( $(left) * 6 / 10 )) $AB eval --work $WORK --device $DEVICE --prompts $PROMPTS --temperature 0 \
    --arms dflash dspark --time-budget-s $(( $(left) * 6 / 10 - 15 )) --out $WORK/ab-results.json > "$OUT/eval-t0.log" 2>&1
  say "eval T=0 (block 16) rc=$?"
  timeout $(( $(left) - 15 )) $AB eval --work $WORK --device $DEVICE --prompts $PROMPTS --temperature 0 \
    --arms dspark8 --time-budget-s $(( $(left) - 30 )) --out $WORK/ab-results-b8.json > "$OUT/eval-t0-b8.log" 2>&1
  say "eval T=0 (block 8) rc=$?"
  ;;
call3)
  say "T=1, sampled drafts, every set: one process per arm, side by side"
  pids=""
  for a in dflash dspark dspark8; do
    timeout $(( $(left) - 20 )) $AB eval --work $WORK --device $DEVICE --prompts $PROMPTS --temperature 1 \
      --draft-sampling sample --sampled-sets --arms $a --time-budget-s $(( $(left) - 40 )) \
      --out $WORK/ab-results-t1-$a.json > "$OUT/eval-t1-$a.log" 2>&1 &
    pids="$pids $!"
  done
  for p in $pids; do wait $p; say "eval T=1 pid $p rc=$?"; done
  ;;
*) echo "call1, call2 or call3"; exit 2 ;;
esac
cp $WORK/ab.json $WORK/ab-results*.json "$OUT/" 2>/dev/null
(cd $WORK && tar czf "$OUT/arm-metrics.tgz" runs/*/metrics.jsonl runs/*/summary.json runs/*/config.json 2>/dev/null)
(cd $OUT && ls *.log | grep -v '^run.log$' > /tmp/logs.txt && tar czf logs-$MODE.tgz -T /tmp/logs.txt \
  && rm -f $(cat /tmp/logs.txt))
say "$MODE done"
