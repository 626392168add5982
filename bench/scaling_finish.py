"""Finish a scaling study cut short by a device call's limit: train the largest matched-steps point alone, and
evaluate the points that trained but were not evaluated (block 16, T=0, bf16, 64 prompts per set, 128 tokens)."""
import dataclasses
import glob
import json
import subprocess
import sys
import time
from pathlib import Path

from dflash_lab.config import TrainConfig
from dflash_lab.runs.rundir import new_run_dir, write_json

W = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/scaling-run")
BUDGET = float(sys.argv[2]) if len(sys.argv) > 2 else 330
pts = {json.load(open(f))["name"]: Path(f).parent for f in glob.glob(str(W / "*/scaling_point.json"))}
print(pts, flush=True)
src = pts["steps-n5000-d3"]
tc = TrainConfig.from_json(src / "config.json")
tc = dataclasses.replace(tc, data=str(W / "data/train-45000.jsonl"), run_name="scaling-steps-n45000-d3", real_tau_every=0)
rd = new_run_dir(tc.runs_dir, tc.run_name)
tc.to_json(rd / "config.json")
meta = json.load(open(src / "scaling_point.json"))
meta = {k: meta[k] for k in ("series", "steps", "depth", "prompt_sets", "eval_new_tokens", "eval_prompts", "eval_dtype")}
meta.update(name="steps-n45000-d3", conversations=45000, epochs=round(1500 * 32 / 45000, 3), block_sizes=[16])
write_json(rd / "scaling_point.json", meta)
procs = [subprocess.Popen([sys.executable, "-m", "dflash_lab.scaling", "--point", str(rd)],
                          stdout=open(rd / "scaling.log", "wb"), stderr=subprocess.STDOUT)]
code = ("import json,sys; from pathlib import Path; from dflash_lab.scaling import evaluate_point; d=Path(sys.argv[1]); "
        "p=json.load(open(d/'scaling_point.json')); p.setdefault('evals',{})['b16-t0']=evaluate_point(d, "
        "p['prompt_sets'], 16, 0.0, 128, 64, 'bfloat16'); json.dump(p, open(d/'scaling_point.json','w'), indent=1)")
for name in ("steps-n1500-d3", "steps-n5000-d3", "epochs-n1500-d3"):
    procs.append(subprocess.Popen([sys.executable, "-c", code, str(pts[name])], stdout=open(pts[name] / "eval.log", "wb"),
                                  stderr=subprocess.STDOUT))
t0 = time.time()
while any(p.poll() is None for p in procs) and time.time() - t0 < BUDGET:
    time.sleep(5)
print("rcs", [p.poll() for p in procs], round(time.time() - t0), flush=True)
for f in glob.glob(str(W / "*/scaling_point.json")):
    p = json.load(open(f))
    ev = (p.get("evals") or {}).get("b16-t0", {})
    print(p["name"], p.get("train", {}).get("wall_s"), {k: (round(v["tau"], 2), v.get("tau_low"), v.get("tau_high"),
          v.get("speedup"), v.get("real_mismatches"), v.get("prompts")) for k, v in ev.items() if isinstance(v, dict)})
for d in list(pts.values()) + [rd]:
    for lf in ("eval.log", "scaling.log"):
        if (d / lf).exists():
            print(d.name, lf, (d / lf).read_text()[-500:])
