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
# On the lent H100 (SmolLM2 staged as bench/recipe_smollm2.sh and bench/smollm2_model.sh do it; DATA a chat JSONL
# with a heldout.jsonl beside it, e.g. the recipe's mix and held-out files):
#   TARGET=smollm2-135m-instruct DATA=/tmp/recipe-run/mix.jsonl STEPS=600 bash bench/defaults_ab.sh
# CPU check of this script (tiny target, a few steps, no GPU): GPUS="[]" STEPS=3 bash bench/defaults_ab.sh
set -u
TARGET=${TARGET:-tiny}
DATA=${DATA:-tiny}
STEPS=${STEPS:-600}
GPUS=${GPUS:-[0]}
OUT=${OUT:-/tmp/dflash-out}
PY=${PY:-python3}
WORK=${WORK:-/tmp/defaults-ab}
mkdir -p "$OUT" "$WORK"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
OLD=(-p block_size 8 -p num_anchors 24 -p seq_len 192 -p batch_size 8 -p num_draft_layers 2 -p lr 0.003
     -p loss_weighting decay -p compile_drafter False -p feature_store_gib 0.0 -p feature_store_host_gib 0.0)
run_arm() {  # arm name, then the extra parameters of that arm
  local arm=$1; shift
  local t0=$(date +%s.%N)
  $PY -m papermill notebooks/train.ipynb "$WORK/$arm.ipynb" --log-output -p target "$TARGET" -p data "$DATA" \
    -p steps "$STEPS" -y "gpus: $GPUS" -p run_name "ab-$arm" -p runs_dir "$WORK/runs" -p progress_every_s 30 "$@" \
    > "$OUT/$arm.log" 2>&1
  local rc=$?
  echo "$arm: exit $rc, $(echo "$(date +%s.%N) - $t0" | bc) s; $(grep -m1 '^settings:' "$OUT/$arm.log" | cut -c1-300)"
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
    run = sorted(runs.glob(f"*-ab-{arm}-*"))[-1]
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
