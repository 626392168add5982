"""Measure a trained drafter by real speculative decoding: tau, acceptance per block slot, tokens/s and speedup.

    python -m dflash_lab.evaluation.evaluate <run dir | checkpoint | export> [--prompts NAME|FILE ...]
        [--checkpoint best|latest|step-N] [--block-size B] [--temperature T] [--max-new-tokens N] [--n-prompts K]
        [--dtype auto|bfloat16|float32] [--decoding auto|static|dynamic] [--draft-sampling argmax|sample|coupled]
        [--seed N] [--time-budget-s S] [--out DIR] [--no-untrained] [--no-notebook]

checks every setting first (a bad one is one line with the fix, and nothing is written), then runs
notebooks/eval.ipynb with papermill into a NEW folder <run>/evals/<UTC stamp>-b<B>-t<T>-<dtype>/ (eval.ipynb,
eval.json, plots/; an exported serving folder goes to runs/exports/<name>/evals/ unless --out), then prints a
compact table: tau (with its 95% bootstrap interval over prompts) and speedup of the trained drafter, of an
untrained drafter (same seed, random init: the floor a drafter must beat) and of the target alone (block size 1,
the speedup baseline), and each prompt set's name, size and sha256. At temperature 0 every drafter's output is
compared with the target-only output, with a verdict per differing prompt (verdicts.py).

Prompts: named sets (general, chitchat-heldout, self-heldout, tiny-heldout, tiny-train; prompt_sets.py) or JSONL
files. Default: the tiny target's held-out and training prompts, 20 of each; a real target's held-out prompts (the
run's held-out JSONL, when it has one) and the general set, 64 of each, 128 new tokens.

On a GPU all three decode with static KV caches and one CUDA graph per iteration (static_decode.py), so the speedup
compares like with like; on the CPU they use the dynamic loop (speculative.py). Timing is wall clock; on a shared
CPU the speedup is noisy (+-10%), tau is not. `heldout_tau()` is the cheap version the Trainer calls every
`eval_every` steps.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from .acceptance import DRAFT_SAMPLING
from .measure import cut_to_measured, heldout_run, heldout_tau, run_decoders, untrained_drafter  # noqa: F401
from .prompt_sets import info_of, is_heldout_file, read_training_prompts, resolve_sets
from .prompts import EvalError, load_prompts, select_prompts
from .report import BASELINE, EVAL_FILE, EvalReport, latest_eval, new_eval_dir, tau_line
from .speculative import PromptTooLongError, SpeculativeDecoder
from .static_decode import make_decoder
from dflash_lab.config.threads import threads_arg, torch_threads
from dflash_lab.runs.gpu_time import gpu_seconds_at
from dflash_lab.runs.checkpoint import CheckpointError
from dflash_lab.runs.rundir import resolve_runs_dir
from dflash_lab.target.load import TargetLoadError, resolve_target_path
from dflash_lab.target.sampling import temperature_problem

REPO = Path(__file__).resolve().parents[2]
NOTEBOOK = REPO / "notebooks" / "eval.ipynb"
DTYPES = {"auto": None, "bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}
DECODING = {"auto": "auto", "static": True, "dynamic": False}
# Prompts per set when none is said: the tiny target's tests and `make demo` stay fast; a real target's figures need
# enough prompts to decide something (8 prompts read 2.28 where 64 others read 1.83; intervals.py).
DEFAULT_PROMPTS = {"tiny": 20, "real": 64}


# ------------------------------------------------------------------------------------------------------------------
# Measurement
# ------------------------------------------------------------------------------------------------------------------

def _check_lengths(dec: SpeculativeDecoder, prompt_sets: dict[str, list[list[int]]], files: dict[str, Path],
                   max_new_tokens: int) -> None:
    too_long = []
    for sname, prompts in prompt_sets.items():
        for i, ids in enumerate(prompts):
            try:
                dec.check_prompt(len(ids), max_new_tokens)
            except PromptTooLongError:
                too_long.append(f"{files[sname]} prompt {i + 1} ({len(ids)} tokens)")
    if too_long:
        limit = dec.max_positions - max_new_tokens - dec.block_size
        raise PromptTooLongError(
            f"{len(too_long)} prompt(s) are longer than the context allows: {', '.join(too_long[:5])}"
            f"{' ...' if len(too_long) > 5 else ''}. The target's context is {dec.max_positions} positions; with "
            f"max_new_tokens={max_new_tokens} and block_size={dec.block_size} a prompt may have at most {limit} "
            "tokens. Fix: drop or shorten those prompts, or lower max_new_tokens.")


@dataclass(frozen=True)
class EvalPlan:
    """Everything an evaluation needs, checked before any model is loaded or any file is written."""

    src: object  # export.DrafterSource
    target: str
    data: str
    seed: int
    device: torch.device
    dtype: torch.dtype
    block_size: int
    prompt_files: dict
    out_dir: Path  # where eval.json, eval.ipynb and plots/ go (created by the evaluation, never reused)
    n_prompts: int | None = None  # per set (None = every prompt of each file)
    prompt_sets: dict | None = None  # {set name: PromptSetInfo}: file, prompts evaluated, sha256, in training
    checkpoint: str | None = None  # which weights of a run (None = its newest)
    selections: dict | None = None  # {set name: prompts.PromptSelection}: exactly the prompts evaluated


def plan_eval(run: str | Path, *, prompts=None, block_size: int | None = None, temperature: float = 0.0,
              max_new_tokens: int = 128, n_prompts: int | str | None = "auto", target: str | None = None,
              seed: int | None = None, device: str = "auto", dtype: str = "auto", out_dir: str | Path | None = None,
              checkpoint: str | None = None) -> EvalPlan:
    """Check every setting and find the target, prompts and output folder; raises EvalError (one line, with the
    fix) or DrafterNotFoundError. Cheap: no model is loaded."""
    from dflash_lab.config import TrainConfig
    from .export import resolve_drafter, train_config_of

    if not str(run).strip():
        raise EvalError("run is empty. Fix: pass the run directory (runs/<name>-<stamp>-<id>/), a checkpoint "
                        "directory, an exported directory or a drafter .safetensors file.")
    src = resolve_drafter(run, checkpoint)
    found = train_config_of(src)
    try:
        train_cfg = TrainConfig.from_dict(found) if found else None
    except Exception:  # noqa: BLE001 - an older/foreign config: fall back to the explicit target
        train_cfg = None
    target_name = target or (train_cfg.target if train_cfg else None)
    if target_name is None:
        raise EvalError(f"{run} does not say which target it was trained on (no run config.json). "
                        "Fix: pass --target <model name or folder> (target=... in Python).")
    try:  # a misspelled target fails here, at once, before the prompts or the hub are looked at
        resolve_target_path(target_name)
    except TargetLoadError as e:
        raise EvalError(str(e)) from None
    problem = temperature_problem(temperature)
    if problem:
        raise EvalError(f"temperature={temperature} {problem}. Fix: use 0 (greedy, lossless check on) or e.g. 1.0.")
    if max_new_tokens < 1:
        raise EvalError(f"max_new_tokens={max_new_tokens} must be >= 1.")
    if n_prompts == "auto":
        n_prompts = DEFAULT_PROMPTS["tiny" if target_name == "tiny" else "real"]
    if n_prompts is not None and (not isinstance(n_prompts, int) or n_prompts < 1):
        raise EvalError(f"n_prompts={n_prompts!r} must be >= 1 (or None for every prompt, \"auto\" for "
                        f"{DEFAULT_PROMPTS['real']} on a real target and {DEFAULT_PROMPTS['tiny']} on the tiny one).")
    B = block_size if block_size is not None else src.config.block_size  # 0 is refused below, not defaulted
    if B < 2:
        raise EvalError(f"block_size={B} leaves no draft slot; use >= 2 (the target-only baseline runs anyway).")
    if dtype not in DTYPES:
        raise EvalError(f"dtype={dtype!r} is not one of {sorted(DTYPES)}. Fix: --dtype float32 for an exact "
                        "lossless check, bfloat16 for serving precision, auto for bf16 on a GPU and fp32 on the CPU.")
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise EvalError(f"device={device!r} but no CUDA GPU is visible. Fix: --device cpu (or auto).")
    torch_dtype = DTYPES[dtype] or (torch.bfloat16 if dev.type == "cuda" else torch.float32)
    data, heldout = (train_cfg.data, train_cfg.heldout_data) if train_cfg else ("", None)
    files = resolve_sets(prompts, target_name, data, heldout)
    # held out = not trained on: every set is checked against the run's training prompts (when its data is known),
    # and those found are left out of a held-out set and counted in the report (prompt_sets.py)
    train = read_training_prompts(data, train_cfg.data_format) if train_cfg else None
    chosen = {name: select_prompts(f, n_prompts, train=train, remove=is_heldout_file(f, data, heldout))
              for name, f in files.items()}
    infos = {name: info_of(name, files[name], c) for name, c in chosen.items()}
    dtype_name = str(torch_dtype).replace("torch.", "")
    if out_dir:
        out = Path(out_dir).expanduser()
        if (out / EVAL_FILE).exists():
            raise EvalError(f"{out} already holds an evaluation ({EVAL_FILE}); evaluations are never overwritten. "
                            "Fix: pass a new --out folder, or leave --out out for a new folder under the run.")
    elif src.kind == "exported":  # a serving folder is written into only when asked (--out)
        out = new_eval_dir(resolve_runs_dir("runs") / "exports" / src.run_dir.name, B, temperature, dtype_name)
    else:
        out = new_eval_dir(src.run_dir, B, temperature, dtype_name)
    seed = seed if seed is not None else (train_cfg.seed if train_cfg else 0)
    return EvalPlan(src=src, target=target_name, data=train_cfg.data if train_cfg else "", seed=seed, device=dev,
                    dtype=torch_dtype, block_size=B, prompt_files=files, out_dir=out, n_prompts=n_prompts,
                    prompt_sets=infos, checkpoint=checkpoint, selections=chosen)


def evaluate(run: str | Path, *, prompts=None, block_size: int | None = None, temperature: float = 0.0,
             max_new_tokens: int = 128, n_prompts: int | str | None = "auto", untrained: bool = True,
             target: str | None = None, seed: int | None = None, device: str = "auto", dtype: str = "auto",
             decoding: str = "auto", out_dir: str | Path | None = None, enable_thinking: bool | None = None,
             threads: int | None = 1, checkpoint: str | None = None, compare: dict | None = None,
             draft_sampling: str = "argmax", time_budget_s: float | None = None, baseline: bool = True,
             log=print) -> EvalReport:
    """Speculative decoding of the run's drafter (+ an untrained one + the target alone) on the prompt sets.

    prompts: set names (general, chitchat-heldout, self-heldout, tiny-heldout, tiny-train) or JSONL files, a list
    of them, or {set name: name or file}; None = the defaults (module docstring). n_prompts: per set; "auto" = 64
    on a real target, 20 on the tiny one; None = every prompt. checkpoint: best | latest | step-N (a run dir).

    dtype: auto (bf16 on a GPU, fp32 on the CPU) | bfloat16 | float32 (an exact lossless check).
    decoding: auto (static caches + CUDA graphs on a GPU, the dynamic loop on the CPU) | static | dynamic.
    out_dir: where report.save() writes (default: a new <run>/evals/<stamp>-b<B>-t<T>-<dtype>/).
    compare: {decoder name: run dir} of other drafters of the same target to decode beside "trained" in this very
    evaluation (same prompts, seed and target-alone baseline, which then runs once for all): an A/B of runs. Each
    decodes at its own block size (a DSpark at 8 beside a DFlash at 16) unless block_size is set, which all then use.
    baseline: False skips the target alone (no speedup, no lossless check): tau at T > 0 needs no baseline, and
    evaluations side by side on one GPU measure no speed anyway.
    draft_sampling: at temperature > 0, "argmax" drafts the drafter's top-1 (accepted with the target's probability
    of it: at most the argmax ceiling), "sample" draws each draft from the drafter's own distribution and verifies
    by speculative sampling against it, "coupled" draws the block's drafts from one shared uniform (acceptance.py;
    lossless every way); on a GPU the sampled modes draw between two CUDA graphs (static_decode.py).
    threads: torch CPU threads while decoding, on every device (None = torch's setting; restored after). Decoding
    at batch size 1 is latency-bound: for small targets 1 thread is the fastest, and on a busy 2-core machine 2
    threads were ~10x slower than 1 (threads waiting for each other on every small matmul); on a GPU the acceptance
    at T > 0 runs on the CPU, where evaluations side by side at torch's default (every core each) wait alike.
    time_budget_s: seconds for the whole evaluation, loading included; it stops before a prompt that would end past
    them and reports the prompts decoded (a cut set's count and sha256 are of those; `stopped` says so).
    """
    from .export import load_drafter
    from dflash_lab.target.load import load_target, load_tokenizer

    if decoding not in DECODING:
        raise EvalError(f"decoding={decoding!r} is not one of {sorted(DECODING)}.")
    if draft_sampling not in DRAFT_SAMPLING:
        raise EvalError(f"draft_sampling={draft_sampling!r} is not one of {list(DRAFT_SAMPLING)}.")
    deadline = None
    if time_budget_s is not None:
        if not time_budget_s > 0:
            raise EvalError(f"time_budget_s={time_budget_s} must be > 0 seconds (None: no budget).")
        deadline = time.monotonic() + time_budget_s
    plan = plan_eval(run, prompts=prompts, block_size=block_size, temperature=temperature,
                     max_new_tokens=max_new_tokens, n_prompts=n_prompts, target=target, seed=seed, device=device,
                     dtype=dtype, out_dir=out_dir, checkpoint=checkpoint)
    dev, B = plan.device, plan.block_size
    src, drafter = load_drafter(run, checkpoint=checkpoint)
    log(f"loading target {plan.target!r} on {dev} ({plan.dtype}) and drafter {src.weights} (step {src.step})")
    tok = load_tokenizer(plan.target)
    tgt = load_target(plan.target, device=dev, dtype=plan.dtype)
    drafter.to(device=dev, dtype=plan.dtype)
    files = plan.prompt_files
    sets = {s: load_prompts(f, tok, enable_thinking=enable_thinking, messages=plan.selections[s].messages)
            for s, f in files.items()}
    eos, fast = tok.eos_token_id, DECODING[decoding]
    drafters = {"trained": drafter}
    if untrained:
        drafters["untrained"] = untrained_drafter(src.config, plan.seed).to(device=dev, dtype=plan.dtype)
        if src.config.draft_vocab_size is not None:  # the same draft vocabulary as the trained one
            drafters["untrained"].d2t.copy_(drafter.d2t)
    blocks = dict.fromkeys(drafters, B)  # {decoder: the block size it drafts}
    for name, other in (compare or {}).items():
        if name in drafters or name == BASELINE:
            raise EvalError(f"compare name {name!r} is taken (trained, untrained, {BASELINE!r}). Fix: another name.")
        other_src, drafters[name] = load_drafter(other, checkpoint=checkpoint)
        blocks[name] = B if block_size is not None else other_src.config.block_size
        if other_src.config.block_size < blocks[name]:
            raise EvalError(f"compare {name!r} ({other}) drafts blocks of {other_src.config.block_size}, fewer than "
                            f"block_size={B}. Fix: leave block_size unset (each drafts its own), or set one <= "
                            f"{other_src.config.block_size}.")
        drafters[name].to(device=dev, dtype=plan.dtype)
    if baseline:
        drafters[BASELINE], blocks[BASELINE] = None, 1
    sampling = draft_sampling if temperature > 0 else "argmax"
    decoders = {name: make_decoder(tgt, d, block_size=blocks[name], eos_token_id=eos, fast=fast, log=log,
                                   draft_sampling=sampling) for name, d in drafters.items()}
    _check_lengths(decoders[max(drafters, key=blocks.get)], sets, files, max_new_tokens)  # the longest block's room
    how = getattr(decoders["trained"], "graph_status", "dynamic loop (eager)")
    own = "".join(f", {n} {b}" for n, b in blocks.items() if b != B and n != BASELINE)
    log(f"prompt sets: {'; '.join(plan.prompt_sets[s].text() for s in sets)}; block size {B}{own}, "
        f"temperature {temperature}, max_new_tokens {max_new_tokens}; decoding: "
        f"{type(decoders['trained']).__name__} ({how})")
    with torch_threads(threads):
        results = run_decoders(tgt, decoders, sets, max_new_tokens=max_new_tokens, temperature=temperature,
                               seed=plan.seed, log=log, deadline=deadline)
    results, infos, cut = cut_to_measured(results, plan.selections, plan.prompt_sets)
    if not infos:
        raise EvalError(f"time_budget_s={time_budget_s} was spent before the first prompt was decoded (loading and "
                        "warm-up took it). Fix: a larger budget.")
    stopped = "" if not cut else (f"stopped by its time budget of {time_budget_s:g} s: " + ", ".join(
        f"{s} {n} of {planned} prompts" for s, (n, planned) in cut.items()))
    how = getattr(decoders["trained"], "graph_status", "dynamic loop (eager)")
    if sampling != "argmax":
        how += (f"; drafts sampled from the drafter at T={temperature}, "
                f"{'from one shared uniform' if sampling == 'coupled' else 'each slot independently'} "
                "(speculative sampling against the proposal)")
    return EvalReport(run_dir=str(src.run_dir), weights=str(src.weights), step=src.step, target=plan.target,
                      block_size=B, temperature=temperature, max_new_tokens=max_new_tokens, results=results,
                      block_sizes={n: b for n, b in blocks.items() if b != B and n != BASELINE},
                      dtype=str(plan.dtype).replace("torch.", ""), out_dir=str(plan.out_dir),
                      decoding=f"{type(decoders['trained']).__name__}: {how}", draft_sampling=sampling, seed=plan.seed,
                      prompt_sets={k: v.to_dict() for k, v in infos.items()}, stopped=stopped,
                      train_gpu_seconds=gpu_seconds_at(src.run_dir, src.step) if src.run_dir else None)


def load_report(path: str | Path) -> dict:
    """A saved eval.json: the file itself, an evaluation folder, or a run (its latest evaluation)."""
    p = Path(path)
    found = p if p.is_file() else (p / EVAL_FILE if (p / EVAL_FILE).is_file() else latest_eval(p))
    if found is None:
        raise EvalError(f"no evaluation under {p}. Fix: run `python -m dflash_lab.evaluation.evaluate {path}` first.")
    return json.loads(found.read_text())


def summary_table(report: dict) -> str:
    """The text table of a saved eval.json (what the CLI prints after the notebook ran)."""
    return EvalReport.from_dict(report).table()


def save_notebook(report: EvalReport) -> Path | None:
    """Copy the executed notebook into the evaluation folder when papermill wrote it elsewhere (no-op otherwise)."""
    from dflash_lab.runs.rundir import find_papermill_output, save_executed_notebook

    src = find_papermill_output()
    out = Path(report.out_dir or report.run_dir)
    if src is None or not src.is_file() or src.resolve() == (out / "eval.ipynb").resolve():
        return None
    return save_executed_notebook(out, "eval.ipynb")


# ------------------------------------------------------------------------------------------------------------------
# CLI
# ------------------------------------------------------------------------------------------------------------------

EXPECTED_ERRORS = ("EvalError", "PromptTooLongError", "DrafterNotFoundError", "DrafterMismatchError",
                   "TargetLoadError", "ConfigError")


def run_notebook(params: dict, out_dir: Path, *, log_output: bool = True) -> Path:
    """Execute notebooks/eval.ipynb with papermill into out_dir/eval.ipynb. An error raised in the notebook comes
    back as one EvalError line; an expected one (bad input) removes out_dir, an unexpected one keeps the notebook
    with its traceback and says where."""
    import os
    import shutil

    from dflash_lab.runs.notebook_exec import PapermillExecutionError, execute

    if not NOTEBOOK.is_file():
        raise EvalError(f"{NOTEBOOK} is missing (installed without the repository's notebooks/). "
                        "Fix: run from a checkout, or pass --no-notebook.")
    out_dir.mkdir(parents=True, exist_ok=False)
    out_path = out_dir / "eval.ipynb"
    # The kernel inherits this: it tells rundir/save_notebook where the executed copy is (a caller such as the
    # demo may have set it to its own training notebook).
    old = os.environ.get("DFLASH_NOTEBOOK_OUTPUT")
    os.environ["DFLASH_NOTEBOOK_OUTPUT"] = str(out_path)
    try:
        execute(NOTEBOOK, out_path, parameters={**params, "out_dir": str(out_dir)}, cwd=NOTEBOOK.parent.parent,
                log_output=log_output)
    except PapermillExecutionError as e:
        if e.ename in EXPECTED_ERRORS:
            shutil.rmtree(out_dir, ignore_errors=True)
            raise EvalError(e.evalue) from None
        raise EvalError(f"the evaluation notebook failed: {e.ename}: {e.evalue}. The executed notebook with the "
                        f"traceback: {out_path}") from None
    finally:
        if old is None:
            os.environ.pop("DFLASH_NOTEBOOK_OUTPUT", None)
        else:
            os.environ["DFLASH_NOTEBOOK_OUTPUT"] = old
    return out_path


def _n_prompts(text: str):
    if text in ("auto", "all"):
        return None if text == "all" else "auto"
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number, auto or all") from None


def _seconds(text: str) -> float:
    try:
        if float(text) > 0:
            return float(text)
    except ValueError:
        pass
    raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds above 0")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dflash_lab.evaluation.evaluate", description=__doc__.split("\n")[0])
    ap.add_argument("run", help="run directory, checkpoint directory, exported directory or drafter .safetensors")
    ap.add_argument("--prompts", nargs="+", default=None, help="prompt sets: names (general, chitchat-heldout, "
                    "self-heldout, tiny-heldout, tiny-train) or JSONL files, one set each (default: the tiny target's "
                    "heldout + train prompts; a real target's held-out prompts + general)")
    ap.add_argument("--checkpoint", default=None, help="which weights of a run: latest (default), best (the best "
                    "held-out real tau while training), step-N or N")
    ap.add_argument("--block-size", type=int, default=None, help="block size (default: the drafter's)")
    ap.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (lossless check on)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--n-prompts", type=_n_prompts, default="auto",
                    help="prompts per set: N of each set's distinct prompts, spread evenly over its file (default "
                    f"auto: {DEFAULT_PROMPTS['real']} on a real target, {DEFAULT_PROMPTS['tiny']} on the tiny one; "
                    "all = every prompt)")
    ap.add_argument("--untrained", action=argparse.BooleanOptionalAction, default=True,
                    help="also measure an untrained drafter of the same shape and seed (default on)")
    ap.add_argument("--target", default=None, help="target model (default: the run's config.json)")
    ap.add_argument("--device", default="auto", help="auto | cpu | cuda:N")
    ap.add_argument("--dtype", default="auto", choices=sorted(DTYPES),
                    help="auto = bf16 on a GPU, fp32 on the CPU; float32 = exact lossless check")
    ap.add_argument("--decoding", default="auto", choices=sorted(DECODING),
                    help="auto = static caches + CUDA graphs on a GPU, the dynamic loop on the CPU")
    ap.add_argument("--draft-sampling", default="argmax", choices=list(DRAFT_SAMPLING),
                    help="at temperature > 0: argmax drafts (accepted with the target's probability of them), or "
                         "drafts sampled from the drafter, each slot independently (sample) or from one shared "
                         "uniform (coupled), verified by speculative sampling")
    ap.add_argument("--out", default=None, help="evaluation folder (default: a new <run>/evals/<stamp>-b<B>-t<T>-"
                    "<dtype>/; for an exported folder runs/exports/<name>/evals/...: an export is written into "
                    "only with --out)")
    ap.add_argument("--seed", type=int, default=None,
                    help="seed of the sampling at T > 0 and of the untrained drafter (default: the run's seed); "
                         "several seeds average out the draws of a sampled evaluation")
    ap.add_argument("--threads", type=threads_arg, default=1, help="torch CPU threads, 0..cores (default 1: fastest "
                    "for small targets at batch size 1, and on a GPU for the acceptance at T > 0; 0 = torch's default)")
    ap.add_argument("--time-budget-s", type=_seconds, default=None, help="seconds for the whole evaluation: it stops "
                    "before a prompt that would end past them and reports the prompts decoded (default: no budget)")
    ap.add_argument("--notebook", action=argparse.BooleanOptionalAction, default=True,
                    help="execute notebooks/eval.ipynb into the evaluation folder (default on); --no-notebook "
                         "evaluates in this process")
    args = ap.parse_args(argv)
    from .export import DrafterNotFoundError

    settings = {"prompts": args.prompts, "block_size": args.block_size, "temperature": args.temperature,
                "max_new_tokens": args.max_new_tokens, "n_prompts": args.n_prompts, "target": args.target,
                "device": args.device, "dtype": args.dtype, "checkpoint": args.checkpoint, "seed": args.seed}
    try:
        plan = plan_eval(args.run, **settings, out_dir=args.out)  # every expected error, before anything is written
        params = {"run": str(args.run), **settings, "untrained": args.untrained, "decoding": args.decoding,
                  "threads": args.threads or None, "draft_sampling": args.draft_sampling,
                  "time_budget_s": args.time_budget_s}
        nb = None
        if args.notebook:
            nb = run_notebook(params, plan.out_dir)
            saved = load_report(plan.out_dir)
        else:
            report = evaluate(**params, out_dir=plan.out_dir)
            report.save()
            saved = report.to_dict()
    except (DrafterNotFoundError, EvalError, PromptTooLongError, CheckpointError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    report = EvalReport.from_dict(saved)
    print(report.table())
    for line in report.verdict_lines():
        print(line)
    print(tau_line(saved))
    print(f"eval folder: {plan.out_dir}" + (f" (notebook {nb.name}, {EVAL_FILE}, plots/)" if nb else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
