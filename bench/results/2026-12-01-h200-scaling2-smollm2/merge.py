"""How scaling.json here was put together from the two studies the device calls wrote (run from this folder).

Call 3 trained the 102,393-conversation pool's points until the call's limit: three finished with their evaluation;
steps-n100000-d3 finished training (its metrics are in points/) but was killed during its evaluation, and
steps-n30000-d3 / variant-lr0.0012 were killed while training. That machine was given back, so call 5 wrote a
second pool (30,023 conversations: the same commands with --n 26000) and trained steps-n30000-d3 on it, with the
same settings, then evaluated it at batch 1 (scaling.final_eval). The merged file keeps every point with its pool.
"""

import json

a = json.load(open("scaling_call3_pool102k.json"))
b = json.load(open("scaling_call5_pool30k.json"))
points = []
for p in a["points"]:
    if p["name"] == "steps-n30000-d3":
        continue  # killed while training; the point of call 5 takes its place
    p["pool"] = "102k"
    if p["name"] == "steps-n100000-d3":
        p["status"] = "killed at the call's time limit (trained 1,500 steps, not evaluated)"
    elif p["name"] == "variant-lr0.0012":  # started after the parent's last write of the file
        p["status"] = "killed at the call's time limit (trained to step 1,000)"
    elif p["status"] == "pending":
        p["status"] = "not started (the call's time limit)"
    points.append(p)
for p in b["points"]:
    points.append({**p, "pool": "30k"})
for p in points:  # the training loss of every point that trained, killed ones included (points/*.metrics.jsonl)
    f = f"points/{p['name']}-pool{p['pool']}.metrics.jsonl"
    try:
        rows = [json.loads(line) for line in open(f) if line.strip()]
    except FileNotFoundError:
        continue
    p.setdefault("train", {})["loss_curve"] = [{"step": r["step"], "loss": r["loss"], "acc": r.get("acc")}
                                               for r in rows if "loss" in r]
merged = {**a, "points": points, "final": b["final"], "best": b["best"],
          "wall_s": round(a.get("wall_s") or 470.0) + b["wall_s"],
          "note": "two studies merged (merge.py): pool 102k (call 3) and pool 30k (call 5)"}
json.dump(merged, open("scaling.json", "w"), indent=1)
print({p["name"]: (p["pool"], p["status"]) for p in points})
