"""Regenerate the assistant turns of a chat data set with the target itself (HF generation or an OpenAI server).

A drafter learns to predict the TARGET's tokens, so its training responses should be the target's own outputs in the
chat template and thinking mode that will be served. For every conversation the user/system turns are kept and each
assistant turn is replaced by the target's answer given the history so far (earlier turns already regenerated); a
conversation ending in a user turn gets one new answer, so a prompts-only file works too.

Two back ends:
- Hugging Face: the target is loaded on each chosen device (one replica per device, one thread each); conversations
  are grouped into left-padded batches of similar prompt length and generated turn by turn.
- Server: POST {url}/v1/chat/completions (vLLM, SGLang or any OpenAI-compatible server running the target), with
  `concurrency` requests in flight and `chat_template_kwargs.enable_thinking` when a thinking mode is chosen.

Output: JSONL, one line per conversation {"id", "source", "messages", "generation": {sampling settings, model,
finish_reasons, new_tokens}}, readable as OpenAI-format training data, plus `<out>.meta.json` (settings, counts,
throughput). It is append-only and resumable: a rerun skips ids already in the file (an interrupted half-written last
line is cut off first) and refuses to mix sampling settings. Greedy (temperature 0) output is reproducible; sampled
output is seeded per batch (seed + batch number), so it is reproducible for the same batch composition.

    python -m dflash_lab.regenerate --data prompts.jsonl --out regen.jsonl --target Qwen/Qwen3-8B \
        --devices cuda:0 cuda:1 --batch-size 64 --max-new-tokens 2048 --temperature 0 --thinking off
"""

from __future__ import annotations

import concurrent.futures as cf
import copy
import dataclasses
import json
import os
import queue
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch

from .chat_formats import ChatData, DataError, read_chat_data
from .regen_server import FailureLog, ServerGenerator, check_record_settings, check_server_url, server_job


@dataclass(frozen=True, kw_only=True)
class SamplingConfig:
    """How the target answers; recorded in every output record and in `<out>.meta.json`."""

    temperature: float = 0.0
    """0 = greedy (reproducible); > 0 samples."""
    top_p: float = 1.0
    """Nucleus sampling mass (only when temperature > 0)."""
    top_k: int = 0
    """Top-k sampling (0 = off; only when temperature > 0)."""
    max_new_tokens: int = 2048
    """Longest answer per turn; answers cut here are recorded with finish_reason "length"."""
    enable_thinking: bool | None = None
    """Passed to the chat template (Qwen3-style thinking switch); None = the template's default."""
    seed: int = 0
    """Base seed of the sampling RNG (seed + batch number)."""

    def __post_init__(self) -> None:
        def bad(name, why, fix):
            raise DataError(f"SamplingConfig.{name}={getattr(self, name)!r} is invalid: {why}. Fix: {fix}.")

        if not self.temperature >= 0:
            bad("temperature", "must be >= 0", "use 0 for greedy or e.g. 0.6")
        if not 0 < self.top_p <= 1:
            bad("top_p", "must be in (0, 1]", "use 1.0 (off) or e.g. 0.95")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            bad("top_k", "must be an integer >= 0", "use 0 (off) or e.g. 20")
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            bad("max_new_tokens", "must be an integer >= 1", "use e.g. 2048")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass
class RegenStats:
    """Counts and throughput of one regenerate() call (this call only; resumed samples are `already_done`)."""

    total: int = 0
    already_done: int = 0
    samples: int = 0
    turns: int = 0
    new_tokens: int = 0
    seconds: float = 0.0
    finish_reasons: Counter = dataclasses.field(default_factory=Counter)
    skipped: dict = dataclasses.field(default_factory=dict)
    out: str = ""
    backend: str = ""
    greedy_match: dict | None = None
    """Batched vs single-sequence greedy on the first prompts (`greedy_match_check`), local back end at T=0."""
    failed: dict = dataclasses.field(default_factory=dict)  # server: reason -> ids not written (regen_server.py)

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d.update(finish_reasons=dict(self.finish_reasons), samples_per_s=round(self.samples_per_s, 3),
                 tokens_per_s=round(self.tokens_per_s, 1))
        return d

    def __str__(self) -> str:
        return (f"regenerated {self.samples} conversations ({self.turns} turns, {self.new_tokens:,} new tokens) in "
                f"{self.seconds:.1f}s: {self.samples_per_s:.2f} samples/s, {self.tokens_per_s:,.0f} new tokens/s "
                f"[{self.backend}]; {self.already_done} already done; finish {dict(self.finish_reasons)}; "
                f"skipped {self.skipped or 0}"
                + (f"; NOT written {({k: len(v) for k, v in self.failed.items()})} (rerun to retry)" if self.failed
                   else "") + f" -> {self.out}" + (f"; greedy match {self.greedy_match['summary']}"
                                                   if self.greedy_match else ""))

    def _repr_html_(self) -> str:
        import html

        return f"<pre>{html.escape(str(self))}</pre>"


# ---------------------------------------------------------------------------------------------------------------
# Back ends: a list of histories -> a list of (text, finish_reason, new_tokens)
# ---------------------------------------------------------------------------------------------------------------

class HFGenerator:
    """Batched generation with a Hugging Face causal LM on one device (left padding, stop at end-of-turn/eos)."""

    def __init__(self, model, tokenizer, sampling: SamplingConfig):
        self.model, self.tokenizer, self.sampling = model, tokenizer, sampling
        self.device = next(model.parameters()).device
        stop = getattr(model.generation_config, "eos_token_id", None)
        stop = set(stop if isinstance(stop, (list, tuple)) else [stop] if stop is not None else [])
        if tokenizer.eos_token_id is not None:
            stop.add(tokenizer.eos_token_id)
        from .data import ChatTemplate

        eot = ChatTemplate(tokenizer).end_of_turn
        if eot is not None:
            stop.add(tokenizer.convert_tokens_to_ids(eot))
        if not stop:
            raise DataError(f"tokenizer {tokenizer.name_or_path} has no eos token and the template no end-of-turn "
                            "token: generation would never stop. Fix: set generation_config.eos_token_id.")
        self.stop_ids = sorted(stop)
        if tokenizer.pad_token is None:
            # Llama-family tokenizers (SmolLM2 from its GGUF, Llama 3) ship no pad token and batched encoding refuses
            # to pad ("Asking to pad but the tokenizer does not have a padding token"). Left padding is masked out
            # by the attention mask, so the pad id's value never reaches an answer: the first stop token serves.
            tokenizer.pad_token = tokenizer.convert_ids_to_tokens(self.stop_ids[0])
        self.pad_id = tokenizer.pad_token_id
        self.kwargs = {} if sampling.enable_thinking is None else {"enable_thinking": sampling.enable_thinking}

    def prompt(self, history: list[dict]) -> str:
        return self.tokenizer.apply_chat_template(history, tokenize=False, add_generation_prompt=True, **self.kwargs)

    # Attention scores one generate() call may hold: rows x (padded prompt + new tokens)^2, per head. The math SDPA
    # path (fp32 with a padding mask) materialises them: 128 rows around one 4,800-token chitchat prompt asked for
    # 107 GiB on an H200 (issue 12). Batches over the budget are split into consecutive sub-batches.
    ATTENTION_BUDGET = 1_200_000_000

    def __call__(self, histories: list[list[dict]], seed: int) -> list[tuple[str, str, int]]:
        prompts = [self.prompt(h) for h in histories]
        longest = max(len(self.tokenizer(p, add_special_tokens=False)["input_ids"]) for p in prompts)
        rows = max(1, self.ATTENTION_BUDGET // (longest + self.sampling.max_new_tokens) ** 2)
        out = []
        for i in range(0, len(prompts), rows):  # same seed per sub-batch: a split never changes greedy answers
            out += self._generate(prompts[i:i + rows], seed + i)
        return out

    @torch.no_grad()
    def _generate(self, prompts: list[str], seed: int) -> list[tuple[str, str, int]]:
        s = self.sampling
        enc = self.tokenizer(prompts, return_tensors="pt", padding=True,
                             padding_side="left", add_special_tokens=False).to(self.device)
        # Every sampling knob explicitly: unset values would be filled from the model's generation_config (e.g.
        # Qwen3 ships top_k=20, temperature=0.6), so the recorded settings would not be what was used.
        kw = dict(max_new_tokens=s.max_new_tokens, eos_token_id=self.stop_ids, pad_token_id=self.pad_id,
                  do_sample=s.temperature > 0, repetition_penalty=1.0, no_repeat_ngram_size=0)
        if s.temperature > 0:  # the warpers act only when sampling (greedy ignores them)
            kw.update(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k, min_p=0.0)
            if self.device.type == "cuda":
                with torch.cuda.device(self.device):
                    torch.cuda.manual_seed(seed)
            else:
                torch.manual_seed(seed)
        out = self.model.generate(**enc, **kw)
        new = out[:, enc["input_ids"].shape[1]:].tolist()  # .tolist() syncs
        stops = set(self.stop_ids)
        results = []
        for row in new:
            end = next((i for i, t in enumerate(row) if t in stops), None)
            toks = row if end is None else row[:end]
            text = self.tokenizer.decode(toks, skip_special_tokens=False)
            results.append((text, "length" if end is None else "stop", len(row) if end is None else end + 1))
        return results


def greedy_match_check(gen: HFGenerator, histories: list[list[dict]], batch_size: int) -> dict:
    """Does batched, left-padded greedy reproduce what the target says ALONE (batch 1, as served)? Generates each
    history both ways with the same model and dtype and compares token ids. In bf16, batching changes reduction
    orders and flips near-tied argmaxes (issue 12: 11 of 24 SmolLM2 prompts diverged on CPU; 0 of 24 in fp32), so
    the training text would not be the served text: record the rate and regenerate in the dtype that matches."""
    t0 = time.perf_counter()
    batched = []
    for b0 in range(0, len(histories), batch_size):
        batched += gen(histories[b0:b0 + batch_size], seed=0)
    single = [gen([h], seed=0)[0] for h in histories]
    diverged = []
    for i, ((tb, _, nb), (ts, _, ns)) in enumerate(zip(batched, single)):
        if tb != ts:
            a, b = gen.tokenizer.encode(tb, add_special_tokens=False), gen.tokenizer.encode(ts, add_special_tokens=False)
            first = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            diverged.append({"index": i, "first_differing_token": first, "batched_tokens": nb, "single_tokens": ns})
    n = len(histories)
    return {"checked": n, "identical": n - len(diverged), "match_rate": round((n - len(diverged)) / max(n, 1), 4),
            "dtype": str(next(gen.model.parameters()).dtype).replace("torch.", ""), "device": str(gen.device),
            "batch_size": min(batch_size, n), "diverged": diverged, "seconds": round(time.perf_counter() - t0, 2),
            "summary": f"{n - len(diverged)}/{n} identical to single-sequence greedy"}


# ---------------------------------------------------------------------------------------------------------------
# Resumable output
# ---------------------------------------------------------------------------------------------------------------

def meta_path(out: Path) -> Path:
    return out.with_name(out.name + ".meta.json")


def load_finished(out: Path, log=print) -> set[str]:
    """Ids already in `out`. A half-written last line (interrupted run) is cut off; a bad line elsewhere raises."""
    if not out.exists():
        return set()
    done, good_end = set(), 0
    with open(out, "rb") as f:
        lines = f.readlines()
    for lineno, raw in enumerate(lines, 1):
        try:
            rec = json.loads(raw)
            done.add(str(rec["id"]))
            good_end += len(raw)
        except (json.JSONDecodeError, KeyError, TypeError, UnicodeDecodeError) as e:
            if lineno == len(lines) and not raw.endswith(b"\n"):
                with open(out, "r+b") as f:
                    f.truncate(good_end)
                log(f"regenerate: cut off a half-written last line of {out} (line {lineno}, interrupted run)")
                break
            raise DataError(f"{out}:{lineno}: not a complete output record ({e}). The output file is corrupt. Fix: "
                            "remove that line, or start a new output file.") from None
    return done


def _check_meta(out: Path, settings: dict, resuming: bool) -> None:
    mp = meta_path(out)
    if not (resuming and mp.is_file()):
        return
    old = json.loads(mp.read_text()).get("settings", {})
    diff = {k: (old.get(k), v) for k, v in settings.items() if old.get(k) != v}
    if diff:
        raise DataError(f"{out} was written with other settings {diff} (old, new). Resuming would mix them in one "
                        "file. Fix: rerun with the same settings, use a new output file, or pass overwrite=True.")


def _write_meta(out: Path, settings: dict, stats: RegenStats) -> None:
    mp = meta_path(out)
    tmp = mp.with_name(mp.name + ".tmp")
    tmp.write_text(json.dumps({"settings": settings, "last_run": stats.to_dict(),
                               "updated": time.strftime("%Y-%m-%dT%H:%M:%S")}, indent=2) + "\n")
    os.replace(tmp, mp)


class _Writer:
    """Append-only JSONL writer shared by worker threads; progress lines every `every_s` seconds."""

    def __init__(self, out: Path, stats: RegenStats, settings: dict, log, every_s: float, on_progress):
        self.f = open(out, "a", encoding="utf-8")
        self.out, self.stats, self.settings, self.log, self.every_s = out, stats, settings, log, every_s
        self.on_progress = on_progress
        self.lock = threading.Lock()
        self.t0 = self.last = time.monotonic()

    def add(self, rec: dict) -> None:
        line = json.dumps(rec, ensure_ascii=False) + "\n"
        with self.lock:
            self.f.write(line)
            self.f.flush()
            s = self.stats
            s.samples += 1
            s.turns += len(rec["generation"]["finish_reasons"])
            s.new_tokens += sum(rec["generation"]["new_tokens"])
            s.finish_reasons.update(rec["generation"]["finish_reasons"])
            now = time.monotonic()
            s.seconds = now - self.t0
            if now - self.last >= self.every_s or s.samples + s.already_done == s.total:
                self.last = now
                os.fsync(self.f.fileno())
                _write_meta(self.out, self.settings, s)
                self.log(self.progress_line())
            if self.on_progress is not None:
                self.on_progress(s)

    def progress_line(self) -> str:
        s = self.stats
        done, left = s.samples + s.already_done, s.total - s.samples - s.already_done
        eta = int(left / s.samples_per_s) if s.samples_per_s > 0 else 0
        return (f"regenerate: {done}/{s.total} conversations | {s.samples_per_s:.2f} samples/s | "
                f"{s.tokens_per_s:,.0f} new tok/s | ETA {eta // 3600}h{eta % 3600 // 60:02d}m{eta % 60:02d}s")

    def close(self) -> None:
        with self.lock:
            self.stats.seconds = time.monotonic() - self.t0
            self.f.flush()
            os.fsync(self.f.fileno())
            self.f.close()
            _write_meta(self.out, self.settings, self.stats)


# ---------------------------------------------------------------------------------------------------------------
# The driver
# ---------------------------------------------------------------------------------------------------------------

class _Job:
    """One conversation being regenerated turn by turn."""

    def __init__(self, conv):
        self.conv = conv
        self.history: list[dict] = []
        self.rest = list(conv.messages)
        self.finish, self.tokens = [], []

    def next_prompt(self) -> list[dict] | None:
        """Advance through kept turns; the history to answer next, or None when the conversation is done."""
        while self.rest:
            m = self.rest.pop(0)
            if m["role"] == "assistant":
                return self.history
            self.history.append({k: v for k, v in m.items() if k in ("role", "content", "name")})
        if self.history and self.history[-1]["role"] != "assistant":
            return self.history  # a trailing user turn gets an answer too
        return None

    def answer(self, text: str, finish: str, n: int) -> None:
        self.history.append({"role": "assistant", "content": text})
        self.finish.append(finish)
        self.tokens.append(n)

    def record(self, generation: dict) -> dict:
        return {"id": self.conv.id, "source": self.conv.source, "messages": self.history,
                "generation": {**generation, "finish_reasons": self.finish, "new_tokens": self.tokens}}


def _hf_worker(gen: HFGenerator, batches: "queue.Queue", writer: _Writer, generation: dict, stop: threading.Event):
    while not stop.is_set():
        try:
            batch_no, convs = batches.get_nowait()
        except queue.Empty:
            return
        jobs = [_Job(c) for c in convs]
        pending = [(j, j.next_prompt()) for j in jobs]
        rnd = 0
        while pending and not stop.is_set():
            active = [(j, h) for j, h in pending if h is not None]
            if not active:
                break
            outs = gen([h for _, h in active], seed=gen.sampling.seed + batch_no * 1000 + rnd)
            for (j, _), (text, finish, n) in zip(active, outs):
                j.answer(text, finish, n)
            pending = [(j, j.next_prompt()) for j, _ in active]
            rnd += 1
        if stop.is_set():
            return
        for j in jobs:
            writer.add(j.record(generation))


def _resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}[name]


def regenerate(data: str | Path | ChatData, out: str | Path, *, target: str = "tiny", devices=("cpu",),
               batch_size: int = 16, sampling: SamplingConfig | None = None, server_url: str | None = None,
               server_model: str | None = None, concurrency: int = 8, dtype: str = "auto",
               data_format: str = "auto", limit: int | None = None, overwrite: bool = False, log=print,
               progress_every_s: float = 10.0, on_progress=None, models: dict | None = None,
               match_check: int = 0, server_timeout_s: float = 300.0, server_retries: int = 3,
               server_backoff_s: float = 0.5) -> RegenStats:
    """Regenerate every conversation of `data` into `out` (JSONL). Resumes if `out` exists. Returns RegenStats.

    `models` optionally maps device name -> an already loaded model (skips loading; used by notebooks and tests).
    `match_check` > 0 (local back end, temperature 0): first compare batched vs single-sequence greedy on that many
    first prompts (`greedy_match_check`); the result goes to the stats and `<out>.meta.json`.
    Server back end: per-request timeout, bounded retries with backoff, failures counted by id (regen_server.py).
    """
    sampling = sampling or SamplingConfig()
    if server_url is not None:
        check_server_url(server_url)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if overwrite:
        for p in (out, meta_path(out)):
            p.unlink(missing_ok=True)
    if isinstance(data, ChatData):
        chat = data
    else:
        from .data import resolve_data_path

        chat = read_chat_data(resolve_data_path(str(data)), data_format=data_format, require_assistant=False)
    convs = []
    skipped = {}
    for c in chat.conversations:
        if any(m["role"] == "tool" for m in c.messages):
            skipped["tool_turns"] = skipped.get("tool_turns", 0) + 1
            continue
        convs.append(c)
    if limit is not None:
        convs = convs[:limit]
    backend = f"server {server_url}" if server_url else f"hf {','.join(map(str, devices))}"
    settings = {"target": target, "backend": "server" if server_url else "hf", "sampling": sampling.to_dict()}
    resuming = out.exists()
    _check_meta(out, settings, resuming)
    if resuming:
        check_record_settings(out, sampling.to_dict())  # also without the .meta.json file
    done = load_finished(out, log=log)
    todo = [c for c in convs if c.id not in done]
    stats = RegenStats(total=len(convs), already_done=len(convs) - len(todo), out=str(out), backend=backend,
                       skipped={**chat.report["skipped"], **skipped})
    if chat.report["skipped"] or skipped:
        log(f"regenerate: skipped input records {stats.skipped} (see the data report for examples)")
    log(f"regenerate: {len(todo)} of {len(convs)} conversations to do ({stats.already_done} already in {out}); "
        f"{backend}; sampling {sampling.to_dict()}")
    if not todo:
        return stats
    generation = {"model": target, **sampling.to_dict()}
    if server_url:
        server = ServerGenerator(server_url, sampling, model=server_model, timeout_s=server_timeout_s,
                                 retries=server_retries, backoff_s=server_backoff_s, log=log)
        generation.update(model=server.model, server_url=server_url)
    else:
        gens = _load_generators(target, devices, sampling, dtype, models, log)
        if match_check > 0 and sampling.temperature == 0:
            firsts = [_Job(c).next_prompt() for c in todo[:match_check]]
            stats.greedy_match = greedy_match_check(gens[0], firsts, batch_size)
            log(f"regenerate: batched vs single-sequence greedy ({stats.greedy_match['dtype']} on "
                f"{stats.greedy_match['device']}): {stats.greedy_match['summary']} "
                f"({stats.greedy_match['seconds']} s)")
    writer = _Writer(out, stats, settings, log, progress_every_s, on_progress)  # the clock starts here
    stop = threading.Event()
    try:
        if server_url:
            with cf.ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="regen-http") as pool:
                failures = FailureLog(stats.failed, max(5, 2 * concurrency), log)
                futs = [pool.submit(server_job, server, _Job(c), i, writer, generation, stop, failures)
                        for i, c in enumerate(todo)]
                _wait(futs, stop)
        else:
            batches = queue.Queue()
            for b in _length_grouped_batches(todo, batch_size):
                batches.put(b)
            with cf.ThreadPoolExecutor(max_workers=len(gens), thread_name_prefix="regen") as pool:
                futs = [pool.submit(_hf_worker, g, batches, writer, generation, stop) for g in gens]
                _wait(futs, stop)
    finally:
        writer.close()
    log(str(stats))
    return stats


def _wait(futs, stop: threading.Event) -> None:
    try:
        for f in cf.as_completed(futs):
            f.result()
    except BaseException:  # KeyboardInterrupt or a worker error: stop the others, keep what is written
        stop.set()
        raise


def _load_generators(target, devices, sampling, dtype, models, log) -> list[HFGenerator]:
    from .targets import load_target, load_tokenizer

    tokenizer = load_tokenizer(target)
    gens = []
    for name in devices:
        dev = torch.device(name)
        if models and name in models:
            model = models[name]
        else:
            t0 = time.perf_counter()
            model = load_target(target, device=dev, dtype=_resolve_dtype(dtype, dev))
            log(f"regenerate: loaded {target} on {dev} in {time.perf_counter() - t0:.1f}s")
        # one tokenizer per device thread: a fast tokenizer's padding state is per object
        gens.append(HFGenerator(model, tokenizer if not gens else copy.deepcopy(tokenizer), sampling))
    return gens


def _length_grouped_batches(convs, batch_size: int, window: int = 16):
    """Batches of similar prompt length (less padding), numbered in a fixed order: windows of `window` batches are
    sorted by the length of the first prompt, so the grouping depends only on the input order."""
    numbered = 0
    span = batch_size * window
    for w0 in range(0, len(convs), span):
        chunk = convs[w0:w0 + span]
        chunk = sorted(chunk, key=lambda c: sum(len(m["content"]) for m in c.messages if m["role"] != "assistant"))
        for b0 in range(0, len(chunk), batch_size):
            yield numbered, chunk[b0:b0 + batch_size]
            numbered += 1


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True, help='input chat data (JSONL/JSON/Parquet/datasets dir) or "tiny"')
    p.add_argument("--out", required=True, help="output JSONL (resumed if it exists)")
    p.add_argument("--target", default="tiny", help='HF id, local dir or "tiny"')
    p.add_argument("--devices", nargs="+", default=["cpu"], help="e.g. cuda:0 cuda:1 (one replica each)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--max-new-tokens", type=int, default=2048)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--thinking", choices=["on", "off", "template"], default="template",
                   help="enable_thinking for the chat template (template = do not pass it)")
    p.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float16", "float32"])
    p.add_argument("--format", default="auto", choices=["auto", "openai", "sharegpt"])
    p.add_argument("--server-url", default=None, help="OpenAI-compatible server, e.g. http://localhost:8000")
    p.add_argument("--server-model", default=None, help="model name on the server (default: its first model)")
    p.add_argument("--concurrency", type=int, default=8, help="requests in flight (server back end)")
    p.add_argument("--request-timeout", type=float, default=300.0,
                   help="seconds per server request before it is retried (server back end; raise it for long answers)")
    p.add_argument("--retries", type=int, default=3, help="retries per server request, with backoff (server back end)")
    p.add_argument("--limit", type=int, default=None, help="only the first N conversations")
    p.add_argument("--overwrite", action="store_true", help="start over instead of resuming")
    p.add_argument("--match-check", type=int, default=0,
                   help="compare batched vs single-sequence greedy on the first N prompts (recorded in .meta.json)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (small models on CPU: 1 is fastest, and far faster on a busy machine)")
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    sampling = SamplingConfig(temperature=a.temperature, top_p=a.top_p, top_k=a.top_k, max_new_tokens=a.max_new_tokens,
                              enable_thinking={"on": True, "off": False, "template": None}[a.thinking], seed=a.seed)
    regenerate(a.data, a.out, target=a.target, devices=tuple(a.devices), batch_size=a.batch_size, sampling=sampling,
               server_url=a.server_url, server_model=a.server_model, concurrency=a.concurrency, dtype=a.dtype,
               data_format=a.format, limit=a.limit, overwrite=a.overwrite, log=lambda s: print(s, flush=True),
               match_check=a.match_check, server_timeout_s=a.request_timeout, server_retries=a.retries)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
