#!/usr/bin/env bash
# H200 run 3 (2 GPUs, kind nvidia-h200-x2), after replacing the compiled create_block_mask (~200 s inductor compile per
# GPU in runs 1-2) by engine.block_mask_from_dense: paper shape on 2 GPUs colocated (cold caches: time to first step),
# then the dense 32B-class shape colocated on both GPUs.   Usage: bash bench/results/2026-11-29-h200x2-run3/h200_run3.sh   (results in $OUT)
set -u
OUT=${OUT:-/tmp/dflash-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
B="python3 -m dflash_lab.benchmarks.step --out $OUT/bench.jsonl"
echo "[run3] paper, 2 GPUs colocated"
timeout ${T_PAPER:-100} $B --shape paper --gpus 0,1 --variants graph --steps 16 --warmup 4 > /dev/null 2> "$OUT/bench_paper_2gpu.log"
echo "[run3] rc=$?; big, 2 GPUs colocated"
timeout ${T_BIG:-95} $B --shape big --gpus 0,1 --variants graph --steps 8 --warmup 3 > /dev/null 2> "$OUT/bench_big_colocated.log"
echo "[run3] rc=$?"
python3 - "$OUT" <<'PY'
import json, sys, pathlib
for line in (pathlib.Path(sys.argv[1]) / "bench.jsonl").read_text().splitlines():
    r = json.loads(line)
    if "error" in r:
        print("ERROR", r["shape"], r["error"][:300]); continue
    e = r["engine"]
    print(r["shape"], r["variant"], r["num_gpus"], r["placement"], "| step", r["step_ms_median"], "| tok/s", r["tokens_per_s"],
          "| /gpu", r["tokens_per_s_per_gpu"], "| MFU", r["mfu"], "| ttfs", r["time_to_first_step_s"], "| d/o/r ms",
          e.get("drafter_ms"), e.get("optimizer_ms"), e.get("reduce_ms"), "| t ms", e.get("target_ms"),
          "| peak", {k.split("/")[1]: v for k, v in e.items() if k.startswith("peak_mem_gb")},
          "|", [v[:30] for k, v in e.items() if k.startswith("graph/")])
PY
tail -4 "$OUT/bench_paper_2gpu.log" "$OUT/bench_big_colocated.log" | cut -c1-300
