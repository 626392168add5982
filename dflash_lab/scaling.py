"""Data-scaling curves: what real tau a drafter reaches as the number of training conversations grows.

A drafter trained on a few thousand narrow conversations memorises them (training simulated tau climbs while real
tau on held-out prompts stalls, docs/tau-gap.md). This workflow measures the cure: nested subsets of one pool of
target-written conversations (the first N of one seeded shuffle, so every larger set contains the smaller ones),
each trained twice, at MATCHED STEPS (the same optimizer steps for every size: does more data help at a fixed
compute budget?) and at MATCHED EPOCHS (the same passes over the data: what does a size give when fully used?), plus
extra draft depths at the largest size. Every point is evaluated by real speculative decoding on the same named
prompt sets (held-out chitchat, held-out target-written, the project's general set), at each block size, T=0.

    cfg = ScalingConfig(target="smollm2-135m-instruct", pool="data/pool.jsonl", heldout_data="data/heldout.jsonl",
                        prompt_sets={"chitchat-heldout": "...", "self-heldout": "...", "general": "..."},
                        devices=("cuda:0",) * 4)
    results = run_scaling(cfg)           # <out>/scaling.json, rewritten as points finish

Each point is its own process (`python -m dflash_lab.scaling --point <run dir>`): a plain Trainer on the run's
config.json, trained and finished, then evaluated; a point that fails is recorded with its error and the others go
on. Several slots on one device run points side by side (a 135M target leaves most of an H200 idle; compare tau,
not the tokens/s of points that shared a device).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import random
import subprocess
import sys
import time
from pathlib import Path

from dflash_lab.config import ConfigError, TrainConfig
from dflash_lab.runs.rundir import new_run_dir, write_json

RESULTS_FILE = "scaling.json"
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
    base: dict = dataclasses.field(default_factory=dict)
    """TrainConfig fields shared by every point (seq_len, batch_size, lr, ...)."""
    block_sizes: tuple = (16, 8)
    eval_new_tokens: int = 128
    eval_prompts: int | None = 64
    """Prompts per set (None = every prompt of the file)."""
    eval_dtype: str = "bfloat16"
    sampled_eval: bool = True
    """Also evaluate the point with the highest held-out real tau at T=1 (block size block_sizes[0])."""
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
        for f in ("pool", "heldout_data"):
            if not Path(getattr(self, f)).expanduser().is_file():
                raise ConfigError(f"{c}.{f}={getattr(self, f)!r} is not a file. Fix: write it first (the target's "
                                  "answers to its own prompts: python -m dflash_lab.data.self_prompts ...).")
        self.train_config(size=self.sizes[0], steps=self.min_steps, data=self.pool)  # fails now, not in a child

    def train_config(self, *, size: int, steps: int, data: str, depth: int | None = None, name: str = "p"
                     ) -> TrainConfig:
        fields = {**self.base, "target": self.target, "data": data, "heldout_data": self.heldout_data,
                  "steps": steps, "seed": self.seed, "run_name": f"scaling-{name}", "runs_dir": str(self.out)}
        if depth is not None:
            fields["num_draft_layers"] = depth
        return TrainConfig(**fields)


def count_lines(path: str | Path) -> int:
    with open(path, "rb") as f:
        return sum(1 for line in f if line.strip())


def write_subsets(pool: str | Path, sizes: tuple, out_dir: Path, seed: int) -> dict[int, Path]:
    """Nested subsets of the pool: one seeded shuffle, then its first N lines for each size (so a larger set holds
    every conversation of a smaller one and the curves differ by data, not by which data)."""
    lines = [line for line in Path(pool).read_text().splitlines() if line.strip()]
    if len(lines) < max(sizes):
        raise ConfigError(f"the pool {pool} holds {len(lines)} conversations, fewer than the largest size "
                          f"{max(sizes)}. Fix: generate more (--n) or drop that size.")
    random.Random(seed).shuffle(lines)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {}
    for n in sizes:
        p = out_dir / f"train-{n}.jsonl"
        p.write_text("\n".join(lines[:n]) + "\n")
        paths[n] = p
    return paths


def plan_points(cfg: ScalingConfig, subsets: dict[int, Path]) -> list[dict]:
    """Every point of the study: its series, size, steps, epochs and depth (validated TrainConfigs)."""
    batch = cfg.train_config(size=1, steps=1, data=cfg.pool).batch_size
    base_depth = cfg.train_config(size=1, steps=1, data=cfg.pool).num_draft_layers
    points = []

    def add(series, n, steps, depth):
        name = f"{series}-n{n}-d{depth}"
        tc = cfg.train_config(size=n, steps=steps, data=str(subsets[n]), depth=depth, name=name)
        points.append({"name": name, "series": series, "conversations": n, "steps": steps, "depth": depth,
                       "epochs": round(steps * batch / n, 3), "config": tc})

    for n in cfg.sizes:
        if cfg.matched_steps is not None:
            add("steps", n, cfg.matched_steps, base_depth)
        if cfg.matched_epochs is not None:
            steps = max(cfg.min_steps, math.ceil(cfg.matched_epochs * n / batch))
            if cfg.matched_steps is None or steps != cfg.matched_steps:
                add("epochs", n, steps, base_depth)
    for depth in cfg.extra_depths:
        if depth != base_depth:
            add("depth", cfg.sizes[-1], cfg.matched_steps or points[-1]["steps"], depth)
    return points


def _child_env(device: str) -> dict:
    env = dict(os.environ)
    if device.startswith("cuda"):
        index = device.split(":")[1] if ":" in device else "0"
        visible = env.get("CUDA_VISIBLE_DEVICES")
        env["CUDA_VISIBLE_DEVICES"] = visible.split(",")[int(index)] if visible else index
    return env


def run_scaling(cfg: ScalingConfig, *, log=print, poll_s: float = 1.0, deadline_s: float | None = None) -> dict:
    """Train and evaluate every point, `len(cfg.devices)` at a time; returns (and writes) the results."""
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    subsets = write_subsets(cfg.pool, cfg.sizes, out / "data", cfg.seed)
    points = plan_points(cfg, subsets)
    state = {"config": {k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(cfg).items()},
             "points": [{k: v for k, v in p.items() if k != "config"} | {"status": "pending"} for p in points],
             "started": time.time()}
    results_path = out / RESULTS_FILE
    write_json(results_path, state)
    log(f"scaling: {len(points)} points on {len(cfg.devices)} slots -> {results_path}")
    pending, running, t0 = list(range(len(points))), {}, time.time()
    free = list(cfg.devices)
    while pending or running:
        while pending and free and (deadline_s is None or time.time() - t0 < deadline_s):
            i, device = pending.pop(0), free.pop(0)
            running[i] = (_start(points[i], state["points"][i], cfg, device, log), device)
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
    if cfg.sampled_eval:
        _sampled_eval(cfg, state, log)
    state["wall_s"] = round(time.time() - t0, 1)
    write_json(results_path, state)
    return state


def _start(point: dict, row: dict, cfg: ScalingConfig, device: str, log) -> subprocess.Popen:
    tc = dataclasses.replace(point["config"], devices=(device if not device.startswith("cuda") else "cuda:0",))
    run_dir = new_run_dir(tc.runs_dir, tc.run_name)
    tc.to_json(run_dir / "config.json")
    write_json(run_dir / POINT_FILE, {**{k: v for k, v in point.items() if k != "config"},
                                      "prompt_sets": cfg.prompt_sets, "block_sizes": list(cfg.block_sizes),
                                      "eval_new_tokens": cfg.eval_new_tokens, "eval_prompts": cfg.eval_prompts,
                                      "eval_dtype": cfg.eval_dtype})
    row.update(status="running", run_dir=str(run_dir), device=device, started=time.time())
    log(f"scaling: {point['name']} ({point['conversations']} conversations, {point['steps']} steps, "
        f"{point['epochs']} epochs, depth {point['depth']}) on {device} -> {run_dir}")
    logf = open(run_dir / LOG_FILE, "wb")
    try:
        return subprocess.Popen([sys.executable, "-m", "dflash_lab.scaling", "--point", str(run_dir)], stdout=logf,
                                stderr=subprocess.STDOUT, env=_child_env(device))
    finally:
        logf.close()


def _collect(row: dict, rc: int) -> None:
    run_dir = Path(row["run_dir"])
    row["wall_s"] = round(time.time() - row["started"], 1)
    found = json.loads((run_dir / POINT_FILE).read_text())
    row.update({k: found[k] for k in ("train", "evals") if k in found})
    if rc == 0 and "evals" in found:
        row["status"] = "finished"
    else:
        tail = (run_dir / LOG_FILE).read_text(errors="replace").strip().splitlines()[-3:]
        row["status"] = "failed"
        row["error"] = found.get("error") or f"exit code {rc}: " + " | ".join(tail)


def _sampled_eval(cfg: ScalingConfig, state: dict, log) -> None:
    """T=1 evaluation of the point with the highest real tau on the first prompt set, first block size."""
    first, B = next(iter(cfg.prompt_sets)), cfg.block_sizes[0]
    done = [p for p in state["points"] if p["status"] == "finished"]
    scored = [(p["evals"][f"b{B}-t0"][first]["tau"], p) for p in done if f"b{B}-t0" in p.get("evals", {})]
    if not scored:
        return
    best = max(scored, key=lambda s: s[0])[1]
    log(f"scaling: T=1 evaluation of the best point {best['name']}")
    best.setdefault("evals", {})[f"b{B}-t1"] = evaluate_point(Path(best["run_dir"]), cfg.prompt_sets, B, 1.0,
                                                              cfg.eval_new_tokens, cfg.eval_prompts, cfg.eval_dtype)
    state["best"] = best["name"]


def evaluate_point(run_dir: Path, prompt_sets: dict, block_size: int, temperature: float, new_tokens: int,
                   n_prompts: int | None, dtype: str, log=print) -> dict:
    """Real speculative decoding of a run's drafter on every prompt set: {set: {tau, its 95% bootstrap interval
    over prompts (tau_low, tau_high), prompts, speedup at batch 1, lossless counts}}."""
    from dflash_lab.evaluation.evaluate import evaluate

    report = evaluate(run_dir, prompts=dict(prompt_sets), block_size=block_size, temperature=temperature,
                      max_new_tokens=new_tokens, n_prompts=n_prompts, untrained=False, dtype=dtype, log=log)
    report.save()
    out = {}
    keep = ("tau", "tau_low", "tau_high", "prompts", "prompt_set_sha256", "speedup", "tokens_per_s",
            "identical_to_target", "near_ties", "real_mismatches", "new_tokens")
    for row in report.rows():
        if row["decoder"] == "trained":
            out[row["prompt_set"]] = {k: row[k] for k in keep if k in row}
    out["eval_dir"] = str(report.out_dir)
    return out


def run_point(run_dir: Path) -> int:
    """One point's process: train on run_dir/config.json, finish, then evaluate on every prompt set."""
    from dflash_lab.train.trainer import Trainer

    point = json.loads((run_dir / POINT_FILE).read_text())
    trainer = None
    try:
        t0 = time.time()
        trainer = Trainer(TrainConfig.from_json(run_dir / "config.json"), run_dir=run_dir)
        trainer.train(progress_every_s=15.0)
        summary = trainer.finish()
        hist = [r for r in trainer.history if "loss" in r]
        point["train"] = {"status": summary.get("status"), "wall_s": round(time.time() - t0, 1),
                          "final_loss": hist[-1]["loss"] if hist else None,
                          "supervised_tokens": sum(r.get("supervised_tokens", 0) for r in hist),
                          "real_tau_curve": [{"step": r["step"], "real_tau": r["real_tau"]} for r in trainer.history
                                             if r.get("real_tau") is not None]}
        trainer.close()
        trainer = None
        write_json(run_dir / POINT_FILE, point)
        point["evals"] = {}
        for B in point["block_sizes"]:
            point["evals"][f"b{B}-t0"] = evaluate_point(run_dir, point["prompt_sets"], B, 0.0,
                                                        point["eval_new_tokens"], point["eval_prompts"],
                                                        point["eval_dtype"])
            write_json(run_dir / POINT_FILE, point)
        return 0
    except BaseException as e:
        point["error"] = f"{type(e).__name__}: {e}"
        write_json(run_dir / POINT_FILE, point)
        raise
    finally:
        if trainer is not None:
            trainer.close()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m dflash_lab.scaling",
                                description="run one point of a data-scaling study (run_scaling starts these)")
    p.add_argument("--point", required=True, help="the point's run directory (config.json + scaling_point.json)")
    args = p.parse_args(argv)
    return run_point(Path(args.point))


if __name__ == "__main__":
    sys.exit(main())
