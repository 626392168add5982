#!/usr/bin/env bash
# The drafter's attention split in two (model.attend_blocks: flex over the context keys, each block's own slots by
# one batched matmul, merged through the log-sum-exp) against the one flex call over [context | every block] of
# the tree before (b3dfbd1), on one GPU, three calls on one warm machine:
#   made here: git archive b3dfbd1 dflash_lab | gzip > .recipe/old/old-b3dfbd1.tgz
#   A  carry [".recipe/x1"] (pytest wheels): GPU tests of the attention, masks, compile and capture; the attention
#      alone at the recipe and paper shapes (bench/flex_tiles.py); distillation's targets (benchmarks/soft_labels)
#   B  carry [".recipe/old"]: the recipe-shape step through the notebook's entry point, old tree and this one,
#      compiled drafter (the recipe) and the default engine (CUDA graphs), batch 32; this tree's last steps profiled
#   AB carry [".recipe/x1", ".recipe/old"]: A with fewer attention variants, and B's compiled rows (one call)
#   C  carry [".whl", ".recipe/old"] (the peer's wheels and harness, ../shared/bench): the peer's paper-shape step,
#      then ours (this tree and the old one) on the same GPU
# Calls made (one H100, 2026-12-06; see README.md): AB (call1/), a GPU-test call, the old tree profiled from its own
# folder with the split's paper-shape attention (call3-old-profile/), batch 64 old and new (call4-b64/).
set -u
OUT=${OUT:-/tmp/dflash-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false DFLASH_LAB_CACHE=/tmp/dflash-cache
T0=$(date +%s)
say() { echo "[$1 $(( $(date +%s) - T0 ))s] ${*:2}" | tee -a "$OUT/run.log"; }
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  echo "commit ${DFLASH_COMMIT:-unknown} (this tree) against b3dfbd1 (old)"; } > "$OUT/env.txt" 2>&1
old_tree() { mkdir -p /tmp/old && tar xzf .recipe/old/old-b3dfbd1.tgz -C /tmp/old; }
E="-m dflash_lab.benchmarks.entry_points --shapes recipe --entry-points notebook --draft-vocab 16384"
entry() {  # label, tree, timeout, extra args. Run FROM the tree: `python -m` puts the working directory ahead of
  # PYTHONPATH, so PYTHONPATH=/tmp/old from the repository root imports this tree (the first call's "old" row did;
  # each row's "tree" field says which package ran)
  (cd $2 && PYTHONPATH=$2 timeout $3 python3 $E --label $1 --out "$OUT/entry.jsonl" ${@:4} > /dev/null 2>> "$OUT/entry.log")
  say entry "$1 rc=$?"
}
case "${1:?A, B, C or AB}" in
AB)  # what matters most, in one call (carry [".recipe/x1", ".recipe/old"]): tests, the attention alone, the step
  T_TESTS=90 T_FLEX=65 T_FLEXP=40 T_SOFT=30 VARIANTS="base split split-compiled" PVARIANTS="base split" bash $0 A
  old_tree
  entry old-b3dfbd1-compiled /tmp/old 80 --compile-drafter true --feature-store-gib 4 --steps 100 --warmup 25
  entry new-compiled $PWD 88 --compile-drafter true --feature-store-gib 4 --steps 105 --warmup 25 --profile-steps 5
  B_SUMMARY=1 bash $0 B
  ;;
A)
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .recipe/x1/*.whl || exit 3
  PYTHONPATH=$PWD:/tmp/site timeout ${T_TESTS:-170} python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_gpu.py \
    tests/test_packing.py tests/test_compile.py tests/test_distill.py \
    -k "flex or packed or compile or distill or graph_replay or selection or mixed" > "$OUT/gpu-tests.log" 2>&1
  say tests "rc=$? $(tail -1 "$OUT/gpu-tests.log")"
  export PYTHONPATH=$PWD
  timeout ${T_FLEX:-130} python3 bench/flex_tiles.py --shape recipe --variants ${VARIANTS:-base split split-compiled b64 sdpa} \
    > "$OUT/flex-recipe.jsonl" 2> "$OUT/flex-recipe.log"
  say flex_recipe "rc=$?"
  timeout ${T_FLEXP:-100} python3 bench/flex_tiles.py --shape paper --variants ${PVARIANTS:-base split split-compiled} \
    > "$OUT/flex-paper.jsonl" 2> "$OUT/flex-paper.log"
  say flex_paper "rc=$?"
  timeout ${T_SOFT:-60} python3 -m dflash_lab.benchmarks.soft_labels > "$OUT/soft-labels.jsonl" 2> "$OUT/soft-labels.log"
  say soft_labels "rc=$?"
  python3 -c "
import json, sys
for f in sys.argv[1:]:
    for l in open(f):
        r = json.loads(l)
        print({k: r.get(k) for k in ('shape', 'variant', 'formulation', 'k', 'ms', 'fwd_ms', 'fwd_bwd_ms', 'partial_tiles', 'full_tiles', 'max_abs_diff', 'dq_diff', 'dk_diff', 'dv_diff', 'same_ids', 'max_logp_diff', 'error') if k in r})
" "$OUT/flex-recipe.jsonl" "$OUT/flex-paper.jsonl" "$OUT/soft-labels.jsonl"
  ;;
B)
  [ -n "${B_SUMMARY:-}" ] || { old_tree
  entry old-b3dfbd1-compiled /tmp/old 110 --compile-drafter true --feature-store-gib 4 --steps 150 --warmup 30
  entry new-compiled $PWD 120 --compile-drafter true --feature-store-gib 4 --steps 155 --warmup 30 --profile-steps 5
  entry old-b3dfbd1-default /tmp/old 90 --compile-drafter false --feature-store-gib 4 --steps 150 --warmup 30
  entry new-default $PWD 90 --compile-drafter false --feature-store-gib 4 --steps 150 --warmup 30
  entry new-compiled-b64 $PWD 100 --compile-drafter true --feature-store-gib 8 --conversations 512 --batch-sizes 64 \
    --steps 150 --warmup 30; }
  python3 - "$OUT/entry.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    print(r.get("label"), "b", r.get("batch_size"), "->", r.get("step_ms"), "ms", r.get("tokens_per_s"), "tok/s",
          "tgt", r.get("target_ms"), "dr", r.get("drafter_ms"), r.get("error", "")[:300])
    if "profile" in r:
        p = r["profile"]
        print(" busy", p["device_busy_ms_per_step"], json.dumps(p["families_ms_per_step"]))
PY
  ;;
C)
  old_tree
  T_BIG=1 T_PEER=${T_PEER:-330} T_OURS=${T_OURS:-130} OUR_VARIANTS=graph,compile bash bench/h200_peer.sh
  PYTHONPATH=/tmp/old timeout ${T_OLD:-100} python3 -m dflash_lab.benchmarks.step --shape paper --gpus 0 \
    --variants graph,compile --steps 20 --warmup 5 --out "$OUT/bench-old.jsonl" > /dev/null 2> "$OUT/bench_old.log"
  say old "rc=$? $(python3 -c "
import json, sys
for l in open(sys.argv[1]): r = json.loads(l); print(r.get('variant'), r.get('step_ms_median'), r.get('tokens_per_s'), r.get('error', '')[:200])
" "$OUT/bench-old.jsonl" | tr '\n' ' ')"
  ;;
esac
say done "$1"
