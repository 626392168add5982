#!/usr/bin/env bash
# One H200 device call (under two minutes): the frozen LM head + CE, ours (step.chunked_head_ce) against
# cut-cross-entropy and liger-kernel's fused linear cross-entropy, forward + hidden gradient, bf16.
# Needs the wheels in .whl-ce/ (git-ignored; call with carry [".whl-ce"]):
#   python3 -m pip download --no-deps -d .whl-ce liger-kernel==0.8.5 cut-cross-entropy==25.1.1
#   bash bench/results/2026-12-02-h200-fused-ce/run.sh
set -u
OUT=${OUT:-/tmp/dflash-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
T0=$(date +%s)
say() { echo "[fused-ce $(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/run.log"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$OUT/env.txt" 2>&1
# A failed install is not fatal: the fused backends then give error rows and ours still runs.
python3 -m pip install -q --no-index --no-deps --target /tmp/ce-site .whl-ce/*.whl >> "$OUT/run.log" 2>&1 \
  || say "wheel install failed (is .whl-ce/ carried?): cce and liger rows will be errors"
export PYTHONPATH=$PWD:/tmp/ce-site
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)" >> "$OUT/env.txt" 2>&1
ls .whl-ce >> "$OUT/env.txt" 2>&1
F="python3 -m dflash_lab.benchmarks.fused_ce --device cuda --dtype bfloat16 --repeats 10 --out $OUT/fused_ce.jsonl"
# One process for every shape: the imports, Inductor and the triton JITs warm up once (each row's first_call_s).
say "recipe rows (32 x 64 anchors x 15 slots = 30720) x 576 at vocab 49152 and 16384; paper rows (512 x 15 = 7680)"
say "x 4096 at 151936 and 32768; recipe 49152 again with a peaked softmax (hidden std 8: logit std ~3.8)"
timeout 100 $F --cases 30720x576x49152 30720x576x16384 7680x4096x151936 7680x4096x32768 30720x576x49152x8 \
  > /dev/null 2>> "$OUT/fused_ce.log" || say "rc $? (124: cut by the timeout; the rows before it are kept)"
say "done"
python3 - "$OUT/fused_ce.jsonl" <<'PY'
import json, sys, pathlib
p = pathlib.Path(sys.argv[1])
rows = [json.loads(line) for line in p.read_text().splitlines()] if p.exists() else []
print(f"{'backend':<10} {'rows':>6} {'H':>5} {'vocab':>7} {'logit std':>9} {'ms':>8} {'peak MiB':>9} "
      f"{'vs ours: loss':>13} {'grad':>8} {'vs fp32: loss':>13} {'grad':>8} {'first s':>7}  per-row w  argmax")
for r in rows:
    if "error" in r:
        print(f"{r['backend']:<10} {r['rows']:>6} {r['hidden']:>5} {r['vocab']:>7} {r['logit_std']:>9}  ERROR "
              f"{r['error'][:200]}")
        continue
    print(f"{r['backend']:<10} {r['rows']:>6} {r['hidden']:>5} {r['vocab']:>7} {r['logit_std']:>9} {r['ms']:>8.2f} "
          f"{r['peak_mem_mib']:>9.0f} {r['loss_rel_diff']:>13.1e} {r['grad_rel_diff']:>8.1e} "
          f"{r['loss_rel_err_fp32']:>13.1e} {r['grad_rel_err_fp32']:>8.1e} {r['first_call_s']:>7}  "
          f"{str(r['per_row_weights']).lower():<9}  {str(r['argmax']).lower():<6}")
PY
