#!/usr/bin/env bash
# One H200 call: the GPU tests the key/value order touches, then the recipe-shape step of the tree before the
# change (commit 689dadb, carried as .recipe/w1/old.tgz) beside this tree, compiled, store + 16,384 ids, with a
# kernel profile of this tree's step and batch 64.
#   made here by: git archive 689dadb dflash_lab | gzip > .recipe/w1/old.tgz; pip download --no-deps pytest pluggy
#   iniconfig -d .recipe/w1        run with carry [".recipe/w1"]
set -u
OUT=${OUT:-/tmp/dflash-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false DFLASH_LAB_CACHE=/tmp/dflash-cache
T0=$(date +%s)
say() { echo "[kv-order $(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/run.log"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$OUT/env.txt" 2>&1
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" >> "$OUT/env.txt"
echo "commit ${DFLASH_COMMIT:-unknown} (this tree) against 689dadb (old)" >> "$OUT/env.txt"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .recipe/w1/*.whl
mkdir -p /tmp/old && tar xzf .recipe/w1/old.tgz -C /tmp/old
say "GPU tests"
PYTHONPATH=$PWD:/tmp/site timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py tests/test_speculative.py \
  tests/test_packing.py -m gpu -k "flex or graph_replay or distilled or compile_drafter_under or cuda_graph_path or packed" > "$OUT/gpu_tests.log" 2>&1
say "GPU tests rc=$?: $(tail -1 "$OUT/gpu_tests.log")"
E="-m dflash_lab.benchmarks.entry_points --shapes recipe --entry-points notebook --draft-vocab 16384 --compile-drafter true"
say "old tree (689dadb), batch 32"
PYTHONPATH=/tmp/old timeout 110 python3 $E --feature-store-gib 4 --steps 150 --warmup 30 --label old-689dadb --out "$OUT/entry.jsonl" > /dev/null 2>> "$OUT/entry.log"
say "this tree, batch 32, last 5 steps profiled"
PYTHONPATH=$PWD timeout 120 python3 $E --feature-store-gib 4 --steps 155 --warmup 30 --profile-steps 5 --label new --out "$OUT/entry.jsonl" > /dev/null 2>> "$OUT/entry.log"
say "this tree, batch 64"
PYTHONPATH=$PWD timeout 120 python3 $E --feature-store-gib 8 --conversations 512 --batch-sizes 64 --steps 150 --warmup 30 --label new-b64 --out "$OUT/entry.jsonl" > /dev/null 2>> "$OUT/entry.log"
say "old tree, batch 64"
PYTHONPATH=/tmp/old timeout 120 python3 $E --feature-store-gib 8 --conversations 512 --batch-sizes 64 --steps 150 --warmup 30 --label old-689dadb-b64 --out "$OUT/entry.jsonl" > /dev/null 2>> "$OUT/entry.log"
say "done"
python3 - "$OUT/entry.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    print(r.get("label"), "b", r["batch_size"], "->", r.get("step_ms"), "ms", r.get("tokens_per_s"), "tok/s",
          "tgt", r.get("target_ms"), "dr", r.get("drafter_ms"), r.get("error", "")[:300])
    if "profile" in r:
        p = r["profile"]
        print(" busy", p["device_busy_ms_per_step"], json.dumps(p["families_ms_per_step"]))
        for k in p["top_kernels"][:25]:
            print("  ", k["ms_per_step"], k["calls_per_step"], k["name"][:110])
PY
