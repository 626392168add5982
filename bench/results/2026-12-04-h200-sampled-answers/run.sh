#!/usr/bin/env bash
# Answers sampled at the serving temperature against greedy answers, at 10,000 steps on SmolLM2 (one H200): two data
# pools that differ only in how the target answered the training prompts (T=0 / T=1; the same prompts, the same
# held-out files), one arm on each with the recipe's TrainConfig, both evaluated in ONE evaluation per (T, draft mode)
# so they share prompts, seed and the target-alone baseline.
#   bash run.sh stage   carry [".recipe/x1"]  GGUF part 1 (bench/smollm2_model.sh)
#   bash run.sh model   carry [".recipe/x2"]  GGUF part 2: join, check, decompress, convert
#   bash run.sh data    carry [".recipe/x3"]  the chitchat wheel; both pools' data phases side by side, then both
#                       arms side by side until the call's time is spent (each stops at a step with a checkpoint)
#   bash run.sh go      arms left unfinished continue exactly (resume_from); then the evaluations side by side: T=0
#                       on every set, and one process per draft mode at T=1 on SAMPLED_SETS
# Real tau does not depend on what else runs on the GPU; tokens/s and speedups measured side by side do, so none is
# quoted from here.
set -u
MODE=${1:?stage, model, data or go}
AB="python3 bench/recipe_ab.py"
OUT=${OUT:-/tmp/dflash-out}; mkdir -p "$OUT"
GREEDY=${GREEDY:-/tmp/sa-greedy}; SAMPLED=${SAMPLED:-/tmp/sa-t1}; BOTH=${BOTH:-/tmp/sa-both}
CALL_S=${CALL_S:-585}
DEVICE=${DEVICE:-cuda:0}
# the knob grid's settings (../2026-12-03-h200-knob-grid/), with the recipe's D-PACE weighting named
COMMON=${COMMON:-"--set compile_drafter=true --set steps=10000 --set val_every=1000 --set real_tau_every=5000 --set loss_weighting=\"dpace\""}
DATA_SETS=${DATA_SETS:-}  # e.g. a CPU smoke run with the tiny target
PROMPTS=${PROMPTS:-64}
SAMPLING=${SAMPLING:-"argmax coupled"}
SAMPLED_SETS=${SAMPLED_SETS:-"chitchat-heldout general"}
EVAL_T0=${EVAL_T0:-1}  # 0: T=1 only
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false DFLASH_LAB_CACHE=${DFLASH_LAB_CACHE:-/tmp/dflash-cache}
export PYTHONPATH=$PWD:/tmp/site
T0=$(date +%s)
left() { echo $(( CALL_S - ($(date +%s) - T0) )); }
say() { echo "[$MODE $(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/run.log"; }
status() { python3 -c "import json,sys; a=json.load(open('$1/ab.json')).get('arms',{}).get('$2'); print(a['status'] if a else 'new')"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$OUT/env.txt" 2>&1
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" >> "$OUT/env.txt"
echo "commit ${DFLASH_COMMIT:-unknown}" >> "$OUT/env.txt"

train_both() {  # each pool's arm in its own process with its own feature store; a stopped arm continues exactly
  local pids=() w arm st budget
  for w in $GREEDY $SAMPLED; do
    arm=dpace-$(basename $w); st=$(status $w $arm)
    case "$st" in new|stopped*) ;; *) say "arm $arm: $st"; continue ;; esac
    budget=$(( $(left) - 20 ))
    [ $budget -gt 90 ] || { say "arm $arm: ${budget}s left, not started"; continue; }
    say "arm $arm ($st) on $w, time budget ${budget}s"
    timeout $(( budget + 15 )) $AB train --work $w --arm $arm $COMMON --set time_budget_s=$budget \
      >> "$OUT/arm-$arm.log" 2>&1 &
    pids+=($!)
    sleep 5  # the second arm's placement check sees the first one's store
  done
  for p in "${pids[@]}"; do wait $p; say "train process $p rc=$?"; done
  for w in $GREEDY $SAMPLED; do arm=dpace-$(basename $w); say "arm $arm: $(status $w $arm); $(grep -v '^{' "$OUT/arm-$arm.log" 2>/dev/null | grep -i 'step\|error\|Trace' | tail -1 | cut -c1-240)"; done
}

case "$MODE" in
stage|model)
  bash bench/smollm2_model.sh $MODE 2>&1 | tee -a "$OUT/run.log"
  ;;
data)
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .recipe/x3/chitchat*.whl || exit 3
  say "data phases of both pools side by side"
  timeout $(left) $AB data --work $GREEDY --device $DEVICE $DATA_SETS > "$OUT/data-greedy.log" 2>&1 &
  p1=$!
  timeout $(left) $AB data --work $SAMPLED --device $DEVICE $DATA_SETS --set regen_temperature=1.0 \
    > "$OUT/data-t1.log" 2>&1 &
  p2=$!
  wait $p1; r1=$?; wait $p2; r2=$?
  say "data rc greedy=$r1 t1=$r2"; tail -1 "$OUT/data-greedy.log" | cut -c1-300; tail -1 "$OUT/data-t1.log" | cut -c1-300
  [ $r1 = 0 ] && [ $r2 = 0 ] || exit 5
  # the pools must differ in the training answers only: the same prompts to answer, the same held-out prompts
  python3 bench/results/2026-12-04-h200-sampled-answers/same_prompts.py $GREEDY $SAMPLED | tee -a "$OUT/run.log" || exit 6
  train_both
  cp $GREEDY/ab.json "$OUT/ab-greedy.json"; cp $SAMPLED/ab.json "$OUT/ab-t1.json"
  ;;
go)
  for w in $GREEDY $SAMPLED; do [ -f $w/ab.json ] || { say "no $w/ab.json: run 'data' first on this machine"; exit 2; }; done
  train_both
  # one state with both arms (the greedy pool's sets: the same prompts as the other pool's, same_prompts.py)
  python3 bench/results/2026-12-04-h200-sampled-answers/same_prompts.py $GREEDY $SAMPLED --merge $BOTH || exit 6
  pids=()
  say "eval T=0"
  [ "$EVAL_T0" = 1 ] && timeout $(left) $AB eval --work $BOTH --device $DEVICE \
    --prompts $PROMPTS --temperature 0 --time-budget-s $(( $(left) - 20 )) --out $BOTH/eval-t0.json \
    > "$OUT/eval-t0.log" 2>&1 &
  pids+=($!)
  # one process per (draft mode, set), each stopping before a prompt that would end past the call's budget (the
  # evaluation runs torch on one CPU thread: the T=1 acceptance runs on the CPU, beside the other processes)
  for s in $SAMPLING; do
    for ps in $SAMPLED_SETS; do
      say "eval T=1 $s on $ps"
      timeout $(left) $AB eval --work $BOTH --device $DEVICE --prompts $PROMPTS \
        --temperature 1 --draft-sampling $s --sampled-sets $ps --time-budget-s $(( $(left) - 20 )) \
        --out $BOTH/eval-t1-$s-$ps.json \
        > "$OUT/eval-t1-$s-$ps.log" 2>&1 &
      pids+=($!)
    done
  done
  for p in "${pids[@]}"; do wait $p; say "eval process $p rc=$?"; done
  for f in "$OUT"/eval-*.log; do say "$(basename $f):"; grep -v "^eval " "$f" | tail -8 | cut -c1-200; done
  cp $GREEDY/ab.json "$OUT/ab-greedy.json"; cp $SAMPLED/ab.json "$OUT/ab-t1.json"
  (cd $BOTH && ls eval-*.json > /dev/null 2>&1 && tar czf "$OUT/evals.tgz" eval-*.json)
  (tar czf "$OUT/arm-metrics.tgz" $GREEDY/runs/*/metrics.jsonl $GREEDY/runs/*/summary.json $GREEDY/runs/*/config.json \
    $SAMPLED/runs/*/metrics.jsonl $SAMPLED/runs/*/summary.json $SAMPLED/runs/*/config.json 2>/dev/null)
  ;;
esac
(cd $OUT && ls *.log > /dev/null 2>&1 && tar czf logs-$MODE.tgz $(ls *.log | grep -v run.log) 2>/dev/null \
  && rm -f $(ls *.log | grep -v run.log))  # 8 files come back
say "done"
nvidia-smi --query-gpu=memory.used --format=csv,noheader >> "$OUT/run.log" 2>&1
ls -la "$OUT"
exit 0
