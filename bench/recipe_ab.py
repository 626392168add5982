"""Training settings compared on the SmolLM2 recipe's data: one data preparation, several arms, real tau for each.

The recipe (dflash_lab/workflows/recipe.py) prepares the data once (model, target-written prompts, chitchat, answers
by the target, the mix); every arm then trains on that same file with the recipe's TrainConfig plus its own
overrides, in its own process, and every arm is measured by real speculative decoding on the same held-out sets.
State lives in <work>/ab.json, so the steps can run in separate GPU jobs on the same machine:

    python bench/recipe_ab.py data  --work /tmp/ab --device cuda:0
    python bench/recipe_ab.py tokenize --work /tmp/ab --tokenize-block-size 16   (the arms then read it from the cache)
    python bench/recipe_ab.py train --work /tmp/ab --arm hard    --set steps=9000 --set draft_vocab_size=16384
    python bench/recipe_ab.py train --work /tmp/ab --arm distill --set steps=9000 --set distill_weight=0.5 ...
    python bench/recipe_ab.py train --work /tmp/ab --arm long --preset long   (a preset's training on this data)
    python bench/recipe_ab.py eval  --work /tmp/ab --temperature 0 --temperature 1 --out results.json
    python bench/recipe_ab.py eval  --work /tmp/ab --temperature 1 --draft-sampling sample --out results.json
    python bench/recipe_ab.py merge t0.json t1-a.json t1-b.json --out results.json   (one file for ab_report)
    python bench/recipe_ab.py collect s1/results.tgz s2/results.tgz --out <folder>/eval  (arms of several sessions)
    python bench/recipe_ab.py adopt call1 call2 call3 --arm dflash-long --out <folder>/eval  (a recipe run as an arm)

`--set FIELD=VALUE` (JSON value) overrides a TrainConfig field of that arm (train) or a RecipeConfig field (data).
An arm stopped by its `time_budget_s` is continued by the same `train` command in the next job (resume_from: the
curve equals an uninterrupted run's), so arms of 10k+ steps run over several 10-minute jobs.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from dflash_lab.evaluation.report import BASELINE  # a row's decoder when the target decodes alone

STATE = "ab.json"


def _values(items: list[str]) -> dict:
    out = {}
    for item in items:
        name, eq, value = item.partition("=")
        if not eq:
            raise SystemExit(f"--set {item!r}: use FIELD=VALUE")
        try:
            out[name] = json.loads(value)
        except json.JSONDecodeError:
            out[name] = value
    return out


def _state(work: Path) -> dict:
    p = work / STATE
    return json.loads(p.read_text()) if p.exists() else {}


def _save(work: Path, state: dict) -> None:
    tmp = work / (STATE + ".tmp")
    tmp.write_text(json.dumps(state, indent=1, default=str))
    tmp.replace(work / STATE)


@contextlib.contextmanager
def _updating(work: Path):
    """The state, read and written back under an exclusive lock: arms trained side by side on one GPU finish in
    any order, and each must add its own entry to what the other wrote."""
    with open(work / (STATE + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        state = _state(work)
        yield state
        _save(work, state)


def data(args) -> None:
    from dflash_lab.workflows.recipe import Recipe
    from dflash_lab.workflows.recipe_config import RecipeConfig

    cfg = RecipeConfig(device=args.device, work_dir=str(args.work), **_values(args.set))
    recipe = Recipe(cfg)
    t0 = time.perf_counter()
    for phase in ("get_model", "self_prompts", "build_data", "regenerate", "mix_data"):
        getattr(recipe, phase)()
    sets, left_out = recipe.evaluation_sets()
    files = {"train_data": recipe.train_data, "heldout_data": recipe.heldout_data,
             **{k: Path(v) for k, v in sets.items() if Path(v).is_file()}}
    with _updating(args.work) as state:
        state.update(recipe=cfg.to_dict(), train_data=str(recipe.train_data), heldout_data=str(recipe.heldout_data),
                     data_sha256={k: hashlib.sha256(f.read_bytes()).hexdigest() for k, f in files.items()},
                     sets=sets, sets_left_out=left_out, data_seconds=round(time.perf_counter() - t0, 1),
                     phases={k: {f: v for f, v in dict(ph).items() if f != "curve"}
                             for k, ph in recipe.results["phases"].items()})
        state.setdefault("arms", {})
    print(json.dumps({"data_seconds": state["data_seconds"], "train_data": state["train_data"], "sets": sets}))


def tokenize(args) -> None:
    """The training data tokenized for each block size the arms use (--tokenize-block-size), exactly as an arm's run
    reads it (TrainConfig.token_cache), so no arm's time budget pays for tokenizing."""
    from dflash_lab.train.prepare import prepare_run
    from dflash_lab.workflows.recipe_config import RecipeConfig

    state = _state(args.work)
    if "train_data" not in state:
        raise SystemExit(f"no data in {args.work / STATE}: run `data` first on this machine")
    cfg = RecipeConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in state["recipe"].items()})
    tc = cfg.train_config(Path(state["train_data"]), Path(state["heldout_data"]))
    t0 = time.perf_counter()
    for block in dict.fromkeys(args.tokenize_block_size or [tc.block_size]):
        prepare_run(tc.replace(block_size=block), check_memory=False, log=print)
    print(json.dumps({"tokenize_seconds": round(time.perf_counter() - t0, 1)}))


def _arm_recipe(state: dict, preset: str | None):
    """The RecipeConfig an arm's TrainConfig comes from: the one the data was made with, or that data under a
    preset's training settings (RecipeConfig.from_preset, the one source of them). A preset that would have made
    other data is refused: its arm would not train on the pool the other arms did."""
    from dflash_lab.workflows.recipe_config import DATA_SETTINGS, PRESETS, RecipeConfig

    recipe = {k: tuple(v) if isinstance(v, list) else v for k, v in state["recipe"].items()}
    if preset is None:
        return RecipeConfig(**recipe)
    if preset not in PRESETS:
        raise SystemExit(f"--preset {preset!r}: unknown; Fix: use one of {sorted(PRESETS)}")
    cfg = RecipeConfig.from_preset(preset, **{k: v for k, v in recipe.items() if k not in PRESETS[preset]})
    data_keys = {k for keys in DATA_SETTINGS.values() for k in keys}
    differ = {k: (recipe[k], getattr(cfg, k)) for k in sorted(data_keys) if recipe.get(k) != getattr(cfg, k)}
    if differ:
        raise SystemExit(f"--preset {preset!r} makes other data than this A/B's ({differ}: ab.json's against the "
                         "preset's); Fix: make the data with the preset's settings (`data --set ...`) or drop --preset")
    return cfg


def train(args) -> None:
    from dflash_lab.runs.run_state import STOPPED_RESUMABLE
    from dflash_lab.train.trainer import Trainer

    state = _state(args.work)
    if "train_data" not in state:
        raise SystemExit(f"no data in {args.work / STATE}: run `data` first on this machine")
    cfg = _arm_recipe(state, args.preset)
    over = _values(args.set)
    tc = cfg.train_config(Path(state["train_data"]), Path(state["heldout_data"])).replace(run_name=args.arm, **over)
    before = state.get("arms", {}).get(args.arm)
    run_dir = None
    if before is not None and before["status"] == STOPPED_RESUMABLE:
        # an arm longer than one job: the same command in the next job continues its run exactly
        if {k: v for k, v in before["overrides"].items() if k != "time_budget_s"} != \
                {k: v for k, v in over.items() if k != "time_budget_s"} or before.get("preset") != args.preset:
            raise SystemExit(f"arm {args.arm!r} stopped with other settings (preset {before.get('preset')}, "
                             f"{before['overrides']}); Fix: give the same --preset and --set values (the time "
                             "budget may differ) or another --arm name")
        tc, run_dir = tc.replace(resume_from=before["run_dir"]), before["run_dir"]
        print(f"arm {args.arm}: resuming {run_dir} at step {before['steps']}", flush=True)
    elif before is not None:
        raise SystemExit(f"arm {args.arm!r} already {before['status']} ({before['run_dir']}); Fix: another --arm name")
    every = max(1, tc.steps // 200)  # ~200 rows of the training curve kept in ab.json
    t0 = time.perf_counter()
    trainer = Trainer(tc, run_dir=run_dir)
    try:
        trainer.train(progress_every_s=20.0)
        summary = trainer.finish()
        curve = [{k: r[k] for k in ("step", "loss", "acc", "sim_tau", "val_acc", "val_chain_tau", "real_tau",
                                    "tokens_per_s", "elapsed_s") if r.get(k) is not None}
                 for r in trainer.history
                 if "real_tau" in r or "val_acc" in r or ("loss" in r and r.get("step", 0) % every == 0)]
        if before is not None:  # the jobs before this one, where the resumed history does not hold them
            have = {r["step"] for r in curve}
            curve = [r for r in before.get("curve", []) if r["step"] not in have] + curve
    finally:
        trainer.close()
    wall = round(time.perf_counter() - t0 + (before or {}).get("wall_s", 0.0), 1)  # over every job of the arm
    with _updating(args.work) as state:  # re-read: another arm may have written meanwhile
        state["arms"][args.arm] = {"preset": args.preset, "overrides": over, "run_dir": summary["run_dir"],
                                   "status": summary["status"], "steps": summary["steps"], "wall_s": wall,
                                   "steady_tokens_per_s": summary.get("steady_tokens_per_s"),
                                   "loss_last": summary.get("loss_last"), "curve": curve}
    print(json.dumps({k: v for k, v in state["arms"][args.arm].items() if k != "curve"}))


def evaluate_arms(args) -> None:
    """Every arm in ONE evaluation per temperature and, above 0, per draft mode (evaluate(compare=...)): the same
    prompts, seed and target-alone baseline, which then decodes once for all arms."""
    state = _state(args.work)
    arms = {a: i for a, i in state.get("arms", {}).items() if not args.arms or a in args.arms}
    if not arms:
        raise SystemExit(f"no trained arm in {args.work / STATE}")
    results = json.loads(Path(args.out).read_text()) if args.out and Path(args.out).exists() else {"rows": []}
    if "rows" not in results:  # e.g. the recipe's own results.json in the work dir
        raise SystemExit(f"--out {args.out} holds no evaluation rows of this script (keys {sorted(results)[:6]}); "
                         "Fix: name another file, e.g. <work>/ab-results.json")
    for temperature in args.temperature:
        for sampling in args.draft_sampling if temperature > 0 else ["argmax"]:  # at T=0 every mode drafts argmax
            held = [r for r in results["rows"]
                    if r["temperature"] == temperature and r.get("draft_sampling", "argmax") == sampling]
            todo = [a for a in arms if a not in {r["arm"] for r in held}]  # an earlier job measured the others
            if not todo:
                continue
            # the target alone decodes once per file: an arm trained later is timed against that earlier pass
            baseline = args.baseline and not any(r["decoder"] == BASELINE for r in held)
            first, *others = todo
            _evaluate_once(args, state, arms, first, others, temperature, sampling, results, baseline)


def _evaluate_once(args, state: dict, arms: dict, first: str, others: list[str], temperature: float, sampling: str,
                   results: dict, baseline: bool) -> None:
    from dflash_lab.evaluation.evaluate import evaluate

    t0 = time.perf_counter()
    sets = state["sets"] if temperature == 0 or not args.sampled_sets else \
        {k: v for k, v in state["sets"].items() if k in args.sampled_sets}
    rep = evaluate(arms[first]["run_dir"], prompts=sets, block_size=None, temperature=temperature,
                   max_new_tokens=128, n_prompts=args.prompts, device=args.device, untrained=False,
                   compare={a: arms[a]["run_dir"] for a in others}, draft_sampling=sampling,
                   time_budget_s=args.time_budget_s, baseline=baseline)
    earlier = {(r["prompt_set"], r["prompts"]): r["tokens_per_s"] for r in results["rows"]
               if r["decoder"] == BASELINE and r["temperature"] == temperature
               and r.get("draft_sampling", "argmax") == sampling}
    for r in rep.rows():
        arm = first if r["decoder"] == "trained" else r["decoder"]
        row = {"arm": arm, "temperature": temperature, "draft_sampling": sampling,
               "steps": arms[arm]["steps"] if arm in arms else None,
               **{k: r.get(k) for k in ("decoder", "prompt_set", "block_size", "prompts", "tau", "tau_low",
                                        "tau_high", "tokens_per_s", "speedup", "prompt_set_sha256")}}
        base = earlier.get((row["prompt_set"], row["prompts"]))
        if row["speedup"] is None and base and row["tokens_per_s"] and row["decoder"] != BASELINE:
            # the same prompts (seeded), device and temperature, each decoded alone on the GPU: a speed ratio
            row.update(speedup=row["tokens_per_s"] / base, speedup_against="an earlier evaluation's target alone")
        results["rows"].append(row)
    label = str(temperature) if sampling == "argmax" else f"{temperature} {sampling}"
    results.setdefault("seconds", {})[label] = round(time.perf_counter() - t0, 1)
    if rep.stopped:  # the rows' `prompts` count what was decoded; these say which sets were cut
        results.setdefault("stopped", {})[label] = rep.stopped
        results.setdefault("prompt_sets", {})[label] = rep.prompt_sets
    print(rep.table(), flush=True)
    if args.out:  # after every evaluation: a job cut by its limit keeps what it measured
        Path(args.out).write_text(json.dumps({**results, "arms": arms, "sets": state["sets"]}, indent=1))


def merge(args) -> None:
    """The rows of several `eval` results files (e.g. T=0 in one evaluation, T=1 in one process per arm) in one file
    that dflash_lab.workflows.ab_report reads; `merged_from` names the sources. A row measured twice (the same arm,
    decoder, set, temperature and draft mode) is refused: which one to keep is the user's call."""
    merged, seen = {"rows": [], "merged_from": []}, {}
    for f in args.inputs:
        d = json.loads(Path(f).read_text())
        if "rows" not in d:
            raise SystemExit(f"{f} holds no evaluation rows of this script. Fix: name the files `eval --out` wrote")
        # each drafter row keeps the target-alone speed of its own file's evaluation: files of other sessions
        # decoded the target alone again, a little faster or slower
        own_base = {}
        for r in d["rows"]:
            if r["decoder"] == BASELINE:
                own_base[(r["prompt_set"], r["temperature"], r.get("draft_sampling", "argmax"))] = r["tokens_per_s"]
                own_base.setdefault((r["prompt_set"], r["temperature"]), r["tokens_per_s"])
        for r in d["rows"]:
            if r["decoder"] != BASELINE and r.get("target_tokens_per_s") is None:
                k = (r["prompt_set"], r["temperature"])
                r["target_tokens_per_s"] = own_base.get((*k, r.get("draft_sampling", "argmax")), own_base.get(k))
            key = (r["arm"], r["decoder"], r["prompt_set"], r["temperature"], r.get("draft_sampling", "argmax"))
            if key in seen and r["decoder"] != BASELINE:
                raise SystemExit(f"{f} and {seen[key]} both hold {key}. Fix: leave one of them out")
            seen[key] = f
            merged["rows"].append(r)
        for k in ("seconds", "stopped", "prompt_sets"):
            merged.setdefault(k, {}).update({f"{Path(f).name} {t}": v for t, v in d.get(k, {}).items()})
        merged.setdefault("sets", d.get("sets"))
        merged["merged_from"].append(Path(f).name)
    merged["arms"] = {k: v for f in args.inputs for k, v in json.loads(Path(f).read_text()).get("arms", {}).items()}
    Path(args.out).write_text(json.dumps(merged, indent=1))
    print(f"{len(merged['rows'])} rows from {len(args.inputs)} files -> {args.out}")


def collect(args) -> None:
    """One A/B folder (--out: ab.json, results.json, arm-metrics.tgz, what dflash_lab.workflows.ab_report reads)
    from the results.tgz of several GPU sessions (bench/variants_ab.sh), each of which trained some of the arms on
    the SAME data: refused unless every session's data_sha256 (the training file, the held-out windows and each
    prompt set, hashed where they were written) is the same, or an arm is in two of them."""
    out = Path(args.out)
    with tempfile.TemporaryDirectory() as tmp:
        states, result_files = [], []
        for i, tgz in enumerate(args.inputs):
            d = Path(tmp) / str(i)
            with tarfile.open(tgz) as t:
                t.extractall(d, filter="data")
            state = json.loads((d / STATE).read_text())
            if states and state.get("data_sha256") != states[0].get("data_sha256"):
                raise SystemExit(f"{tgz} trained on other data than {args.inputs[0]} (data_sha256 "
                                 f"{state.get('data_sha256')} against {states[0].get('data_sha256')}). Fix: collect "
                                 "sessions of one data pack")
            for arm in state["arms"]:
                if any(arm in s["arms"] for s in states):
                    raise SystemExit(f"arm {arm!r} is in {tgz} and an earlier input. Fix: leave one of them out")
            states.append(state)
            result_files += sorted(d.glob("ab-results*.json"))
        joined = {**states[0], "arms": {a: v for s in states for a, v in s["arms"].items()},
                  "collected_from": [Path(t).name for t in args.inputs]}
        out.mkdir(parents=True, exist_ok=True)  # only now: a refused input leaves nothing behind
        (out / STATE).write_text(json.dumps(joined, indent=1))
        merge(argparse.Namespace(inputs=[str(f) for f in result_files], out=str(out / "results.json")))
        with tarfile.open(out / "arm-metrics.tgz", "w:gz") as t:
            for i in range(len(args.inputs)):
                for f in sorted((Path(tmp) / str(i)).glob("runs/*/*")):
                    t.add(f, arcname=str(f.relative_to(Path(tmp) / str(i))))
    print(f"{len(joined['arms'])} arms from {len(args.inputs)} sessions -> {out}")


def _prompt_shas(rows: list[dict]) -> dict[str, set[str]]:
    """Per prompt set, the sha256 of the prompts its rows decoded (rows without one say nothing)."""
    out = {}
    for r in rows:
        if r.get("prompt_set_sha256"):
            out.setdefault(r["prompt_set"], set()).add(r["prompt_set_sha256"])
    return out


def adopt(args) -> None:
    """A recipe run (the recipe notebook's results.json of each call, the last call's metrics.jsonl and
    config.json) as arm --arm of the A/B folder --out that `collect` wrote: its training wall (the train phase's
    seconds summed over the calls), curve files and final evaluation rows, e.g. the long preset's DFlash run beside
    an arm trained with `train --preset long` on the same data. Refused when its held-out prompt sets are not the
    A/B's (by sha256) or the arm exists. The target alone's rows stay the A/B's own; each adopted row keeps the
    speedup its run measured and the target-alone speed it was measured against (`target_tokens_per_s`)."""
    out, calls = Path(args.out), [Path(c) for c in args.inputs]
    state, results = json.loads((out / STATE).read_text()), json.loads((out / "results.json").read_text())
    if args.arm in state["arms"]:
        raise SystemExit(f"arm {args.arm!r} is already in {out / STATE}. Fix: another --arm name")
    phases = [json.loads((c / "results.json").read_text())["phases"] for c in calls]
    train, last = phases[-1].get("train"), calls[-1]
    rows = (phases[-1].get("evaluate") or {}).get("rows")
    if not train or not rows or not (last / "metrics.jsonl").is_file():
        raise SystemExit(f"{last} holds no finished, evaluated recipe run (results.json's train and evaluate "
                         "phases, metrics.jsonl). Fix: name the recipe's call folders in order, the last one "
                         "the call that evaluated it")
    mine, theirs = _prompt_shas(rows), _prompt_shas(results["rows"])
    differ = sorted(k for k in mine if k in theirs and mine[k] != theirs[k])
    if differ:
        raise SystemExit(f"{last}'s prompt sets {differ} are not the A/B's (sha256 differ). Fix: adopt a run "
                         "evaluated on the same held-out files")
    wall = sum(p["train"]["seconds"] for p in phases if p.get("train") and not p["train"].get("reused"))
    run = Path(train["run_dir"]).name
    state["arms"][args.arm] = {"adopted_from": [str(c) for c in calls], "run_dir": train["run_dir"],
                               "status": train["status"], "steps": train["steps"], "wall_s": round(wall, 1),
                               "steady_tokens_per_s": None, "loss_last": train.get("loss_last"), "curve": []}
    own_base = {(r["prompt_set"], r.get("temperature", 0.0)): r["tokens_per_s"] for r in rows
                if r["decoder"] == BASELINE}
    for r in rows:
        if r["decoder"] != BASELINE:
            alone = own_base.get((r["prompt_set"], r.get("temperature", 0.0)))
            results["rows"].append({**r, "arm": args.arm, "steps": train["steps"], "decoder": "trained",
                                    "draft_sampling": r.get("draft_sampling", "argmax"), "target_tokens_per_s": alone})
    results.setdefault("adopted", {})[args.arm] = [str(c) for c in calls]
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(out / "arm-metrics.tgz") as t:
            t.extractall(tmp, filter="data")
        (Path(tmp) / "runs" / run).mkdir(parents=True, exist_ok=True)
        for f in ("metrics.jsonl", "config.json"):
            if (last / f).is_file():
                (Path(tmp) / "runs" / run / f).write_bytes((last / f).read_bytes())
        with tarfile.open(out / "arm-metrics.tgz", "w:gz") as t:
            for f in sorted(Path(tmp).glob("runs/*/*")):
                t.add(f, arcname=str(f.relative_to(tmp)))
    (out / STATE).write_text(json.dumps(state, indent=1))
    (out / "results.json").write_text(json.dumps(results, indent=1))
    print(f"arm {args.arm}: {train['steps']} steps, {wall:.1f} s of training, {len(rows)} rows -> {out}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python bench/recipe_ab.py", description=__doc__.split("\n")[0])
    p.add_argument("what", choices=["data", "tokenize", "train", "eval", "merge", "collect", "adopt"])
    p.add_argument("inputs", nargs="*", help="merge: the results files of `eval` to merge into --out; collect: the "
                   "sessions' results.tgz to join in the folder --out; adopt: a recipe run's call folders, in order")
    p.add_argument("--work", type=Path, help="data, train, eval: the A/B's folder (ab.json)")
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--arm", help="train: the arm's name (its run is named after it)")
    p.add_argument("--tokenize-block-size", type=int, action="append",
                   help="tokenize: the training data for arms of this block size, repeat for several (default: "
                        "the recipe's); an arm whose block is not among them tokenizes inside its own time budget")
    p.add_argument("--preset", help="train: the arm trains with this recipe preset's settings (e.g. long) on the "
                   "A/B's data, which must be the data the preset makes; --set goes on top")
    p.add_argument("--arms", nargs="*", help="eval: only these arms")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE")
    p.add_argument("--temperature", type=float, action="append", help="eval: repeat for several (default 0)")
    p.add_argument("--draft-sampling", action="append", choices=["argmax", "sample", "coupled"],
                   help="eval at temperatures above 0: repeat for several draft modes (default argmax)")
    p.add_argument("--prompts", type=int, default=64, help="eval: prompts per set")
    p.add_argument("--sampled-sets", nargs="*", default=["chitchat-heldout"],
                   help="eval: the sets also decoded at temperatures above 0 (none given: every set)")
    p.add_argument("--time-budget-s", type=float, help="eval: seconds for each evaluation; it stops before a prompt "
                   "that would end past them and keeps the prompts decoded (default: none)")
    p.add_argument("--out", help="eval: results file (rows appended; rerun skips what it holds)")
    p.add_argument("--baseline", action=argparse.BooleanOptionalAction, default=True,
                   help="eval: also decode with the target alone (speedups, the lossless check); --no-baseline for "
                        "tau alone, e.g. evaluations side by side on one GPU")
    args = p.parse_args(argv)
    if args.what in ("merge", "collect", "adopt"):
        if not args.inputs or not args.out or (args.what == "adopt" and not args.arm):
            p.error(f"{args.what} needs inputs and --out" + (" and --arm" if args.what == "adopt" else ""))
        {"merge": merge, "collect": collect, "adopt": adopt}[args.what](args)
        return 0
    if args.work is None:
        p.error(f"{args.what} needs --work")
    args.work.mkdir(parents=True, exist_ok=True)
    if args.what == "train" and not args.arm:
        p.error("train needs --arm NAME")
    args.temperature = args.temperature or [0.0]
    args.draft_sampling = args.draft_sampling or ["argmax"]
    {"data": data, "tokenize": tokenize, "train": train, "eval": evaluate_arms}[args.what](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
