import glob, json, os, sys
from dflash_lab.evaluation.evaluate import evaluate
runs = "/tmp/defaults-ab/runs"
new = sorted(glob.glob(f"{runs}/ab-new-2*"))[-1]; old = sorted(glob.glob(f"{runs}/ab-old-2*"))[-1]
rep = evaluate(new, prompts={"chitchat-heldout": "/tmp/defaults-ab/data/heldout.jsonl"}, block_size=None,
               temperature=0.0, max_new_tokens=128, n_prompts=64, device="cuda:0", untrained=False,
               compare={"old": old}, time_budget_s=150)
print(rep.table())
json.dump({"new": new, "old": old, "rows": rep.rows()}, open(os.environ["OUT"] + "/defaults-eval.json", "w"), indent=1, default=str)
