#!/usr/bin/env bash
# One arm at a recipe preset's TRAINING settings (default: DSpark at the long preset's) on the data that
# bench/variants_ab.sh made and packed, trained in JOBS: one job a `train` call, each stopped by its time budget
# (loading and tokenizing included, as the recipe counts its train phase) and continued exactly by the next. The
# default JOBS are the train phases of the long preset's DFlash run over its three calls, 98.2 + 490.1 + 99.4 s
# (bench/results/2026-12-06-h100-long-preset5/): the same minutes cut the same way, so the arm also tokenizes, loads
# and refills its feature store once a job as that run did once a call (hence token_cache=false), and the two compare
# at equal GPU-minutes on the same target-written data (self-60000.jsonl, sha256 8da2e712...). Jobs run while this
# script exported TOKENIZERS_PARALLELISM=false tokenized with the fast tokenizer's threads off: ~890-1,550
# conversations/s against the recipe run's ~4,300-4,900 on an H100 host, ~25-55 s more of each job's budget.
#   train   the next job of JOBS ("all jobs done" once every one ran or the arm finished its steps)
#   eval    real speculative decoding as the recipe evaluates: T=0 on the three held-out sets with the target alone
#           decoded too (speedups), T=1 with drafts sampled on held-out chitchat; 64 prompts, 128 new tokens, bf16
# Device calls on one warm machine, after bench/recipe_smollm2.sh stage1 with .recipe/x1, x2, x3 (~1,200 s of device
# time with the start on an H100):
#   carry .variants-data:  ITEMS=unpack CALL_S=60 bash bench/variants_ab.sh next
#   carry .recipe/x4:      ITEMS=model CALL_S=100 bash bench/variants_ab.sh next && bash bench/long_arm.sh train
#   then:                  bash bench/long_arm.sh train
#   then:                  bash bench/long_arm.sh train && bash bench/long_arm.sh eval
# Results under $OUT: long-arm.log, train-*.log, eval.log, results.tgz (ab.json with the arm's curve, the evaluation's
# rows, the run's metrics.jsonl, summary.json, config.json).
# CPU check (tiny target): after `TINY=1 ITEMS="data" bash bench/variants_ab.sh next`,
#   TINY=1 PRESET= JOBS="5 5" SETS="--set steps=400" bash bench/long_arm.sh train   (twice, then)
#   TINY=1 bash bench/long_arm.sh eval
set -u -o pipefail
MODE=${1:?usage: bash bench/long_arm.sh train|eval}
OUT=${OUT:-/tmp/dflash-out}; mkdir -p "$OUT"
WORK=${WORK:-/tmp/variants-ab}
PY=${PY:-python3}
DEVICE=${DEVICE:-cuda:0}
PROMPTS=${PROMPTS:-64}
ARM=${ARM:-dspark-long}
PRESET=${PRESET-long}
JOBS=${JOBS:-"98.2 490.1 99.4"}
# DSpark's step cost 1.10x DFlash's with the target's forward and 1.22x from the feature store at 3 layers (its heads
# add ~20% of that drafter's FLOPs, ~14% of the long preset's 5 layers): ~6,700 steps fill the 687.7 s in which
# DFlash took 7,500. 6,800 errs long: a cosine cut at ~97% by the last job's budget has lr ~0.2% of its peak left,
# while one that ends early leaves minutes unused. Validation every 500 steps draws the held-out chain-tau curve
SETS=${SETS:-'--set steps=6800 --set val_every=500 --set token_cache=false --set drafter_variant="dspark"
  --set loss_weighting="decay"'}
if [ "${TINY:-0}" = 1 ]; then DEVICE=cpu PROMPTS=2; fi
# TOKENIZERS_PARALLELISM left as it is: the tokenizer's own threads batch-encode the data, as they did in the
# recipe run this arm compares with (its tokenizing counts in each job's budget)
export PYTHONPATH=$PWD:/tmp/site${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export DFLASH_LAB_CACHE=${DFLASH_LAB_CACHE:-/tmp/dflash-cache}
say() { echo "[$(date -u +%H:%M:%S)] $*" | tee -a "$OUT/long-arm.log"; }
arm_field() {  # a field of the arm's entry in ab.json, $2 when it has none
  $PY -c "import json, sys; a = json.load(open(sys.argv[1])).get('arms', {}).get(sys.argv[2]) or {}
print(a.get(sys.argv[3], sys.argv[4]))" "$WORK/ab.json" "$ARM" "$1" "$2"
}
[ -f "$WORK/ab.json" ] || { say "no $WORK/ab.json: unpack or make the data first (bench/variants_ab.sh)"; exit 2; }
case $MODE in
train)
  [ "$(arm_field status none)" = finished ] && { say "arm $ARM already finished"; exit 0; }
  touch "$WORK/$ARM.jobs"; k=$(wc -l < "$WORK/$ARM.jobs")
  set -- $JOBS; [ "$k" -lt $# ] || { say "arm $ARM: all $# jobs done ($JOBS s); evaluate it"; exit 0; }
  shift "$k"; budget=$1
  say "arm $ARM (preset ${PRESET:-none}): job $(( k + 1 )) of ${budget}s, $(arm_field wall_s 0)s trained so far"
  log="$OUT/train-$(date -u +%H%M%S).log"
  # shellcheck disable=SC2086  # SETS holds several --set words
  timeout $(( ${budget%.*} + 150 )) $PY bench/recipe_ab.py train --work "$WORK" --arm "$ARM" \
    ${PRESET:+--preset $PRESET} $SETS --set time_budget_s=$budget > "$log" 2>&1
  rc=$?; [ $rc = 0 ] && echo "$budget" >> "$WORK/$ARM.jobs"
  say "arm $ARM rc=$rc: $(tail -1 "$log" | cut -c1-300)" ;;
eval)
  timeout ${EVAL_S:-400} $PY bench/recipe_ab.py eval --work "$WORK" --device "$DEVICE" --prompts "$PROMPTS" \
    --arms "$ARM" --temperature 0 --temperature 1 --draft-sampling sample --out "$WORK/ab-results-$ARM.json" \
    > "$OUT/eval.log" 2>&1
  rc=$?; say "eval rc=$rc: $(tail -1 "$OUT/eval.log" | cut -c1-300)" ;;
*) say "unknown mode $MODE: use train or eval"; exit 2 ;;
esac
(cd "$WORK" && tar czf "$OUT/results.tgz" ab.json $(ls ab-results*.json 2>/dev/null) runs/*/metrics.jsonl \
  runs/*/summary.json runs/*/config.json 2>/dev/null)
exit $rc
