"""summary.json of this folder's evaluations (python summarize.py LABEL=EVAL_DIR ... > summary.json).

LABEL names the drafter, the draft mode and the seed, e.g. hard-3k/coupled/seed1. Per evaluation and prompt set:
tau with its 95% interval over prompts, and each slot's acceptance given that the slot was reached (iterations that
accepted >= k drafts over those that accepted >= k - 1). Per drafter, mode and set over its seeds: the pooled tau
(every iteration of every seed: accepted / iterations + 1) and each seed's tau, since at T > 0 one seed's draws move
tau by more than the modes differ.
"""

import json
import sys
from collections import defaultdict
from pathlib import Path


def slot_acceptance(accepted: list[int], slots: int) -> list[float | None]:
    reached = [sum(a >= k for a in accepted) for k in range(slots + 1)]
    return [round(reached[k] / reached[k - 1], 4) if reached[k - 1] else None for k in range(1, slots + 1)]


rows, pooled = [], defaultdict(lambda: {"accepted": [], "seed_tau": {}})
for item in sys.argv[1:]:
    label, _, folder = item.partition("=")
    drafter, mode, seed = label.split("/")
    ev = json.loads((Path(folder) / "eval.json").read_text())
    summary = {s["prompt_set"]: s for s in ev["summary"] if s["decoder"] == "trained"}
    for name, per_prompt in ev["results"]["trained"].items():
        accepted = [a for r in per_prompt for a in r["accepted"]]
        s = summary[name]
        rows.append({"drafter": drafter, "draft_sampling": mode, "seed": seed, "prompt_set": name,
                     "prompts": len(per_prompt), "tau": round(s["tau"], 4), "tau_low": round(s["tau_low"], 4),
                     "tau_high": round(s["tau_high"], 4), "iterations": len(accepted),
                     "slot_acceptance_given_reached": slot_acceptance(accepted, ev["block_size"] - 1)})
        p = pooled[(drafter, mode, name)]
        p["accepted"] += accepted
        p["seed_tau"][seed] = round(s["tau"], 4)
        p["slots"] = ev["block_size"] - 1
out = [{"drafter": d, "draft_sampling": m, "prompt_set": n, "seeds": len(p["seed_tau"]),
        "pooled_tau": round(sum(p["accepted"]) / len(p["accepted"]) + 1, 4), "seed_tau": p["seed_tau"],
        "iterations": len(p["accepted"]), "slot_acceptance_given_reached": slot_acceptance(p["accepted"], p["slots"])}
       for (d, m, n), p in pooled.items()]
print(json.dumps({"temperature": ev["temperature"], "block_size": ev["block_size"], "dtype": ev["dtype"],
                  "max_new_tokens": ev["max_new_tokens"], "pooled_over_seeds": out, "evaluations": rows}, indent=1))
