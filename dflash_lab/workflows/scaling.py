"""Data-scaling curves: what real tau a drafter reaches as the number of training conversations grows.

A drafter trained on a few thousand narrow conversations memorises them (training simulated tau climbs while real
tau on held-out prompts stalls, docs/tau-gap.md). This workflow measures the cure: nested subsets of one pool of
target-written conversations (the first N of one seeded shuffle, so every larger set contains the smaller ones),
each trained twice, at MATCHED STEPS (the same optimizer steps for every size: does more data help at a fixed
compute budget?) and at MATCHED EPOCHS (the same passes over the data: what does a size give when fully used?), plus
extra draft depths and other variants (a learning rate, more steps) at the largest size. Every point is evaluated
by real speculative decoding on the same named prompt sets (held-out chitchat, held-out target-written, the
project's general set), at each block size, T=0, many prompts at once (evaluation/batched_eval.py: the tau of
batch-1 decoding, with its bootstrap interval). Speedup needs a quiet device and batch 1, so it is measured once,
for the best point, by `final_eval` (`python -m dflash_lab.workflows.scaling --final <out>`): batch-1 decoding
beside the target alone (speedup, lossless verdicts), T=1, and optionally an fp32 lossless check.

    cfg = ScalingConfig(target="smollm2-135m-instruct", pool="data/pool.jsonl", heldout_data="data/heldout.jsonl",
                        prompt_sets={"chitchat-heldout": "...", "self-heldout": "...", "general": "..."},
                        devices=("cuda:0",) * 4)
    results = run_scaling(cfg)           # <out>/scaling.json, rewritten as points finish

Each point is its own process (`python -m dflash_lab.workflows.scaling --point <run dir>`): a plain Trainer on the run's
config.json, trained and finished, then evaluated; a point that fails is recorded with its error and the others go
on. Several slots on one device run points side by side (a 135M target leaves most of an H200 idle; compare tau,
not the tokens/s of points that shared a device). A point's process dies with the study (children.py), so a killed
study leaves no point training on in a run dir its resume needs.

A study resumed (`resume=True`) keeps only what belongs to it: the same configuration and the same pool by content
(sha256, recorded in scaling.json; a pool regenerated at the same path is refused before a subset is rewritten). A
per-point training budget goes in `base` as TrainConfig's `time_budget_s`: a point that spends it stops with a
checkpoint ("stopped (resumable)") and a resume continues it, as with stop_after_s.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path

from dflash_lab.config import ConfigError, TrainConfig
from dflash_lab.runs.checkpoint import latest_checkpoint
from dflash_lab.runs.rundir import new_run_dir, write_json
from dflash_lab.runs.run_files import RunFileError, read_json
from dflash_lab.runs.run_state import STOPPED_RESUMABLE
from dflash_lab.train.controls import STOP_FILE

from .children import child_env, die_with_parent
from .scaling_plan import (count_lines, plan_points, pool_sha256, schedule_order,  # noqa: F401 (the study's names)
                           write_subsets)

RESULTS_FILE = "scaling.json"
STOPPED_RC = 3  # a point's process: stopped with a checkpoint before its steps (run_scaling's stop_after_s)
POINT_FILE = "scaling_point.json"  # in each run dir: what the point is, then its evaluation figures
LOG_FILE = "scaling.log"


@dataclasses.dataclass(frozen=True, kw_only=True)
class ScalingConfig:
    """A scaling study: a pool of training conversations, the sizes to cut from it, and how each point is trained
    and measured."""

    target: str
    pool: str
    """JSONL of training conversations (answers written by the target); subsets are its first N after a shuffle."""
    heldout_data: str
    """Held-out conversations for validation during training (the same for every point)."""
    prompt_sets: dict
    """name -> JSONL prompt file (or a named set the evaluator knows); every point is evaluated on all of them."""
    sizes: tuple = (3_000, 10_000, 30_000, 100_000)
    matched_steps: int | None = 3_000
    """Optimizer steps of every size in the matched-steps series (None = no such series)."""
    matched_epochs: float | None = 1.0
    """Passes over the data in the matched-epochs series (steps = epochs * N / batch_size; None = no such series)."""
    min_steps: int = 100
    """The matched-epochs series never trains fewer steps than this (warm-up needs some)."""
    extra_depths: tuple = (5,)
    """Draft depths trained at the LARGEST size (matched steps) besides the base's num_draft_layers."""
    variants: dict = dataclasses.field(default_factory=dict)
    """name -> TrainConfig overrides (plus optional "steps"), each trained at the LARGEST size: the levers besides
    data, e.g. {"lr1.5e-3": {"lr": 1.5e-3}, "long": {"steps": 4500}}."""
    base: dict = dataclasses.field(default_factory=dict)
    """TrainConfig fields shared by every point (seq_len, batch_size, lr, ...)."""
    block_sizes: tuple = (16, 8)
    eval_new_tokens: int = 128
    eval_prompts: int | None = 64
    """Prompts per set (None = every prompt of the file)."""
    eval_dtype: str = "bfloat16"
    eval_batch: int = 64
    """Prompts decoded at once by each point's evaluation (greedy; tau as at batch 1)."""
    devices: tuple = ("cpu",)
    """Slots: one point per entry at a time; a device may be listed several times."""
    out: str = "runs/scaling"
    seed: int = 0

    def __post_init__(self):
        c = "ScalingConfig"
        sizes = tuple(self.sizes)
        if not sizes or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in sizes):
            raise ConfigError(f"{c}.sizes={self.sizes!r} is invalid: positive integers. Fix: e.g. (3000, 30000).")
        object.__setattr__(self, "sizes", tuple(sorted(sizes)))
        if self.matched_steps is None and self.matched_epochs is None:
            raise ConfigError(f"{c}: matched_steps and matched_epochs are both None, so no point would train. "
                              "Fix: set at least one (e.g. matched_steps=3000).")
        if self.matched_steps is not None and self.matched_steps < 1:
            raise ConfigError(f"{c}.matched_steps={self.matched_steps} must be >= 1 (or None).")
        if self.matched_epochs is not None and not self.matched_epochs > 0:
            raise ConfigError(f"{c}.matched_epochs={self.matched_epochs} must be > 0 (or None).")
        if not self.prompt_sets or not isinstance(self.prompt_sets, dict):
            raise ConfigError(f"{c}.prompt_sets={self.prompt_sets!r} is invalid: a dict name -> prompt file. "
                              "Fix: e.g. {'general': 'general'}.")
        if not self.devices or isinstance(self.devices, str):
            raise ConfigError(f"{c}.devices={self.devices!r} is invalid: a tuple of slots. Fix: ('cuda:0',) * 4.")
        object.__setattr__(self, "devices", tuple(self.devices))
        object.__setattr__(self, "block_sizes", tuple(self.block_sizes))
        object.__setattr__(self, "extra_depths", tuple(self.extra_depths))
        if not isinstance(self.variants, dict) or any(not isinstance(v, dict) for v in self.variants.values()):
            raise ConfigError(f"{c}.variants={self.variants!r} is invalid: a dict name -> TrainConfig overrides. "
                              "Fix: e.g. {'lr1.5e-3': {'lr': 1.5e-3}}.")
        if not isinstance(self.eval_batch, int) or self.eval_batch < 1:
            raise ConfigError(f"{c}.eval_batch={self.eval_batch!r} must be an integer >= 1.")
        for f in ("pool", "heldout_data"):
            if not Path(getattr(self, f)).expanduser().is_file():
                raise ConfigError(f"{c}.{f}={getattr(self, f)!r} is not a file. Fix: write it first (the target's "
                                  "answers to its own prompts: python -m dflash_lab.data.self_prompts ...).")
        self.train_config(size=self.sizes[0], steps=self.min_steps, data=self.pool)  # fails now, not in a child
        for name, over in self.variants.items():
            self.train_config(size=self.sizes[-1], steps=self.min_steps, data=self.pool, overrides=over, name=name)

    def train_config(self, *, size: int, steps: int, data: str, depth: int | None = None, name: str = "p",
                     overrides: dict | None = None) -> TrainConfig:
        fields = {**self.base, "target": self.target, "data": data, "heldout_data": self.heldout_data,
                  "steps": steps, "seed": self.seed, "run_name": f"scaling-{name}", "runs_dir": str(self.out)}
        if depth is not None:
            fields["num_draft_layers"] = depth
        fields.update({k: v for k, v in (overrides or {}).items() if k != "steps"})
        return TrainConfig(**fields)


def read_study(path: str | Path) -> dict:
    """A study's scaling.json; a cut-off or damaged one is a ConfigError naming the file and what to do."""
    try:
        return read_json(path)
    except RunFileError as e:
        raise ConfigError(f"{e} Its points' figures are still in their run dirs (scaling_point.json). Fix: put back "
                          "a good copy of the file, or run the study into a new out folder.") from None


def run_scaling(cfg: ScalingConfig, *, log=print, poll_s: float = 1.0, deadline_s: float | None = None,
                only: tuple | None = None, resume: bool = False, stop_after_s: float | None = None) -> dict:
    """Train and evaluate every point, `len(cfg.devices)` at a time; returns (and writes) the results.

    deadline_s: no point starts after this many seconds; stop_after_s: the points still training then stop at their
    next step with a checkpoint (the trainer's STOP file), recorded as "stopped (resumable)". only: names of the
    points to run now (the others are recorded as "not run"); resume: keep the finished points of the study already
    in cfg.out (same configuration) and run the rest, a stopped point continuing from its checkpoint and a trained
    but unevaluated one only evaluated: a study split over several sessions or time-limited calls."""
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    results_path = out / RESULTS_FILE
    config = json.loads(json.dumps({k: (list(v) if isinstance(v, tuple) else v)
                                    for k, v in dataclasses.asdict(cfg).items()}))
    pool_hash = pool_sha256(cfg.pool)
    before = read_study(results_path) if resume and results_path.is_file() else None
    if before is not None:  # checked before the subsets are written: they are the finished points' data
        what = lambda c: {k: v for k, v in (c or {}).items() if k != "devices"}  # noqa: E731 (slots are how, not what)
        if what(before.get("config")) != what(config):
            raise ConfigError(f"{results_path} was written by another configuration, so its points do not belong "
                              "to this study. Fix: the same ScalingConfig, or a new out folder.")
        if before.get("pool_sha256", pool_hash) != pool_hash:  # a study from before the hash was kept: not known
            raise ConfigError(f"the pool {cfg.pool} changed since {results_path} was written (sha256 "
                              f"{before['pool_sha256']} then, {pool_hash} now): resumed, its finished points and "
                              "the rest would come from two pools. Fix: put the study's pool back at that path, "
                              "or run this pool into a new out folder.")
    subsets = write_subsets(cfg.pool, cfg.sizes, out / "data", cfg.seed)
    points = plan_points(cfg, subsets)
    names = [p["name"] for p in points]
    if only is not None and set(only) - set(names):
        raise ConfigError(f"only={sorted(set(only) - set(names))} names no planned point. Fix: use names from "
                          f"{names}.")
    kept, trained = {}, {}
    if before is not None:
        kept = {p["name"]: p for p in before["points"] if p.get("status") == "finished"}
        # a point trained but not evaluated, or stopped with a checkpoint, goes on in its own run dir
        trained = {p["name"]: {"run_dir": p["run_dir"]} for p in before["points"]
                   if p["name"] not in kept and _reusable(p.get("run_dir"))}
    state = {"config": config, "pool_sha256": pool_hash, "points": [kept.get(p["name"]) or
                                          ({k: v for k, v in p.items() if k != "config"} | {"status": "pending"}
                                           | trained.get(p["name"], {}))
                                          for p in points], "started": time.time()}
    write_json(results_path, state)
    todo = [i for i in schedule_order(points) if names[i] not in kept and (only is None or names[i] in only)]
    for i in set(range(len(points))) - set(todo) - {names.index(n) for n in kept}:
        state["points"][i]["status"] = "not run (only)"
    log(f"scaling: {len(todo)} of {len(points)} points on {len(cfg.devices)} slots ({len(kept)} kept) -> "
        f"{results_path}")
    pending, running, t0, stopping = todo, {}, time.time(), False
    free = list(cfg.devices)
    while pending or running:
        if stop_after_s is not None and not stopping and time.time() - t0 >= stop_after_s:
            stopping, deadline_s = True, 0.0  # nothing starts now
            for i in running:  # the trainer checkpoints and ends at its next step boundary
                Path(state["points"][i]["run_dir"], STOP_FILE).touch()
            log(f"scaling: {stop_after_s:.0f} s: stopping {len(running)} running point(s) after a checkpoint")
        while pending and free and (deadline_s is None or time.time() - t0 < deadline_s):
            i, device = pending.pop(0), free.pop(0)
            running[i] = (_start(points[i], state["points"][i], cfg, device, log), device)
            write_json(results_path, state)  # a study killed now still names the point's run dir
        if deadline_s is not None and time.time() - t0 >= deadline_s and pending:
            for i in pending:
                state["points"][i]["status"] = "not started (deadline)"
            pending = []
        for i, (proc, device) in list(running.items()):
            rc = proc.poll()
            if rc is None:
                continue
            del running[i]
            free.append(device)
            _collect(state["points"][i], rc)
            log(f"scaling: {points[i]['name']} {state['points'][i]['status']} "
                f"({state['points'][i].get('wall_s', 0):.0f} s)")
            write_json(results_path, state)
        time.sleep(poll_s)
    state["best"] = best_point(state, cfg.block_sizes[0], next(iter(cfg.prompt_sets)))
    state["wall_s"] = round(time.time() - t0, 1)
    write_json(results_path, state)
    return state


def _start(point: dict, row: dict, cfg: ScalingConfig, device: str, log) -> subprocess.Popen:
    tc = dataclasses.replace(point["config"], devices=(device if not device.startswith("cuda") else "cuda:0",))
    if _reusable(row.get("run_dir")):
        run_dir = Path(row["run_dir"])  # from an earlier call: run_point resumes or only evaluates it
    else:
        run_dir = new_run_dir(tc.runs_dir, tc.run_name)
        tc.to_json(run_dir / "config.json")
        write_json(run_dir / POINT_FILE, {**{k: v for k, v in point.items() if k != "config"},
                                          "prompt_sets": cfg.prompt_sets, "block_sizes": list(cfg.block_sizes),
                                          "eval_new_tokens": cfg.eval_new_tokens, "eval_prompts": cfg.eval_prompts,
                                          "eval_dtype": cfg.eval_dtype, "eval_batch": cfg.eval_batch})
    row.update(status="running", run_dir=str(run_dir), device=device, started=time.time())
    log(f"scaling: {point['name']} ({point['conversations']} conversations, {point['steps']} steps, "
        f"{point['epochs']} epochs, depth {point['depth']}) on {device} -> {run_dir}")
    logf = open(run_dir / LOG_FILE, "ab")
    try:
        proc = subprocess.Popen([sys.executable, "-m", "dflash_lab.workflows.scaling", "--point", str(run_dir)],
                                stdout=logf, stderr=subprocess.STDOUT, env=child_env(device))
    finally:
        logf.close()  # the child holds its own copy of the file descriptor
    row["pid"] = proc.pid
    return proc


def _reusable(run_dir: str | None) -> bool:
    """Whether a point's run dir holds a finished training (its drafter and scaling_point.json's "train") or a
    checkpoint to resume from."""
    point = Path(run_dir or "") / POINT_FILE
    if not run_dir or not point.is_file():
        return False
    try:
        trained = read_json(point).get("train", {}).get("status") == "finished"
    except RunFileError:  # cut off while written: what the point did is not known, so it starts again
        return False
    return (point.parent / "checkpoints" / "drafter.safetensors").is_file() if trained else \
        latest_checkpoint(point.parent) is not None


def _collect(row: dict, rc: int) -> None:
    run_dir = Path(row["run_dir"])
    row["wall_s"] = round(time.time() - row["started"], 1)
    try:
        found = read_json(run_dir / POINT_FILE)
    except RunFileError as e:  # the point was killed while writing it: a failed point, not a failed study
        found = {"error": str(e)}
    row.update({k: found[k] for k in ("train", "evals") if k in found})
    if rc == 0 and "evals" in found:
        row["status"] = "finished"
    elif rc == STOPPED_RC:
        row["status"] = STOPPED_RESUMABLE
    else:
        tail = (run_dir / LOG_FILE).read_text(errors="replace").strip().splitlines()[-3:]
        row["status"] = "failed"
        row["error"] = found.get("error") or f"exit code {rc}: " + " | ".join(tail)


def best_point(state: dict, block_size: int, first_set: str) -> str | None:
    """The finished point with the highest tau on the first prompt set at the first block size (T=0)."""
    key = f"b{block_size}-t0"
    scored = [(p["evals"][key][first_set]["tau"], p["name"]) for p in state["points"]
              if p.get("status") == "finished" and first_set in p.get("evals", {}).get(key, {})]
    return max(scored)[1] if scored else None


def evaluate_point(run_dir: Path, prompt_sets: dict, block_sizes, new_tokens: int, n_prompts: int | None,
                   dtype: str, batch: int = 64, log=print) -> dict:
    """Greedy real tau of a run's drafter on every prompt set and block size, `batch` prompts at once:
    {f"b{B}-t0": {set: {tau, its 95% bootstrap interval over prompts (tau_low, tau_high), prompts, checksum}}}."""
    from dflash_lab.evaluation.batched_eval import batched_taus

    taus = batched_taus(run_dir, prompts=dict(prompt_sets), block_sizes=tuple(block_sizes),
                        max_new_tokens=new_tokens, n_prompts=n_prompts, dtype=dtype, batch=batch, log=log)
    return {f"{k}-t0": v for k, v in taus.items() if k != "drafter"}


def run_point(run_dir: Path) -> int:
    """One point's process: train on run_dir/config.json, finish, then evaluate on every prompt set."""
    die_with_parent()  # a point left training after its study is gone would hold its run dir on resume
    from dflash_lab.train.trainer import Trainer

    point = json.loads((run_dir / POINT_FILE).read_text())
    trainer = None
    try:
        before = point.get("train") or {}
        if before.get("status") == "finished":  # trained in an earlier call: evaluate only
            return _evaluate_point_file(run_dir, point)
        t0 = time.time()
        cfg = TrainConfig.from_json(run_dir / "config.json")
        resumed = latest_checkpoint(run_dir) is not None  # stopped in an earlier call: go on from its checkpoint
        trainer = Trainer(cfg.replace(resume_from=str(run_dir)) if resumed else cfg, run_dir=run_dir, explicit=())
        trainer.train(progress_every_s=15.0)
        summary = trainer.finish()
        hist = [r for r in trainer.history if "loss" in r and r["step"] > before.get("steps_done", 0)]
        curve = [{k: r[k] for k in ("step", "loss", "acc", "val_acc", "val_sim_tau", "real_tau", "real_tau_low",
                                    "real_tau_high") if r.get(k) is not None}
                 for r in trainer.history if (r.get("real_tau") is not None or r.get("val_acc") is not None)
                 and r["step"] > before.get("steps_done", 0)]
        done = trainer.step_count
        point["train"] = {"status": summary.get("status") if done >= cfg.steps else "stopped", "steps_done": done,
                          "wall_s": round(before.get("wall_s", 0) + time.time() - t0, 1),
                          "final_loss": hist[-1]["loss"] if hist else before.get("final_loss"),
                          "steady_tokens_per_s": summary.get("steady_tokens_per_s"),
                          "supervised_tokens": before.get("supervised_tokens", 0) + sum(
                              r.get("supervised_tokens", 0) for r in hist),
                          "loss_curve": before.get("loss_curve", []) + [
                              {"step": r["step"], "loss": r["loss"], "acc": r.get("acc")} for r in hist],
                          "curve": before.get("curve", []) + curve}
        trainer.close()
        trainer = None
        write_json(run_dir / POINT_FILE, point)
        return _evaluate_point_file(run_dir, point) if done >= cfg.steps else STOPPED_RC
    except BaseException as e:
        point["error"] = f"{type(e).__name__}: {e}"
        write_json(run_dir / POINT_FILE, point)
        raise
    finally:
        if trainer is not None:
            trainer.close()


def _evaluate_point_file(run_dir: Path, point: dict) -> int:
    t1 = time.time()
    point["evals"] = evaluate_point(run_dir, point["prompt_sets"], point["block_sizes"], point["eval_new_tokens"],
                                    point["eval_prompts"], point["eval_dtype"], point.get("eval_batch", 64))
    point["eval_wall_s"] = round(time.time() - t1, 1)
    write_json(run_dir / POINT_FILE, point)
    return 0


def final_eval(out: str | Path, *, prompt_sets: dict | None = None, block_size: int | None = None,
               n_prompts: int | None = 64, new_tokens: int = 128, dtype: str = "bfloat16",
               sampled_sets: tuple = (), sampled_prompts: int | None = None, lossless_prompts: int = 0,
               name: str | None = None, log=print) -> dict:
    """The best point (or `name`) at batch 1 on a quiet device: speedup over the target alone and the lossless
    verdicts at T=0 on every set, T=1 on `sampled_sets` (`sampled_prompts` each, None = n_prompts), and an fp32
    lossless check on `lossless_prompts` prompts of each set (0 = skip). Recorded under "final" in
    <out>/scaling.json and returned."""
    from dflash_lab.evaluation.evaluate import evaluate

    path = Path(out) / RESULTS_FILE
    if not path.is_file():
        raise ConfigError(f"{path} does not exist. Fix: pass the out folder of a study (run_scaling writes "
                          f"{RESULTS_FILE} there).")
    state = read_study(path)
    cfg = state["config"]
    sets = dict(prompt_sets or cfg["prompt_sets"])
    B = block_size or cfg["block_sizes"][0]
    pick = name or state.get("best")
    rows = [p for p in state["points"] if p["name"] == pick and p.get("status") == "finished"]
    if not rows:
        raise ConfigError(f"{path}: no finished point named {pick!r}. Fix: pass name= one of "
                          f"{[p['name'] for p in state['points'] if p.get('status') == 'finished']}.")
    if set(sampled_sets) - set(sets):
        raise ConfigError(f"sampled_sets={sorted(set(sampled_sets) - set(sets))} are not prompt sets of this "
                          f"evaluation. Fix: use names from {sorted(sets)}.")
    run_dir = Path(rows[0]["run_dir"])
    final = {"point": pick, "run_dir": str(run_dir), "block_size": B, "evals": {}}
    jobs = [("t0", sets, 0.0, dtype, n_prompts)]
    if sampled_sets:
        jobs.append(("t1", {s: sets[s] for s in sampled_sets}, 1.0, dtype, sampled_prompts or n_prompts))
    if lossless_prompts:
        jobs.append(("fp32-lossless", sets, 0.0, "float32", lossless_prompts))
    for key, chosen, temperature, dt, n in jobs:
        t0 = time.time()
        report = evaluate(run_dir, prompts=chosen, block_size=B, temperature=temperature, max_new_tokens=new_tokens,
                          n_prompts=n, untrained=False, dtype=dt, log=log)
        report.save()
        final["evals"][key] = {row["prompt_set"]: row for row in report.rows() if row["decoder"] == "trained"}
        final["evals"][key]["eval_dir"] = str(report.out_dir)
        final["evals"][key]["seconds"] = round(time.time() - t0, 1)
        state["final"] = final
        write_json(path, state)  # what finished is kept if a later job is cut off
        log(report.table())
    return final


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m dflash_lab.workflows.scaling",
                                description="one point of a data-scaling study (run_scaling starts these), or the "
                                            "batch-1 evaluation of its best point")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--point", help="the point's run directory (config.json + scaling_point.json)")
    g.add_argument("--final", help="a study's folder (scaling.json): evaluate its best point at batch 1")
    p.add_argument("--name", help="with --final: this point instead of the best")
    p.add_argument("--sampled", nargs="*", default=[], help="with --final: prompt sets also evaluated at T=1")
    p.add_argument("--lossless-prompts", type=int, default=0, help="with --final: fp32 lossless check on N "
                   "prompts of each set (0 = skip)")
    p.add_argument("--n-prompts", type=int, default=64, help="with --final: prompts per set")
    args = p.parse_args(argv)
    if args.point:
        return run_point(Path(args.point))
    if args.lossless_prompts < 0 or args.n_prompts < 1:
        p.error("--lossless-prompts must be >= 0 and --n-prompts >= 1")
    try:
        final_eval(args.final, name=args.name, sampled_sets=tuple(args.sampled), n_prompts=args.n_prompts,
                   lossless_prompts=args.lossless_prompts)
    except (ConfigError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
