#!/usr/bin/env bash
# Optional second device call (one H200, kind nvidia-h200, ~8-9 minutes): the peer `speculators` 0.9.0 DFlash step at
# the paper shape with the target forward inside (its first step compiles for ~4 minutes), then OUR step in bf16
# and FP8 on the same GPU in the same call, so the ratio is like for like (issue 16 item 6).
# Needs .whl/ carried: the peer wheels (bash ../shared/bench/get_peer_wheels.sh .whl) and the harness
# (cp ../shared/bench/peer_speculators.py .whl/).    Usage: bash bench/h200_peer.sh     (results in $OUT)
set -u
OUT=${OUT:-/tmp/dflash-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
T0=$(date +%s)
step() { echo "[peer $(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/run.log"; }
[ -f .whl/peer_speculators.py ] || { echo "missing .whl/peer_speculators.py: carry .whl (see the header)"; exit 2; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  > "$OUT/pip.log" 2>&1
step "pip rc=$?; peer speculators 0.9.0, paper shape with target forward (compile ~4 min)"
PYTHONPATH=/tmp/site timeout ${T_PEER:-330} python3 .whl/peer_speculators.py --spec-loss eager \
  --only spec_paper_A_with_target --budget-s 320 --out "$OUT/peer.json" > "$OUT/peer.log" 2>&1
step "peer rc=$?"
step "ours, same GPU: bf16 graph, FP8 graph, FP8 + compiled drafter, + compiled target, FP8 incl. weight grads"
PYTHONPATH=$PWD timeout ${T_OURS:-120} python3 -m dflash_lab.benchmarks.step --shape paper --gpus 0 \
  --variants ${OUR_VARIANTS:-graph,compile,compile-fp8} --steps 20 --warmup 5 --out "$OUT/bench.jsonl" \
  > /dev/null 2> "$OUT/bench_ours.log"
step "ours rc=$?"
step "ours, 32B-class shape (S=4096, colocated; the harness has no peer scenario for it): bf16 graph, FP8 compiled"
PYTHONPATH=$PWD timeout ${T_BIG:-130} python3 -m dflash_lab.benchmarks.step --shape big --gpus 0 \
  --variants ${BIG_VARIANTS:-graph,compile-fp8} --steps 10 --warmup 4 --out "$OUT/bench.jsonl" \
  > /dev/null 2> "$OUT/bench_big.log"
step "big rc=$?"
python3 - "$OUT" <<'PY'
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
peer = {}
if (out / "peer.json").exists():
    peer = json.loads((out / "peer.json").read_text())["scenarios"].get("spec_paper_A_with_target", {})
print("PEER", {k: peer.get(k) for k in ("ms_per_step", "seq_tokens_per_s", "peak_alloc_GiB", "error", "skipped")})
for line in (out / "bench.jsonl").read_text().splitlines() if (out / "bench.jsonl").exists() else []:
    r = json.loads(line)
    if "error" in r:
        print("ERROR", r.get("variant"), r["error"][:300]); continue
    ratio = (round(peer["ms_per_step"] / r["step_ms_median"], 3)
             if peer.get("ms_per_step") and r["shape"] == "paper" else None)
    print("OURS", r["shape"], r["variant"], r["step_ms_median"], "ms |", r["tokens_per_s"], "tok/s | x peer", ratio,
          "| time to 1st step", r["time_to_first_step_s"], "s | peak GiB", r["engine"].get("peak_mem_gb/cuda:0"))
PY
step "done"
