"""Real tau of both defaults A/B arms (bench/defaults_ab.sh) at their last step: T=0, 64 held-out chitchat prompts,
128 new tokens, each arm at its own block size (16 now, 8 before), one evaluation each; rows into $OUT."""
import glob
import json
import os

from dflash_lab.evaluation.evaluate import evaluate

runs = os.environ.get("RUNS", "/tmp/defaults-ab/runs")
prompts = {"chitchat-heldout": os.environ.get("HELDOUT", "/tmp/defaults-ab/data/heldout.jsonl")}
out = {}
for arm in ("new", "old"):
    run = sorted(glob.glob(f"{runs}/ab-{arm}-2*"))[-1]  # <name>-<UTC stamp>-<id>
    rep = evaluate(run, prompts=prompts, block_size=None, temperature=0.0, max_new_tokens=128, n_prompts=64,
                   device=os.environ.get("DEVICE", "cuda:0"), untrained=False,
                   time_budget_s=float(os.environ.get("EVAL_S", "60")))
    print(arm, run, "\n", rep.table(), flush=True)
    out[arm] = {"run": run, "rows": rep.rows()}
    with open(os.path.join(os.environ.get("OUT", "."), "defaults-eval.json"), "w") as f:
        json.dump(out, f, indent=1, default=str)
