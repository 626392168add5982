"""Measure a trained drafter by real speculative decoding: tau, acceptance per block slot, tokens/s and speedup.

    python -m dflash_lab.evaluate <run dir | checkpoint> [--prompts FILE ...] [--block-size B] [--temperature T]
                                  [--max-new-tokens N] [--n-prompts K] [--no-untrained] [--no-notebook]

runs notebooks/eval.ipynb with papermill into <run dir>/eval.ipynb (which calls `evaluate()` below, writes
<run dir>/eval.json and PNG plots into <run dir>/plots/), then prints a compact table: tau and speedup of the
trained drafter, of an untrained drafter (same seed, random init: the floor a drafter must beat) and of the
target alone (block size 1, the speedup baseline). At temperature 0 it also checks that every drafter's output is
identical to the target-only output (lossless).

Prompts are JSONL: {"messages": [...]} (trailing assistant turns are dropped and the chat template's generation
prompt is added) or {"prompt": "text"} (one user turn); default: the tiny target's held-out and train prompts.
Timing is wall clock on whatever device runs the target; on a shared CPU the speedup is noisy (+-10%), tau is not.
`heldout_tau()` is the cheap version the Trainer calls every `eval_every` steps.
"""

from __future__ import annotations

import argparse
import html
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .drafter import DFlashDrafter
from .speculative import GenerationResult, PromptTooLongError, SpeculativeDecoder

BASELINE = "target only"
EVAL_FILE = "eval.json"
NOTEBOOK = Path(__file__).resolve().parent.parent / "notebooks" / "eval.ipynb"


class EvalError(ValueError):
    """Bad evaluation input (prompts file, run, target); the message says what to pass instead."""


# ------------------------------------------------------------------------------------------------------------------
# Prompts
# ------------------------------------------------------------------------------------------------------------------

def _render(tokenizer, messages: list[dict], enable_thinking: bool | None) -> list[int]:
    while messages and messages[-1].get("role") == "assistant":
        messages = messages[:-1]
    if not messages:
        return []
    if getattr(tokenizer, "chat_template", None):
        kw = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kw)
    else:
        text = "\n".join(m.get("content") or "" for m in messages)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def load_prompts(path: str | Path, tokenizer, *, n_prompts: int | None = None,
                 enable_thinking: bool | None = None) -> list[list[int]]:
    """Token ids of the prompts in a JSONL file ({"messages": [...]} or {"prompt": "..."} per line); the first
    n_prompts. An empty file, a line without a usable prompt, or a prompt that renders empty raises EvalError."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise EvalError(f"prompts file {p} does not exist. Expected JSONL with one {{\"messages\": [...]}} or "
                        "{\"prompt\": \"...\"} object per line.")
    out: list[list[int]] = []
    with open(p, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            if n_prompts is not None and len(out) >= n_prompts:
                break
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise EvalError(f"{p}:{lineno}: not valid JSON ({e.msg}). Fix or remove that line.") from e
            if isinstance(obj, dict) and isinstance(obj.get("messages"), list):
                ids = _render(tokenizer, obj["messages"], enable_thinking)
            elif isinstance(obj, dict) and isinstance(obj.get("prompt"), str):
                ids = _render(tokenizer, [{"role": "user", "content": obj["prompt"]}], enable_thinking)
            else:
                raise EvalError(f"{p}:{lineno}: expected {{\"messages\": [...]}} or {{\"prompt\": \"...\"}}.")
            if not ids:
                raise EvalError(f"{p}:{lineno}: the prompt is empty after dropping assistant turns. Fix: give at "
                                "least one user message.")
            out.append(ids)
    if not out:
        raise EvalError(f"prompts file {p} is empty: it holds no prompts. Fix: add one JSON object per line, e.g. "
                        "{\"messages\": [{\"role\": \"user\", \"content\": \"...\"}]}.")
    return out


def default_prompt_files(target: str, data: str = "tiny") -> dict[str, Path]:
    """Prompt sets used when none are given: for the tiny target its held-out set and its training prompts."""
    if target == "tiny":
        from .tiny import tiny_data_path, tiny_heldout_path

        return {"heldout": Path(tiny_heldout_path()), "train": Path(tiny_data_path())}
    if data and data != "tiny" and Path(data).is_file():
        return {"train": Path(data)}
    raise EvalError(f"no default prompts for target {target!r}. Fix: pass prompts=<JSONL file> (--prompts FILE).")


def _prompt_sets(prompts, target: str, data: str) -> dict[str, Path]:
    if prompts is None or prompts == "" or prompts == []:
        return default_prompt_files(target, data)
    if isinstance(prompts, dict):
        return {str(k): Path(v) for k, v in prompts.items()}
    if isinstance(prompts, (str, Path)):
        prompts = [prompts]
    sets = {}
    for p in prompts:
        name = Path(p).stem
        while name in sets:
            name += "'"
        sets[name] = Path(p)
    return sets


# ------------------------------------------------------------------------------------------------------------------
# Measurement
# ------------------------------------------------------------------------------------------------------------------

@dataclass
class EvalReport:
    """Results of one evaluation: per decoder (trained / untrained / target only) and prompt set, per prompt."""

    run_dir: str
    weights: str
    step: int | None
    target: str
    block_size: int
    temperature: float
    max_new_tokens: int
    results: dict = field(default_factory=dict)  # {decoder: {prompt set: [GenerationResult.to_dict() + output_ids]}}

    @classmethod
    def from_dict(cls, d: dict) -> "EvalReport":
        keys = ("run_dir", "weights", "step", "target", "block_size", "temperature", "max_new_tokens", "results")
        return cls(**{k: d[k] for k in keys})

    def rows(self) -> list[dict]:
        """One row per (decoder, prompt set): prompts, tau, tokens/s, speedup vs target only, lossless match."""
        rows = []
        for name, sets in self.results.items():
            for sname, res in sets.items():
                its = sum(r["iterations"] for r in res)
                acc = sum(sum(r["accepted"]) for r in res)
                toks = sum(r["new_tokens"] for r in res)
                secs = sum(r["prefill_s"] + r["decode_s"] for r in res)
                base = self.results.get(BASELINE, {}).get(sname)
                speedup = None
                if base:
                    b_toks = sum(r["new_tokens"] for r in base)
                    b_secs = sum(r["prefill_s"] + r["decode_s"] for r in base)
                    speedup = (b_secs / b_toks) / (secs / toks) if toks and b_toks and secs else None
                same = None
                if self.temperature == 0 and base and name != BASELINE:
                    same = sum(a["output_ids"] == b["output_ids"] for a, b in zip(res, base))
                rows.append({"decoder": name, "prompt_set": sname, "block_size": 1 if name == BASELINE else
                             self.block_size, "prompts": len(res), "iterations": its, "accepted": acc,
                             "tau": (acc / its + 1) if its else 1.0,
                             "tau_per_prompt_mean": sum(r["tau"] for r in res) / len(res),
                             "new_tokens": toks, "tokens_per_s": toks / secs if secs else 0.0, "speedup": speedup,
                             "identical_to_target": same})
        return rows

    def tau(self, decoder: str = "trained", prompt_set: str | None = None) -> float:
        """Pooled tau of a decoder over all its iterations (of one prompt set, or of all)."""
        rows = [r for r in self.rows()
                if r["decoder"] == decoder and (prompt_set is None or r["prompt_set"] == prompt_set)]
        if not rows:
            raise KeyError(f"no results for decoder {decoder!r} / prompt set {prompt_set!r}; have "
                           f"{sorted({(r['decoder'], r['prompt_set']) for r in self.rows()})}")
        return pooled_tau(rows)

    def table(self) -> str:
        """A compact text table."""
        head = f"{'decoder':<13}{'prompts':<10}{'B':>3}{'n':>5}{'tau':>7}{'tok/s':>9}{'speedup':>9}{'lossless':>10}"
        lines = [head, "-" * len(head)]
        for r in self.rows():
            sp = f"{r['speedup']:.2f}x" if r["speedup"] is not None else "-"
            same = f"{r['identical_to_target']}/{r['prompts']}" if r["identical_to_target"] is not None else "-"
            lines.append(f"{r['decoder']:<13}{r['prompt_set']:<10}{r['block_size']:>3}{r['prompts']:>5}"
                         f"{r['tau']:>7.2f}{r['tokens_per_s']:>9.1f}{sp:>9}{same:>10}")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        cols = ["decoder", "prompt_set", "block_size", "prompts", "tau", "tokens_per_s", "speedup",
                "identical_to_target"]
        fmt = {"tau": "{:.2f}", "tokens_per_s": "{:.1f}", "speedup": "{:.2f}x"}
        cell = lambda r, c: fmt.get(c, "{}").format(r[c]) if r[c] is not None else "-"  # noqa: E731
        body = "".join("<tr>" + "".join(f"<td>{html.escape(cell(r, c))}</td>" for c in cols) + "</tr>"
                       for r in self.rows())
        return (f"<p>step {self.step} of {html.escape(self.run_dir)}, T={self.temperature}, "
                f"max_new_tokens={self.max_new_tokens}</p><table><tr>"
                + "".join(f"<th>{c}</th>" for c in cols) + f"</tr>{body}</table>")

    def __repr__(self) -> str:
        return self.table()

    def acceptance(self, decoder: str = "trained") -> tuple[list[int], list[float]]:
        """(histogram of accepted drafts per iteration 0..B-1, acceptance rate per block slot 1..B-1), pooled."""
        hist = [0] * self.block_size
        for res in self.results.get(decoder, {}).values():
            for r in res:
                hist = [a + b for a, b in zip(hist, r["accept_histogram"])]
        n = max(1, sum(hist))
        rate = [sum(hist[k:]) / n for k in range(1, self.block_size)]
        return hist, rate

    def to_dict(self) -> dict:
        return {"run_dir": self.run_dir, "weights": self.weights, "step": self.step, "target": self.target,
                "block_size": self.block_size, "temperature": self.temperature,
                "max_new_tokens": self.max_new_tokens, "summary": self.rows(),
                "acceptance": {d: dict(zip(("histogram", "slot_rate"), self.acceptance(d)))
                               for d in self.results if d != BASELINE},
                "results": self.results}

    def save(self, run_dir: str | Path | None = None) -> dict[str, Path]:
        """Write eval.json and the PNG plots (tau per prompt set, acceptance, speedup) into the run dir."""
        d = Path(run_dir or self.run_dir)
        from .rundir import write_json

        d.mkdir(parents=True, exist_ok=True)
        write_json(d / EVAL_FILE, self.to_dict())
        from .eval_plots import plot_eval

        paths = {"json": d / EVAL_FILE}
        paths.update(plot_eval(self, d / "plots"))
        return paths


def _device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def untrained_drafter(config, seed: int) -> DFlashDrafter:
    """The floor: a drafter of the same shape, initialised exactly as training starts (same seed), never trained."""
    d = DFlashDrafter(config)
    d.init_weights(torch.Generator().manual_seed(seed))
    return d.eval().requires_grad_(False)


def run_decoders(target, decoders: dict[str, SpeculativeDecoder], prompt_sets: dict[str, list[list[int]]], *,
                 max_new_tokens: int, temperature: float, seed: int = 0, log=print, progress_every_s: float = 10.0
                 ) -> dict:
    """Every decoder on every prompt, interleaved per prompt (fair timing on a shared machine).

    Returns {decoder: {set: [result dict with output_ids]}}."""
    first = next(iter(prompt_sets.values()))[0]
    for dec in decoders.values():  # warm-up: first calls allocate / pick kernels
        dec.generate(first, max_new_tokens=min(8, max_new_tokens), temperature=0.0)
    results = {name: {s: [] for s in prompt_sets} for name in decoders}
    total = sum(len(v) for v in prompt_sets.values())
    done, last = 0, time.monotonic()
    for sname, prompts in prompt_sets.items():
        for i, ids in enumerate(prompts):
            for k, (name, dec) in enumerate(decoders.items()):
                g = torch.Generator().manual_seed(seed * 1_000_003 + i * 101 + k)
                r: GenerationResult = dec.generate(ids, max_new_tokens=max_new_tokens, temperature=temperature,
                                                   generator=g)
                results[name][sname].append({**r.to_dict(), "output_ids": r.output_ids})
            done += 1
            if time.monotonic() - last >= progress_every_s or done == total:
                last = time.monotonic()
                taus = " | ".join(f"{n} tau {pooled_tau([x for v in results[n].values() for x in v]):.2f}"
                                  for n in decoders if n != BASELINE)
                log(f"eval {done}/{total} prompts | {taus}")
    return results


def pooled_tau(rows: list[dict]) -> float:
    """tau over all iterations of result rows or per-prompt results (each with iterations + accepted)."""
    its = sum(r["iterations"] for r in rows)
    acc = sum(r["accepted"] if isinstance(r["accepted"], int) else sum(r["accepted"]) for r in rows)
    return acc / its + 1 if its else 1.0


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


def evaluate(run: str | Path, *, prompts=None, block_size: int | None = None, temperature: float = 0.0,
             max_new_tokens: int = 128, n_prompts: int | None = 20, untrained: bool = True,
             target: str | None = None, seed: int | None = None, device: str = "auto",
             enable_thinking: bool | None = None, threads: int | None = 1, log=print) -> EvalReport:
    """Speculative decoding of the run's drafter (+ an untrained one + the target alone) on the prompt sets.

    threads: torch CPU threads when the device is the CPU (None = leave torch's setting). Decoding at batch size 1 is
    latency-bound: for small targets 1 thread is the fastest, and on a busy 2-core machine 2 threads were ~10x
    slower than 1 (threads waiting for each other on every small matmul).
    """
    from .config import TrainConfig
    from .export import load_drafter, train_config_of
    from .targets import load_target, load_tokenizer
    from .prepare import resolve_dtype

    if not str(run).strip():
        raise EvalError("run is empty. Fix: pass the run directory (runs/<stamp>-<name>-<id>/), a checkpoint "
                        "directory, an exported directory or a drafter .safetensors file.")
    src, drafter = load_drafter(run)
    train_cfg = None
    found = train_config_of(src)
    if found:
        try:
            train_cfg = TrainConfig.from_dict(found)
        except Exception:  # noqa: BLE001 - an older/foreign config: fall back to the explicit target
            train_cfg = None
    target_name = target or (train_cfg.target if train_cfg else None)
    if target_name is None:
        raise EvalError(f"{run} does not say which target it was trained on (no run config.json). "
                        "Fix: pass target=<model dir or hub id> (--target).")
    seed = seed if seed is not None else (train_cfg.seed if train_cfg else 0)
    dev = _device(device)
    dtype = resolve_dtype("auto", dev)
    if dev.type == "cpu" and threads:
        torch.set_num_threads(threads)
    if temperature < 0:
        raise EvalError(f"temperature={temperature} must be >= 0 (0 = greedy, lossless check on).")
    if max_new_tokens < 1:
        raise EvalError(f"max_new_tokens={max_new_tokens} must be >= 1.")
    B = block_size or src.config.block_size
    if B < 2:
        raise EvalError(f"block_size={B} leaves no draft slot; use >= 2 (the target-only baseline runs anyway).")

    log(f"loading target {target_name!r} on {dev} and drafter {src.weights} (step {src.step})")
    tok = load_tokenizer(target_name)
    tgt = load_target(target_name, device=dev, dtype=dtype)
    drafter.to(device=dev, dtype=dtype)
    files = _prompt_sets(prompts, target_name, train_cfg.data if train_cfg else "")
    sets = {s: load_prompts(f, tok, n_prompts=n_prompts, enable_thinking=enable_thinking) for s, f in files.items()}
    eos = tok.eos_token_id
    decoders = {"trained": SpeculativeDecoder(tgt, drafter, block_size=B, eos_token_id=eos)}
    if untrained:
        decoders["untrained"] = SpeculativeDecoder(
            tgt, untrained_drafter(src.config, seed).to(device=dev, dtype=dtype), block_size=B, eos_token_id=eos)
    decoders[BASELINE] = SpeculativeDecoder(tgt, None, block_size=1, eos_token_id=eos)
    _check_lengths(decoders["trained"], sets, files, max_new_tokens)
    log(f"prompt sets: {', '.join(f'{s} ({len(v)} from {files[s]})' for s, v in sets.items())}; block size {B}, "
        f"temperature {temperature}, max_new_tokens {max_new_tokens}")
    results = run_decoders(tgt, decoders, sets, max_new_tokens=max_new_tokens, temperature=temperature,
                                    seed=seed, log=log)
    return EvalReport(run_dir=str(src.run_dir), weights=str(src.weights), step=src.step, target=target_name,
                      block_size=B, temperature=temperature, max_new_tokens=max_new_tokens, results=results)


def heldout_tau(source, prompts=None, block_size: int | None = None, max_new_tokens: int = 64,
                n_prompts: int = 8, temperature: float = 0.0) -> float:
    """Real tau of a drafter on a few held-out prompts (pooled over iterations); cheap enough to run while training.

    `source` is a Trainer or a (target, drafter, tokenizer) tuple. prompts: a JSONL file, a list of token-id lists,
    or None = the tiny held-out set (tiny target) / the training data's prompts.
    """
    if isinstance(source, tuple):
        target, drafter, tok = source
        target_name, data = "tiny", "tiny"
    else:
        target, drafter, tok = source.target, source.drafter, source.tokenizer
        target_name, data = source.config.target, source.config.data
    if prompts is None:
        prompts = next(iter(default_prompt_files(target_name, data).values()))
    if isinstance(prompts, (str, Path)):
        ids = load_prompts(prompts, tok, n_prompts=n_prompts)
    else:
        ids = [list(p) for p in prompts][:n_prompts]
        if not ids:
            raise EvalError("heldout_tau got no prompts. Fix: pass a JSONL file or a non-empty list of token ids.")
    dec = SpeculativeDecoder(target, drafter, block_size=block_size, eos_token_id=tok.eos_token_id)
    was_training = drafter.training
    drafter.eval()
    try:
        accepted = []
        for i, p in enumerate(ids):
            g = torch.Generator().manual_seed(i)
            accepted += dec.generate(p, max_new_tokens=max_new_tokens, temperature=temperature, generator=g).accepted
    finally:
        drafter.train(was_training)
    return sum(accepted) / len(accepted) + 1 if accepted else 1.0


def load_report(run_dir: str | Path) -> dict:
    p = Path(run_dir) / EVAL_FILE
    if not p.is_file():
        raise EvalError(f"{p} does not exist. Fix: run `python -m dflash_lab.evaluate {run_dir}` first.")
    return json.loads(p.read_text())


def summary_table(report: dict) -> str:
    """The text table of a saved eval.json (what the CLI prints after the notebook ran)."""
    return EvalReport.from_dict(report).table()


def save_notebook(report: EvalReport) -> Path | None:
    """Copy the executed notebook into the run dir when papermill wrote it elsewhere (no-op otherwise)."""
    from .rundir import find_papermill_output, save_executed_notebook

    src = find_papermill_output()
    dst = Path(report.run_dir) / "eval.ipynb"
    if src is None or not src.is_file() or src.resolve() == dst.resolve():
        return None
    return save_executed_notebook(report.run_dir, "eval.ipynb")


# ------------------------------------------------------------------------------------------------------------------
# CLI
# ------------------------------------------------------------------------------------------------------------------

def run_notebook(params: dict, out_path: Path, *, log_output: bool = True) -> Path:
    """Execute notebooks/eval.ipynb with papermill into out_path."""
    import papermill

    if not NOTEBOOK.is_file():
        raise EvalError(f"{NOTEBOOK} is missing (installed without the repository's notebooks/). "
                        "Fix: run from a checkout, or pass --no-notebook.")
    import os

    # The kernel inherits this: it tells rundir/save_notebook where the executed copy is (a caller such as the
    # demo may have set it to its own training notebook).
    old = os.environ.get("DFLASH_NOTEBOOK_OUTPUT")
    os.environ["DFLASH_NOTEBOOK_OUTPUT"] = str(out_path)
    try:
        papermill.execute_notebook(str(NOTEBOOK), str(out_path), parameters=params, log_output=log_output,
                                   progress_bar=False, kernel_name="python3", cwd=str(NOTEBOOK.parent.parent))
    finally:
        if old is None:
            os.environ.pop("DFLASH_NOTEBOOK_OUTPUT", None)
        else:
            os.environ["DFLASH_NOTEBOOK_OUTPUT"] = old
    return out_path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dflash_lab.evaluate", description=__doc__.split("\n")[0])
    ap.add_argument("run", help="run directory, checkpoint directory, exported directory or drafter .safetensors")
    ap.add_argument("--prompts", nargs="+", default=None, help="JSONL prompt file(s); each file is one prompt set "
                    "(default: the tiny target's heldout + train prompts)")
    ap.add_argument("--block-size", type=int, default=None, help="block size (default: the drafter's)")
    ap.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (lossless check on)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--n-prompts", type=int, default=20, help="prompts per set (first N of each file)")
    ap.add_argument("--untrained", action=argparse.BooleanOptionalAction, default=True,
                    help="also measure an untrained drafter of the same shape and seed (default on)")
    ap.add_argument("--target", default=None, help="target model (default: the run's config.json)")
    ap.add_argument("--device", default="auto", help="auto | cpu | cuda:N")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads on the CPU (default 1: fastest for "
                    "small targets at batch size 1; 0 = torch's default)")
    ap.add_argument("--notebook", action=argparse.BooleanOptionalAction, default=True,
                    help="execute notebooks/eval.ipynb into <run>/eval.ipynb (default on); --no-notebook "
                         "evaluates in this process")
    args = ap.parse_args(argv)
    from .export import DrafterNotFoundError, resolve_drafter

    try:
        src = resolve_drafter(args.run)
        params = {"run": str(args.run), "prompts": args.prompts, "block_size": args.block_size,
                  "temperature": args.temperature, "max_new_tokens": args.max_new_tokens,
                  "n_prompts": args.n_prompts, "untrained": args.untrained, "target": args.target,
                  "device": args.device, "threads": args.threads or None}
        nb = None
        if args.notebook:
            nb = run_notebook(params, src.run_dir / "eval.ipynb")
            saved = load_report(src.run_dir)
            table = summary_table(saved)
        else:
            kw = {k: v for k, v in params.items() if k != "run"}
            report = evaluate(args.run, **kw)
            report.save()
            saved, table = report.to_dict(), report.table()
    except (DrafterNotFoundError, EvalError, PromptTooLongError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(table)
    decs = dict.fromkeys(r["decoder"] for r in saved["summary"] if r["decoder"] != BASELINE)
    taus = {d: pooled_tau([r for r in saved["summary"] if r["decoder"] == d]) for d in decs}
    print("tau " + ", ".join(f"{d} {t:.2f}" for d, t in taus.items())
          + f" (block size {saved['block_size']}, temperature {saved['temperature']})")
    print(f"eval results: {src.run_dir / EVAL_FILE}")
    if nb:
        print(f"eval notebook: {nb}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
