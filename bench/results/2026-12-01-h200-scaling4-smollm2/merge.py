"""How scaling.json here was put together (run from this folder): this session's two points on the spread prompt
selections plus the earlier sessions' points (../2026-12-01-h200-scaling3-smollm2/scaling.json).

This session evaluated on the selections `evaluation/prompts.py` now makes (a set's distinct prompts, n of them spread
evenly over the file): chitchat-heldout sha256 f27e55e533be, self-heldout 6d91c340112f, general 7c13700ee809. The
earlier points were evaluated on each file's FIRST 64 prompts (chitchat: the shortest answers, mostly greetings;
general: no multi-step prompts), so their sets are renamed "<set> (first 64)" and drawn as their own lines: the two
selections are different prompts and their taus are not comparable point for point. Same pool (102,393
conversations, restored from the earlier session's data parts), same settings (batch 32, seq 320, 64 anchors, lr
6e-4, 3 layers) and the same seeded training.
- s1500.json.gz: the study of call 9 (steps-n100000-d3: 1,500 steps), as the device wrote it.
- long10k_point.json.gz: the 10,000-step point's scaling_point.json (its training, as the device wrote it; its
  batched evaluation was cut by the call's limit after block 16) and long10k_evals.json (the same drafter evaluated
  again in call 9, block 16 and 8), final_scaling.json (its batch-1 evaluation, `final`).
"""

import gzip
import json

OLD_NAMES = {"steps-n100000-d3": "steps-n100000-d3 (first 64)", "variant-long": "variant-long6k"}

s1500 = json.load(gzip.open("s1500.json.gz"))
short = next(p for p in s1500["points"] if p["status"] == "finished")
long_point = json.load(gzip.open("long10k_point.json.gz"))
long_point["evals"] = json.load(open("long10k_evals.json"))
final = json.load(open("final_scaling.json"))["final"]
run_dir = final["run_dir"]
new = [{**short, "pool": "102k", "session": "2026-12-01 (4)"},
       {**{k: v for k, v in long_point.items() if k not in ("prompt_sets", "block_sizes", "eval_new_tokens",
                                                            "eval_prompts", "eval_dtype", "eval_batch")},
        "name": "variant-long10k", "status": "finished", "run_dir": run_dir, "pool": "102k",
        "session": "2026-12-01 (4)"}]
before = json.load(open("../2026-12-01-h200-scaling3-smollm2/scaling.json"))
old = []
for p in before["points"]:
    evals = {key: {f"{name} (first 64)": fig for name, fig in sets.items()} for key, sets in p["evals"].items()}
    old.append({**p, "name": OLD_NAMES.get(p["name"], p["name"]), "evals": evals})
order = {"steps": 0, "epochs": 1, "depth": 2, "variant": 3}
points = new + sorted(old, key=lambda p: (order.get(p["series"], 9), p["conversations"], p["steps"], p["name"]))
merged = {**s1500, "points": points, "best": "variant-long10k",
          "final": {**final, "point": "variant-long10k"},
          "wall_s": round(sum(p.get("wall_s", 0) for p in new), 1),
          "note": "this session's points on the spread selections + the earlier ones on the first-64 selections "
                  "(merge.py)"}
json.dump(merged, open("scaling.json", "w"))  # compact: the loss curves make it large
print([(p["name"], p["session"], sorted(p["evals"]["b16-t0"])) for p in points])
