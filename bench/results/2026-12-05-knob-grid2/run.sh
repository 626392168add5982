#!/usr/bin/env bash
# The knob grid's next arms at 10,000 steps' tokens on one data pool (the SmolLM2 recipe's data at its defaults),
# one GPU, several 10-minute calls on one warm machine. Every arm is D-PACE on top of the recipe's TrainConfig
# (spec below): hard-label arms (`dpace`, batch 128 at equal tokens, WSD, the full vocabulary; run 2026-12-05/06)
# and, since the recipe distills, `distill1-dpace` and the knobs on top of it (5 layers and 128 anchors: run
# 2026-12-06, ../2026-12-06-h100-layers5-anchors128/; the full vocabulary and the top-64 distillation target: the
# default queue, with the baseline's pool identical by sha256). Arms run from a queue, PAR at a time (each its own
# process and feature store, sized to the GPU's memory); an arm stopped by the call's time continues exactly in the
# next call (resume_from).
# Each finished arm is evaluated at once beside the training: T=0 on every held-out set, and for T1_ARMS also T=1
# with each of SAMPLING's draft modes. Tau does not depend on what else runs on the GPU; tokens/s and speedups
# measured side by side do, so none from here is a speed figure.
#   bash run.sh stage            carry [".recipe/x1"], then [".recipe/x2"], then [".recipe/x3"]: GGUF parts and
#                                wheels (bench/smollm2_model.sh); with x1 (pytest wheels) also the GPU tests of
#                                sampled drafts on the static path
#   bash run.sh model            carry [".recipe/x4"]: last part, join, convert
#   bash run.sh data             the chitchat wheel (staged from x3), then the recipe's data phases (recipe_ab.py)
#   bash run.sh go               the queue: train, resume, evaluate, until the call's time is spent
#   bash run.sh decode           decode_bench at T=0 and T=1 (sampled drafts) on a random SmolLM2-shaped pair, alone
#   bash run.sh softlabels       distillation's targets (benchmarks/soft_labels.py): bf16 selection against fp32
#   bash run.sh pack             every log but run.log into logs.tgz (8 files come back from a call)
# CALL_T0 (epoch seconds) counts the call's time over several modes run in one call.
set -u
MODE=${1:?stage, model, data, go, decode, softlabels or pack}
AB=${AB:-"python3 bench/recipe_ab.py"}
OUT=${OUT:-/tmp/dflash-out}; mkdir -p "$OUT"
WORK=${WORK:-/tmp/knob-grid2}
CALL_S=${CALL_S:-580}
T0=${CALL_T0:-$(date +%s)}
ARMS=${ARMS:-"vocab-full-distill1 topk64-distill1"}
PAR=${PAR:-2}
T1_ARMS=${T1_ARMS:-"topk64-distill1"}
SAMPLING=${SAMPLING:-"argmax sample"}
PROMPTS=${PROMPTS:-64}
PROMPTS_T1=${PROMPTS_T1:-32}
DEVICE=${DEVICE:-cuda:0}
COMMON=${COMMON:-"--set compile_drafter=true --set steps=10000 --set val_every=1000 --set real_tau_every=5000"}
if [ -z "${STORE_GIB:-}" ]; then  # each of PAR arms' feature store: what the GPU holds beside ~30 GiB of working set
  TOTAL=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1)
  STORE_GIB=$(( ${TOTAL:-81920} / 1024 )); STORE_GIB=$(( (STORE_GIB - 30) / PAR )); [ $STORE_GIB -gt 60 ] && STORE_GIB=60
fi
spec() {
  # every arm names its distillation weight: the recipe trains with distill_weight=1.0 since 2026-12-06
  # (bench/results/2026-12-06-h100-distill-t1/), and the arms below "*-distill1" compare knobs on top of that
  P='--set loss_weighting="dpace" --set distill_weight=0.0'
  D='--set loss_weighting="dpace" --set distill_weight=1.0'
  case "$1" in
    dpace) echo "$P" ;;
    # the same tokens as 10,000 steps of 32 (2,500 steps of 128), lr x 2 (sqrt of 4), checks at the same tokens
    b128-dpace) echo "$P --set batch_size=128 --set steps=2500 --set lr=1.2e-3 --set val_every=250 --set real_tau_every=1250" ;;
    wsd-dpace) echo "$P --set lr_schedule=\"wsd\"" ;;
    vocab-full-dpace) echo "$P --set draft_vocab_size=null" ;;
    anchors128-dpace) echo "$P --set num_anchors=128" ;;
    # the target's own T=1 distribution (top-16) as the whole training target: the T=1 lever the sampled-draft
    # ceilings point at (added 2026-12-06, bench/results/2026-12-06-cpu-sampled-answers-ceiling/)
    distill1-dpace) echo "$D" ;;
    # the knobs not yet measured at 10,000 steps, on the recipe's distilled baseline (distill1-dpace)
    layers5-distill1) echo "$D --set num_draft_layers=5" ;;
    vocab32k-distill1) echo "$D --set draft_vocab_size=32768" ;;
    vocab-full-distill1) echo "$D --set draft_vocab_size=null" ;;
    anchors128-distill1) echo "$D --set num_anchors=128" ;;
    # the target's top 64 ids instead of 16: a sampled draft is accepted with at most the top-k mass the drafter
    # learned (bench/results/2026-12-06-cpu-top-k-ceiling/)
    topk64-distill1) echo "$D --set distill_top_k=64" ;;
    *) echo "unknown arm $1" >&2; exit 9 ;;
  esac
}
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false DFLASH_LAB_CACHE=/tmp/dflash-cache
export PYTHONPATH=$PWD:/tmp/site
left() { echo $(( CALL_S - ($(date +%s) - T0) )); }
say() { echo "[$MODE $(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/run.log"; }
status() { python3 -c "import json; a=json.load(open('$WORK/ab.json')).get('arms',{}).get('$1'); print(a['status'] if a else 'new')"; }
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
  echo "commit ${DFLASH_COMMIT:-unknown}; feature store per arm ${STORE_GIB} GiB, ${PAR} arms at a time"; } > "$OUT/env.txt" 2>&1

eval_arm() {  # $1 arm: T=0 on every set; for T1_ARMS one more process per draft mode at T=1 on chitchat
  local arm=$1 s
  say "eval $arm T=0"
  timeout $(left) $AB eval --work $WORK --device $DEVICE --prompts $PROMPTS --arms $arm --temperature 0 \
    --time-budget-s $(( $(left) - 20 )) --out $WORK/eval-$arm-t0.json > "$OUT/eval-$arm-t0.log" 2>&1 &
  epids+=($!)
  case " $T1_ARMS " in *" $arm "*) ;; *) return ;; esac
  for s in $SAMPLING; do
    say "eval $arm T=1 $s"
    timeout $(left) $AB eval --work $WORK --device $DEVICE --prompts $PROMPTS_T1 --arms $arm --temperature 1 \
      --draft-sampling $s --sampled-sets chitchat-heldout --time-budget-s $(( $(left) - 20 )) \
      --out $WORK/eval-$arm-t1-$s.json > "$OUT/eval-$arm-t1-$s.log" 2>&1 &
    epids+=($!)
  done
}

case "$MODE" in
stage)
  bash bench/smollm2_model.sh stage 2>&1 | tee -a "$OUT/run.log"
  if ls .recipe/x1/pytest-*.whl > /dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .recipe/x1/*.whl || exit 3
    say "GPU tests: sampled drafts on the static path (graphs against eager), the decoders, distillation's targets${GPU_TESTS:+, $GPU_TESTS}"
    timeout ${T_TESTS:-240} python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_speculative.py tests/test_distill.py \
      ${GPU_TESTS:-} 2>&1 \
      | tail -25 \
      | tee -a "$OUT/run.log"
  fi
  ;;
model)
  bash bench/smollm2_model.sh model 2>&1 | tee -a "$OUT/run.log"
  ;;
data)
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/recipe-smollm2/chitchat*.whl \
    || exit 3
  say "recipe data phases"
  timeout $(left) $AB data --work $WORK --device $DEVICE > "$OUT/data.log" 2>&1 || { say "data rc=$?"; exit 5; }
  tail -1 "$OUT/data.log" | cut -c1-600 | tee -a "$OUT/run.log"
  ;;
go)
  [ -f $WORK/ab.json ] || { say "no $WORK/ab.json: run 'data' first on this machine"; exit 2; }
  declare -A tpid=() tried=() evaled=()
  epids=()
  while :; do
    for arm in "${!tpid[@]}"; do  # reap finished training processes
      kill -0 ${tpid[$arm]} 2>/dev/null && continue
      wait ${tpid[$arm]}; rc=$?; unset "tpid[$arm]"
      say "arm $arm rc=$rc: $(status $arm); $(grep -v '^{' "$OUT/arm-$arm.log" | grep -i 'REAL tau\|error\|Trace' | tail -1 | cut -c1-300)"
    done
    for arm in $ARMS; do  # evaluate every finished arm once
      [ -z "${evaled[$arm]:-}" ] && [ "$(status $arm)" = finished ] && [ $(left) -gt 90 ] && { evaled[$arm]=1; eval_arm $arm; }
    done
    for arm in $ARMS; do  # start (or resume) arms while fewer than PAR train
      [ ${#tpid[@]} -lt $PAR ] || break
      [ -z "${tried[$arm]:-}" ] || continue
      tried[$arm]=1
      st=$(status $arm)
      case "$st" in new|stopped*) ;; *) continue ;; esac
      budget=$(( $(left) - 25 ))
      [ $budget -gt 150 ] || { say "arm $arm ($st): ${budget}s left, not started"; continue; }
      say "arm $arm ($st): $(spec $arm) feature_store_gib=$STORE_GIB, time budget ${budget}s"
      timeout $(( budget + 20 )) $AB train --work $WORK --arm $arm $COMMON $(spec $arm) \
        --set feature_store_gib=$STORE_GIB ${HOST_GIB:+--set feature_store_host_gib=$HOST_GIB} \
        --set time_budget_s=$budget >> "$OUT/arm-$arm.log" 2>&1 &
      tpid[$arm]=$!
      sleep 5  # the next arm's placement check sees this one's store
    done
    busy=${#tpid[@]}; for p in "${epids[@]}"; do kill -0 $p 2>/dev/null && busy=$((busy + 1)); done
    [ $busy -eq 0 ] && break
    [ $(left) -le 0 ] && { say "call's time spent"; break; }
    sleep 10
  done
  for p in "${epids[@]}"; do wait $p; done
  for f in "$OUT"/eval-*.log; do [ -f "$f" ] && { say "$(basename $f):"; grep -v "^eval \|^prompt set" "$f" | grep -v "^$" | tail -9 | cut -c1-160 | tee -a "$OUT/run.log"; }; done
  cp $WORK/ab.json "$OUT/ab.json"
  (cd $WORK && ls eval-*.json > /dev/null 2>&1 && tar czf "$OUT/evals.tgz" eval-*.json)
  (cd $WORK && tar czf "$OUT/arm-metrics.tgz" runs/*/metrics.jsonl runs/*/summary.json runs/*/config.json \
    runs/*/events.jsonl 2>/dev/null)
  ;;
decode)  # the decoders' cost at T=0 and T=1 (sampled drafts), random SmolLM2-shaped pair, nothing else on the GPU
  for t in 0 1; do
    timeout ${T_DECODE:-120} python3 -m dflash_lab.evaluation.decode_bench --skip-dynamic --temperature $t \
      --draft-sampling sample --repeats 3 > "$OUT/decode-t$t.jsonl" 2> "$OUT/decode-t$t.log"
    say "decode_bench T=$t rc=$?: $(grep summary "$OUT/decode-t$t.jsonl" | cut -c1-400)"
  done
  ;;
softlabels)  # distillation's targets at SmolLM2's head: the bf16 selection against the fp32 formulation, k 16 and 64
  timeout ${T_SOFT:-120} python3 -m dflash_lab.benchmarks.soft_labels > "$OUT/soft-labels.jsonl" 2> "$OUT/soft-labels.log"
  say "soft_labels rc=$?: $(cut -c1-120 "$OUT/soft-labels.jsonl" | tr '\n' ' ')"
  ;;
pack)  # at most 8 files come back: every log but run.log in one archive
  (cd $OUT && ls *.log 2>/dev/null | grep -v '^run.log$' > /tmp/logs.txt && [ -s /tmp/logs.txt ] \
    && tar czf logs.tgz -T /tmp/logs.txt && rm -f $(cat /tmp/logs.txt))
  ;;
esac
say "$MODE done"
