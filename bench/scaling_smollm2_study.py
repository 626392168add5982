"""The SmolLM2 data-scaling study's configuration, shared by the device calls of bench/scaling_smollm2.sh.

    python bench/scaling_smollm2_study.py train DATA WORK MODEL DEVICE DTYPE BUDGET_S   every point but "long"
    python bench/scaling_smollm2_study.py final DATA WORK MODEL DEVICE DTYPE BUDGET_S   "long" (resumed study), then
                                                                                        the best point at batch 1
    STOP_AFTER=540 ...   the points still training 540 s in stop with a checkpoint; the next `final` resumes them
    ONLY="variant-long steps-n100000-d3" python bench/scaling_smollm2_study.py train ...  these points alone (either mode)

Sizes 3k / 10k / 30k / the pool (up to 100k) at matched steps (STEPS, default 1,500); matched epochs at the
largest size's epochs, so the largest point is shared by both series and compute grows with data; a 5-layer
drafter, a doubled learning rate and a long run (LONG_STEPS, default 4,000) at the largest size. SCALING_CPU=1 runs
the same plan on the tiny target with tiny sizes (a dry run of the scripts).
"""

import os
import sys

from dflash_lab.workflows.scaling import ScalingConfig, count_lines, final_eval, run_scaling


def study(data: str, work: str, model: str, device: str, dtype: str) -> ScalingConfig:
    cpu = os.environ.get("SCALING_CPU") == "1"
    n_pool = count_lines(f"{data}/pool.jsonl")
    sizes = [int(s) for s in os.environ.get("SIZES", "3000 10000 30000 100000").split()]
    sizes = sorted({min(s, n_pool) for s in sizes})  # a pool short of the largest size trains on all of it
    steps, batch = int(os.environ.get("STEPS", 1500)), int(os.environ.get("BATCH", 32))
    base = ({"seq_len": 320, "batch_size": batch, "num_anchors": 64, "block_size": 16, "num_draft_layers": 3,
             "lr": 6e-4, "real_tau_every": int(os.environ.get("REAL_TAU_EVERY", 500)), "real_tau_prompts": 32,
             "val_every": int(os.environ.get("VAL_EVERY", 500)), "log_every": 50}
            if not cpu else {"seq_len": 128, "batch_size": batch, "num_anchors": 8, "block_size": 4,
                             "num_draft_layers": 1, "lr": 3e-3, "real_tau_every": 0, "val_every": 0, "log_every": 1})
    lr = base["lr"]
    extra = os.environ.get("EXTRA", "1") == "1"  # EXTRA=0: the matched-steps series only
    return ScalingConfig(
        target=model, pool=f"{data}/pool.jsonl", heldout_data=f"{data}/chitchat-heldout-regen.jsonl",
        prompt_sets={"chitchat-heldout": f"{data}/chitchat-heldout-regen.jsonl",
                     "self-heldout": f"{data}/self/self-heldout.jsonl", "general": "general"},
        sizes=tuple(sizes), matched_steps=steps, matched_epochs=steps * batch / sizes[-1] if extra else None,
        min_steps=100 if not cpu else 2, base=base, extra_depths=((5,) if not cpu else (2,)) if extra else (),
        variants={f"lr{2 * lr:g}": {"lr": 2 * lr},
                  "long": {"steps": int(os.environ.get("LONG_STEPS", 4000 if not cpu else 8))}} if extra else {},
        block_sizes=tuple(int(b) for b in os.environ.get("BLOCKS", "16 8").split()) if not cpu else (4,),
        eval_dtype=dtype, eval_prompts=int(os.environ.get("EVAL_PROMPTS", 64)),
        eval_new_tokens=int(os.environ.get("EVAL_TOKENS", 128)),
        devices=(device,) * int(os.environ.get("SLOTS", 1)), out=work)


def main() -> int:
    mode, data, work, model, device, dtype, budget = sys.argv[1:8]
    cfg = study(data, work, model, device, dtype)
    only = tuple(os.environ.get("ONLY", "").split()) or None  # names of points (dflash_lab.workflows.scaling.plan_points)
    # STOP_AFTER: seconds into the call when running points stop with a checkpoint; `final` resumes them
    stop = float(os.environ["STOP_AFTER"]) if os.environ.get("STOP_AFTER") else None
    if mode == "train":
        from pathlib import Path

        from dflash_lab.workflows.scaling import plan_points

        names = [p["name"] for p in plan_points(cfg, {n: Path(work, f"train-{n}.jsonl") for n in cfg.sizes})]
        state = run_scaling(cfg, deadline_s=float(budget), only=only or tuple(n for n in names if n != "variant-long"),
                            stop_after_s=stop)
    elif mode in ("final", "one"):  # one: a fresh study trained and evaluated in the same call
        state = run_scaling(cfg, deadline_s=float(budget), resume=mode == "final", only=only, stop_after_s=stop)
        if not state.get("best"):  # every point still training (stopped again): the next `final` goes on
            print({p["name"]: p["status"] for p in state["points"]}, "no finished point: no batch-1 evaluation")
            return 0
        cpu = os.environ.get("SCALING_CPU") == "1"
        sets = os.environ.get("FINAL_SETS", "").split()
        final_eval(work, prompt_sets={k: v for k, v in cfg.prompt_sets.items() if k in sets} if sets else None,
                   n_prompts=int(os.environ.get("EVAL_PROMPTS", 64)),
                   new_tokens=int(os.environ.get("EVAL_TOKENS", 128)), dtype=dtype,
                   sampled_sets=("chitchat-heldout",), sampled_prompts=int(os.environ.get("SAMPLED_PROMPTS", 64)),
                   lossless_prompts=int(os.environ.get("LOSSLESS", 16)) if not cpu else 2)
    else:
        print(f"unknown mode {mode!r}: train or final", file=sys.stderr)
        return 2
    print({p["name"]: p["status"] for p in state["points"]}, state.get("best"), state.get("wall_s"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
