# Builds eval/ (what notebooks/results/vocab-topk64-smollm2-h100.ipynb reads through ab_report.load_ab) from this
# folder's calls and the `distill1-dpace` baseline of ../2026-12-06-h100-distill-t1/ (the same data pool: its
# training, held-out and prompt files are identical by sha256). No row here was decoded alone on the GPU (each arm's
# T=0 evaluation ran beside the other arm's training or beside its own T=1 evaluation), so every speed is left out:
# tau does not depend on what else runs on the GPU, tokens/s and speedups do.
#   python bench/results/2026-12-06-h100-vocab-topk64/merge_eval.py
import json
import sys
import tarfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ab_merge import merge_arm_metrics  # noqa: E402  (bench/results/ab_merge.py)

HERE = Path(__file__).resolve().parent
BASE = HERE.parent / "2026-12-06-h100-distill-t1" / "eval"
BASE_ARM = "distill1-dpace"
LAST = HERE / "call5-topk64-eval"  # its evals.tgz and arm-metrics.tgz hold both arms


def evals() -> dict[str, dict]:
    with tarfile.open(LAST / "evals.tgz") as tgz:
        return {m.name: json.load(tgz.extractfile(m)) for m in tgz.getmembers() if m.isfile()}


def main() -> None:
    ev = evals()
    rows = []
    for arm in ("vocab-full-distill1", "topk64-distill1"):
        for name in (f"eval-{arm}-t0.json", f"eval-{arm}-t1-sample.json"):
            rows += [{**r, "tokens_per_s": None, "speedup": None} for r in ev[name]["rows"] if r["arm"] == arm]
    base = json.loads((BASE / "results.json").read_text())
    rows += [{**r, "tokens_per_s": None, "speedup": None} for r in base["rows"]
             if r["arm"] == BASE_ARM and (r["temperature"] == 0 or r["draft_sampling"] == "sample")]
    ab = json.loads((LAST / "ab.json").read_text())
    base_ab = json.loads((BASE / "ab.json").read_text())
    ab["arms"] = {BASE_ARM: base_ab["arms"][BASE_ARM], **ab["arms"]}
    seconds = {arm: {**ev[f"eval-{arm}-t0.json"]["seconds"], **ev[f"eval-{arm}-t1-sample.json"]["seconds"]}
               for arm in ("vocab-full-distill1", "topk64-distill1")}
    seconds[BASE_ARM] = base["seconds"][BASE_ARM]
    out = HERE / "eval"
    out.mkdir(exist_ok=True)
    (out / "results.json").write_text(json.dumps({
        "rows": rows, "sets": base["sets"], "arms": ab["arms"], "seconds": seconds,
        "stopped": {"topk64-distill1": ev["eval-topk64-distill1-t0.json"]["stopped"]["0.0"]},
        "speed_left_out": "every row: each T=0 evaluation ran beside the other arm's training or beside a T=1 "
                          "evaluation, and distill1-dpace's rows beside its run's other arms (tau does not depend "
                          "on that; tokens/s and speedups do)."}, indent=1))
    (out / "ab.json").write_text(json.dumps(ab, indent=1))
    (out / "env.txt").write_text((LAST / "env.txt").read_text())
    merge_arm_metrics(out / "arm-metrics.tgz", LAST / "arm-metrics.tgz", BASE / "arm-metrics.tgz", BASE_ARM)
    print(f"{len(rows)} rows, arms {list(ab['arms'])} -> {out}")


if __name__ == "__main__":
    main()
