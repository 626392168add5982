#!/usr/bin/env bash
# The knobs at 10,000 steps on one data pool (the SmolLM2 recipe's data at its defaults), one H200, several
# 10-minute calls on one warm machine. Arms train two at a time on the one GPU (each in its own process, each with
# its own feature store: two of the ~46 GiB stores fit beside each other, three do not), and the evaluation of
# finished arms runs beside the next pair's training (batch-1 decoding leaves most of the GPU idle). Tau does not
# depend on what else runs on the GPU; tokens/s and speedups measured side by side do, so none is quoted from here.
#   bash run.sh stage   carry [".recipe/x1"]  GGUF part 1 (bench/smollm2_model.sh)
#   bash run.sh model   carry [".recipe/x2"]  GGUF part 2: join, check, decompress, convert (bench/smollm2_model.sh)
#   bash run.sh data    carry [".recipe/x3"]  the chitchat wheel, then the recipe's data phases (bench/recipe_ab.py)
#   TRAIN="base dpace" EVAL="" bash run.sh go   train the named arms side by side (each stopped by its time budget
#                        continues exactly in the next call), evaluate the named finished arms beside them
#                        (TEMPS="0 1": temperatures; SAMPLING="argmax sample coupled": draft modes at T > 0)
# .recipe/x1, x2: see bench/smollm2_model.sh; .recipe/x3: the chitchat_dataset-0.9.0 wheel (+ papermill's).
set -u
MODE=${1:?stage, model, data or go}
AB="python3 bench/recipe_ab.py"
OUT=${OUT:-/tmp/dflash-out}; mkdir -p "$OUT"
WORK=${WORK:-/tmp/knob-grid}
CALL_S=${CALL_S:-585}  # the call's limit, minus a margin
# Every arm: the recipe's TrainConfig (3 layers, 16,384-id head, decay weighting, cosine, batch 32, lr 6e-4,
# 64 anchors, feature store) at 10,000 steps, compiled, held-out validation every 1,000 steps, real tau (32
# held-out chitchat prompts) at 5,000 and 10,000; then one knob changed per arm.
COMMON=${COMMON:-"--set compile_drafter=true --set steps=10000 --set val_every=1000 --set real_tau_every=5000"}
DEVICE=${DEVICE:-cuda:0}  # cpu: a smoke run of this script with the tiny target (DATA_SETS, COMMON)
spec() {  # the weighting is named in every arm: the recipe's default changed to D-PACE after this grid
  D='--set loss_weighting="decay"'; P='--set loss_weighting="dpace"'
  case "$1" in
    base) echo "$D" ;;
    dpace) echo "$P" ;;
    layers5) echo "$D --set num_draft_layers=5" ;;
    # the grid's next arms, on top of the winner (D-PACE)
    layers5-dpace) echo "$P --set num_draft_layers=5" ;;
    vocab-full-dpace) echo "$P --set draft_vocab_size=null" ;;
    wsd-dpace) echo "$P --set lr_schedule=\"wsd\"" ;;
    anchors128-dpace) echo "$P --set num_anchors=128" ;;
    # batch 128 at equal tokens (2,500 steps), lr x 2 (sqrt of 4), checks at the same tokens as the others
    b128-dpace) echo "$P --set batch_size=128 --set steps=2500 --set lr=1.2e-3 --set val_every=250 --set real_tau_every=1250" ;;
    float8-dpace) echo "$P --set feature_store_dtype=\"float8\"" ;;
    # for sampled serving: the target's top-16 at T=1 as the label (half the loss), evaluated with SAMPLING
    distill-dpace) echo "$P --set distill_weight=0.5" ;;
    *) echo "unknown arm $1" >&2; exit 9 ;;
  esac
}
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false DFLASH_LAB_CACHE=/tmp/dflash-cache
export PYTHONPATH=$PWD:/tmp/site
T0=$(date +%s)
left() { echo $(( CALL_S - ($(date +%s) - T0) )); }
say() { echo "[$MODE $(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/run.log"; }
status() { python3 -c "import json,sys; a=json.load(open('$WORK/ab.json')).get('arms',{}).get('$1'); print(a['status'] if a else 'new')"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$OUT/env.txt" 2>&1
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" >> "$OUT/env.txt"
echo "commit ${DFLASH_COMMIT:-unknown}" >> "$OUT/env.txt"
case "$MODE" in
stage|model)
  bash bench/smollm2_model.sh $MODE 2>&1 | tee -a "$OUT/run.log"
  ;;
data)
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .recipe/x3/chitchat*.whl || exit 3
  say "recipe data phases"
  timeout $(( $(left) )) $AB data --work $WORK --device $DEVICE ${DATA_SETS:-} > "$OUT/data.log" 2>&1 || { say "data rc=$?"; exit 5; }
  tail -1 "$OUT/data.log" | cut -c1-600
  cp $WORK/ab.json "$OUT/ab.json"
  ;;
go)
  [ -f $WORK/ab.json ] || { say "no $WORK/ab.json: run 'data' first on this machine"; exit 2; }
  pids=()
  for arm in ${EVAL:-}; do  # finished arms: T=0 on every held-out set (+ T=1 on chitchat when TEMPS says so)
    [ "$(status $arm)" = finished ] || { say "eval $arm: $(status $arm), not evaluated"; continue; }
    temps=""; for t in ${TEMPS:-0}; do temps="$temps --temperature $t"; done
    say "eval $arm ($temps)"
    timeout $(( $(left) )) $AB eval --work $WORK --device $DEVICE --prompts ${PROMPTS:-64} --arms $arm $temps --out $WORK/eval-$arm.json \
      > "$OUT/eval-$arm.log" 2>&1 &
    pids+=($!)
  done
  for arm in ${TRAIN:-}; do
    st=$(status $arm)
    case "$st" in new|stopped*) ;; *) say "arm $arm: $st"; continue ;; esac
    budget=$(( $(left) - 20 ))
    say "arm $arm ($st): $(spec $arm), time budget ${budget}s"
    timeout $(( budget + 15 )) $AB train --work $WORK --arm $arm $COMMON $(spec $arm) --set time_budget_s=$budget \
      > "$OUT/arm-$arm.log" 2>&1 &
    pids+=($!)
    sleep 5  # the second arm's placement check sees the first one's store
  done
  for p in "${pids[@]}"; do wait $p; say "process $p rc=$?"; done
  for arm in ${TRAIN:-}; do say "arm $arm: $(status $arm); $(grep -v '^{' "$OUT/arm-$arm.log" 2>/dev/null | grep -i 'step\|error\|Trace' | tail -2 | cut -c1-240)"; done
  for arm in ${EVAL:-}; do [ -f "$OUT/eval-$arm.log" ] && { say "eval $arm:"; grep -v "^eval " "$OUT/eval-$arm.log" | tail -12 | cut -c1-200; }; done
  cp $WORK/ab.json "$OUT/ab.json"
  (cd $WORK && ls eval-*.json > /dev/null 2>&1 && tar czf "$OUT/evals.tgz" eval-*.json)
  (cd $WORK && tar czf "$OUT/arm-metrics.tgz" runs/*/metrics.jsonl runs/*/summary.json runs/*/config.json \
    runs/*/events.jsonl 2>/dev/null)
  (cd $OUT && tar czf logs-go.tgz arm-*.log eval-*.log 2>/dev/null && rm -f arm-*.log eval-*.log)  # 8 files come back
  ;;
esac
say "done"
nvidia-smi --query-gpu=memory.used --format=csv,noheader >> "$OUT/run.log" 2>&1
ls -la "$OUT"
exit 0
