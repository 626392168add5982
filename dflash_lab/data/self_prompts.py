"""Prompts written by the target: sample user turns from its own chat template, clean them, answer them, report.

A drafter trained on a small, narrow prompt set learns that set, not the target. The target itself knows what its
users ask: given its chat template up to and including the user header (the system turn the template renders when
given none, then e.g. `<|im_start|>user\\n`) and sampled at T=1, it writes varied, plausible requests, until it
closes the turn with its end-of-turn token. This module samples N such first turns, drops exact and near duplicates
and bad turns (prompt_filters.py), holds out a fixed split by a hash of the text, lets the target answer (greedy by
default, as the drafter is measured), optionally alternates k target-written user turns and answers, and writes:

    <out>                        training records {"id", "messages", "generation"} (OpenAI chat format)
    <out stem>.heldout.jsonl     held-out records in the same format (evaluation: `--prompts self-heldout`)
    <out stem>.report.json/.txt  what the data is (prompt_report.py): counts, removals by reason, lengths, diversity

All three are named after --out, so two runs into one folder never replace each other's files, and a data-folder
read (files.py) leaves the held-out file and the reports out: training on the folder trains on `<out>` only.

    python -m dflash_lab.data.self_prompts --target smollm2-135m-instruct --n 2000 --out runs/data/self.jsonl

Generation goes through target/generate.py's batched engine; token ids are decoded once into message text (the
training pipeline renders and tokenizes text). Deterministic for a seed: the same command writes the same files.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import torch

from dflash_lab.config.errors import fail
from dflash_lab.config.threads import threads_arg
from dflash_lab.target import models
from dflash_lab.target.load import TargetLoadError, load_targets, load_tokenizer, resolve_target_path
from dflash_lab.target.sampling import GenerationSettings

from .chat_formats import DataError
from .files import HELDOUT_SUFFIX, heldout_path, not_training_data
from .heldout_overlap import conversations_in_training
from .prompt_filters import FilterConfig, dedup, filter_reason, is_heldout
from .prompt_report import PromptReport
from .self_prompt_gen import TurnGenerator
from .user_turns import UserTurnFormat

CHECKSUM_MAX_BYTES = 2 << 30  # hash weights up to 2 GiB (SmolLM2: 0.5 GB, ~1 s); larger ones are not hashed


USER_SAMPLING = GenerationSettings(max_new_tokens=256, temperature=1.0, top_p=0.95)
"""The user turns' default: T=1 after the user header writes varied, plausible requests; a turn that reaches
max_new_tokens without its end-of-turn token is filtered as truncated."""
ANSWER_SAMPLING = GenerationSettings(max_new_tokens=512)
"""The answers' default: greedy, what T=0 speculative decoding is measured on."""


@dataclass(frozen=True, kw_only=True)
class SelfPromptConfig:
    """How target-written prompts are sampled, cleaned, split and answered; recorded in the report and records."""

    n: int
    """First user turns to sample (the kept number is smaller: duplicates and bad turns are removed)."""
    turns: int = 1
    """User turns per conversation: k target-written user turns, each answered by the target."""
    user_sampling: GenerationSettings = USER_SAMPLING
    """How user turns are sampled (temperature > 0); user turn t + 1 uses seed + 104729 t. Each token is drawn from a
    hash of (seed, sample index, position): target/sampling.py. Its seed names the records; its enable_thinking is
    the template's mode for the whole conversation."""
    answer_sampling: GenerationSettings = ANSWER_SAMPLING
    """How the target answers; the answers of turn t use seed + 7919 (t + 1)."""
    answers: bool = True
    """Let the target answer each user turn (training data); False writes prompts only (turns must be 1)."""
    heldout: int = 256
    """Held-out conversations to write (the first ones, in sample order, whose text hash falls in the held-out part)."""
    heldout_fraction: float = 0.01
    """Part of the hash range that is held out: fixed by the text, so the split does not move as N grows."""
    near_threshold: float | None = 0.7
    """Word-3-gram Jaccard at or above which a prompt is a near duplicate of an earlier one (None: keep them)."""
    batch_size: int = 256
    max_len: int = 2048
    """Longest prompt + new tokens the engine holds; a conversation that would outgrow it ends earlier."""
    filters: FilterConfig = field(default_factory=FilterConfig)

    def __post_init__(self) -> None:
        counts = [(name, isinstance(getattr(self, name), int) and getattr(self, name) >= 1, "must be an integer >= 1",
                   "pass a positive count") for name in ("n", "turns", "batch_size", "max_len")]
        types = [(name, isinstance(getattr(self, name), GenerationSettings), "must be a GenerationSettings",
                  "build one: GenerationSettings(max_new_tokens=...)") for name in ("user_sampling", "answer_sampling")]
        self._check(counts + types)  # the rest reads these fields
        u, a = self.user_sampling, self.answer_sampling
        self._check([
            ("user_sampling", u.temperature > 0, "needs temperature > 0: greedy would write the same prompt N times",
             "use temperature=1.0"),
            ("answer_sampling", a.enable_thinking == u.enable_thinking, "has another enable_thinking than "
             "user_sampling: one conversation is rendered in one thinking mode", "give both the same enable_thinking"),
            ("heldout_fraction", 0 <= self.heldout_fraction < 1, "must be in [0, 1)", "use e.g. 0.01"),
            ("heldout", self.heldout >= 0, "must be >= 0", "use e.g. 256, or 0 for no held-out file"),
            ("turns", self.answers or self.turns == 1, "needs answers: later user turns follow the target's answers",
             "drop --no-answers"),
            ("user_sampling", u.max_new_tokens < self.max_len,
             f"max_new_tokens={u.max_new_tokens} leaves no room in max_len={self.max_len}", "raise max_len"),
        ])

    def _check(self, checks: list[tuple[str, bool, str, str]]) -> None:
        for name, ok, why, fix in checks:
            if not ok:
                fail("SelfPromptConfig", name, getattr(self, name), why, fix)

    @property
    def seed(self) -> int:
        return self.user_sampling.seed

    def user_settings(self, turn: int) -> GenerationSettings:
        return dataclasses.replace(self.user_sampling, seed=self.user_sampling.seed + 104729 * turn)

    def answer_settings(self, turn: int) -> GenerationSettings:
        return dataclasses.replace(self.answer_sampling, seed=self.answer_sampling.seed + 7919 * (turn + 1))

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def target_checksum(target: str) -> dict | None:
    """sha256 of the target's weight files: from a known model's manifest, else hashed when they total <= 2 GiB."""
    if models.is_known(target):
        m = models.manifest(target)
        return dict(m.get("output_sha256", {})) if m else None
    try:
        folder = Path(resolve_target_path(target))
    except TargetLoadError:
        return None
    files = sorted(folder.glob("*.safetensors")) if folder.is_dir() else []
    if not files or sum(f.stat().st_size for f in files) > CHECKSUM_MAX_BYTES:
        return None
    return {f.name: models.sha256_of(f) for f in files}


def output_paths(out: str | Path) -> dict[str, Path]:
    """The files of one run, all named after --out: training data, held-out data, the report (JSON and text)."""
    out = Path(out)
    why = not_training_data(out.name)
    if why is not None or out.suffix.lower() != ".jsonl":
        raise DataError(f"--out {out} is not a training file name" + (f" (a data-folder read skips it: {why})" if why
                        else " (training data is .jsonl)") + f". Fix: e.g. --out {out.parent / 'self.jsonl'}.")
    stem = out.with_suffix("")
    return {"out": out, "heldout": heldout_path(out), "report_json": Path(f"{stem}.report.json"),
            "report_txt": Path(f"{stem}.report.txt")}


@dataclass
class _Conversation:
    index: int
    messages: list[dict]
    user_tokens: list[int]
    finish_reasons: list[str] = field(default_factory=list)
    new_tokens: list[int] = field(default_factory=list)
    open: bool = True


def _dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":  # bf16 on a GPU (what the drafter is served against), fp32 on the CPU
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return {"bfloat16": torch.bfloat16, "float32": torch.float32}[name]


def write_self_prompts(target: str, out: str | Path, config: SelfPromptConfig, *, model=None, tokenizer=None,
                       devices=("cpu",), dtype: str = "auto", log=print) -> PromptReport:
    """Sample, clean, split and answer `config.n` target-written prompts; write the files; return the report.
    `model`: an already loaded target (one device); otherwise one replica is loaded per device in `devices`."""
    paths = output_paths(out)
    tok = tokenizer if tokenizer is not None else load_tokenizer(target)
    fmt = UserTurnFormat.of(tok, enable_thinking=config.user_sampling.enable_thinking)
    if model is not None:
        replicas = [model]
    else:
        t_load = time.perf_counter()
        replicas = load_targets(target, list(devices), dtype=lambda d: _dtype(dtype, d))
        log(f"self-prompts: loaded {target} on {', '.join(map(str, devices))} in {time.perf_counter() - t_load:.1f} s")
    generator = TurnGenerator(replicas, tok, stop_ids=fmt.stop_ids, max_batch=config.batch_size,
                              max_len=config.max_len, log=log)
    t0 = time.perf_counter()
    log(f"self-prompts: sampling {config.n:,} first user turns from {target} after {fmt.first_prefix[-40:]!r} "
        f"({config.user_sampling.to_dict()})")
    firsts = generator.turns([fmt.first_prefix] * config.n, config.user_settings(0), keys=list(range(config.n)),
                             what="first user turns")
    sample_s = time.perf_counter() - t0

    filtered, examples = Counter(), {}
    survivors = []
    for i, (text, finish, n_tok) in enumerate(firsts):
        reason = filter_reason(text, finish, markers=fmt.markers, config=config.filters)
        if reason:
            filtered[reason] += 1
            examples.setdefault(reason, [])
            if len(examples[reason]) < 3:
                examples[reason].append(text[:200])
        else:
            survivors.append(_Conversation(i, [{"role": "user", "content": text}], [n_tok]))
    dd = dedup([c.messages[0]["content"] for c in survivors], near_threshold=config.near_threshold)
    kept = [survivors[k] for k in dd.kept]
    held = [c for c in kept if is_heldout(c.messages[0]["content"], config.heldout_fraction)]
    held_ids = {c.index for c in held}
    train = [c for c in kept if c.index not in held_ids]
    written_held = held[:config.heldout]
    if len(written_held) < config.heldout:
        log(f"self-prompts: only {len(held)} kept prompts fall in the held-out fraction {config.heldout_fraction} "
            f"(asked for {config.heldout}). HINT: sample more (--n) or raise --heldout-fraction.")
    later = _extend(generator, tok, fmt, train + written_held, config)

    first_texts = [c.messages[0]["content"] for c in kept]
    user_texts = [m["content"] for c in train + written_held for m in c.messages if m["role"] == "user"]
    settings = {"target": target, "target_checksum": target_checksum(target), "user_prefix": fmt.first_prefix,
                "end_of_turn": fmt.end_of_turn, "stop_ids": list(fmt.stop_ids), **config.to_dict(),
                "engine": generator.engine, "dtype": str(next(replicas[0].parameters()).dtype).replace("torch.", "")}
    generation = {"model": target, "user": dataclasses.asdict(config.user_settings(0)),
                  "answer": dataclasses.asdict(config.answer_settings(0)) if config.answers else None}
    _write_jsonl(paths["out"], [_record(c, config.seed, generation) for c in train if c.messages])
    _write_jsonl(paths["heldout"], [_record(c, config.seed, generation) for c in written_held if c.messages])
    report = PromptReport.build(
        settings=settings, sampled=config.n, filtered=filtered, filter_examples=examples, exact=len(dd.exact),
        near=len(dd.near), first_turns=first_texts, user_turns=user_texts,
        first_turn_tokens=[c.user_tokens[0] for c in kept], train=len(train), heldout=len(written_held),
        heldout_unused=len(held) - len(written_held), heldout_fraction=config.heldout_fraction,
        out=str(paths["out"]), heldout_out=str(paths["heldout"]), seconds=time.perf_counter() - t0,
        sample_seconds=sample_s, first_turn_new_tokens=sum(n for _, _, n in firsts), turns=later,
        heldout_in_training=conversations_in_training([c.messages for c in written_held if c.messages],
                                                      [c.messages for c in train if c.messages]))
    _write_text(paths["report_json"], json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    _write_text(paths["report_txt"], str(report) + "\n")
    log(str(report))
    log(f"self-prompts: held-out prompts (evaluation --prompts self-heldout): {paths['heldout']}")
    return report


def _extend(gen: TurnGenerator, tok, fmt: UserTurnFormat, convs: list[_Conversation], config: SelfPromptConfig) -> dict:
    """Answers, and for turns > 1 further target-written user turns, for every conversation. Returns counts of how
    conversations ended early (a later user turn filtered, by reason; the context full; an answer cut off) and of
    answers cut off at max_answer_tokens (kept: the drafter learns from them all the same)."""
    ended: Counter = Counter()
    truncated = 0
    for turn in range(config.turns):
        if turn > 0:
            active = [c for c in convs if c.open]
            prefixes = [fmt.user_prefix(tok, c.messages) for c in active]
            fits = [len(ids) + config.user_sampling.max_new_tokens <= gen.max_len for ids in gen.prompt_ids(prefixes)]
            for c, ok in zip(active, fits):
                if not ok:
                    c.open = False
                    ended["context_full"] += 1
            active, prefixes = [c for c in active if c.open], [p for p, ok in zip(prefixes, fits) if ok]
            outs = gen.turns(prefixes, config.user_settings(turn), keys=[c.index for c in active], what=f"user turns {turn + 1}")
            for c, (text, finish, n_tok) in zip(active, outs):
                reason = filter_reason(text, finish, markers=fmt.markers, config=config.filters)
                if reason:
                    c.open = False
                    ended[f"later_turn_{reason}"] += 1
                else:
                    c.messages.append({"role": "user", "content": text})
                    c.user_tokens.append(n_tok)
        if not config.answers:
            break
        active = [c for c in convs if c.open and c.messages[-1]["role"] == "user"]
        prompts = [fmt.answer_prompt(tok, c.messages) for c in active]
        fits = [len(ids) + config.answer_sampling.max_new_tokens <= gen.max_len for ids in gen.prompt_ids(prompts)]
        for c, ok in zip(active, fits):
            if not ok:  # the unanswerable user turn goes: a record ends with an answer
                c.messages.pop()
                c.user_tokens.pop()
                c.open = False
                ended["context_full"] += 1
        active, prompts = [c for c in active if c.open], [p for p, ok in zip(prompts, fits) if ok]
        outs = gen.turns(prompts, config.answer_settings(turn), keys=[c.index for c in active],
                         what=f"answers {turn + 1}", strip=False)
        for c, (text, finish, n_tok) in zip(active, outs):
            c.messages.append({"role": "assistant", "content": text})
            c.finish_reasons.append(finish)
            c.new_tokens.append(n_tok)
            if finish == "length":
                c.open = False  # a cut-off answer is kept for training, but no user would reply to it
                truncated += 1
                if turn + 1 < config.turns:
                    ended["answer_truncated"] += 1
        if not any(c.open for c in convs):
            break
    per = Counter(sum(m["role"] == "user" for m in c.messages) for c in convs)
    return {"user_turns": {str(k): v for k, v in sorted(per.items())}, "answers_truncated": truncated,
            "ended_early": dict(ended)}


def _record(c: _Conversation, seed: int, generation: dict) -> dict:
    return {"id": f"self-s{seed}-{c.index:07d}", "messages": c.messages,
            "generation": {**generation, "user_tokens": c.user_tokens, "finish_reasons": c.finish_reasons,
                           "new_tokens": c.new_tokens}}


def _write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _write_jsonl(path: Path, records: list[dict]) -> None:
    _write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", required=True, help='HF id, local dir, a known model name or "tiny"')
    p.add_argument("--n", type=int, required=True, help="first user turns to sample (fewer are kept)")
    p.add_argument("--out", required=True, help=f"training JSONL; the held-out file is <out stem>{HELDOUT_SUFFIX}")
    p.add_argument("--turns", type=int, default=1, help="user turns per conversation (each answered)")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-prompt-tokens", type=int, default=256)
    p.add_argument("--no-answers", action="store_true", help="write prompts only (then e.g. regenerate them)")
    p.add_argument("--answer-temperature", type=float, default=0.0, help="0 = greedy answers")
    p.add_argument("--answer-top-p", type=float, default=1.0)
    p.add_argument("--answer-top-k", type=int, default=0)
    p.add_argument("--max-answer-tokens", type=int, default=512)
    p.add_argument("--heldout", type=int, default=256, help="held-out conversations to write")
    p.add_argument("--heldout-fraction", type=float, default=0.01, help="part of the text-hash range held out")
    p.add_argument("--near-threshold", type=float, default=0.7, help="near-duplicate Jaccard (0 = keep them)")
    p.add_argument("--thinking", choices=["on", "off", "template"], default="template")
    p.add_argument("--devices", nargs="+", default=["cpu"], help="e.g. cuda:0 cuda:1 (one target replica each)")
    p.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"])
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--max-len", type=int, default=2048)
    p.add_argument("--threads", type=threads_arg, default=None,
                   help="torch CPU threads, 1..cores (1 is fastest for tiny models; 0 = torch's default)")
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    try:
        thinking = {"on": True, "off": False, "template": None}[a.thinking]
        cfg = SelfPromptConfig(
            n=a.n, turns=a.turns, answers=not a.no_answers,
            user_sampling=GenerationSettings(max_new_tokens=a.max_prompt_tokens, temperature=a.temperature,
                                             top_p=a.top_p, top_k=a.top_k, seed=a.seed, enable_thinking=thinking),
            answer_sampling=GenerationSettings(max_new_tokens=a.max_answer_tokens, temperature=a.answer_temperature,
                                               top_p=a.answer_top_p, top_k=a.answer_top_k, seed=a.seed,
                                               enable_thinking=thinking),
            heldout=a.heldout, heldout_fraction=a.heldout_fraction, near_threshold=a.near_threshold or None,
            batch_size=a.batch_size, max_len=a.max_len)
        write_self_prompts(a.target, a.out, cfg, devices=tuple(a.devices), dtype=a.dtype,
                           log=lambda s: print(s, flush=True))
    except (DataError, TargetLoadError, ValueError) as e:
        print(f"error: {e}", flush=True)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
