# Builds eval/ (what notebooks/results/layers5-anchors128-smollm2-h100.ipynb reads through ab_report.load_ab) from
# this folder's calls and the `distill1-dpace` baseline of ../2026-12-06-h100-distill-t1/ (the same data pool: its
# training, held-out and prompt files are identical by sha256). Speeds are kept only for rows decoded alone on the
# GPU: anchors128's T=0 evaluation (call 5) and layers5's second T=0 pass (call 6, chitchat and target-written).
#   python bench/results/2026-12-06-h100-layers5-anchors128/merge_eval.py
import json
import sys
import tarfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ab_merge import merge_arm_metrics  # noqa: E402  (bench/results/ab_merge.py)

HERE = Path(__file__).resolve().parent
BASE = HERE.parent / "2026-12-06-h100-distill-t1" / "eval"
BASE_ARM = "distill1-dpace"
NUM = {"temperature": float, "steps": int, "prompts": int, "tau": float, "tau_low": float, "tau_high": float,
       "tokens_per_s": float, "speedup": float}


def typed(row: dict) -> dict:
    return {k: (None if v in (None, "") else NUM[k](v)) if k in NUM else v for k, v in row.items()}


def evals(call: str) -> dict[str, dict]:
    with tarfile.open(HERE / call / "evals.tgz") as tgz:
        return {m.name: json.load(tgz.extractfile(m)) for m in tgz.getmembers() if m.isfile()}


def main() -> None:
    e4, e5 = evals("call4-layers5-anchors128"), evals("call5-anchors128-eval")
    alone6 = json.loads((HERE / "call6-layers5-speed" / "eval-layers5-alone.json").read_text())
    speed6 = {(r["arm"], r["prompt_set"]): r for r in map(typed, alone6["rows"]) if r["prompts"] == 64}
    rows = []
    for r in map(typed, e4["eval-layers5-distill1-t0.json"]["rows"]):  # decoded beside anchors128's training
        if r["arm"] == "target only":
            continue
        alone = speed6.get((r["arm"], r["prompt_set"]))
        assert alone is None or abs(alone["tau"] - r["tau"]) < 1e-9, "the two passes must decode identically"
        rows.append({**r, "tokens_per_s": alone and alone["tokens_per_s"], "speedup": alone and alone["speedup"]})
    rows += [{**r, "tokens_per_s": None, "speedup": None} for r in map(typed, e4["eval-layers5-distill1-t1-sample.json"]["rows"])]
    rows += list(map(typed, e5["eval-anchors128-distill1-t0.json"]["rows"]))  # alone: its target-only rows are the baseline
    base = json.loads((BASE / "results.json").read_text())
    rows += [r for r in base["rows"] if r["arm"] == BASE_ARM and (r["temperature"] == 0 or r["draft_sampling"] == "sample")]
    ab = json.loads((HERE / "call5-anchors128-eval" / "ab.json").read_text())
    base_ab = json.loads((BASE / "ab.json").read_text())
    ab["arms"] = {BASE_ARM: base_ab["arms"][BASE_ARM], **ab["arms"]}
    arms = {a: ab["arms"][a] for a in ab["arms"]}
    seconds = {"layers5-distill1": {**e4["eval-layers5-distill1-t0.json"]["seconds"],
                                    "1.0 sample": e4["eval-layers5-distill1-t1-sample.json"]["seconds"]["1.0 sample"]},
               "anchors128-distill1": e5["eval-anchors128-distill1-t0.json"]["seconds"],
               BASE_ARM: base["seconds"][BASE_ARM]}
    out = HERE / "eval"
    out.mkdir(exist_ok=True)
    (out / "results.json").write_text(json.dumps({
        "rows": rows, "sets": base["sets"], "arms": arms, "seconds": seconds, "stopped": None,
        "speed_left_out": "layers5-distill1's general row and T=1 row, and every distill1-dpace row: decoded beside "
                          "training or other evaluations (tau does not depend on that; tokens/s and speedups do). "
                          "layers5-distill1's chitchat and target-written speeds are of its second T=0 pass, alone "
                          "on the GPU (call6-layers5-speed/, identical tau); anchors128-distill1's T=0 rows decoded "
                          "alone, and their target-only rows are the T=0 baseline."}, indent=1))
    (out / "ab.json").write_text(json.dumps(ab, indent=1))
    (out / "env.txt").write_text((HERE / "call5-anchors128-eval" / "env.txt").read_text())
    merge_arm_metrics(out / "arm-metrics.tgz", HERE / "call5-anchors128-eval" / "arm-metrics.tgz", BASE / "arm-metrics.tgz", BASE_ARM)
    print(f"{len(rows)} rows, arms {list(arms)} -> {out}")


if __name__ == "__main__":
    main()
